#pragma once
// What the packed GEMV's two kernels share (cuda_gemv_packed.cu: bf16 x
// through mma; cuda_gemv_packed_dp4a.cu: int8 x through dp4a): the operands,
// the packed forms (backend/gpu_block_pack.h) as compile-time parameters, the
// per-form k-step, and the streamed loads of the scales.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_gemv_unit.cuh"
#include "backend/gpu_block_pack.h"

namespace serval::cuda {

// The operands: x, outputs and units as the bf16 GEMV's (MatmulSegments,
// whose w it leaves unused), the packed weights per segment (gated: gate and
// up, one segment), all of one form and width.
struct PackedGemvParams {
  MatmulSegments seg;
  const uint8_t* quants[3];
  const uint16_t* scales[3];  // f16 group scales; row-scale forms: f32 per row
  int64_t row_bytes;
  int steps;                // k-steps per row
  const uint16_t* mins[3];  // forms with mins
};

// The packed forms, one set of kernels each. Q4 (group 32, no mins) is Q4_0
// and symmetric int4 g32; Q4Min: Q4_1, Q4_K, asymmetric int4 g32; G64/G128:
// int4 of those groups; Q8: Q8_0; Q8Min: Q5_K; Q8Row: int8 per channel.
enum PackedForm : int {
  kFormQ4,
  kFormQ4Min,
  kFormQ4G64,
  kFormQ4G64Min,
  kFormQ4G128,
  kFormQ4G128Min,
  kFormQ8,
  kFormQ8Min,
  kFormQ8Row,
};
int packed_form(const GpuBlockPack& pack);  // throws for a pack of no form

template <int kForm>
struct Form {
  static constexpr int kBits = kForm >= kFormQ8 ? 8 : 4;
  static constexpr int kGroup = kForm == kFormQ4G64 || kForm == kFormQ4G64Min     ? 64
                                : kForm == kFormQ4G128 || kForm == kFormQ4G128Min ? 128
                                                                                  : 32;
  static constexpr bool kMins = kForm == kFormQ4Min || kForm == kFormQ4G64Min || kForm == kFormQ4G128Min ||
                                kForm == kFormQ8Min;
  static constexpr bool kRowScale = kForm == kFormQ8Row;
};

// A k-step of a lane's 16-byte chunk: its groups of 32 columns (the layout's
// words), its scale groups, and the f16 scales (and mins) a lane loads with
// it (pairs of rows, one per scale group; none for row scales).
template <int kForm>
struct PackedStep {
  using F = Form<kForm>;
  static constexpr int kGroups = F::kBits == 4 ? 4 : 2;  // groups of 32 columns per k-step
  static constexpr int kCols = 32 * kGroups;
  static constexpr int kSubs = F::kGroup / 32;           // groups of 32 columns per scale
  static constexpr int kScaleGroups = kGroups / kSubs;   // scales per row per k-step
  using Scales = std::conditional_t<kScaleGroups == 4, uint4, std::conditional_t<kScaleGroups == 2, uint2, uint32_t>>;
};

// 8 bytes of scales, streamed as load_weight streams W (cuda_gemv_unit.cuh).
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
// 4 bytes of scales (int4 g128: one pair of rows a k-step).
__device__ __forceinline__ uint32_t load_stream4(const void* p, bool ok, uint64_t policy) {
  uint32_t v;
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %1, 0;\n\t"
      "mov.b32 %0, 0;\n\t"
      "@p ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%2], %3;\n\t}"
      : "=r"(v)
      : "r"(int(ok)), "l"(p), "l"(policy));
  return v;
}

template <int kForm>
__device__ __forceinline__ typename PackedStep<kForm>::Scales load_scales(const uint16_t* p, bool ok,
                                                                          uint64_t policy) {
  constexpr int n = PackedStep<kForm>::kScaleGroups;
  if constexpr (n == 4)
    return gemv_unit::load_weight(p, ok, policy);
  else if constexpr (n == 2)
    return load_stream8(p, ok, policy);
  else
    return load_stream4(p, ok, policy);
}

// Scale group j's word (an f16 pair) of what load_scales loaded.
__device__ __forceinline__ uint32_t scale_word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t scale_word(const uint2& v, int j) { return j == 0 ? v.x : v.y; }
__device__ __forceinline__ uint32_t scale_word(uint32_t v, int) { return v; }

// The dp4a kernel (1 or 2 rows of x; cuda_gemv_packed_dp4a.cu).
constexpr int kDp4aMaxTokens = 2;
// Bytes of shared memory it needs for x of `tokens` rows of `padded_cols`.
inline int64_t dp4a_x_bytes(int tokens, int64_t padded_cols) { return int64_t(tokens) * padded_cols * 2; }
constexpr int64_t kDp4aMaxSmem = 160 * 1024;
template <int kForm, typename Out, bool kGated, bool kRope>
void launch_packed_dp4a(const PackedGemvParams& P, int64_t padded_cols, const GemvRopeKv& r, const Launch& on);

}  // namespace serval::cuda
