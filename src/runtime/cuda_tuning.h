#pragma once
// The CUDA backend's tuning knobs: which kernels and fusions its ops choose.
// The defaults are what measured fastest (docs/CUDA_TUNING.md says what each
// key does and when to change it); the others are there for A/B benchmarks
// and for tests of the paths they select. Set from one flag, --cuda-tuning
// key=value,... (parse_cuda_tuning), carried by RunnerOptions::cuda_tuning and
// handed to the backend when it is made (create_backend). Plain C++: the CLI
// and the runtime include it in builds without CUDA too.
#include <string>
#include <string_view>

namespace serval {

struct CudaTuning {
  // Decode attention's stream kernel (long contexts in batches that fill
  // the GPU): where it is expected to win, never, or wherever it can.
  enum class AttnStream { kAuto, kOff, kAlways };
  // Rope and the KV write inside the split decode attention kernel: at
  // CUTLASS's rows past its rope epilogue's (auto), wherever it fits, or never.
  enum class RopeInAttn { kAuto, kOn, kOff };
  // Quantized matrices at their size on the GPU (packed_blocks below).
  enum class PackedBlocks { kAuto, kOn, kOff };

  // Kernels launched as programmatic dependents of the kernel before them
  // (Hopper PDL); off launches them plainly (the results must not change).
  bool pdl = true;
  // bf16 products of 17..64 rows on CUTLASS's decode GEMM (where the build
  // has CUTLASS); off: cuBLASLt.
  bool cutlass_gemm = true;
  // Up to this many rows (0..64) the q/k/v product takes rope and the KV
  // write in CUTLASS's epilogue; 0: never.
  int cutlass_rope_rows = 32;
  // 33..64 rows: the swapped CUTLASS kernel (x as A, W tiles sized to the
  // SMs' waves); off: the 48- and 64-row x tiles.
  bool cutlass_swap = true;
  // The same for the gate/up pair with silu * up in its epilogue.
  bool cutlass_swap_gated = true;
  // 17..32 rows: two CUTLASS CTAs per SM, each with half an SM's stages.
  bool cutlass_two_ctas = true;
  // k blocks (of 128) of its W rows each CUTLASS CTA asks L2 for before it
  // waits for the kernel before it (0..64; 0: none).
  int cutlass_w_prefetch = 4;
  // Gate and up uploaded as one interleaved pair (bf16), so that CUTLASS's
  // epilogue computes silu(gate) * up; off: two matrices and a silu kernel.
  bool gate_up_interleaved = true;
  // Up to 16 rows: the q/k/v GEMV rotates and writes K/V in its epilogue.
  bool gemv_rope = true;
  // 17..256 rows: q/k/v as one GEMM of the stacked weights.
  bool stacked_qkv = true;
  // The o and down projections split in k (129..256 rows, and CUTLASS's),
  // summed by the add + RMSNorm kernel.
  bool split_k = true;
  // RMSNorm weights folded into the matrices after them (bf16).
  bool norm_fold = true;
  // Up to 16 rows: the norm between two GEMVs done by those GEMVs (needs norm_fold).
  bool norm_elision = true;
  // Quantized matrices (GGUF Q4_0, Q8_0, Q4_1, Q4_K, Q5_K; int4 g32/64/128;
  // int8 per channel) kept packed at their size for the quantized GEMV (on),
  // dequantized to bf16 at load (off), or packed only where the dequantized
  // weights would take more than half the memory the weights may use (auto:
  // the runner decides, Backend::keep_linear_formats; Q4_0 and Q8_0 only).
  PackedBlocks packed_blocks = PackedBlocks::kAuto;
  // 1 or 2 rows: the packed GEMV quantizes x to int8 per 32 columns and
  // multiplies in integers (dp4a; never in batch-invariant mode); off: bf16
  // x through mma, the exact product (Q4_0 7B on an H100: 490 tok/s on, 341
  // off).
  bool packed_int8_x = true;
  // SMs the GEMV's persistent grid is planned for (0: all of the device's;
  // fewer: a measuring tool for bytes in flight).
  int gemv_sms = 0;
  AttnStream attn_stream = AttnStream::kAuto;
  RopeInAttn rope_in_attn = RopeInAttn::kAuto;
  // A split decode attention block that holds a whole sequence writes the
  // output itself instead of leaving it to the merge.
  bool attn_direct_split = true;
  // From 24 rows, decode attention lets the next kernel launch early.
  bool attn_trigger = true;
  // The GPU sampler counts fed tokens in the penalties, so async scheduling
  // continues penalized rows; off leaves those rows to the scheduler.
  bool fed_penalties = true;

  bool operator==(const CudaTuning&) const = default;
};

// `spec` as "key=value,key=value" over the defaults ("" keeps them all);
// booleans take 1/0, on/off or true/false. Throws serval::Error naming an
// unknown key (with the valid keys listed), a bad value, or an entry that is
// not key=value.
CudaTuning parse_cuda_tuning(std::string_view spec);
// The valid keys, comma-separated.
std::string cuda_tuning_keys();

}  // namespace serval
