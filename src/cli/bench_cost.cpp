#include "cli/bench_cost.h"

#include <algorithm>

#include "runtime/backend.h"

namespace serval::cli {

StepCost::StepCost(const ModelConfig& c, const std::string& device, int64_t matrix_bytes,
                   int64_t kv_bytes_per_token) {
  const double H = double(c.hidden_size), Q = double(c.q_dim()), KV = double(c.kv_dim());
  const double layer = H * (Q + 2 * KV) + Q * H + 3 * H * double(c.intermediate_size);
  lm_head_params_ = double(c.vocab_size) * H;
  matrix_params_ = layer * double(c.num_layers) + lm_head_params_;
  const double elem = is_cuda_device(device) ? 2.0 : 4.0;
  weight_bytes_ = matrix_bytes > 0 ? double(matrix_bytes) : elem * matrix_params_;
  kv_bytes_per_token_ = kv_bytes_per_token > 0 ? double(kv_bytes_per_token)
                                               : 2.0 * elem * double(c.num_layers) * KV;  // K and V of every layer
  // q.k and p.v: 2 FLOPs per multiply-add, head_dim of each query head, twice.
  attn_flops_per_pair_ = 4.0 * double(c.num_layers) * Q;
}

double StepCost::attention_flops(int64_t n_new, int64_t context_len) const {
  const double n = double(n_new), before = double(context_len - n_new);
  return attn_flops_per_pair_ * (n * before + n * (n + 1) / 2.0);
}

double StepCost::matmul_flops(int64_t tokens, int64_t logits_rows) const {
  return 2.0 * (matrix_params_ - lm_head_params_) * double(tokens) + 2.0 * lm_head_params_ * double(logits_rows);
}

double StepCost::op_limit_s(const Limits& l, double matmul_flops, double kv_bytes, double attention_flops) const {
  return std::max(l.seconds_for_bytes(weight_bytes_), l.seconds_for_flops(matmul_flops)) +
         std::max(l.seconds_for_bytes(kv_bytes), l.seconds_for_flops(attention_flops));
}

}  // namespace serval::cli
