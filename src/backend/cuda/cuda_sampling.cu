// CudaBackend::sample, host side. Per call: one Task per spec, the penalty
// entries (each distinct token of prompt ∪ output once, with its output
// count: O(prompt + output) per row, never O(vocab)) and the bans are packed
// into one pinned buffer and sent in one copy (none when the device holds
// those bytes from the call before); the kernels (cuda_sampling_kernels.cu)
// run on stream_ after the LM head and write the results into pinned memory,
// which finish_sample reads after one wait.
// Errors are raised in spec order with the CPU sampler's messages; token ids
// outside the vocabulary are caught here, before anything is queued.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sampling.cuh"

namespace serval::cuda {
namespace {

using sampling::PenaltyEntry;
using sampling::Result;
using sampling::Task;

// Kept across calls in CudaBackend::sampler_state_; buffers grow, never shrink.
struct SamplerState {
  void* host_in = nullptr;   // pinned: tasks, penalty entries, bans
  int64_t host_in_bytes = 0;
  void* host_out = nullptr;  // pinned: results, written by the kernels themselves
  int64_t host_out_bytes = 0;
  DeviceBuffer dev_in, work;
  // What dev_in holds (a decode step of plain greedy rows sends the same
  // tasks as the step before it, and need not send them again).
  std::vector<char> sent;
  const void* sent_to = nullptr;
  std::vector<Task> greedy_tasks, general_tasks;
  std::vector<int32_t> task_of_spec;  // >= 0: greedy_tasks index; else ~general_tasks index
  std::vector<PenaltyEntry> patches;
  std::vector<int32_t> bans;
  // Indexed by token id and all zero between calls (only touched ids are reset).
  std::vector<int32_t> output_count;
  std::vector<uint8_t> seen;
  // Between start_sample and finish_sample: each spec's row and whether it wants logprobs.
  bool started = false;
  int64_t vocab = 0;
  std::vector<int32_t> spec_rows;
  std::vector<uint8_t> spec_logprobs;

  SamplerState() = default;
  SamplerState(const SamplerState&) = delete;
  SamplerState& operator=(const SamplerState&) = delete;
  ~SamplerState() {
    if (host_in) cudaFreeHost(host_in);
    if (host_out) cudaFreeHost(host_out);
  }
};

// Callers have no copy in flight on the buffer (finish_sample() ends synchronized).
void reserve_pinned(void*& p, int64_t& bytes, int64_t need) {
  if (bytes >= need) return;
  const int64_t grown = std::max<int64_t>(need, bytes * 2);
  if (p) SERVAL_CUDA_CHECK(cudaFreeHost(p));
  p = nullptr;
  bytes = 0;
  SERVAL_CUDA_CHECK(cudaMallocHost(&p, size_t(grown)));
  bytes = grown;
}

int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

// PenaltyApplier's checks and counting, as entries for the device to apply.
void add_penalty_entries(SamplerState& st, int64_t vocab, std::span<const int32_t> prompt,
                         std::span<const int32_t> output) {
  auto check = [vocab](int32_t id, const char* where) {
    SERVAL_CHECK(id >= 0 && id < vocab, "token id ", id, " in the ", where, " is outside the vocabulary [0, ",
                 vocab, ")");
  };
  // Every id before marking any, so a bad id leaves the scratch clean.
  for (int32_t id : prompt) check(id, "prompt");
  for (int32_t id : output) check(id, "output");
  if (st.seen.size() != size_t(vocab)) {
    st.seen.assign(size_t(vocab), 0);
    st.output_count.assign(size_t(vocab), 0);
  }
  const size_t first = st.patches.size();
  for (int32_t id : prompt) {
    if (!st.seen[size_t(id)]) {
      st.seen[size_t(id)] = 1;
      st.patches.push_back(PenaltyEntry{id, 0});
    }
  }
  for (int32_t id : output) {
    if (!st.seen[size_t(id)]) {
      st.seen[size_t(id)] = 1;
      st.patches.push_back(PenaltyEntry{id, 0});
    }
    ++st.output_count[size_t(id)];
  }
  for (size_t i = first; i < st.patches.size(); ++i) {
    PenaltyEntry& e = st.patches[i];
    e.output_count = st.output_count[size_t(e.id)];
    st.seen[size_t(e.id)] = 0;
    st.output_count[size_t(e.id)] = 0;
  }
}

Task make_task(SamplerState& st, const SampleSpec& s, int64_t vocab, int32_t& work_rows) {
  const SamplingParams& p = *s.params;
  Task t{};
  t.uniform = s.uniform;
  t.row = s.row;
  t.greedy = p.greedy() ? 1 : 0;
  t.temperature = p.temperature;
  t.top_k = !t.greedy && p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;
  t.top_p = !t.greedy && p.top_p < 1.0f ? p.top_p : 1.0f;
  t.use_min_p = !t.greedy && p.min_p > 0.0f ? 1 : 0;
  t.log_min_p = t.use_min_p ? std::log(p.min_p) : 0.0f;  // float log, as the CPU computes it
  t.top_n = p.logprobs >= 0 ? int32_t(std::min<int64_t>(p.logprobs, vocab)) : -1;
  t.repetition = p.repetition_penalty;
  t.frequency = p.frequency_penalty;
  t.presence = p.presence_penalty;
  t.patch_begin = int32_t(st.patches.size());
  if (p.has_penalties()) add_penalty_entries(st, vocab, s.prompt_ids, s.output_ids);
  t.patch_count = int32_t(st.patches.size()) - t.patch_begin;
  t.ban_begin = int32_t(st.bans.size());
  for (int32_t id : s.banned)
    if (id >= 0 && id < vocab) st.bans.push_back(id);  // the CPU ignores ids outside the vocabulary
  t.ban_count = int32_t(st.bans.size()) - t.ban_begin;
  t.work_row = t.patch_count > 0 || t.ban_count > 0 ? work_rows++ : -1;
  return t;
}

void check_status(const Result& r, int64_t vocab, int32_t row) {
  switch (r.status) {
    case sampling::kOk:
      break;
    case sampling::kNan:
      fail("logits contain NaN (the model output is broken)");
    case sampling::kPosInf:
      fail("logits contain +inf (the model output is broken)");
    case sampling::kAllNegInf:
      fail("all ", vocab, " logits are -inf: no token can be sampled");
    default:
      fail("cuda sampler: internal error (status ", r.status, ") on row ", row);
  }
  SERVAL_CHECK(r.token >= 0 && r.token < vocab, "cuda sampler: internal error (token ", r.token, ") on row ", row);
  SERVAL_CHECK(r.top_count >= 0 && r.top_count <= sampling::kMaxTopLogprobs, "cuda sampler: internal error (",
               r.top_count, " top logprobs) on row ", row);
}

}  // namespace

void CudaBackend::sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) {
  start_sample(logits, specs);
  finish_sample(out);
}

void CudaBackend::start_sample(const Tensor& logits, std::span<const SampleSpec> specs) {
  if (!sampler_state_) sampler_state_ = std::make_shared<SamplerState>();
  SamplerState& st = *static_cast<SamplerState*>(sampler_state_.get());
  st.started = false;
  st.spec_rows.clear();
  st.spec_logprobs.clear();
  if (specs.empty()) {
    st.started = true;
    return;
  }
  SERVAL_CHECK(logits.dtype == DType::F32, "cuda sampler: logits must be f32, got ", dtype_name(logits.dtype));
  const int64_t vocab = logits.cols;
  SERVAL_CHECK(vocab > 0, "cannot sample from an empty row of logits");
  SERVAL_CHECK(vocab <= sampling::kMaxVocab, "cuda sampler: a vocabulary of ", vocab, " tokens is more than ",
               sampling::kMaxVocab);

  // ---- tasks: plain greedy rows first (their own one-pass kernel)
  st.greedy_tasks.clear();
  st.general_tasks.clear();
  st.task_of_spec.clear();
  st.patches.clear();
  st.bans.clear();
  int32_t work_rows = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SampleSpec& s = specs[i];
    SERVAL_CHECK(s.params != nullptr, "cuda sampler: spec ", i, " has no sampling parameters");
    SERVAL_CHECK(s.row >= 0 && s.row < logits.rows, "cuda sampler: spec ", i, " samples row ", s.row, " of ",
                 logits.rows);
    SERVAL_CHECK(s.params->logprobs <= sampling::kMaxTopLogprobs, "cuda sampler: at most ",
                 sampling::kMaxTopLogprobs, " top logprobs, got ", s.params->logprobs);
    const Task t = make_task(st, s, vocab, work_rows);
    if (t.greedy && t.work_row < 0 && t.top_n < 0) {
      st.task_of_spec.push_back(int32_t(st.greedy_tasks.size()));
      st.greedy_tasks.push_back(t);
    } else {
      st.task_of_spec.push_back(~int32_t(st.general_tasks.size()));
      st.general_tasks.push_back(t);
    }
  }
  const int64_t n = int64_t(specs.size());
  const int64_t num_greedy = int64_t(st.greedy_tasks.size());

  // ---- one pinned input buffer: [tasks | penalty entries | bans]
  const int64_t patches_at = align16(n * int64_t(sizeof(Task)));
  const int64_t bans_at = patches_at + align16(int64_t(st.patches.size() * sizeof(PenaltyEntry)));
  const int64_t in_bytes = bans_at + align16(int64_t(st.bans.size() * sizeof(int32_t)));
  const int64_t out_bytes = n * int64_t(sizeof(Result));
  reserve_pinned(st.host_in, st.host_in_bytes, in_bytes);
  reserve_pinned(st.host_out, st.host_out_bytes, out_bytes);
  char* in = static_cast<char*>(st.host_in);
  std::memcpy(in, st.greedy_tasks.data(), st.greedy_tasks.size() * sizeof(Task));
  std::memcpy(in + num_greedy * int64_t(sizeof(Task)), st.general_tasks.data(),
              st.general_tasks.size() * sizeof(Task));
  if (!st.patches.empty()) std::memcpy(in + patches_at, st.patches.data(), st.patches.size() * sizeof(PenaltyEntry));
  if (!st.bans.empty()) std::memcpy(in + bans_at, st.bans.data(), st.bans.size() * sizeof(int32_t));

  // ---- device buffers (grown geometrically; sampling is never in a graph), copy in (unless
  // dev_in holds these bytes already), kernels writing the pinned results, one wait. Each CUDA
  // call here costs microseconds of the step, during which the GPU idles.
  const int64_t work_stride = (vocab + 3) / 4 * 4;  // rows 16-byte aligned
  char* dev_in = static_cast<char*>(host_op_scratch(st.dev_in, in_bytes));
  float* work =
      work_rows > 0 ? static_cast<float*>(host_op_scratch(st.work, int64_t(work_rows) * work_stride * 4)) : nullptr;
  const bool sent = st.sent_to == dev_in && int64_t(st.sent.size()) == in_bytes &&
                    std::memcmp(st.sent.data(), in, size_t(in_bytes)) == 0;
  if (!sent) {
    st.sent_to = nullptr;
    SERVAL_CUDA_CHECK(cudaMemcpyAsync(dev_in, st.host_in, size_t(in_bytes), cudaMemcpyHostToDevice, stream_));
    st.sent.assign(in, in + in_bytes);
    st.sent_to = dev_in;
  }
  sampling::SamplingLaunch l;
  l.tasks = reinterpret_cast<const Task*>(dev_in);
  l.patches = reinterpret_cast<const PenaltyEntry*>(dev_in + patches_at);
  l.bans = reinterpret_cast<const int32_t*>(dev_in + bans_at);
  l.logits = static_cast<const float*>(logits.data);
  l.vocab = vocab;
  l.work = work;
  l.work_stride = work_stride;
  l.results = static_cast<Result*>(st.host_out);  // pinned memory is the device's too (unified addressing)
  l.list_limit = sampling::sampling_list_limit();
  try {
    sampling::launch_sampling(l, int(num_greedy), int(n - num_greedy), stream_);
  } catch (...) {
    st.sent_to = nullptr;
    cudaStreamSynchronize(stream_);  // the next call may rewrite the pinned buffers
    throw;
  }
  // What finish_sample needs of the specs, which may be gone by then.
  st.vocab = vocab;
  for (const SampleSpec& s : specs) {
    st.spec_rows.push_back(s.row);
    st.spec_logprobs.push_back(s.params->logprobs >= 0);
  }
  st.started = true;
}

void CudaBackend::finish_sample(std::vector<SampleResult>& out) {
  SERVAL_CHECK(sampler_state_ && static_cast<SamplerState*>(sampler_state_.get())->started,
               "cuda sampler: finish_sample without a started sample");
  SamplerState& st = *static_cast<SamplerState*>(sampler_state_.get());
  st.started = false;
  const size_t n = st.spec_rows.size();
  out.assign(n, SampleResult{});
  if (n == 0) return;
  try {
    sync_stream();
  } catch (...) {
    st.sent_to = nullptr;
    throw;
  }

  // ---- results, in spec order
  const int64_t num_greedy = int64_t(st.greedy_tasks.size());
  const Result* results = static_cast<const Result*>(st.host_out);
  for (size_t i = 0; i < n; ++i) {
    const int32_t k = st.task_of_spec[i];
    const Result& r = results[k >= 0 ? k : num_greedy + ~k];
    check_status(r, st.vocab, st.spec_rows[i]);
    out[i].token = r.token;
    if (st.spec_logprobs[i]) {
      Logprobs lp;
      lp.chosen = r.chosen_logprob;
      lp.chosen_rank = r.chosen_rank;
      lp.top.resize(size_t(r.top_count));
      for (int32_t j = 0; j < r.top_count; ++j) lp.top[size_t(j)] = TokenLogprob{r.top_ids[j], r.top_logprobs[j]};
      out[i].logprobs = std::move(lp);
    }
  }
}

}  // namespace serval::cuda
