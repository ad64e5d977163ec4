#pragma once
// Radix selection over composite keys for the GPU sampler: the state of one
// selection and the block-wide step that resolves a digit from its histogram.
// A selection either
//   counts: finds the token of a given rank (k-th largest), or
//   weighs: finds the last token, in the CPU's order, whose preceding mass is
//           below a target (top-p);
// one digit per pass over the row. After the first digit it may instead
// collect every token at or above the boundary bin into a shared-memory list
// (when few enough) and finish there (cuda_sampling_kernels.cu).
#include <climits>

#include "backend/cuda/cuda_sampling_block.cuh"

namespace serval::cuda::sampling {

enum Mode : int32_t { kIdle = 0, kCount = 1, kMass = 2, kCollect = 3 };

struct Selector {
  uint64_t prefix;             // the composite's digits resolved so far
  double above;                // mass mode: mass ranked before the prefix's tokens
  double target;               // mass mode: top_p * total mass
  double found_above_mass;     // resolve results, written by the thread owning the bin
  int32_t digit;               // next digit to resolve
  int32_t mode;                // Mode
  uint32_t rank;               // count mode: wanted rank (1: largest) among the prefix's tokens
  uint32_t matched;            // tokens matching the prefix
  int32_t found_bin;
  int32_t min_bin;             // mass mode: atomicMin scratch
  uint32_t found_count;        // tokens in the bin found
  uint32_t found_above_count;  // tokens of the prefix ranked above that bin
  int32_t list_count;          // collect mode: tokens appended so far
};

__device__ inline Selector idle_selector() {
  Selector s{};
  s.mode = kIdle;
  s.found_bin = -1;
  s.min_bin = INT_MAX;
  return s;
}

// Each thread owns `per` consecutive bins, thread 0 the highest, so the
// exclusive scan over threads counts what ranks above a thread's bins. The
// histogram is zeroed for the next pass.
__device__ inline void resolve_count(Selector& s, uint32_t* count, uint32_t* scan) {
  const int nb = 1 << digit_width(s.digit), per = nb / blockDim.x, top = nb - 1 - threadIdx.x * per;
  uint32_t local = 0u;
  for (int i = 0; i < per; ++i) local += count[top - i];
  const Scan<uint32_t> sc = block_scan(local, scan);
  const uint32_t rank = s.rank;
  uint32_t above = sc.excl;
  for (int i = 0; i < per; ++i) {
    const int bin = top - i;
    const uint32_t c = count[bin];
    count[bin] = 0u;
    if (c > 0u && above < rank && rank <= above + c) {  // exactly one bin
      s.found_bin = bin;
      s.found_count = c;
      s.found_above_count = above;
    }
    above += c;
  }
  __syncthreads();
}

// The lowest bin with mass whose preceding mass is below the target holds the
// last kept token (preceding mass only grows towards lower bins). At digit 0
// the target is top_p times the total.
__device__ inline void resolve_mass(Selector& s, uint32_t* count, float* mass, double* scan_d, uint32_t* scan_u,
                                    float top_p) {
  const int d = s.digit;
  const int nb = 1 << digit_width(d), per = nb / blockDim.x, top = nb - 1 - threadIdx.x * per;
  double local = 0.0;
  uint32_t local_count = 0u;
  for (int i = 0; i < per; ++i) {
    local += double(mass[top - i]);
    local_count += count[top - i];
  }
  const Scan<double> sc = block_scan(local, scan_d);
  const Scan<uint32_t> scc = block_scan(local_count, scan_u);
  const double target = d == 0 ? double(top_p) * sc.total : s.target;
  double above = s.above + sc.excl;
  uint32_t above_count = scc.excl;
  int best = -1;
  uint32_t best_count = 0u, best_above_count = 0u;
  double best_above = 0.0;
  for (int i = 0; i < per; ++i) {
    const int bin = top - i;
    const float m = mass[bin];
    const uint32_t c = count[bin];
    mass[bin] = 0.0f;
    count[bin] = 0u;
    if (m > 0.0f && above < target) {
      best = bin;
      best_count = c;
      best_above = above;
      best_above_count = above_count;
    }
    above += double(m);
    above_count += c;
  }
  if (best >= 0) atomicMin(&s.min_bin, best);
  __syncthreads();
  if (best >= 0 && best == s.min_bin) {
    s.found_bin = best;
    s.found_count = best_count;
    s.found_above_mass = best_above;
    s.found_above_count = best_above_count;
  }
  if (threadIdx.x == 0 && d == 0) s.target = target;
  __syncthreads();
}

// Thread 0, after a resolve: moves past the digit just resolved.
__device__ inline void advance(Selector& s) {
  s.prefix = (s.prefix << digit_width(s.digit)) | uint64_t(uint32_t(s.found_bin));
  s.digit += 1;
  s.matched = s.found_count;
  if (s.mode == kCount) s.rank -= s.found_above_count;
  else s.above = s.found_above_mass;
  s.found_bin = -1;
  s.min_bin = INT_MAX;
}

}  // namespace serval::cuda::sampling
