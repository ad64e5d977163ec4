// The families' definitions. They differ only in their attention: llama
// (q/k/v bias when the checkpoint has one), mistral (llama with a sliding
// window on every layer), qwen2 (q/k/v bias, a window on the layers from
// max_window_layers on when use_sliding_window), qwen3 (per-head q/k norms,
// windows as qwen2).
#include "model/model_def.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/gguf_linear_formats.h"
#include "model/kv_checkpoint_scales.h"
#include "model/qk_permute.h"

namespace serval {

namespace {

std::string layer_prefix(int64_t l) { return str_cat("blk.", l, "."); }

bool is_sliding(const ModelConfig& c, int64_t l) {
  if (c.sliding_window == 0) return false;
  if (!c.sliding_layers.empty()) return c.sliding_layers[size_t(l)] != 0;
  if (c.architecture == "mistral") return true;
  if (c.architecture == "qwen2" || c.architecture == "qwen3") return l >= c.sliding_window_from_layer;
  return false;
}

}  // namespace

std::string quant_scale_name(const std::string& weight_name) { return weight_name + "_scale"; }
std::string int4_weight_name(const std::string& weight_name) { return weight_name + "_int4"; }
std::string int4_zero_name(const std::string& weight_name) { return weight_name + "_zero"; }

Linear load_linear(const WeightStore& store, const ModelConfig& config, const std::string& name, int64_t out,
                   int64_t in) {
  if (const auto it = config.linear_formats.find(name); it != config.linear_formats.end())
    return load_stored_linear(store, name, it->second, out, in);
  if (const TensorView* packed = store.find(int4_weight_name(name))) {
    const TensorView* scales = store.find(quant_scale_name(name));
    SERVAL_CHECK(scales != nullptr && scales->shape.size() == 2 && scales->shape[1] > 0, "int4 weight \"", name,
                 "\" has no [out, groups] scales (\"", quant_scale_name(name), "\")");
    Linear w;
    w.name = name;
    w.out = out;
    w.in = in;
    w.weight = *packed;
    w.scales = *scales;
    if (const TensorView* zeros = store.find(int4_zero_name(name))) w.zeros = *zeros;
    w.format = {LinearFormat::Kind::Int4Grouped, DType::I8, int32_t(in / scales->shape[1]), !w.zeros.has_value()};
    w.shard = ShardSpec::whole(out, in);
    w.validate();
    return w;
  }
  Linear w = linear_of(store.get(name, {out, in}));
  if (w.weight.dtype != DType::FP8_E4M3 && w.weight.dtype != DType::I8) return w;
  const bool fp8 = w.weight.dtype == DType::FP8_E4M3;
  const TensorView* scales = store.find(quant_scale_name(name));
  SERVAL_CHECK(scales != nullptr, fp8 ? "fp8" : "int8", " weight \"", name, "\" has no scales (\"",
               quant_scale_name(name), "\")");
  w.format = fp8 ? LinearFormat{LinearFormat::Kind::Fp8, DType::FP8_E4M3, 0, true}
                 : LinearFormat{LinearFormat::Kind::Int8PerChannel, DType::I8, 0, true};
  if (fp8 && scales->shape.size() == 2) {
    w.format.block_rows = int32_t(config.fp8_block_rows);
    w.format.block_cols = int32_t(config.fp8_block_cols);
  }
  w.scales = *scales;
  w.validate();
  return w;
}

ModelDef ModelDef::of(const ModelConfig& config) {
  check_architecture_supported(config.architecture);
  SERVAL_CHECK(config.sliding_window == 0 || config.architecture != "llama", "model config: the llama family has ",
               "no sliding window (sliding_window ", config.sliding_window, "); load the model as mistral");
  return ModelDef(config);
}

LayerDef ModelDef::layer(int64_t l) const {
  SERVAL_CHECK(l >= 0 && l < cfg_.num_layers, "layer ", l, " is outside the model's ", cfg_.num_layers);
  LayerDef d;
  d.attention.num_heads = cfg_.num_heads;
  d.attention.num_kv_heads = cfg_.num_kv_heads;
  d.attention.head_dim = cfg_.head_dim;
  d.attention.window = is_sliding(cfg_, l) && cfg_.sliding_window < cfg_.max_position ? cfg_.sliding_window : 0;
  d.attention.qkv_bias = cfg_.attention_bias;
  d.attention.qk_norm = cfg_.qk_norm;
  d.mlp.intermediate = cfg_.intermediate_size;
  return d;
}

void ModelDef::for_each_tensor(const std::function<void(const TensorSpec&)>& fn) const {
  const int64_t h = cfg_.hidden_size;
  fn({"token_embd.weight", {cfg_.vocab_size, h}});
  fn({"output_norm.weight", {h}});
  if (!cfg_.tie_word_embeddings) fn({"output.weight", {cfg_.vocab_size, h}});
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerDef d = layer(l);
    const AttentionDef& a = d.attention;
    const int64_t q = a.num_heads * a.head_dim, kv = a.num_kv_heads * a.head_dim, i = d.mlp.intermediate;
    const std::string p = layer_prefix(l);
    fn({p + "attn_norm.weight", {h}});
    fn({p + "attn_q.weight", {q, h}});
    fn({p + "attn_k.weight", {kv, h}});
    fn({p + "attn_v.weight", {kv, h}});
    fn({p + "attn_output.weight", {h, q}});
    if (a.qkv_bias) {
      fn({p + "attn_q.bias", {q}});
      fn({p + "attn_k.bias", {kv}});
      fn({p + "attn_v.bias", {kv}});
    }
    if (a.qk_norm) {
      fn({p + "attn_q_norm.weight", {a.head_dim}});
      fn({p + "attn_k_norm.weight", {a.head_dim}});
    }
    fn({p + "ffn_norm.weight", {h}});
    fn({p + "ffn_gate.weight", {i, h}});
    fn({p + "ffn_up.weight", {i, h}});
    fn({p + "ffn_down.weight", {h, i}});
  }
}

std::vector<TensorSpec> ModelDef::tensors() const {
  std::vector<TensorSpec> out;
  for_each_tensor([&](const TensorSpec& t) { out.push_back(t); });
  return out;
}

void ModelDef::check_weights(const WeightStore& weights) const {
  for_each_tensor([&](const TensorSpec& t) {
    const bool linear = t.shape.size() == 2 && t.name != "token_embd.weight";
    if (cfg_.linear_formats.contains(t.name)) {
      SERVAL_CHECK(linear, "tensor \"", t.name, "\" is ", cfg_.linear_formats.at(t.name).describe(),
                   ", which Serval takes only for the matrices of linear layers");
      load_linear(weights, cfg_, t.name, t.shape[0], t.shape[1]);  // its companions, checked
      return;
    }
    if (linear && weights.find(int4_weight_name(t.name))) {
      load_linear(weights, cfg_, t.name, t.shape[0], t.shape[1]);  // its packed tensors
      return;
    }
    const TensorView& v = weights.get(t.name, t.shape);
    if (v.dtype == DType::FP8_E4M3 || v.dtype == DType::I8) {
      SERVAL_CHECK(linear, "tensor \"", t.name, "\" is ", dtype_name(v.dtype),
                   ", which Serval takes only for the matrices of linear layers");
      load_linear(weights, cfg_, t.name, t.shape[0], t.shape[1]);  // its scales
    }
  });
  check_kv_checkpoint_scales(cfg_, weights);
  if (const TensorView* f = weights.find(kRopeFreqsTensor)) {
    if (f->numel() != cfg_.rope_dim / 2)
      fail("tensor \"", kRopeFreqsTensor, "\" has shape ", f->shape_str(), ", expected [", cfg_.rope_dim / 2,
           "] (rope_dim / 2)");
  }
}

KvLayerSpec ModelDef::kv_spec(int64_t l, DType dtype) const {
  const AttentionDef a = layer(l).attention;
  return KvLayerSpec{dtype, int32_t(a.num_kv_heads), int32_t(a.head_dim), a.window};
}

int64_t ModelDef::kv_bytes_per_token(DType dtype) const {
  int64_t bytes = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) bytes += kv_spec(l, dtype).bytes_per_token();
  return bytes;
}

int64_t ModelDef::widest_window() const {
  int64_t widest = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const int64_t w = layer(l).attention.window;
    if (w == 0) return 0;
    widest = std::max(widest, w);
  }
  return widest;
}

LayerWeights ModelDef::load_layer(const WeightStore& store, int64_t l, const WeightTransforms& tf) const {
  auto linear = [&](const WeightStore& st, const std::string& name, int64_t out, int64_t in) {
    return load_linear(st, cfg_, name, out, in);
  };
  const LayerDef d = layer(l);
  const AttentionDef& a = d.attention;
  const int64_t h = cfg_.hidden_size, q = a.num_heads * a.head_dim, kv = a.num_kv_heads * a.head_dim;
  const int64_t i = d.mlp.intermediate;
  const std::string p = layer_prefix(l);
  LayerWeights w;
  // Rows of q/k tensors permuted into a copy that `w` owns.
  const bool permute = tf.permute_rope && cfg_.rope_style == RopeStyle::Neox;
  auto qk_rows = [&](TensorView view) {
    if (!permute) return view;
    const int64_t rows = view.shape[0];
    SERVAL_CHECK(rows % a.head_dim == 0 && view.nbytes % rows == 0, "tensor \"", view.name, "\": ", rows,
                 " rows are not whole heads of ", a.head_dim);
    std::vector<uint8_t>& copy = w.owned.emplace_back(size_t(view.nbytes));
    permute_qk_rows(view.data, copy.data(), rows / a.head_dim, a.head_dim, view.nbytes / rows, cfg_.rope_dim);
    view.data = copy.data();
    return view;
  };
  w.attn_norm = store.get(p + "attn_norm.weight", {h});
  // A format with scales per row or block is permuted dequantized (its
  // scales would have to move with its rows).
  auto qk_linear = [&](Linear lin) {
    if (permute && lin.format.kind != LinearFormat::Kind::Dense && lin.format.kind != LinearFormat::Kind::GgufBlock) {
      const std::vector<float> f = dequantize_linear(lin);
      std::vector<uint8_t>& bytes = w.owned.emplace_back(f.size() * sizeof(float));
      std::memcpy(bytes.data(), f.data(), bytes.size());
      lin.format = LinearFormat::dense(DType::F32);
      lin.weight = TensorView{lin.name, DType::F32, {lin.out, lin.in}, bytes.data(), int64_t(bytes.size())};
      lin.scales.reset();
      lin.zeros.reset();
    }
    lin.weight = qk_rows(lin.weight);
    return lin;
  };
  w.q = qk_linear(linear(store, p + "attn_q.weight", q, h));
  w.k = qk_linear(linear(store, p + "attn_k.weight", kv, h));
  w.v = linear(store, p + "attn_v.weight", kv, h);
  w.o = linear(store, p + "attn_output.weight", h, q);
  if (a.qkv_bias) {
    w.q_bias = qk_rows(store.get(p + "attn_q.bias", {q}));
    w.k_bias = qk_rows(store.get(p + "attn_k.bias", {kv}));
    w.v_bias = store.get(p + "attn_v.bias", {kv});
  }
  if (a.qk_norm) {
    w.q_norm = qk_rows(store.get(p + "attn_q_norm.weight", {a.head_dim}));
    w.k_norm = qk_rows(store.get(p + "attn_k_norm.weight", {a.head_dim}));
  }
  w.ffn_norm = store.get(p + "ffn_norm.weight", {h});
  w.gate = linear(store, p + "ffn_gate.weight", i, h);
  w.up = linear(store, p + "ffn_up.weight", i, h);
  w.down = linear(store, p + "ffn_down.weight", h, i);
  return w;
}

TensorView ModelDef::embedding(const WeightStore& store) const {
  return store.get("token_embd.weight", {cfg_.vocab_size, cfg_.hidden_size});
}

TensorView ModelDef::final_norm(const WeightStore& store) const {
  return store.get("output_norm.weight", {cfg_.hidden_size});
}

std::string ModelDef::stored_formats(const WeightStore& store) const {
  std::vector<std::string> attn, mlp, head;
  for_each_tensor([&](const TensorSpec& t) {
    if (t.shape.size() != 2 || t.name == "token_embd.weight") return;
    const std::string d = load_linear(store, cfg_, t.name, t.shape[0], t.shape[1]).format.describe();
    const bool ffn = t.name.find(".ffn_") != std::string::npos;
    std::vector<std::string>& cls = t.name == "output.weight" ? head : ffn ? mlp : attn;
    if (std::find(cls.begin(), cls.end(), d) == cls.end()) cls.push_back(d);
  });
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& d : v) out += (out.empty() ? "" : " + ") + d;
    return out;
  };
  return str_cat("attention ", join(attn), ", MLP ", join(mlp), ", LM head ",
                 head.empty() ? std::string("tied to the embedding") : join(head));
}

std::optional<Linear> ModelDef::lm_head(const WeightStore& store) const {
  if (cfg_.tie_word_embeddings) return std::nullopt;
  return load_linear(store, cfg_, "output.weight", cfg_.vocab_size, cfg_.hidden_size);
}

}  // namespace serval
