#pragma once
// What the packed GEMV's two kernels share (cuda_gemv_packed.cu: bf16 x
// through mma; cuda_gemv_packed_dp4a.cu: int8 x through dp4a): the operands,
// the per-format k-step, and the streamed loads of the scales.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_gemv_unit.cuh"

namespace serval::cuda {

// The operands: x, outputs and units as the bf16 GEMV's (MatmulSegments,
// whose w it leaves unused), the packed weights per segment (gated: gate and
// up, one segment), all of one format and width.
struct PackedGemvParams {
  MatmulSegments seg;
  const uint8_t* quants[3];
  const uint16_t* scales[3];
  int64_t row_bytes;
  int steps;  // k-steps per row
};

// A k-step of a lane's 16-byte chunk: its groups of 32 columns (one GGUF
// block each), and the f16 scales a lane loads with it (pairs of rows).
template <int kBits>
struct PackedStep {
  static constexpr int kGroups = kBits == 4 ? 4 : 2;  // groups (of 32 columns) per k-step
  static constexpr int kCols = 32 * kGroups;
  using Scales = std::conditional_t<kBits == 4, uint4, uint2>;
};

// 8 bytes of Q8_0 scales, streamed as load_weight streams W (cuda_gemv_unit.cuh).
__device__ __forceinline__ uint2 load_stream8(const void* p, bool ok, uint64_t policy) {
  uint2 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "@p ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%3], %4;\n\t}"
      : "=r"(v.x), "=r"(v.y)
      : "r"(int(ok)), "l"(p), "l"(policy));
  return v;
}

template <int kBits>
__device__ __forceinline__ typename PackedStep<kBits>::Scales load_scales(const uint16_t* p, bool ok,
                                                                         uint64_t policy) {
  if constexpr (kBits == 4)
    return gemv_unit::load_weight(p, ok, policy);
  else
    return load_stream8(p, ok, policy);
}

// The dp4a kernel (1 or 2 rows of x; cuda_gemv_packed_dp4a.cu).
constexpr int kDp4aMaxTokens = 2;
// Bytes of shared memory it needs for x of `tokens` rows of `padded_cols`.
inline int64_t dp4a_x_bytes(int tokens, int64_t padded_cols) { return int64_t(tokens) * padded_cols * 2; }
constexpr int64_t kDp4aMaxSmem = 160 * 1024;
template <int kBits, typename Out, bool kGated, bool kRope>
void launch_packed_dp4a(const PackedGemvParams& P, int64_t padded_cols, const GemvRopeKv& r, const Launch& on);

}  // namespace serval::cuda
