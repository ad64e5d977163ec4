#pragma once
// The GPU sampler's per-block state (cuda_sampling_kernels.cu): the shared
// memory of one row's block and what the block knows about its row.
#include <climits>

#include "backend/cuda/cuda_sampling.cuh"
#include "backend/cuda/cuda_sampling_block.cuh"
#include "backend/cuda/cuda_sampling_select.cuh"

namespace serval::cuda::sampling {

constexpr int kThreads = 512;  // threads of the general kernel's blocks
static_assert(kThreads % 32 == 0 && (kMaxBins / 2) % kThreads == 0, "resolves give each thread whole bins");
static_assert(kListA % kThreads == 0, "list scans give each thread whole entries");
constexpr int kListPerThread = kListA / kThreads;

enum Stage : int32_t { kStageTopK = 0, kStageTopP = 1 };

struct Shared {
  union {  // selector a: its histograms, then (list mode) its candidates
    struct {
      uint32_t count[kMaxBins];
      float mass[kMaxBins];
    } hist;
    uint64_t list[kListA];
  } a_mem;
  union {  // selector b: its histogram, then (list mode) its candidates
    uint32_t count[kMaxBins];
    uint64_t list[kListB];
  } b_mem;
  double scan_d[33];
  uint32_t scan_u[33];
  float red_f[32];
  int32_t red_i[32];
  double red_d[32];
  uint32_t red_u[32];
  Selector a, b;
  uint64_t topp_min;        // threshold draw: top-p keeps composite >= topp_min
  uint64_t topn_min;        // threshold logprobs: top n are composite >= topn_min
  uint64_t top[kMaxTopLogprobs];
  double draw_local;
  double draw_total;
  uint32_t topk_key;        // threshold draw: top-k keeps key >= topk_key
  uint32_t b_floor;         // b's list holds every raw token whose digit 0 is >= b_floor
  int32_t b_list_len;       // 0: b found a threshold instead
  int32_t a_stage;
  int32_t status;
  int32_t token;            // set by a's list, or by the threshold draw
  int32_t draw_thread;
  int32_t last_positive;    // thread (threshold draw) or entry (list draw)
  int32_t pick;             // list draw: first entry crossing the target
  int32_t top_count;
};

// What one block knows about its row.
struct Row {
  Task t;
  RowReader raw;  // the logits
  RowReader src;  // what is sampled from: the logits, or the penalized copy
  bool patched, greedy, topk, topp, minp, logprobs, top_list;
  int32_t list_a, list_b;  // most candidates a list may hold (0: no lists)
  float ymax = 0.0f;       // max of the scaled logits, after the stats pass

  __device__ Row(const SamplingLaunch& l, const Task& task)
      : t(task),
        raw(l.logits + int64_t(task.row) * l.vocab, l.vocab),
        src(task.work_row >= 0 ? static_cast<const float*>(l.work + int64_t(task.work_row) * l.work_stride)
                               : l.logits + int64_t(task.row) * l.vocab,
            l.vocab),
        patched(task.work_row >= 0),
        greedy(task.greedy != 0),
        topk(task.top_k > 0),
        topp(task.top_p < 1.0f),
        minp(task.use_min_p != 0),
        logprobs(task.top_n >= 0),
        top_list(task.top_n > 0),
        list_a(min(l.list_limit, kListA)),
        list_b(min(l.list_limit, kListB)) {}

  // The CPU divides the penalized logits by the temperature (IEEE division).
  __device__ __forceinline__ float scaled(float x) const { return greedy ? x : __fdiv_rn(x, t.temperature); }
  // Unnormalized probability; one formula for top-p masses and the draw.
  __device__ __forceinline__ float weight(float y) const { return __expf(y - ymax); }
  // min-p keeps y >= the CPU's max + log(min_p).
  __device__ __forceinline__ float min_logit() const { return __fadd_rn(ymax, t.log_min_p); }
};

}  // namespace serval::cuda::sampling
