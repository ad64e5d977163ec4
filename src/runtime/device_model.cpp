#include "runtime/device_model.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/linear_upload.h"
#include "runtime/rope.h"

namespace serval {

namespace {

// Vectors (norms, biases) and the embedding table, as they are.
std::unique_ptr<DeviceWeight> upload_tensor(Backend& be, const TensorView& view, int64_t& bytes) {
  bytes += dtype_bytes(view.shape.size() == 2 ? be.act_dtype() : DType::F32, view.numel());
  return be.upload_weight(view);
}

std::unique_ptr<DeviceWeight> upload_optional(Backend& be, const std::optional<TensorView>& view, int64_t& bytes) {
  return view ? upload_tensor(be, *view, bytes) : nullptr;
}

}  // namespace

DeviceModel::DeviceModel(const ModelDef& def, const WeightStore& weights, Backend& backend, RopePermute permute)
    : def_(def) {
  const bool neox = def_.config().rope_style == RopeStyle::Neox;
  WeightTransforms tf;
  tf.permute_rope = neox && (permute == RopePermute::On ||
                             (permute == RopePermute::Auto && backend.prefers_interleaved_rope()));
  tok_embd_ = upload_tensor(backend, def_.embedding(weights), bytes_);
  output_norm_ = upload_tensor(backend, def_.final_norm(weights), bytes_);
  if (const std::optional<Linear> head = def_.lm_head(weights)) output_ = upload_linear(backend, *head, matrix_bytes_);
  load_layers(weights, backend, tf);
  if (backend.folds_norm_weights() && norm_readers_dense()) fold_norms(backend);
  setup_rope(weights, backend, tf.permute_rope);
}

void DeviceModel::load_layers(const WeightStore& weights, Backend& be, const WeightTransforms& tf) {
  layers_.resize(size_t(def_.num_layers()));
  for (int64_t l = 0; l < def_.num_layers(); ++l) {
    // Host copies (permuted rows) live only while their layer uploads.
    const LayerWeights w = def_.load_layer(weights, l, tf);
    DeviceLayer& L = layers_[size_t(l)];
    L.def = def_.layer(l);
    L.attn_norm = upload_tensor(be, w.attn_norm, bytes_);
    auto qkv = upload_linear_group(be, {&w.q, &w.k, &w.v}, false, matrix_bytes_);
    L.wq = std::move(qkv[0]);
    L.wk = std::move(qkv[1]);
    L.wv = std::move(qkv[2]);
    L.wo = upload_linear(be, w.o, matrix_bytes_);
    L.bq = upload_optional(be, w.q_bias, bytes_);
    L.bk = upload_optional(be, w.k_bias, bytes_);
    L.bv = upload_optional(be, w.v_bias, bytes_);
    L.q_norm = upload_optional(be, w.q_norm, bytes_);
    L.k_norm = upload_optional(be, w.k_norm, bytes_);
    L.ffn_norm = upload_tensor(be, w.ffn_norm, bytes_);
    auto gate_up = upload_linear_group(be, {&w.gate, &w.up}, true, matrix_bytes_);
    L.gate = std::move(gate_up[0]);
    L.up = std::move(gate_up[1]);
    L.down = upload_linear(be, w.down, matrix_bytes_);
  }
}

std::string DeviceModel::formats() const {
  auto names = [](std::vector<const DeviceWeight*> ws) {
    std::vector<std::string> seen;
    for (const DeviceWeight* w : ws) {
      const std::string d = w->format().describe();
      if (std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);
    }
    std::string out;
    for (const std::string& d : seen) out += (out.empty() ? "" : " + ") + d;
    return out;
  };
  std::vector<const DeviceWeight*> attn, mlp;
  for (const DeviceLayer& L : layers_) {
    attn.insert(attn.end(), {L.wq.get(), L.wk.get(), L.wv.get(), L.wo.get()});
    mlp.insert(mlp.end(), {L.gate.get(), L.up.get(), L.down.get()});
  }
  return str_cat("attention ", names(attn), ", MLP ", names(mlp), ", LM head ",
                 output_ ? names({output_.get()}) : "tied to the embedding");
}

// Whether every matrix that reads a block's input norm is dense: a norm
// weight scales columns, which a block format's per-row scales cannot hold.
bool DeviceModel::norm_readers_dense() const {
  for (const DeviceLayer& L : layers_)
    for (const DeviceWeight* w : {L.wq.get(), L.wk.get(), L.wv.get(), L.gate.get(), L.up.get()})
      if (w->format().kind != LinearFormat::Kind::Dense) return false;
  return true;
}

// Each block's input norm scales the columns of the matrices that read it
// (attention: q/k/v; MLP: gate/up); the norms then run with a weight of ones.
void DeviceModel::fold_norms(Backend& be) {
  for (DeviceLayer& L : layers_) {
    be.fold_norm_weight(*L.attn_norm, {L.wq.get(), L.wk.get(), L.wv.get()});
    be.fold_norm_weight(*L.ffn_norm, {L.gate.get(), L.up.get()});
  }
  const int64_t h = def_.config().hidden_size;
  const std::vector<float> ones(size_t(h), 1.0f);
  unit_norm_ = be.upload_weight(TensorView{"unit_norm.weight", DType::F32, {h}, ones.data(), h * 4});
}

void DeviceModel::setup_rope(const WeightStore& weights, Backend& be, bool permuted) {
  const ModelConfig& cfg = def_.config();
  std::vector<float> divisors;
  if (const TensorView* rf = weights.find(kRopeFreqsTensor)) {
    SERVAL_CHECK(rf->shape.size() == 1 && rf->shape[0] == cfg.rope_dim / 2, "tensor \"", kRopeFreqsTensor,
                 "\" has shape ", rf->shape_str(), ", expected [", cfg.rope_dim / 2, "]");
    divisors.resize(size_t(cfg.rope_dim / 2));
    to_f32(rf->dtype, rf->data, divisors.data(), int64_t(divisors.size()));
  }
  const RopeScaling& sc = cfg.rope_scaling;
  if (sc.type != RopeScaling::Type::None) {
    SERVAL_CHECK(sc.factor > 0, "model config: rope scaling factor must be positive, got ", sc.factor);
  }
  if (sc.type == RopeScaling::Type::Llama3) {
    SERVAL_CHECK(sc.high_freq_factor != sc.low_freq_factor && sc.low_freq_factor > 0 &&
                     sc.original_max_position > 0,
                 "model config: llama3 rope scaling needs low_freq_factor (", sc.low_freq_factor,
                 ") != high_freq_factor (", sc.high_freq_factor, ") and original_max_position > 0");
  }
  const std::vector<float> inv_freq = rope_inv_freq(cfg, divisors);
  const int64_t bytes = int64_t(inv_freq.size() * sizeof(float));
  inv_freq_ = be.alloc(bytes);
  be.copy_to_device(inv_freq_.data(), inv_freq.data(), bytes);
  rope_ = RopeParams{permuted ? RopeStyle::Interleaved : cfg.rope_style, int32_t(cfg.head_dim), int32_t(cfg.rope_dim),
                     static_cast<const float*>(inv_freq_.data())};
}

int64_t planned_weight_bytes(const ModelDef& def, const WeightStore& weights, const Backend& backend) {
  int64_t bytes = 0;
  def.for_each_tensor([&](const TensorSpec& t) {
    const bool linear = t.shape.size() == 2 && t.name != "token_embd.weight";
    if (linear)
      bytes += backend.linear_device_bytes(load_linear(weights, def.config(), t.name, t.shape[0], t.shape[1]));
    else
      bytes += dtype_bytes(t.shape.size() == 2 ? backend.act_dtype() : DType::F32, weights.get(t.name, t.shape).numel());
  });
  return bytes;
}

}  // namespace serval
