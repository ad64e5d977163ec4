#pragma once
// What one forward step must move and compute, for serval bench's rooflines:
// bytes (every weight matrix, the LM head included, plus the K/V attention
// reads) over the memory bandwidth, FLOPs over the bf16 peak. The embedding
// table is not counted: a step reads only T of its rows.
#include <cstdint>
#include <string>

#include "model/model_config.h"

namespace serval::cli {

// The physical limits every figure is compared with (issue 5's H200 by default).
struct Limits {
  double bandwidth_gbs = 4261;  // copy bandwidth
  double peak_tflops = 736;     // bf16 dense matmul

  double seconds_for_bytes(double bytes) const { return bytes / (bandwidth_gbs * 1e9); }
  double seconds_for_flops(double flops) const { return flops / (peak_tflops * 1e12); }
};

class StepCost {
 public:
  // `device` "cuda" keeps weights and K/V in bf16; the CPU keeps both in f32.
  // `matrix_bytes`: the runner's (ModelRunner::matrix_bytes), the bytes a step
  // streams in the weights' real format; 0: the device's dtype per parameter.
  // `kv_bytes_per_token`: the pools' (an fp8/int8 cache's 1-byte codes); 0:
  // the device's dtype.
  StepCost(const ModelConfig& config, const std::string& device, int64_t matrix_bytes = 0,
           int64_t kv_bytes_per_token = 0);

  // Parameters of every matrix a step streams, the LM head included.
  double matrix_params() const { return matrix_params_; }
  double weight_bytes() const { return weight_bytes_; }
  double kv_bytes_per_token() const { return kv_bytes_per_token_; }

  // One sequence's share of a step: n_new new tokens ending a context of
  // context_len. Attention reads the whole context once (K and V) and each
  // new token at position p attends to p + 1 keys.
  double kv_read_bytes(int64_t context_len) const { return kv_bytes_per_token_ * double(context_len); }
  double attention_flops(int64_t n_new, int64_t context_len) const;
  // The matmuls of a step of `tokens` tokens of which `logits_rows` go
  // through the LM head.
  double matmul_flops(int64_t tokens, int64_t logits_rows) const;

  // A decode step of `batch` sequences, each at context `context_len`.
  double decode_bytes(int64_t batch, int64_t context_len) const {
    return weight_bytes_ + double(batch) * kv_read_bytes(context_len);
  }
  double decode_flops(int64_t batch, int64_t context_len) const {
    return matmul_flops(batch, batch) + double(batch) * attention_flops(1, context_len);
  }

  // A step's floor when its ops run one after another, as Serval's do: the
  // matmuls take max(weight bytes / bandwidth, matmul FLOPs / peak), then
  // attention max(K/V bytes / bandwidth, attention FLOPs / peak). At a few
  // hundred tokens the matmuls are bound by FLOPs while attention is bound by
  // bytes, so this is tighter than the whole step's max(bytes, FLOPs), which
  // only an engine overlapping attention with the matmuls could approach.
  double op_limit_s(const Limits& l, double matmul_flops, double kv_bytes, double attention_flops) const;
  double decode_op_limit_s(const Limits& l, int64_t batch, int64_t context_len) const {
    return op_limit_s(l, matmul_flops(batch, batch), double(batch) * kv_read_bytes(context_len),
                      double(batch) * attention_flops(1, context_len));
  }

 private:
  double matrix_params_ = 0, lm_head_params_ = 0, weight_bytes_ = 0, kv_bytes_per_token_ = 0;
  double attn_flops_per_pair_ = 0;  // one query token against one key, every layer
};

}  // namespace serval::cli
