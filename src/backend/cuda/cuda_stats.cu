// cuda_stats.h: the CUDA backend's counters and tuning setters, read from its parts.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_stats.h"

namespace serval::cuda {

int64_t batched_gemm_calls(const Backend& be) {
  return cuda_backend_of(be, "batched_gemm_calls").matmuls().lt().batched_calls();
}

int64_t stacked_qkv_calls(const Backend& be) {
  return cuda_backend_of(be, "stacked_qkv_calls").matmuls().stacked_qkv_calls();
}

int64_t elided_norms(const Backend& be) { return cuda_backend_of(be, "elided_norms").matmuls().elided_norms(); }
int64_t packed_gemv_calls(const Backend& be) {
  return cuda_backend_of(be, "packed_gemv_calls").matmuls().packed_gemv_calls();
}
int64_t dequantized_gemm_calls(const Backend& be) {
  return cuda_backend_of(be, "dequantized_gemm_calls").matmuls().dequantized_gemm_calls();
}

int64_t gemm_searches(const Backend& be) { return cuda_backend_of(be, "gemm_searches").matmuls().lt().searches(); }

int64_t gemm_search_cache_hits(const Backend& be) {
  return cuda_backend_of(be, "gemm_search_cache_hits").matmuls().lt().search_cache_hits();
}

bool use_cutlass_gemm(Backend& be, bool on) {
  cuda_backend_of(be, "use_cutlass_gemm").tuning().cutlass_gemm = on && cutlass_gemm_built();
  return cutlass_gemm_built();
}

int64_t cutlass_gemm_calls(const Backend& be) {
  return cuda_backend_of(be, "cutlass_gemm_calls").matmuls().cutlass_gemm_calls();
}

void use_cutlass_rope_epilogue(Backend& be, bool on) {
  cuda_backend_of(be, "use_cutlass_rope_epilogue").tuning().cutlass_rope_rows = on ? int(kCutlassMaxRows) : 0;
}

int64_t cutlass_epilogue_calls(const Backend& be) {
  return cuda_backend_of(be, "cutlass_epilogue_calls").matmuls().cutlass_epilogue_calls();
}

void use_interleaved_gate_up(Backend& be, bool on) {
  cuda_backend_of(be, "use_interleaved_gate_up").tuning().gate_up_interleaved = on;
}

void use_attention_stream(Backend& be, AttentionStream mode) {
  cuda_backend_of(be, "use_attention_stream").tuning().attn_stream = mode;
}

int64_t stream_attention_calls(const Backend& be) {
  return cuda_backend_of(be, "stream_attention_calls").attention().stream_calls();
}

void use_rope_in_attention(Backend& be, bool on) {
  cuda_backend_of(be, "use_rope_in_attention").tuning().rope_in_attn =
      on ? CudaTuning::RopeInAttn::kOn : CudaTuning::RopeInAttn::kOff;
}

int64_t rope_folded_attention_calls(const Backend& be) {
  return cuda_backend_of(be, "rope_folded_attention_calls").attention().rope_folded_calls();
}

}  // namespace serval::cuda
