// The Llama-family forward pass, written once against the Backend interface.
// Architecture differences are config flags only: attention_bias (qwen2),
// qk_norm (qwen3), tie_word_embeddings.
#include "runtime/backend_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "model/qk_permute.h"
#include "runtime/backend.h"
#include "runtime/rope.h"
#include "runtime/step_graphs.h"

namespace serval {

namespace {

struct LayerWeights {
  std::unique_ptr<DeviceWeight> attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm;
  std::unique_ptr<DeviceWeight> ffn_norm, gate, up, down;
};

// Activation buffers for up to `capacity` tokens and `row_capacity` logits
// rows per step, reused across steps. x (the residual stream) and rows are f32.
struct Workspace {
  int64_t capacity = 0, row_capacity = 0;
  DeviceBuffer x, xn, q, k, v, attn, proj, gate, up, rows, logits;
  int64_t bytes = 0;
};

constexpr double kGiB = double(int64_t(1) << 30);

// Device memory kept out of the KV pool for what grows at run time: attention
// partials, sampling scratch, cuBLASLt's workspace, graphs.
constexpr int64_t kGpuReserveBytes = int64_t(1) << 30;

class BackendModelRunner : public ModelRunner {
 public:
  BackendModelRunner(const ModelConfig& config, const WeightStore& weights, const RunnerOptions& opts);

  void forward(const Batch& batch, std::vector<float>& logits) override;
  void forward_sample(const Batch& batch, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override;
  void start_sample(const Batch& batch, std::span<const SampleSpec> specs) override;
  void finish_sample(std::vector<SampleResult>& out) override { backend_->finish_sample(out); }
  bool sample_ready() const override { return backend_->sample_ready(); }
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  const ModelConfig& config() const override { return cfg_; }
  int32_t block_size() const override { return geom_.block_size; }
  int64_t num_blocks() const override { return num_blocks_; }
  std::string device() const override { return backend_->name(); }
  RopeStyle rope_style() const override { return rope_.style; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t activation_bytes() const override { return ws_.bytes; }
  int64_t graph_replays() const override { return graph_replays_; }
  int64_t graphs_captured() const override { return graphs_captured_; }
  bool uses_graphs() const override { return graphs_ != nullptr; }
  bool queues_steps_async() const override { return backend_->queues_work_async(); }
  bool counts_fed_tokens() const override { return backend_->counts_fed_tokens(); }

 private:
  std::unique_ptr<DeviceWeight> upload(const WeightStore& ws, const std::string& name,
                                       const std::vector<int64_t>& shape);
  std::vector<std::unique_ptr<DeviceWeight>> upload_group(
      const WeightStore& ws, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors);
  // ws.get(name, shape), or its rope-permuted copy (permute_rope_; kept in permuted_).
  TensorView weight_view(const WeightStore& ws, const std::string& name, const std::vector<int64_t>& shape);
  std::vector<std::unique_ptr<DeviceWeight>> upload_gated_pair(const WeightStore& ws, const std::string& gate,
                                                               const std::string& up,
                                                               const std::vector<int64_t>& shape);
  void load_weights(const WeightStore& ws);
  void setup_rope(const WeightStore& ws);
  void plan_kv_cache(const RunnerOptions& opts);
  // Bytes a weight takes once uploaded: matrices in the activation dtype,
  // vectors (norms, biases) in f32, on every backend.
  int64_t device_bytes(const TensorView& t) const;
  void check_weights_fit(const WeightStore& ws, double fraction);
  void ensure_workspace(int64_t tokens, int64_t rows);
  BatchView upload_batch(const Batch& batch);
  void validate(const Batch& batch) const;
  // Runs the step (from a graph when it can); returns the f32 logits [R, vocab]
  // in device memory.
  Tensor run(const Batch& batch);
  // Enqueues the forward pass over `bv`; logits land in ws_.logits.
  void enqueue_forward(const BatchView& bv);
  Tensor act(const DeviceBuffer& buf, int64_t rows, int64_t cols) const {
    return Tensor{buf.data(), backend_->act_dtype(), rows, cols};
  }

  ModelConfig cfg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceWeight> tok_embd_, output_norm_, output_;  // output_ null when tied
  std::vector<LayerWeights> layers_;
  // Ones: the layers' norms run with it when the backend folded their
  // weights into q/k/v and gate/up (Backend::folds_norm_weights); else null.
  std::unique_ptr<DeviceWeight> unit_norm_;
  const DeviceWeight& attn_norm(size_t l) const { return unit_norm_ ? *unit_norm_ : *layers_[l].attn_norm; }
  const DeviceWeight& ffn_norm(size_t l) const { return unit_norm_ ? *unit_norm_ : *layers_[l].ffn_norm; }
  DeviceBuffer inv_freq_;
  RopeParams rope_;
  KvGeometry geom_;
  std::vector<KvLayer> kv_;
  int64_t num_blocks_ = 0;  // blocks the engine may use; the pool may hold one spare (graph padding)
  int64_t weight_bytes_ = 0;
  // q/k rows loaded in adjacent-pair order from a Neox model (permute_rope_),
  // and the host copies of the weights being uploaded (backends copy a view
  // before upload_weight returns).
  bool permute_rope_ = false;
  std::vector<std::vector<uint8_t>> permuted_;
  Workspace ws_;
  std::unique_ptr<StepGraphs> graphs_;  // null: eager only
  int64_t graphs_epoch_ = 0;            // backend graph_epoch() the graphs were recorded at
  int64_t graph_replays_ = 0, graphs_captured_ = 0;
  // Batch metadata: packed on the host, copied to the device in one transfer.
  std::vector<int64_t> meta_host_;
  DeviceBuffer meta_dev_;
  // Specs of the latest start_sample that did not throw: what a chained
  // step's token_source may name.
  int64_t sampled_specs_ = 0;
};

// A Neox model's q/k rows (weights, biases, q/k norms) in adjacent-pair order
// where the backend prefers it (Backend::prefers_interleaved_rope), so that
// its fused rope kernels take the model: every q and k head permuted alike
// leaves attention's scores as they were. RunnerOptions::rope_permute says
// where (kOn on any backend, kOff on none: to compare, and to test the
// permuted load on the CPU).
static bool rope_permute_wanted(const ModelConfig& cfg, const Backend& be, RunnerOptions::RopePermute mode) {
  if (cfg.rope_style != RopeStyle::Neox || mode == RunnerOptions::RopePermute::kOff) return false;
  return mode == RunnerOptions::RopePermute::kOn || be.prefers_interleaved_rope();
}

BackendModelRunner::BackendModelRunner(const ModelConfig& config, const WeightStore& weights,
                                       const RunnerOptions& opts)
    : cfg_(config) {
  cfg_.validate();
  SERVAL_CHECK(opts.block_size > 0, "runner: block_size must be positive, got ", opts.block_size);
  SERVAL_CHECK(opts.gpu_memory_fraction >= 0 && opts.gpu_memory_fraction <= 1,
               "--gpu-memory-fraction must be in (0, 1], got ", opts.gpu_memory_fraction);
  SERVAL_CHECK(opts.max_num_batched_tokens > 0 && opts.max_num_seqs > 0, "runner: max_num_batched_tokens and ",
               "max_num_seqs must be positive");
  backend_ = create_backend(opts.device, opts.threads, opts.dtype, opts.cuda_tuning);
  SERVAL_CHECK(device_supports_head_dim(backend_->name(), cfg_.head_dim), "the ", backend_->name(),
               " backend has no attention kernel for this model's head_dim of ", cfg_.head_dim,
               "; run it with --device cpu");
  backend_->set_batch_invariant(opts.batch_invariant);
  backend_->set_gemm_search(opts.gemm_search, opts.gemm_search_cache);
  const bool gpu = backend_->name() != "cpu";
  if (gpu) check_weights_fit(weights, opts.gpu_memory_fraction > 0 ? opts.gpu_memory_fraction : 1.0);
  permute_rope_ = rope_permute_wanted(cfg_, *backend_, opts.rope_permute);
  load_weights(weights);
  setup_rope(weights);
  // Activations for the largest step first: the KV pool gets what is left.
  ensure_workspace(std::max<int64_t>(opts.max_num_batched_tokens, opts.max_num_seqs), opts.max_num_seqs);
  plan_kv_cache(opts);
  if (backend_->supports_graphs() && !opts.enforce_eager) {
    const int32_t max_len = opts.max_model_len > 0 ? opts.max_model_len : int32_t(cfg_.max_position);
    graphs_ = std::make_unique<StepGraphs>(*backend_, std::min<int32_t>(opts.max_num_seqs, 512), max_len,
                                           geom_.block_size, int32_t(num_blocks_));
  }
}

int64_t BackendModelRunner::device_bytes(const TensorView& t) const {
  return dtype_bytes(t.shape.size() == 2 ? backend_->act_dtype() : DType::F32, t.numel());
}

void BackendModelRunner::check_weights_fit(const WeightStore& ws, double fraction) {
  int64_t bytes = 0;
  for (const auto& [name, t] : ws.all()) bytes += device_bytes(t);
  int64_t free_b = 0, total_b = 0;
  backend_->memory_info(free_b, total_b);
  SERVAL_CHECK(bytes <= free_b && double(bytes) <= fraction * double(total_b), "the model's weights need ",
               double(bytes) / kGiB, " GiB of GPU memory, but the GPU has ", double(free_b) / kGiB, " GiB free of ",
               double(total_b) / kGiB, " GiB (--gpu-memory-fraction ", fraction,
               "): use a smaller or quantized model, or another GPU");
}

void BackendModelRunner::setup_rope(const WeightStore& weights) {
  std::vector<float> divisors;
  if (const TensorView* rf = weights.find("rope_freqs.weight")) {
    SERVAL_CHECK(rf->shape.size() == 1 && rf->shape[0] == cfg_.rope_dim / 2, "tensor \"rope_freqs.weight\" has shape ",
                 rf->shape_str(), ", expected [", cfg_.rope_dim / 2, "]");
    divisors.resize(size_t(cfg_.rope_dim / 2));
    to_f32(rf->dtype, rf->data, divisors.data(), int64_t(divisors.size()));
  }
  const RopeScaling& sc = cfg_.rope_scaling;
  if (sc.type != RopeScaling::Type::None) {
    SERVAL_CHECK(sc.factor > 0, "model config: rope scaling factor must be positive, got ", sc.factor);
  }
  if (sc.type == RopeScaling::Type::Llama3) {
    SERVAL_CHECK(sc.high_freq_factor != sc.low_freq_factor && sc.low_freq_factor > 0 &&
                     sc.original_max_position > 0,
                 "model config: llama3 rope scaling needs low_freq_factor (", sc.low_freq_factor,
                 ") != high_freq_factor (", sc.high_freq_factor, ") and original_max_position > 0");
  }
  const std::vector<float> inv_freq = rope_inv_freq(cfg_, divisors);
  inv_freq_ = backend_->alloc(int64_t(inv_freq.size() * sizeof(float)));
  backend_->copy_to_device(inv_freq_.data(), inv_freq.data(), int64_t(inv_freq.size() * sizeof(float)));
  rope_ = RopeParams{permute_rope_ ? RopeStyle::Interleaved : cfg_.rope_style, int32_t(cfg_.head_dim),
                     int32_t(cfg_.rope_dim),
                     static_cast<const float*>(inv_freq_.data())};

}

TensorView BackendModelRunner::weight_view(const WeightStore& ws, const std::string& name,
                                           const std::vector<int64_t>& shape) {
  const TensorView& view = ws.get(name, shape);
  const bool qk = name.find(".attn_q.") != std::string::npos || name.find(".attn_k.") != std::string::npos ||
                  name.find(".attn_q_norm.") != std::string::npos || name.find(".attn_k_norm.") != std::string::npos;
  if (!permute_rope_ || !qk) return view;
  const int64_t rows = view.shape[0];
  SERVAL_CHECK(rows % cfg_.head_dim == 0 && view.nbytes % rows == 0, "tensor \"", name, "\": ", rows,
               " rows are not whole heads of ", cfg_.head_dim);
  std::vector<uint8_t>& copy = permuted_.emplace_back(size_t(view.nbytes));
  permute_qk_rows(view.data, copy.data(), rows / cfg_.head_dim, cfg_.head_dim, view.nbytes / rows, cfg_.rope_dim);
  TensorView out = view;
  out.data = copy.data();
  return out;
}

std::unique_ptr<DeviceWeight> BackendModelRunner::upload(const WeightStore& ws, const std::string& name,
                                                         const std::vector<int64_t>& shape) {
  const TensorView view = weight_view(ws, name, shape);
  weight_bytes_ += device_bytes(view);
  auto w = backend_->upload_weight(view);
  permuted_.clear();  // uploaded: a permuted host copy goes
  return w;
}

std::vector<std::unique_ptr<DeviceWeight>> BackendModelRunner::upload_group(
    const WeightStore& ws, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  std::vector<TensorView> views;
  for (const auto& [name, shape] : tensors) {
    views.push_back(weight_view(ws, name, shape));
    weight_bytes_ += device_bytes(views.back());
  }
  auto group = backend_->upload_weight_group(views);
  permuted_.clear();
  return group;
}

std::vector<std::unique_ptr<DeviceWeight>> BackendModelRunner::upload_gated_pair(const WeightStore& ws,
                                                                                  const std::string& gate,
                                                                                  const std::string& up,
                                                                                  const std::vector<int64_t>& shape) {
  const TensorView &g = ws.get(gate, shape), &u = ws.get(up, shape);
  weight_bytes_ += device_bytes(g) + device_bytes(u);
  return backend_->upload_gated_pair(g, u);
}

void BackendModelRunner::load_weights(const WeightStore& ws) {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, Q = cfg_.q_dim(), KV = cfg_.kv_dim();
  tok_embd_ = upload(ws, "token_embd.weight", {cfg_.vocab_size, H});
  output_norm_ = upload(ws, "output_norm.weight", {H});
  if (!cfg_.tie_word_embeddings) output_ = upload(ws, "output.weight", {cfg_.vocab_size, H});
  layers_.resize(size_t(cfg_.num_layers));
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    LayerWeights& L = layers_[size_t(l)];
    const std::string p = str_cat("blk.", l, ".");
    L.attn_norm = upload(ws, p + "attn_norm.weight", {H});
    auto qkv = upload_group(ws, {{p + "attn_q.weight", {Q, H}}, {p + "attn_k.weight", {KV, H}},
                                 {p + "attn_v.weight", {KV, H}}});
    L.wq = std::move(qkv[0]);
    L.wk = std::move(qkv[1]);
    L.wv = std::move(qkv[2]);
    L.wo = upload(ws, p + "attn_output.weight", {H, Q});
    if (cfg_.attention_bias) {
      L.bq = upload(ws, p + "attn_q.bias", {Q});
      L.bk = upload(ws, p + "attn_k.bias", {KV});
      L.bv = upload(ws, p + "attn_v.bias", {KV});
    }
    if (cfg_.qk_norm) {
      L.q_norm = upload(ws, p + "attn_q_norm.weight", {cfg_.head_dim});
      L.k_norm = upload(ws, p + "attn_k_norm.weight", {cfg_.head_dim});
    }
    L.ffn_norm = upload(ws, p + "ffn_norm.weight", {H});
    auto gate_up = upload_gated_pair(ws, p + "ffn_gate.weight", p + "ffn_up.weight", {I, H});
    L.gate = std::move(gate_up[0]);
    L.up = std::move(gate_up[1]);
    L.down = upload(ws, p + "ffn_down.weight", {H, I});
  }
  if (backend_->folds_norm_weights()) {
    for (LayerWeights& L : layers_) {
      backend_->fold_norm_weight(*L.attn_norm, {L.wq.get(), L.wk.get(), L.wv.get()});
      backend_->fold_norm_weight(*L.ffn_norm, {L.gate.get(), L.up.get()});
    }
    const std::vector<float> ones(size_t(H), 1.0f);
    unit_norm_ = backend_->upload_weight(TensorView{"unit_norm.weight", DType::F32, {H}, ones.data(), H * 4});
  }
}

void BackendModelRunner::plan_kv_cache(const RunnerOptions& opts) {
  geom_.block_size = opts.block_size;
  geom_.num_kv_heads = int32_t(cfg_.num_kv_heads);
  geom_.head_dim = int32_t(cfg_.head_dim);
  // K and V of one token in every layer.
  const int64_t bytes_per_token = 2 * cfg_.num_layers * dtype_bytes(backend_->kv_dtype(), cfg_.kv_dim());
  SERVAL_CHECK(opts.kv_cache_tokens >= 0 && opts.kv_memory_bytes >= 0,
               "runner: kv_cache_tokens and kv_memory_bytes must not be negative");
  const bool gpu = backend_->name() != "cpu";
  int64_t tokens = 0;
  if (opts.kv_cache_tokens > 0) {
    tokens = opts.kv_cache_tokens;
  } else if (opts.kv_memory_bytes > 0) {
    tokens = opts.kv_memory_bytes / bytes_per_token;
    SERVAL_CHECK(tokens >= opts.block_size, "runner: kv_memory_bytes ", opts.kv_memory_bytes,
                 " holds less than one block of ", opts.block_size, " tokens (", bytes_per_token,
                 " bytes per token)");
  } else if (gpu && opts.gpu_memory_fraction > 0) {
    // Everything this process holds on the device (weights, activations, the
    // CUDA context) is already allocated: the pool gets the rest of the fraction.
    int64_t free_b = 0, total_b = 0;
    backend_->memory_info(free_b, total_b);
    const int64_t used = total_b - free_b;
    const int64_t budget = int64_t(opts.gpu_memory_fraction * double(total_b)) - used - kGpuReserveBytes;
    const int64_t min_bytes = bytes_per_token * opts.block_size;
    SERVAL_CHECK(budget >= min_bytes && budget <= free_b, "GPU memory plan: --gpu-memory-fraction ",
                 opts.gpu_memory_fraction, " of ", double(total_b) / kGiB, " GiB leaves no room for a KV cache: ",
                 double(used) / kGiB, " GiB are in use (weights ", double(weight_bytes_) / kGiB, " GiB, activations ",
                 double(ws_.bytes) / kGiB, " GiB for ", ws_.capacity, " tokens per step), ",
                 double(kGpuReserveBytes) / kGiB, " GiB is reserved for scratch; raise the fraction or lower ",
                 "--max-num-batched-tokens / --max-num-seqs");
    tokens = budget / bytes_per_token;
  } else {
    tokens = 4 * std::min<int64_t>(cfg_.max_position, 4096);
  }
  num_blocks_ = (tokens + opts.block_size - 1) / opts.block_size;
  SERVAL_CHECK(num_blocks_ < (int64_t(1) << 31) - 1, "runner: ", num_blocks_, " KV blocks are more than a block id holds");
  // One spare block that no request owns: graph-padding rows write there.
  geom_.num_blocks = num_blocks_ + (backend_->supports_graphs() ? 1 : 0);
  kv_.clear();
  for (int64_t l = 0; l < cfg_.num_layers; ++l) kv_.push_back(backend_->alloc_kv_layer(geom_));
}

void BackendModelRunner::ensure_workspace(int64_t tokens, int64_t rows) {
  if (tokens <= ws_.capacity && rows <= ws_.row_capacity) return;
  const int64_t T = std::max(tokens, ws_.capacity * 3 / 2);
  const int64_t R = std::max({rows, ws_.row_capacity * 3 / 2, int64_t(1)});
  const DType a = backend_->act_dtype();
  ws_ = Workspace{};  // free the old buffers first
  int64_t bytes = 0;
  auto buf_bytes = [&](int64_t b) {
    bytes += b;
    return backend_->alloc(b);
  };
  auto buf = [&](int64_t n, DType dt) { return buf_bytes(dtype_bytes(dt, n)); };
  ws_.x = buf(T * cfg_.hidden_size, DType::F32);
  ws_.xn = buf(T * cfg_.hidden_size, a);
  // q, k, v back to back, and gate, up: with weights laid out alike
  // (upload_weight_group) a backend may write several in one batched product.
  // Each part starts at a 256-byte boundary, as an allocation of its own would
  // (cuBLASLt assumes that alignment).
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t q_bytes = dtype_bytes(a, T * cfg_.q_dim()), kv_bytes = dtype_bytes(a, T * cfg_.kv_dim());
  const DeviceBuffer qkv = buf_bytes(aligned(q_bytes) + 2 * aligned(kv_bytes));
  ws_.q = qkv.slice(0, q_bytes);
  ws_.k = qkv.slice(aligned(q_bytes), kv_bytes);
  ws_.v = qkv.slice(aligned(q_bytes) + aligned(kv_bytes), kv_bytes);
  ws_.attn = buf(T * cfg_.q_dim(), a);
  ws_.proj = buf(T * cfg_.hidden_size, a);
  const int64_t ffn_bytes = dtype_bytes(a, T * cfg_.intermediate_size);
  const DeviceBuffer gate_up = buf_bytes(2 * aligned(ffn_bytes));
  ws_.gate = gate_up.slice(0, ffn_bytes);
  ws_.up = gate_up.slice(aligned(ffn_bytes), ffn_bytes);
  ws_.rows = buf(R * cfg_.hidden_size, DType::F32);
  // Logits are f32 on every backend: the LM head accumulates in f32 and
  // rounding them to a bf16 activation would only lose precision.
  ws_.logits = buf(R * cfg_.vocab_size, DType::F32);
  ws_.capacity = T;
  ws_.row_capacity = R;
  ws_.bytes = bytes;
  if (graphs_) graphs_->clear();  // they hold the old addresses
}

BatchView BackendModelRunner::upload_batch(const Batch& b) {
  // Layout: each array starts on a 64-byte boundary of one buffer.
  struct Part { const void* src; int64_t bytes; int64_t offset; };
  Part parts[] = {
      {b.token_ids.data(), int64_t(b.token_ids.size() * 4), 0},
      {b.token_source.data(), int64_t(b.token_source.size() * 4), 0},
      {b.positions.data(), int64_t(b.positions.size() * 4), 0},
      {b.query_start.data(), int64_t(b.query_start.size() * 4), 0},
      {b.context_len.data(), int64_t(b.context_len.size() * 4), 0},
      {b.block_table.data(), int64_t(b.block_table.size() * 4), 0},
      {b.slot_mapping.data(), int64_t(b.slot_mapping.size() * 8), 0},
      {b.logits_rows.data(), int64_t(b.logits_rows.size() * 4), 0},
  };
  int64_t total = 0;
  for (Part& p : parts) {
    p.offset = total;
    total += (p.bytes + 63) / 64 * 64;
  }
  if (int64_t(meta_host_.size()) * 8 < total) meta_host_.resize(size_t(total / 8));
  if (meta_dev_.bytes() < total) meta_dev_ = backend_->alloc(total * 2);
  char* host = reinterpret_cast<char*>(meta_host_.data());
  for (const Part& p : parts)
    if (p.bytes > 0) std::memcpy(host + p.offset, p.src, size_t(p.bytes));
  backend_->copy_to_device_async(meta_dev_.data(), host, total);

  const char* dev = static_cast<const char*>(meta_dev_.data());
  BatchView v;
  v.token_ids = reinterpret_cast<const int32_t*>(dev + parts[0].offset);
  if (!b.token_source.empty())
    v.feed = TokenFeed{reinterpret_cast<const int32_t*>(dev + parts[1].offset), backend_->sampled_tokens()};
  v.positions = reinterpret_cast<const int32_t*>(dev + parts[2].offset);
  v.query_start = reinterpret_cast<const int32_t*>(dev + parts[3].offset);
  v.context_len = reinterpret_cast<const int32_t*>(dev + parts[4].offset);
  v.block_table = reinterpret_cast<const int32_t*>(dev + parts[5].offset);
  v.slot_mapping = reinterpret_cast<const int64_t*>(dev + parts[6].offset);
  v.logits_rows = reinterpret_cast<const int32_t*>(dev + parts[7].offset);
  v.num_tokens = b.num_tokens();
  v.num_seqs = b.num_seqs();
  v.num_logits_rows = int32_t(b.logits_rows.size());
  v.logits_rows_all = v.num_logits_rows == v.num_tokens;
  for (int32_t i = 0; v.logits_rows_all && i < v.num_logits_rows; ++i) v.logits_rows_all = b.logits_rows[i] == i;
  v.max_blocks_per_seq = b.max_blocks_per_seq;
  int64_t context_sum = 0;
  for (int32_t s = 0; s < v.num_seqs; ++s) {
    v.max_query_len = std::max(v.max_query_len, b.query_start[s + 1] - b.query_start[s]);
    v.max_context_len = std::max(v.max_context_len, b.context_len[s]);
    context_sum += b.context_len[s];
  }
  if (v.num_seqs > 0) v.mean_context_len = int32_t(context_sum / v.num_seqs);
  return v;
}

void BackendModelRunner::validate(const Batch& batch) const {
  batch.validate(geom_.block_size, num_blocks_);
  for (int32_t t = 0; t < batch.num_tokens(); ++t) {
    const int32_t source = batch.token_source.empty() ? -1 : batch.token_source[t];
    SERVAL_CHECK(source < sampled_specs_, "batch: token_source[", t, "] = ", source, " names no spec of the sample ",
                 "before, which had ", sampled_specs_);
    SERVAL_CHECK(source >= 0 || (batch.token_ids[t] >= 0 && batch.token_ids[t] < cfg_.vocab_size), "batch: token_ids[",
                 t, "] = ", batch.token_ids[t], " is outside the vocabulary of ", cfg_.vocab_size);
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    SERVAL_CHECK(batch.context_len[s] <= cfg_.max_position, "batch: sequence ", s, " has context_len ",
                 batch.context_len[s], ", beyond the model's context length ", cfg_.max_position);
  }
}

Tensor BackendModelRunner::run(const Batch& batch) {
  validate(batch);
  const int64_t R = int64_t(batch.logits_rows.size());
  if (graphs_ && graphs_->eligible(batch)) {
    const int32_t B = graphs_->padded_size(batch.num_seqs());
    ensure_workspace(B, B);  // may drop the graphs, so before find()
    const int32_t* sampled = backend_->sampled_tokens();  // may move (a new epoch), so before the check
    // A scratch buffer reallocated since the graphs were recorded (by an eager
    // step of another shape) would leave them reading freed memory.
    if (backend_->graph_epoch() != graphs_epoch_) graphs_->clear();
    const BatchView bv = graphs_->upload(batch, B, sampled);
    if (DeviceGraph* g = graphs_->find(bv)) {
      g->replay();
      ++graph_replays_;
      return Tensor{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
    }
    // First step of this size: run it eagerly (which also sizes every scratch
    // buffer and matmul plan the graph will use), then record it.
    enqueue_forward(bv);
    if (backend_->graph_epoch() != graphs_epoch_) graphs_->clear();  // the warm-up grew a scratch buffer
    graphs_epoch_ = backend_->graph_epoch();
    backend_->begin_capture();
    try {
      enqueue_forward(bv);
    } catch (...) {
      try { backend_->end_capture(); } catch (...) {}
      throw;
    }
    graphs_->store(bv, backend_->end_capture());
    ++graphs_captured_;
    return Tensor{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
  }
  ensure_workspace(batch.num_tokens(), R);
  enqueue_forward(upload_batch(batch));
  return Tensor{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
}

void BackendModelRunner::forward(const Batch& batch, std::vector<float>& logits) {
  const Tensor out = run(batch);
  logits.resize(size_t(out.numel()));
  if (out.rows > 0) backend_->tensor_to_host(out, logits.data());
}

void BackendModelRunner::forward_sample(const Batch& batch, std::span<const SampleSpec> specs,
                                        std::vector<SampleResult>& out) {
  SERVAL_CHECK(backend_->started_samples() == 0, "forward_sample while a started step is unfinished");
  start_sample(batch, specs);
  finish_sample(out);
}

void BackendModelRunner::start_sample(const Batch& batch, std::span<const SampleSpec> specs) {
  SERVAL_CHECK(backend_->started_samples() < Backend::kMaxStartedSamples, "start_sample: ",
               Backend::kMaxStartedSamples, " steps are already started and unfinished");
  for (const SampleSpec& s : specs) {
    SERVAL_CHECK(s.params != nullptr && s.row >= 0 && s.row < int64_t(batch.logits_rows.size()),
                 "forward_sample: spec row ", s.row, " is outside the step's ", batch.logits_rows.size(),
                 " logits rows");
    SERVAL_CHECK(s.fed_source < sampled_specs_, "sample spec: fed_source ", s.fed_source,
                 " names no spec of the sample before, which had ", sampled_specs_);
  }
  const Tensor logits = run(batch);
  sampled_specs_ = 0;  // a chained step after a failed start would read stale tokens
  backend_->start_sample(logits, specs);
  sampled_specs_ = int64_t(specs.size());
}

void BackendModelRunner::enqueue_forward(const BatchView& bv) {
  Backend& be = *backend_;
  const int64_t T = bv.num_tokens, R = bv.num_logits_rows;
  const int64_t Hd = cfg_.hidden_size, Qd = cfg_.q_dim(), KVd = cfg_.kv_dim(), I = cfg_.intermediate_size;
  const Tensor x{ws_.x.data(), DType::F32, T, Hd};
  const Tensor xn = act(ws_.xn, T, Hd), proj = act(ws_.proj, T, Hd);
  const Tensor q = act(ws_.q, T, Qd), k = act(ws_.k, T, KVd), v = act(ws_.v, T, KVd);
  const Tensor attn = act(ws_.attn, T, Qd), gate = act(ws_.gate, T, I), up = act(ws_.up, T, I);
  const float eps = cfg_.rms_eps;
  const float scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));

  // A bias or a per-head norm comes between the projection and rope, so the
  // layer cannot take the fused q/k/v path (qkv_attention).
  auto unfused_qkv = [&](const LayerWeights& L) { return L.bq || cfg_.qk_norm; };

  be.embedding(*tok_embd_, bv.token_ids, bv.feed, x);
  // Only the fused path may use the step's angles.
  if (!layers_.empty() && !unfused_qkv(layers_[0])) be.prepare_rope_angles(bv.positions, T, rope_);
  be.rmsnorm(x, attn_norm(0), eps, xn);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& L = layers_[l];
    if (unfused_qkv(L)) {
      if (L.bq) {
        be.matmul(xn, *L.wq, L.bq.get(), q);
        be.matmul(xn, *L.wk, L.bk.get(), k);
        be.matmul(xn, *L.wv, L.bv.get(), v);
      } else {
        be.matmul_multi(xn, {L.wq.get(), L.wk.get(), L.wv.get()}, {q, k, v});
      }
      if (cfg_.qk_norm) {
        be.rmsnorm(q.reshaped(cfg_.head_dim), *L.q_norm, eps, q.reshaped(cfg_.head_dim));
        be.rmsnorm(k.reshaped(cfg_.head_dim), *L.k_norm, eps, k.reshaped(cfg_.head_dim));
      }
      be.rope_kv_write(q, k, v, bv.positions, rope_, bv.slot_mapping, kv_[l], geom_);
      be.paged_attention(q, kv_[l], geom_, bv, int32_t(cfg_.num_heads), scale, attn);
    } else {
      be.qkv_attention(xn, *L.wq, *L.wk, *L.wv, q, k, v, rope_, kv_[l], geom_, bv, int32_t(cfg_.num_heads), scale,
                       attn);
    }
    be.matmul_add_rmsnorm(attn, *L.wo, proj, x, ffn_norm(l), eps, xn);

    be.gated_mlp_up(xn, *L.gate, *L.up, gate, up, gate);  // silu(gate) * up lands in gate
    if (l + 1 < layers_.size()) {
      be.matmul_add_rmsnorm(gate, *L.down, proj, x, attn_norm(l + 1), eps, xn);
    } else if (R > 0 && bv.logits_rows_all) {
      // Every row needs logits (a decode step): the final norm follows the
      // last projection as the other norms do, with no gather between.
      be.matmul_add_rmsnorm(gate, *L.down, proj, x, *output_norm_, eps, xn);
    } else {
      be.matmul(gate, *L.down, nullptr, proj);
      be.add(x, proj);
    }
  }
  if (R == 0) return;
  // Only the rows that need logits go through the final norm and the LM head.
  const Tensor rows_n = act(ws_.xn, R, Hd);
  const Tensor out{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
  if (!bv.logits_rows_all) {
    const Tensor rows{ws_.rows.data(), DType::F32, R, Hd};
    be.gather_rows(x, bv.logits_rows, rows);
    be.rmsnorm(rows, *output_norm_, eps, rows_n);
  }
  be.matmul(rows_n, output_ ? *output_ : *tok_embd_, nullptr, out);
}

void BackendModelRunner::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  for (const auto& [src, dst] : src_dst) {
    SERVAL_CHECK(src >= 0 && src < geom_.num_blocks && dst >= 0 && dst < geom_.num_blocks, "copy_blocks: ", src,
                 " -> ", dst, " is outside the pool of ", geom_.num_blocks, " blocks");
  }
  for (const KvLayer& layer : kv_)
    for (const auto& [src, dst] : src_dst)
      if (src != dst) backend_->copy_kv_block(layer, geom_, src, dst);
}

}  // namespace

std::unique_ptr<ModelRunner> make_backend_model_runner(const ModelConfig& config, const WeightStore& weights,
                                                       const RunnerOptions& opts) {
  return std::make_unique<BackendModelRunner>(config, weights, opts);
}

}  // namespace serval
