#include "model/model_shapes.h"

#include "core/error.h"

namespace serval {

void for_each_expected_tensor(const ModelConfig& c, const std::function<void(const ExpectedTensor&)>& fn) {
  const int64_t h = c.hidden_size;
  std::vector<ExpectedTensor> out;
  auto flush = [&] {
    for (const ExpectedTensor& e : out) fn(e);
    out.clear();
  };
  out.push_back({"token_embd.weight", {c.vocab_size, h}});
  out.push_back({"output_norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"output.weight", {c.vocab_size, h}});
  flush();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = str_cat("blk.", i, ".");
    out.push_back({p + "attn_norm.weight", {h}});
    out.push_back({p + "attn_q.weight", {c.q_dim(), h}});
    out.push_back({p + "attn_k.weight", {c.kv_dim(), h}});
    out.push_back({p + "attn_v.weight", {c.kv_dim(), h}});
    out.push_back({p + "attn_output.weight", {h, c.q_dim()}});
    if (c.attention_bias) {
      out.push_back({p + "attn_q.bias", {c.q_dim()}});
      out.push_back({p + "attn_k.bias", {c.kv_dim()}});
      out.push_back({p + "attn_v.bias", {c.kv_dim()}});
    }
    if (c.qk_norm) {
      out.push_back({p + "attn_q_norm.weight", {c.head_dim}});
      out.push_back({p + "attn_k_norm.weight", {c.head_dim}});
    }
    out.push_back({p + "ffn_norm.weight", {h}});
    out.push_back({p + "ffn_gate.weight", {c.intermediate_size, h}});
    out.push_back({p + "ffn_up.weight", {c.intermediate_size, h}});
    out.push_back({p + "ffn_down.weight", {h, c.intermediate_size}});
    flush();
  }
  flush();
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  for_each_expected_tensor(c, [&](const ExpectedTensor& e) { out.push_back(e); });
  return out;
}

void check_weight_shapes(const ModelConfig& config, const WeightStore& weights) {
  for_each_expected_tensor(config, [&](const ExpectedTensor& e) { weights.get(e.name, e.shape); });
  if (const TensorView* f = weights.find(kRopeFreqsTensor)) {
    if (f->numel() != config.rope_dim / 2)
      fail("tensor \"", kRopeFreqsTensor, "\" has shape ", f->shape_str(), ", expected [",
           config.rope_dim / 2, "] (rope_dim / 2)");
  }
}

}  // namespace serval
