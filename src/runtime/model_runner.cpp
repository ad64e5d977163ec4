// The Llama-family forward pass, written once against the Backend interface.
// Architecture differences are config flags only: attention_bias (qwen2),
// qk_norm (qwen3), tie_word_embeddings.
#include "runtime/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/rope.h"

namespace serval {

namespace {

struct LayerWeights {
  std::unique_ptr<DeviceWeight> attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm;
  std::unique_ptr<DeviceWeight> ffn_norm, gate, up, down;
};

// Activation buffers for up to `capacity` tokens per step, reused across steps.
struct Workspace {
  int64_t capacity = 0;
  DeviceBuffer x, xn, q, k, v, attn, proj, gate, up, rows, logits;
};

class BackendModelRunner : public ModelRunner {
 public:
  BackendModelRunner(const ModelConfig& config, const WeightStore& weights, const RunnerOptions& opts);

  void forward(const Batch& batch, std::vector<float>& logits) override;
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  const ModelConfig& config() const override { return cfg_; }
  int32_t block_size() const override { return geom_.block_size; }
  int64_t num_blocks() const override { return geom_.num_blocks; }

 private:
  std::unique_ptr<DeviceWeight> upload(const WeightStore& ws, const std::string& name,
                                       const std::vector<int64_t>& shape);
  void load_weights(const WeightStore& ws);
  void setup_rope(const WeightStore& ws);
  void plan_kv_cache(const RunnerOptions& opts);
  void ensure_workspace(int64_t tokens);
  BatchView upload_batch(const Batch& batch);
  Tensor act(const DeviceBuffer& buf, int64_t rows, int64_t cols) const {
    return Tensor{buf.data(), backend_->act_dtype(), rows, cols};
  }

  ModelConfig cfg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceWeight> tok_embd_, output_norm_, output_;  // output_ null when tied
  std::vector<LayerWeights> layers_;
  DeviceBuffer inv_freq_;
  RopeParams rope_;
  KvGeometry geom_;
  std::vector<KvLayer> kv_;
  Workspace ws_;
  // Batch metadata: packed on the host, copied to the device in one transfer.
  std::vector<int64_t> meta_host_;
  DeviceBuffer meta_dev_;
};

BackendModelRunner::BackendModelRunner(const ModelConfig& config, const WeightStore& weights,
                                       const RunnerOptions& opts)
    : cfg_(config) {
  cfg_.validate();
  SERVAL_CHECK(opts.block_size > 0, "runner: block_size must be positive, got ", opts.block_size);
  backend_ = create_backend(opts.device, opts.threads);
  load_weights(weights);
  setup_rope(weights);
  plan_kv_cache(opts);
  ensure_workspace(std::min<int64_t>(cfg_.max_position, 512));
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
  rope_ = RopeParams{cfg_.rope_style, int32_t(cfg_.head_dim), int32_t(cfg_.rope_dim),
                     static_cast<const float*>(inv_freq_.data())};

}

std::unique_ptr<DeviceWeight> BackendModelRunner::upload(const WeightStore& ws, const std::string& name,
                                                         const std::vector<int64_t>& shape) {
  return backend_->upload_weight(ws.get(name, shape));
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
    L.wq = upload(ws, p + "attn_q.weight", {Q, H});
    L.wk = upload(ws, p + "attn_k.weight", {KV, H});
    L.wv = upload(ws, p + "attn_v.weight", {KV, H});
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
    L.gate = upload(ws, p + "ffn_gate.weight", {I, H});
    L.up = upload(ws, p + "ffn_up.weight", {I, H});
    L.down = upload(ws, p + "ffn_down.weight", {H, I});
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
  int64_t tokens = 0;
  if (opts.kv_cache_tokens > 0) {
    tokens = opts.kv_cache_tokens;
  } else if (opts.kv_memory_bytes > 0) {
    tokens = opts.kv_memory_bytes / bytes_per_token;
    SERVAL_CHECK(tokens >= opts.block_size, "runner: kv_memory_bytes ", opts.kv_memory_bytes,
                 " holds less than one block of ", opts.block_size, " tokens (", bytes_per_token,
                 " bytes per token)");
  } else {
    tokens = 4 * std::min<int64_t>(cfg_.max_position, 4096);
  }
  geom_.num_blocks = (tokens + opts.block_size - 1) / opts.block_size;
  kv_.clear();
  for (int64_t l = 0; l < cfg_.num_layers; ++l) kv_.push_back(backend_->alloc_kv_layer(geom_));
}

void BackendModelRunner::ensure_workspace(int64_t tokens) {
  if (tokens <= ws_.capacity) return;
  const int64_t T = std::max<int64_t>(tokens, ws_.capacity * 3 / 2);
  const DType a = backend_->act_dtype();
  auto buf = [&](int64_t cols) { return backend_->alloc(dtype_bytes(a, T * cols)); };
  ws_.x = buf(cfg_.hidden_size);
  ws_.xn = buf(cfg_.hidden_size);
  ws_.q = buf(cfg_.q_dim());
  ws_.k = buf(cfg_.kv_dim());
  ws_.v = buf(cfg_.kv_dim());
  ws_.attn = buf(cfg_.q_dim());
  ws_.proj = buf(cfg_.hidden_size);
  ws_.gate = buf(cfg_.intermediate_size);
  ws_.up = buf(cfg_.intermediate_size);
  ws_.rows = buf(cfg_.hidden_size);
  // Logits are f32 on every backend: the LM head accumulates in f32 and
  // rounding them to a bf16 activation would only lose precision.
  ws_.logits = backend_->alloc(T * cfg_.vocab_size * int64_t(sizeof(float)));
  ws_.capacity = T;
}

BatchView BackendModelRunner::upload_batch(const Batch& b) {
  // Layout: each array starts on a 64-byte boundary of one buffer.
  struct Part { const void* src; int64_t bytes; int64_t offset; };
  Part parts[] = {
      {b.token_ids.data(), int64_t(b.token_ids.size() * 4), 0},
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
  backend_->copy_to_device(meta_dev_.data(), host, total);

  const char* dev = static_cast<const char*>(meta_dev_.data());
  BatchView v;
  v.token_ids = reinterpret_cast<const int32_t*>(dev + parts[0].offset);
  v.positions = reinterpret_cast<const int32_t*>(dev + parts[1].offset);
  v.query_start = reinterpret_cast<const int32_t*>(dev + parts[2].offset);
  v.context_len = reinterpret_cast<const int32_t*>(dev + parts[3].offset);
  v.block_table = reinterpret_cast<const int32_t*>(dev + parts[4].offset);
  v.slot_mapping = reinterpret_cast<const int64_t*>(dev + parts[5].offset);
  v.logits_rows = reinterpret_cast<const int32_t*>(dev + parts[6].offset);
  v.num_tokens = b.num_tokens();
  v.num_seqs = b.num_seqs();
  v.num_logits_rows = int32_t(b.logits_rows.size());
  v.max_blocks_per_seq = b.max_blocks_per_seq;
  for (int32_t s = 0; s < v.num_seqs; ++s) {
    v.max_query_len = std::max(v.max_query_len, b.query_start[s + 1] - b.query_start[s]);
    v.max_context_len = std::max(v.max_context_len, b.context_len[s]);
  }
  return v;
}

void BackendModelRunner::forward(const Batch& batch, std::vector<float>& logits) {
  batch.validate(geom_.block_size, geom_.num_blocks);
  for (int32_t t = 0; t < batch.num_tokens(); ++t) {
    SERVAL_CHECK(batch.token_ids[t] >= 0 && batch.token_ids[t] < cfg_.vocab_size, "batch: token_ids[", t, "] = ",
                 batch.token_ids[t], " is outside the vocabulary of ", cfg_.vocab_size);
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    SERVAL_CHECK(batch.context_len[s] <= cfg_.max_position, "batch: sequence ", s, " has context_len ",
                 batch.context_len[s], ", beyond the model's context length ", cfg_.max_position);
  }
  const int64_t T = batch.num_tokens();
  const int64_t R = int64_t(batch.logits_rows.size());
  ensure_workspace(T);
  const BatchView bv = upload_batch(batch);
  Backend& be = *backend_;

  const int64_t Hd = cfg_.hidden_size, Qd = cfg_.q_dim(), KVd = cfg_.kv_dim(), I = cfg_.intermediate_size;
  const Tensor x = act(ws_.x, T, Hd), xn = act(ws_.xn, T, Hd), proj = act(ws_.proj, T, Hd);
  const Tensor q = act(ws_.q, T, Qd), k = act(ws_.k, T, KVd), v = act(ws_.v, T, KVd);
  const Tensor attn = act(ws_.attn, T, Qd), gate = act(ws_.gate, T, I), up = act(ws_.up, T, I);
  const float eps = cfg_.rms_eps;
  const float scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));

  be.embedding(*tok_embd_, bv.token_ids, x);
  be.rmsnorm(x, *layers_[0].attn_norm, eps, xn);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& L = layers_[l];
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
    be.rope(q, k, bv.positions, rope_);
    be.kv_write(k, v, bv.slot_mapping, kv_[l], geom_);
    be.paged_attention(q, kv_[l], geom_, bv, int32_t(cfg_.num_heads), scale, attn);
    be.matmul(attn, *L.wo, nullptr, proj);
    be.add_rmsnorm(x, proj, *L.ffn_norm, eps, xn);

    be.matmul_multi(xn, {L.gate.get(), L.up.get()}, {gate, up});
    be.silu_mul(gate, up, gate);
    be.matmul(gate, *L.down, nullptr, proj);
    if (l + 1 < layers_.size()) {
      be.add_rmsnorm(x, proj, *layers_[l + 1].attn_norm, eps, xn);
    } else {
      be.add(x, proj);
    }
  }

  logits.resize(size_t(R * cfg_.vocab_size));
  if (R == 0) return;
  // Only the rows that need logits go through the final norm and the LM head.
  const Tensor rows = act(ws_.rows, R, Hd);
  const Tensor out{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
  be.gather_rows(x, bv.logits_rows, rows);
  be.rmsnorm(rows, *output_norm_, eps, rows);
  be.matmul(rows, output_ ? *output_ : *tok_embd_, nullptr, out);
  be.tensor_to_host(out, logits.data());
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

void ModelRunner::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>&) {
  fail("this model runner cannot copy KV blocks");
}

std::unique_ptr<ModelRunner> ModelRunner::create(const ModelConfig& config, const WeightStore& weights,
                                                 const RunnerOptions& opts) {
  return std::make_unique<BackendModelRunner>(config, weights, opts);
}

}  // namespace serval
