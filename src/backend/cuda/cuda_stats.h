#pragma once
// Counters of the CUDA backend that tests read through the Backend interface,
// and setters of its CudaTuning for tests of the paths it selects (plain
// C++: no CUDA headers needed to include this).
#include <cstdint>

#include "runtime/backend.h"
#include "runtime/cuda_tuning.h"

namespace serval::cuda {

// cuBLASLt launches that computed several weights as one strided batch
// (matmul_multi); `be` must be the CUDA backend.
int64_t batched_gemm_calls(const Backend& be);
// q/k/v projections computed as one GEMM of their stacked weights
// (qkv_rope_kv_write, 17..256 rows); `be` must be the CUDA backend.
int64_t stacked_qkv_calls(const Backend& be);
// Norms left to the GEMV after their projection (matmul_add_rmsnorm with a
// unit norm weight, up to 16 rows; cuda_norm_fold.cu); `be` must be the CUDA backend.
int64_t elided_norms(const Backend& be);
// Products of packed GGUF block weights (CudaWeight::packed) that the packed
// GEMV computed, and those that dequantized the matrix for one GEMM.
int64_t packed_gemv_calls(const Backend& be);
int64_t dequantized_gemm_calls(const Backend& be);
// Matmul shapes whose algorithm the wide search chose (--gemm-search,
// Backend::set_gemm_search); `be` must be the CUDA backend.
int64_t gemm_searches(const Backend& be);
// Products whose configuration came from the search's cache file instead.
int64_t gemm_search_cache_hits(const Backend& be);
// Sends the bf16 products of 17..64 rows to CUTLASS's decode GEMM (on) or to
// cuBLASLt (off): CudaTuning::cutlass_gemm. Returns false if this build has
// no CUTLASS (then none go). `be` must be the CUDA backend.
bool use_cutlass_gemm(Backend& be, bool on);
// Products that CUTLASS's decode GEMM computed.
int64_t cutlass_gemm_calls(const Backend& be);
// Whether CUTLASS's q/k/v product rotates q and k and writes the KV cache in
// its epilogue: at all of its rows (on), or at none (off)
// (CudaTuning::cutlass_rope_rows; by default the 32-row tile's 17..32).
void use_cutlass_rope_epilogue(Backend& be, bool on);
// CUTLASS products that finished their outputs in the epilogue (the q/k/v
// product's rope, an interleaved gate/up pair's silu * up).
int64_t cutlass_epilogue_calls(const Backend& be);
// Whether upload_gated_pair interleaves gate and up (cuda_gate_up_layout.cuh)
// for the weights it uploads from now on (CudaTuning::gate_up_interleaved).
void use_interleaved_gate_up(Backend& be, bool on);
// Which kernel serves decode rows (CudaTuning::attn_stream): the stream
// kernel for long contexts (BatchView::mean_context_len >= kLongDecodeContext)
// in batches whose items fill the GPU (kAuto), never (kOff), or wherever it
// can (kAlways); and how many launches it served.
using AttentionStream = CudaTuning::AttnStream;
void use_attention_stream(Backend& be, AttentionStream mode);
int64_t stream_attention_calls(const Backend& be);
// Rope and the KV write inside the split decode kernel (qkv_attention, a step
// of decodes from 17 rows): wherever it fits (on), or nowhere (off), where
// by default only at CUTLASS's rows past its rope epilogue's
// (CudaTuning::rope_in_attn); and how many launches did it.
void use_rope_in_attention(Backend& be, bool on);
int64_t rope_folded_attention_calls(const Backend& be);

}  // namespace serval::cuda
