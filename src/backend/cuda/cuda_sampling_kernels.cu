// GPU sampling kernels (CudaBackend::sample), one thread block per row.
//
// Plain greedy rows take one pass: a fused max/argmax (lowest id on ties) that
// also flags NaN. The general kernel, for one row:
//   0. penalized rows: copies the row to the work buffer and applies the
//      penalty entries and bans there (the raw row stays for logprobs);
//   1. stats pass: max of the (penalized, scaled) logits, NaN, argmax, the raw
//      log-sum-exp for logprobs, and the first radix digit of the counting
//      selections (top-k, top-n logprobs), which need no max;
//   2. selections (cuda_sampling_select.cuh), without sorting the vocabulary:
//      selector a finds the top-k threshold (k-th largest key, ties kept) and
//      then the top-p cut (by mass, in the CPU's order); selector b finds the
//      top-n logprobs. After their first digit, when the tokens at or above
//      the boundary bin are few, one pass collects them into shared memory and
//      the rest happens there: a bitonic sort gives the CPU's exact order, so
//      top-k, top-p, min-p and the draw (selector a) or the top-n list and the
//      chosen token's rank (selector b) are scans over a short list.
//      Otherwise each further pass resolves one more digit, down to exact
//      thresholds; the draw is then one more pass: each thread sums the
//      weights of the tokens it kept, a block scan finds the thread whose
//      interval holds u * total, and that thread's warp walks its tokens. (The
//      walk order is not the CPU's; the distribution is the same.)
//   3. logprobs: the top-n list and the chosen token's rank (from selector b's
//      list, or one more pass).
#include <atomic>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sampling.cuh"
#include "backend/cuda/cuda_sampling_block.cuh"
#include "backend/cuda/cuda_sampling_draw.cuh"
#include "backend/cuda/cuda_sampling_row.cuh"
#include "backend/cuda/cuda_sampling_select.cuh"

namespace serval::cuda::sampling {
namespace {

constexpr int kGreedyThreads = 512;  // plain greedy kernel

// ---------------------------------------------------------------- greedy

__global__ void __launch_bounds__(kGreedyThreads) greedy_kernel(const Task* tasks, const float* logits, int64_t vocab,
                                                                Result* results, int32_t* tokens) {
  __shared__ float s_value[32];
  __shared__ int32_t s_id[32];
  const RowReader row(logits + int64_t(tasks[blockIdx.x].row) * vocab, vocab);
  ArgMax best{-CUDART_INF_F, INT32_MAX};
  bool nan = false;
  for_each_group(row, [&](int64_t g, const float (&x)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // ids past the end read -inf and never win
      nan |= x[k] != x[k];
      if (x[k] > best.value) best = ArgMax{x[k], int32_t(4 * g + k)};
    }
  });
  best = block_argmax(best, s_value, s_id);
  const bool any_nan = __syncthreads_or(nan) != 0;
  if (threadIdx.x == 0) {
    Result& r = results[blockIdx.x];
    r.status = any_nan                       ? kNan
               : best.value == CUDART_INF_F  ? kPosInf
               : best.value == -CUDART_INF_F ? kAllNegInf
                                             : kOk;
    r.token = best.id;
    r.top_count = 0;
    tokens[tasks[blockIdx.x].spec] = r.status == kOk ? best.id : -1;
  }
}

// ---------------------------------------------------------------- general

__device__ void init_shared(Shared& sh, const Row& r) {
  for (int i = threadIdx.x; i < kMaxBins; i += blockDim.x) {
    sh.a_mem.hist.count[i] = 0u;
    sh.a_mem.hist.mass[i] = 0.0f;
    sh.b_mem.count[i] = 0u;
  }
  if (threadIdx.x == 0) {
    sh.a = idle_selector();
    sh.b = idle_selector();
    sh.a_stage = kStageTopP;
    if (!r.greedy && r.topk) {
      sh.a.mode = kCount;
      sh.a.rank = uint32_t(r.t.top_k);
      sh.a_stage = kStageTopK;
    } else if (!r.greedy && r.topp) {
      sh.a.mode = kMass;
    }
    if (r.logprobs) {  // at least rank 1: its list also gives the chosen token's rank
      sh.b.mode = kCount;
      sh.b.rank = uint32_t(max(r.t.top_n, 1));
    }
    sh.topp_min = 0u;
    sh.topn_min = 0u;
    sh.draw_local = 0.0;
    sh.draw_total = 0.0;
    sh.topk_key = 0u;
    sh.b_floor = 0u;
    sh.b_list_len = 0;
    sh.status = kOk;
    sh.token = -1;
    sh.draw_thread = -1;
    sh.last_positive = -1;
    sh.pick = INT_MAX;
    sh.top_count = 0;
  }
}

// One token's penalties, exactly as PenaltyApplier computes them (the host
// build contracts `x -= freq * count` into one fused multiply-add).
__device__ __forceinline__ float penalized(const Task& t, float x, int32_t output_count) {
  if (t.repetition != 1.0f) x = x > 0.0f ? __fdiv_rn(x, t.repetition) : __fmul_rn(x, t.repetition);
  if (output_count > 0) {
    x = __fmaf_rn(-t.frequency, float(output_count), x);
    x = __fsub_rn(x, t.presence);
  }
  return x;
}

// Penalties, then bans. `fed` (>= 0): one more output token than the
// entries count (Task::fed_source), an entry's or a token of its own.
__device__ void copy_and_patch(const Row& r, float* work, const PenaltyEntry* patches, const int32_t* bans,
                               const BiasEntry* biases, const uint32_t* masks, int32_t fed) {
  __shared__ int fed_has_entry;
  if (threadIdx.x == 0) fed_has_entry = 0;
  for (int64_t g = threadIdx.x; g < r.raw.groups; g += blockDim.x) {
    float x[4];
    r.raw.load(g, x);
    *reinterpret_cast<float4*>(work + 4 * g) = make_float4(x[0], x[1], x[2], x[3]);
  }
  __syncthreads();
  const Task& t = r.t;
  // logit_bias before the penalties (distinct ids), as the CPU adds it.
  for (int i = threadIdx.x; i < t.bias_count; i += blockDim.x) {
    const BiasEntry b = biases[t.bias_begin + i];
    work[b.id] += b.bias;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < t.patch_count; i += blockDim.x) {
    const PenaltyEntry e = patches[t.patch_begin + i];  // distinct ids: no two threads share one
    const bool is_fed = e.id == fed;
    if (is_fed) fed_has_entry = 1;
    work[e.id] = penalized(t, work[e.id], e.output_count + (is_fed ? 1 : 0));
  }
  __syncthreads();
  if (fed >= 0 && fed < r.raw.vocab) {  // the same for every thread: the barrier below is uniform
    if (threadIdx.x == 0 && !fed_has_entry) work[fed] = penalized(t, work[fed], 1);
    __syncthreads();
  }
  // Bans after penalties: a penalized -inf stays -inf, so the order does not matter.
  for (int i = threadIdx.x; i < t.ban_count; i += blockDim.x) work[bans[t.ban_begin + i]] = -CUDART_INF_F;
  // Tokens outside the allowed mask likewise (structured output); a word per thread.
  if (t.mask_begin >= 0) {
    const uint32_t* mask = masks + t.mask_begin;
    const int64_t words = (r.raw.vocab + 31) / 32;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      const uint32_t bits = mask[w];
      if (bits == 0xffffffffu) continue;
      const int64_t end = min(r.raw.vocab, (w + 1) * 32);
      for (int64_t id = w * 32; id < end; ++id)
        if (!((bits >> (id - w * 32)) & 1u)) work[id] = -CUDART_INF_F;
    }
  }
  __syncthreads();
}

// ---- selector transitions (thread 0, after a resolve)

// Selector a: top-k (count over the key digits), then top-p over the top-k
// candidates (mass over the key digits; if the boundary key's ties are only
// partly kept, count over the id digits for the exact cut). After digit 0 of
// either, a list when the candidates fit.
__device__ void advance_a(Shared& sh, const Row& r) {
  Selector& s = sh.a;
  if (s.found_bin < 0) {
    sh.status = kInternal;
    s.mode = kIdle;
    return;
  }
  const uint32_t upto = s.found_above_count + s.found_count;  // candidates in bins >= the boundary
  advance(s);
  if (s.digit == 1 && upto <= uint32_t(r.list_a)) {  // digit 0 of top-k, or of top-p's mass
    s.mode = kCollect;
    s.list_count = 0;
    return;
  }
  if (sh.a_stage == kStageTopK) {
    if (s.digit == kKeyDigits) {
      sh.topk_key = uint32_t(s.prefix);
      if (r.topp) {
        s.prefix = 0u;
        s.digit = 0;
        s.mode = kMass;
        s.above = 0.0;
        s.target = 0.0;
        sh.a_stage = kStageTopP;
      } else {
        s.mode = kIdle;
      }
    }
  } else if (s.mode == kMass) {
    if (s.digit == kKeyDigits) {
      // Tokens of the boundary key, lower ids first, are kept while the mass
      // before them is below the target: the first ceil((target - above) / w).
      const float w = r.weight(key_value(uint32_t(s.prefix)));
      uint32_t keep = s.matched;
      if (w > 0.0f) {
        const double need = ceil((s.target - s.above) / double(w));
        if (need < double(keep)) keep = need < 1.0 ? 1u : uint32_t(need);
      }
      if (keep == s.matched) {
        sh.topp_min = s.prefix << kIdBits;
        s.mode = kIdle;
      } else {
        s.mode = kCount;
        s.rank = keep;
      }
    }
  } else if (s.digit == kNumDigits) {
    sh.topp_min = s.prefix;
    s.mode = kIdle;
  }
}

// Selector b: the n-th largest raw composite (or a list after digit 0); the
// id digits only when the boundary key's ties are cut.
__device__ void advance_b(Shared& sh, const Row& r) {
  Selector& s = sh.b;
  if (s.found_bin < 0) {
    sh.status = kInternal;
    s.mode = kIdle;
    return;
  }
  const uint32_t upto = s.found_above_count + s.found_count;
  advance(s);
  if (s.digit == 1 && upto <= uint32_t(r.list_b)) {
    s.mode = kCollect;
    s.list_count = 0;
  } else if (s.digit == kKeyDigits && s.rank == s.matched) {
    sh.topn_min = s.prefix << kIdBits;
    s.mode = kIdle;
  } else if (s.digit == kNumDigits) {
    sh.topn_min = s.prefix;
    s.mode = kIdle;
  }
}

// After a pass that worked for the selectors flagged on.
__device__ void finish_pass(Shared& sh, const Row& r, bool a_on, bool b_on) {
  const int32_t ma = sh.a.mode, mb = sh.b.mode;
  if (a_on) {
    if (ma == kCollect) resolve_list_a(sh, r);
    else if (ma == kMass) resolve_mass(sh.a, sh.a_mem.hist.count, sh.a_mem.hist.mass, sh.scan_d, sh.scan_u, r.t.top_p);
    else resolve_count(sh.a, sh.a_mem.hist.count, sh.scan_u);
  }
  if (b_on) {
    if (mb == kCollect) resolve_list_b(sh, r);
    else resolve_count(sh.b, sh.b_mem.count, sh.scan_u);
  }
  if (threadIdx.x == 0) {
    if (a_on && ma != kCollect) advance_a(sh, r);
    if (b_on && mb != kCollect) advance_b(sh, r);
  }
  __syncthreads();
}

// Appends composite c to a list of capacity cap (the count was checked first).
__device__ __forceinline__ void append(uint64_t* list, int32_t* count, int cap, uint64_t c) {
  const int slot = atomicAdd(count, 1);
  if (slot < cap) list[slot] = c;
}

// One pass for the active selectors: histograms their next digit over the
// tokens matching their prefix, or collects the tokens at or above their
// boundary bin.
__device__ void digit_pass(Shared& sh, const Row& r) {
  const Selector a = sh.a, b = sh.b;
  const bool a_on = a.mode != kIdle, b_on = b.mode != kIdle;
  const bool a_mass = a.mode == kMass, a_collect = a.mode == kCollect, b_collect = b.mode == kCollect;
  const int a_lo = digit_shift(a.digit), a_hi = a_lo + digit_width(a.digit);
  const uint32_t a_mask = (1u << digit_width(a.digit)) - 1u;
  const int b_lo = digit_shift(b.digit), b_hi = b_lo + digit_width(b.digit);
  const uint32_t b_mask = (1u << digit_width(b.digit)) - 1u;
  const bool a_filter = r.topk && sh.a_stage == kStageTopP;  // top-p measures the top-k candidates only
  const uint32_t topk_key = sh.topk_key;
  const bool raw_apart = b_on && r.patched;
  const int64_t vocab = r.raw.vocab;
  for_each_group(r.src, [&](int64_t g, const float (&x)[4]) {
    float v[4] = {x[0], x[1], x[2], x[3]};
    if (raw_apart) r.raw.load(g, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t id = 4 * g + k;
      if (id >= vocab) break;
      if (a_on) {
        const float y = r.scaled(x[k]);
        const uint32_t key = order_key(y);
        const uint64_t c = composite(key, id);
        if (!a_filter || key >= topk_key) {
          if (a_collect) {
            if (uint32_t(c >> digit_shift(0)) >= uint32_t(a.prefix))
              append(sh.a_mem.list, &sh.a.list_count, kListA, c);
          } else if ((c >> a_hi) == a.prefix) {
            const uint32_t bin = uint32_t(c >> a_lo) & a_mask;
            atomicAdd(&sh.a_mem.hist.count[bin], 1u);
            if (a_mass) atomicAdd(&sh.a_mem.hist.mass[bin], r.weight(y));
          }
        }
      }
      if (b_on && v[k] == v[k]) {
        const uint64_t c = composite(order_key(v[k]), id);
        if (b_collect) {
          if (uint32_t(c >> digit_shift(0)) >= uint32_t(b.prefix)) append(sh.b_mem.list, &sh.b.list_count, kListB, c);
        } else if ((c >> b_hi) == b.prefix) {
          atomicAdd(&sh.b_mem.count[uint32_t(c >> b_lo) & b_mask], 1u);
        }
      }
    }
  });
}

// Pass 1. Returns the row's status; sets r.ymax, *argmax and (logprobs) *lse.
// Also histograms digit 0 for the counting selectors, which need no max.
__device__ int32_t stats_pass(Shared& sh, Row& r, int32_t* argmax, double* lse) {
  const bool hist_a = sh.a.mode == kCount, hist_b = sh.b.mode == kCount;
  const int64_t vocab = r.raw.vocab;
  constexpr int kDigit0 = 42 - kIdBits;  // digit 0 of a composite is key >> 21
  ArgMax best{-CUDART_INF_F, INT32_MAX};
  bool nan = false;
  float raw_max = -CUDART_INF_F, raw_sum = 0.0f;  // online: sum of exp(raw - raw_max)
  for_each_group(r.src, [&](int64_t g, const float (&x)[4]) {
    float v[4] = {x[0], x[1], x[2], x[3]};
    if (r.logprobs && r.patched) r.raw.load(g, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t id = 4 * g + k;
      if (id >= vocab) break;
      const float y = r.scaled(x[k]);
      if (y != y) {
        nan = true;
      } else {
        if (y > best.value) best = ArgMax{y, int32_t(id)};
        if (hist_a) atomicAdd(&sh.a_mem.hist.count[order_key(y) >> kDigit0], 1u);
      }
      if (r.logprobs) {
        const float u = v[k];
        if (u > raw_max) {
          raw_sum = raw_sum * expf(raw_max - u) + 1.0f;
          raw_max = u;
        } else if (u > -CUDART_INF_F) {
          raw_sum += expf(u - raw_max);
        }
        if (hist_b && u == u) atomicAdd(&sh.b_mem.count[order_key(u) >> kDigit0], 1u);
      }
    }
  });
  best = block_argmax(best, sh.red_f, sh.red_i);
  const bool any_nan = __syncthreads_or(nan) != 0;
  r.ymax = best.value;
  *argmax = best.id;
  if (r.logprobs) {
    const float m = block_reduce(raw_max, [](float p, float q) { return fmaxf(p, q); }, sh.red_f);
    const double part = raw_max > -CUDART_INF_F ? double(raw_sum * expf(raw_max - m)) : 0.0;
    const double sum = block_reduce(part, [](double p, double q) { return p + q; }, sh.red_d);
    *lse = m == -CUDART_INF_F ? double(m) : double(m) + log(sum);
  }
  if (any_nan) return kNan;
  if (best.value == CUDART_INF_F) return kPosInf;
  if (best.value == -CUDART_INF_F) return kAllNegInf;
  return kOk;
}

// Logprobs of the raw logits: the chosen token's rank and the top n, as
// compute_logprobs reports them. From b's list when it covers the chosen
// token, else with one more pass (which also collects the top n when b found
// a threshold instead of a list).
__device__ void logprobs_result(Shared& sh, const Row& r, int32_t token, double lse, Result& out) {
  const float chosen = r.raw.p[token];
  const uint32_t chosen_key = order_key(chosen);
  const int n_list = sh.b_list_len;
  uint32_t larger = 0u;
  if (n_list > 0 && (chosen_key >> (42 - kIdBits)) >= sh.b_floor) {
    for (int i = threadIdx.x; i < n_list; i += blockDim.x)
      larger += composite_key(sh.b_mem.list[i]) > chosen_key ? 1u : 0u;
  } else {
    const bool collect = n_list == 0 && r.top_list;
    const uint64_t topn_min = sh.topn_min;
    const int64_t vocab = r.raw.vocab;
    for_each_group(r.raw, [&](int64_t g, const float (&x)[4]) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t id = 4 * g + k;
        if (id >= vocab) break;
        larger += x[k] > chosen ? 1u : 0u;
        if (collect && x[k] == x[k]) {
          const uint64_t c = composite(order_key(x[k]), id);
          if (c >= topn_min) append(sh.top, &sh.top_count, kMaxTopLogprobs, c);
        }
      }
    });
  }
  larger = block_reduce(larger, [](uint32_t p, uint32_t q) { return p + q; }, sh.red_u);
  if (threadIdx.x != 0) return;
  const int n = sh.top_count;
  if (n != (r.top_list ? r.t.top_n : 0)) {
    out.status = kInternal;
    return;
  }
  for (int i = 1; i < n; ++i) {  // n <= 20: insertion sort, largest first
    const uint64_t c = sh.top[i];
    int j = i - 1;
    for (; j >= 0 && sh.top[j] < c; --j) sh.top[j + 1] = sh.top[j];
    sh.top[j + 1] = c;
  }
  out.token = token;
  out.status = kOk;
  out.chosen_logprob = float(double(chosen) - lse);
  out.chosen_rank = int32_t(larger) + 1;
  out.top_count = n;
  for (int i = 0; i < n; ++i) {
    out.top_ids[i] = composite_id(sh.top[i]);
    out.top_logprobs[i] = float(double(key_value(composite_key(sh.top[i]))) - lse);
  }
}

__global__ void __launch_bounds__(kThreads, 2) sample_kernel(SamplingLaunch l) {
  __shared__ Shared sh;
  Row r(l, l.tasks[blockIdx.x]);
  Result& out = l.results[blockIdx.x];
  init_shared(sh, r);
  if (r.patched)
    copy_and_patch(r, l.work + int64_t(r.t.work_row) * l.work_stride, l.patches, l.bans, l.biases, l.masks,
                   l.fed_tokens ? l.fed_tokens[blockIdx.x] : -1);
  __syncthreads();

  int32_t argmax = -1;
  double lse = 0.0;
  const bool a_first = sh.a.mode == kCount, b_first = sh.b.mode == kCount;
  const int32_t status = stats_pass(sh, r, &argmax, &lse);
  if (status != kOk) {
    if (threadIdx.x == 0) {
      out.status = status;
      out.token = -1;
      l.tokens[r.t.spec] = -1;
    }
    return;
  }
  finish_pass(sh, r, a_first, b_first);
  while (sh.status == kOk && (sh.a.mode != kIdle || sh.b.mode != kIdle)) {
    const bool a_on = sh.a.mode != kIdle, b_on = sh.b.mode != kIdle;
    digit_pass(sh, r);
    __syncthreads();
    finish_pass(sh, r, a_on, b_on);
  }
  int32_t token = -1;
  if (sh.status == kOk)
    token = r.t.forced >= 0 ? r.t.forced : r.greedy ? argmax : sh.token >= 0 ? sh.token : threshold_draw(sh, r);
  if (threadIdx.x == 0) l.tokens[r.t.spec] = token;
  if (token < 0) {
    if (threadIdx.x == 0) {
      out.status = kInternal;
      out.token = -1;
    }
    return;
  }
  if (r.logprobs) {
    logprobs_result(sh, r, token, lse, out);
  } else if (threadIdx.x == 0) {
    out.token = token;
    out.status = kOk;
    out.top_count = 0;
  }
}

std::atomic<bool> g_lists{true};

}  // namespace

void set_sampling_lists(bool enabled) { g_lists.store(enabled); }
int32_t sampling_list_limit() { return g_lists.load() ? kListA : 0; }

__global__ void read_fed_tokens_kernel(const Task* tasks, int n, const int32_t* tokens, int32_t* fed) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x))
    fed[i] = tasks[i].fed_source >= 0 ? tokens[tasks[i].fed_source] : -1;
}

void launch_read_fed_tokens(const Task* tasks, int n, const int32_t* tokens, int32_t* fed, cudaStream_t stream) {
  if (n <= 0) return;
  read_fed_tokens_kernel<<<(n + 255) / 256, 256, 0, stream>>>(tasks, n, tokens, fed);
  SERVAL_CUDA_LAUNCH_CHECK();
}

void launch_sampling(const SamplingLaunch& l, int num_greedy, int num_general, cudaStream_t stream) {
  if (num_greedy > 0) {
    greedy_kernel<<<num_greedy, kGreedyThreads, 0, stream>>>(l.tasks, l.logits, l.vocab, l.results, l.tokens);
    SERVAL_CUDA_LAUNCH_CHECK();
  }
  if (num_general > 0) {
    SamplingLaunch g = l;
    g.tasks += num_greedy;
    g.results += num_greedy;
    sample_kernel<<<num_general, kThreads, 0, stream>>>(g);
    SERVAL_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace serval::cuda::sampling
