#pragma once
// The GPU sampler's data, shared by the host side (cuda_sampling.cu: packs one
// Task per spec, checks results) and the kernels (cuda_sampling_kernels.cu).
// The semantics are sampling/sampler.h's; see the kernels for how they are met
// without sorting the vocabulary.
#include <cuda_runtime.h>

#include <cstdint>

namespace serval::cuda::sampling {

constexpr int kMaxTopLogprobs = 20;
// Selection keys pack (logit key, token id) into 53 bits, so ids are < 2^21.
constexpr int kIdBits = 21;
constexpr int64_t kMaxVocab = int64_t(1) << kIdBits;
// Shared-memory candidate lists: the most tokens the sampling selection (a)
// and the logprobs selection (b) finish in shared memory instead of with
// more passes over the row.
constexpr int kListA = 2048;
constexpr int kListB = 1024;

enum Status : int32_t { kOk = 0, kNan = 1, kPosInf = 2, kAllNegInf = 3, kInternal = 4 };

// One spec, as the kernels read it. Filters the host found inactive are
// already switched off (top_k 0, top_p 1, use_min_p 0).
struct Task {
  double uniform;           // the request's draw in [0, 1) (sampled rows)
  int32_t row;              // row of the logits
  int32_t spec;             // index of its spec: where the token goes in SamplingLaunch::tokens
  int32_t work_row;         // row of the work buffer holding the penalized copy; -1: none
  int32_t patch_begin;      // penalty entries [patch_begin, patch_begin + patch_count)
  int32_t patch_count;
  int32_t ban_begin;        // banned ids [ban_begin, ban_begin + ban_count), all in the vocabulary
  int32_t ban_count;
  int32_t bias_begin;       // logit biases [bias_begin, bias_begin + bias_count), distinct ids, before penalties
  int32_t bias_count;
  int32_t mask_begin;       // >= 0: the allowed-token bitmask at masks[mask_begin, + (vocab + 31) / 32)
  int32_t fed_source;       // >= 0: penalties also count tokens[fed_source] as it was before this launch
  int32_t greedy;           // 1: argmax, nothing else of the sampling part applies
  int32_t forced;           // >= 0: the token is this one (a prompt token scored); greedy, no penalties
  int32_t top_k;            // 0: off, else 0 < top_k < vocab
  int32_t top_n;            // -1: no logprobs, else the number of top logprobs (<= vocab, <= 20)
  int32_t use_min_p;        // 1: keep logit >= max + log_min_p
  float temperature;
  float top_p;              // 1: off
  float log_min_p;
  float repetition;
  float frequency;
  float presence;
};

// A token of the prompt or output touched by penalties, once per row.
struct PenaltyEntry {
  int32_t id;
  int32_t output_count;     // occurrences in the output (0: prompt only)
};

// A logit_bias entry: added to the token's logit before the penalties.
struct BiasEntry {
  int32_t id;
  float bias;
};

struct Result {
  int32_t token;
  int32_t status;           // Status
  float chosen_logprob;
  int32_t chosen_rank;
  int32_t top_count;
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

// Device pointers of one sample() call. tasks[0, num_greedy) are plain greedy
// rows (no penalties, bans or logprobs: one argmax pass); the rest go through
// the general kernel. results[i] belongs to tasks[i].
struct SamplingLaunch {
  const Task* tasks = nullptr;
  const PenaltyEntry* patches = nullptr;
  const int32_t* bans = nullptr;
  const BiasEntry* biases = nullptr;
  const uint32_t* masks = nullptr;  // allowed-token bitmasks (Task::mask_begin)
  const float* logits = nullptr;  // [rows, vocab] f32
  int64_t vocab = 0;
  float* work = nullptr;          // [penalized rows, work_stride]
  int64_t work_stride = 0;        // floats, a multiple of 4
  Result* results = nullptr;
  int32_t* tokens = nullptr;      // device, by spec: each task's token (-1 when it fails), for the next step
  // Device, by general task: tokens[fed_source] read before this launch's
  // kernels write tokens (-1: none); null when no task has a fed source.
  int32_t* fed_tokens = nullptr;
  int32_t list_limit = kListA;    // most candidates a list may hold; 0: radix passes only
};

void launch_sampling(const SamplingLaunch& l, int num_greedy, int num_general, cudaStream_t stream);
// fed[i] = tokens[tasks[i].fed_source] (-1 where it is < 0), for i < n: the
// tokens of the launch before, read before the next launch overwrites them.
void launch_read_fed_tokens(const Task* tasks, int n, const int32_t* tokens, int32_t* fed, cudaStream_t stream);

// For tests: with lists off, every selection runs the radix passes to the end
// (the path rows with many candidates take). On by default.
void set_sampling_lists(bool enabled);
int32_t sampling_list_limit();

}  // namespace serval::cuda::sampling
