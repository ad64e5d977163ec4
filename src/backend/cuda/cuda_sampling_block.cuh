#pragma once
// Device building blocks of the GPU sampler: order-preserving keys of floats,
// the composite (key, id) keys that rank tokens exactly as the CPU sorts them,
// a row reader, and block-wide reductions and scans. One thread block works on
// one row; every function here that synchronizes must be called by the whole
// block.
#include <math_constants.h>

#include <cstdint>

#include "backend/cuda/cuda_sampling.cuh"

namespace serval::cuda::sampling {

// key(a) > key(b) iff a > b, for floats that are not NaN; -0 and +0 share a key
// (they compare equal, so they must tie).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Composite key: the logit's key above the id reversed, so composites are
// unique and a larger composite means a larger logit, or the same logit and
// a lower id: the CPU's order (descending, lower id first on ties).
constexpr uint32_t kIdMask = (1u << kIdBits) - 1;

__device__ __forceinline__ uint64_t composite(uint32_t key, int64_t id) {
  return (uint64_t(key) << kIdBits) | uint64_t(kIdMask - uint32_t(id));
}
__device__ __forceinline__ int32_t composite_id(uint64_t c) { return int32_t(kIdMask - uint32_t(c & kIdMask)); }
__device__ __forceinline__ uint32_t composite_key(uint64_t c) { return uint32_t(c >> kIdBits); }

// Radix digits of a composite, most significant first: three over the key
// (bits 52..21), two over the id (bits 20..0). Up to 2048 bins.
constexpr int kNumDigits = 5;
constexpr int kKeyDigits = 3;
constexpr int kMaxBins = 2048;
__device__ __forceinline__ int digit_shift(int d) { return d == 0 ? 42 : d == 1 ? 31 : d == 2 ? 21 : d == 3 ? 10 : 0; }
__device__ __forceinline__ int digit_width(int d) { return (d == 0 || d == 1 || d == 3) ? 11 : 10; }

// A row of `vocab` floats read in groups of 4 consecutive ids (one 16-byte
// load when the row is aligned); ids past the end read -inf.
struct RowReader {
  const float* p;
  int64_t vocab;
  int64_t groups;
  bool vec;

  __device__ RowReader(const float* row, int64_t n)
      : p(row), vocab(n), groups((n + 3) / 4), vec((reinterpret_cast<uintptr_t>(row) & 15) == 0) {}

  __device__ __forceinline__ void load(int64_t g, float (&x)[4]) const {
    const int64_t i = 4 * g;
    if (vec && i + 4 <= vocab) {
      const float4 f = *reinterpret_cast<const float4*>(p + i);
      x[0] = f.x;
      x[1] = f.y;
      x[2] = f.z;
      x[3] = f.w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) x[k] = i + k < vocab ? p[i + k] : -CUDART_INF_F;
    }
  }
};

// Calls f(g, x) for the groups g = threadIdx.x + j * blockDim.x, j = 0, 1, ...
// in that order (the draw relies on it), two loads in flight at a time.
template <typename F>
__device__ __forceinline__ void for_each_group(const RowReader& r, F&& f) {
  const int64_t step = blockDim.x;
  int64_t g = threadIdx.x;
  for (; g + step < r.groups; g += 2 * step) {
    float a[4], b[4];
    r.load(g, a);
    r.load(g + step, b);
    f(g, a);
    f(g + step, b);
  }
  if (g < r.groups) {
    float a[4];
    r.load(g, a);
    f(g, a);
  }
}

// Reduction over the block with a commutative, associative `op`; every thread
// gets the same value (combined in the same order). `scratch` holds 32 values.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
  return v;
}

// Largest value, lowest id among equal values (NaN never wins).
struct ArgMax {
  float value;
  int32_t id;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.id < a.id)) ? b : a;
}
__device__ __forceinline__ ArgMax block_argmax(ArgMax v, float* sv, int32_t* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = better(v, ArgMax{__shfl_xor_sync(0xffffffffu, v.value, o), __shfl_xor_sync(0xffffffffu, v.id, o)});
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v.value;
    si[warp] = v.id;
  }
  __syncthreads();
  v = ArgMax{sv[0], si[0]};
  for (int w = 1; w < warps; ++w) v = better(v, ArgMax{sv[w], si[w]});
  return v;
}

// Exclusive and inclusive prefix sums over threads (in thread order) and the
// total. The intervals [excl, incl) of consecutive threads touch exactly
// (excl of thread t+1 is bitwise incl of thread t), so a value in [0, total)
// falls in exactly one of them; for floats, rounding may give a thread whose
// value is 0 a sliver of an interval. `off` holds 33 values.
template <typename T>
struct Scan {
  T excl, incl, total;
};
template <typename T>
__device__ __forceinline__ Scan<T> block_scan(T v, T* off) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  T incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  T excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = T(0);
  __syncthreads();  // off may still be read by a previous call
  if (lane == 31) off[warp + 1] = incl;
  __syncthreads();
  if (threadIdx.x == 0) {
    // Serially, so that off[w + 1] is exactly off[w] + (warp w's total).
    off[0] = T(0);
    for (int w = 0; w < warps; ++w) off[w + 1] = off[w] + off[w + 1];
  }
  __syncthreads();
  const T base = off[warp];
  return Scan<T>{base + excl, base + incl, off[warps]};
}

// Sorts a[0, n) in descending order in place (bitonic network over the next
// power of two, padded with zeros: composites are never 0). `a` must have room
// for that power of two.
__device__ __forceinline__ void sort_descending(uint64_t* a, int n) {
  int size = 2;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += blockDim.x) a[i] = 0u;
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const uint64_t x = a[i], y = a[l];
          if ((i & k) == 0 ? x < y : x > y) {  // descending runs where bit k of i is 0
            a[i] = y;
            a[l] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Inclusive prefix sum over the lanes of one warp.
__device__ __forceinline__ double warp_inclusive_sum(double v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

}  // namespace serval::cuda::sampling
