#pragma once
// The GPU sampler's draws (cuda_sampling_kernels.cu), once the selections are
// done: over selector a's sorted candidate list in shared memory (top-k,
// top-p and min-p each keep a prefix of the CPU's order there), or over the
// row with the thresholds the radix passes found. Also selector b's list.
#include "backend/cuda/cuda_sampling_row.cuh"

namespace serval::cuda::sampling {

// ---- selector a's list: top-k, top-p, min-p and the draw over the candidates

// Thread t owns entries [t * kListPerThread, ...) of the sorted list.
__device__ inline void resolve_list_a(Shared& sh, const Row& r) {
  uint64_t* list = sh.a_mem.list;
  const int n_list = sh.a.list_count;
  if (n_list > kListA) {  // cannot happen: the count was known before collecting
    if (threadIdx.x == 0) sh.status = kInternal;
    return;
  }
  sort_descending(list, n_list);
  const int lo = threadIdx.x * kListPerThread;
  auto key_at = [&](int j) { return composite_key(list[j]); };
  // top-k: the entries with a key >= the k-th's (ties kept).
  int n = n_list;
  if (sh.a_stage == kStageTopK) {
    const uint32_t kth = key_at(r.t.top_k - 1);
    uint32_t c = 0u;
    for (int j = lo; j < lo + kListPerThread && j < n_list; ++j) c += key_at(j) >= kth ? 1u : 0u;
    n = int(block_reduce(c, [](uint32_t p, uint32_t q) { return p + q; }, sh.red_u));
  }
  const int n_k = n;
  float w[kListPerThread];
  double local = 0.0;
#pragma unroll
  for (int i = 0; i < kListPerThread; ++i) {
    const int j = lo + i;
    w[i] = j < n_k ? r.weight(key_value(key_at(j))) : 0.0f;
    local += double(w[i]);
  }
  const Scan<double> sc = block_scan(local, sh.scan_d);
  // top-p: kept while the mass before an entry is below the target.
  if (r.topp) {
    const double target = sh.a_stage == kStageTopK ? double(r.t.top_p) * sc.total : sh.a.target;
    int last = -1;
    double run = sc.excl;
#pragma unroll
    for (int i = 0; i < kListPerThread; ++i) {
      if (lo + i < n_k && run < target) last = lo + i;
      run += double(w[i]);
    }
    n = min(n, 1 + block_reduce(last, [](int p, int q) { return max(p, q); }, sh.red_i));
  }
  if (r.minp) {
    const float min_logit = r.min_logit();
    uint32_t c = 0u;
    for (int j = lo; j < lo + kListPerThread && j < n_k; ++j) c += key_value(key_at(j)) >= min_logit ? 1u : 0u;
    n = min(n, int(block_reduce(c, [](uint32_t p, uint32_t q) { return p + q; }, sh.red_u)));
  }
  // The draw over the first n entries (all filters keep a prefix of the order).
  double run = sc.excl;
  int last_positive = -1;
#pragma unroll
  for (int i = 0; i < kListPerThread; ++i) {
    const int j = lo + i;
    if (j < n) {
      run += double(w[i]);
      if (w[i] > 0.0f) last_positive = j;
      if (j == n - 1) sh.draw_total = run;
    }
  }
  if (last_positive >= 0) atomicMax(&sh.last_positive, last_positive);
  __syncthreads();
  const double target = r.t.uniform * sh.draw_total;
  run = sc.excl;
#pragma unroll
  for (int i = 0; i < kListPerThread; ++i) {
    const int j = lo + i;
    if (j >= n) break;
    run += double(w[i]);
    if (w[i] > 0.0f && run > target) {
      atomicMin(&sh.pick, j);
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int chosen = sh.pick != INT_MAX ? sh.pick : sh.last_positive;  // rounding: the last with weight
    sh.token = chosen >= 0 ? composite_id(list[chosen]) : -1;
    if (chosen < 0) sh.status = kInternal;
    sh.a.mode = kIdle;
  }
}

// Selector b's list: the top n and, later, the chosen token's rank.
__device__ inline void resolve_list_b(Shared& sh, const Row& r) {
  const int n_list = sh.b.list_count;
  if (n_list > kListB) {
    if (threadIdx.x == 0) sh.status = kInternal;
    return;
  }
  sort_descending(sh.b_mem.list, n_list);
  if (threadIdx.x == 0) {
    const int n = r.t.top_n;  // <= n_list: the list holds at least max(n, 1) tokens
    for (int i = 0; i < n; ++i) sh.top[i] = sh.b_mem.list[i];
    sh.top_count = n;
    sh.b_list_len = n_list;
    sh.b_floor = uint32_t(sh.b.prefix);
    sh.b.mode = kIdle;
  }
}

// The draw over the row, with the thresholds the radix passes found: each
// thread sums the weights of the tokens it kept, a block scan finds the thread
// whose interval holds u * total, and that thread's warp walks its groups.
// Returns the token, or -1 if no token has weight (cannot happen: the max
// always stays).
__device__ inline int32_t threshold_draw(Shared& sh, const Row& r) {
  const uint32_t topk_key = sh.topk_key;
  const uint64_t topp_min = sh.topp_min;
  const float min_logit = r.min_logit();
  const int64_t vocab = r.raw.vocab;
  auto group_weights = [&](int64_t g, const float (&x)[4], float (&w)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t id = 4 * g + k;
      const float y = r.scaled(x[k]);
      bool keep = id < vocab && !(r.minp && !(y >= min_logit));
      if (r.topp) keep = keep && composite(order_key(y), id) >= topp_min;
      else if (r.topk) keep = keep && order_key(y) >= topk_key;
      w[k] = keep ? r.weight(y) : 0.0f;
    }
    return ((w[0] + w[1]) + w[2]) + w[3];
  };

  double mine = 0.0;
  for_each_group(r.src, [&](int64_t g, const float (&x)[4]) {
    float w[4];
    mine += double(group_weights(g, x, w));
  });
  const Scan<double> sc = block_scan(mine, sh.scan_d);
  const double target = r.t.uniform * sc.total;
  // Scan rounding can give a thread without weight a sliver of an interval:
  // only threads with weight may own the draw.
  if (mine > 0.0 && sc.excl <= target && target < sc.incl) {
    sh.draw_thread = int32_t(threadIdx.x);
    sh.draw_local = target - sc.excl;
  }
  if (mine > 0.0) atomicMax(&sh.last_positive, int32_t(threadIdx.x));
  __syncthreads();
  int32_t owner = sh.draw_thread;
  double local = sh.draw_local;
  if (owner < 0) {  // rounding: u * total fell in no weighted interval; the last token with weight
    owner = sh.last_positive;
    local = CUDART_INF;
  }
  if (owner < 0) return -1;

  // The owner's warp walks the owner's groups, 32 at a time, in its order.
  if ((threadIdx.x >> 5) == (uint32_t(owner) >> 5)) {
    const int lane = threadIdx.x & 31;
    const int64_t step = blockDim.x;
    const int64_t groups = owner < r.src.groups ? (r.src.groups - 1 - owner) / step + 1 : 0;
    double carry = 0.0;
    int32_t chosen = -1, last_positive = -1;
    for (int64_t j0 = 0; j0 < groups; j0 += 32) {
      const int64_t j = j0 + lane, g = owner + j * step;
      float w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float f = 0.0f;
      if (j < groups) {
        float x[4];
        r.src.load(g, x);
        f = group_weights(g, x, w);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (w[k] > 0.0f) last_positive = int32_t(4 * g + k);
      }
      const double incl = warp_inclusive_sum(double(f)) + carry;
      double excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane == 0) excl = carry;
      const unsigned hit = __ballot_sync(0xffffffffu, f > 0.0f && incl > local);
      if (hit != 0u) {
        const int h = __ffs(hit) - 1;
        int32_t pick = -1;
        if (lane == h) {
          double run = excl;
          for (int k = 0; k < 4 && pick < 0; ++k) {
            if (w[k] > 0.0f) {
              run += double(w[k]);
              if (run > local) pick = int32_t(4 * g + k);
            }
          }
          if (pick < 0) pick = last_positive;  // rounding: the group's last token with weight
        }
        chosen = __shfl_sync(0xffffffffu, pick, h);
        break;
      }
      carry = __shfl_sync(0xffffffffu, incl, 31);
    }
    if (chosen < 0) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) last_positive = max(last_positive, __shfl_xor_sync(0xffffffffu, last_positive, o));
      chosen = last_positive;
    }
    if (lane == 0) sh.token = chosen;
  }
  __syncthreads();
  return sh.token;
}

}  // namespace serval::cuda::sampling
