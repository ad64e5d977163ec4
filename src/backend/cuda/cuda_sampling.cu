// CudaSampler (cuda_sampler.h). Per call: one Task per spec, the penalty
// entries (each distinct token of prompt ∪ output once, with its output
// count: O(prompt + output) per row, never O(vocab)) and the bans are packed
// into one pinned buffer and sent in one copy (none when the device holds
// those bytes from the call before); the kernels (cuda_sampling_kernels.cu)
// run on the device's stream after the LM head and write the results into pinned memory,
// which finish_sample reads after waiting for that start's event. Two starts
// may be unfinished (Backend::kMaxStartedSamples), each with its own pinned
// buffers (a slot); the kernels also write each token to a device array
// (sampled_tokens), from which the next step may take its input ids, and
// whose penalties count such a fed token (a small kernel reads them first).
// Errors are raised in spec order with the CPU sampler's messages; token ids
// outside the vocabulary are caught here, before anything is queued.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_sampler.h"
#include "backend/cuda/cuda_sampling.cuh"

namespace serval::cuda {
namespace {

using sampling::BiasEntry;
using sampling::PenaltyEntry;
using sampling::Result;
using sampling::Task;

// One start_sample's buffers and what its finish_sample needs: a start
// writes them while the slot of the start before may still be in flight.
struct SampleSlot {
  void* host_in = nullptr;   // pinned: tasks, penalty entries, bans
  int64_t host_in_bytes = 0;
  void* host_out = nullptr;  // pinned: results, written by the kernels themselves
  int64_t host_out_bytes = 0;
  cudaEvent_t done = nullptr;  // recorded after the kernels
  int64_t vocab = 0;
  int64_t num_greedy = 0;
  std::vector<int32_t> task_of_spec;  // >= 0: a greedy task's index; else ~ the general task's
  std::vector<int32_t> spec_rows;
  std::vector<uint8_t> spec_logprobs;  // whether the spec wants logprobs

  SampleSlot() = default;
  SampleSlot(const SampleSlot&) = delete;
  SampleSlot& operator=(const SampleSlot&) = delete;
  ~SampleSlot() {
    if (host_in) cudaFreeHost(host_in);
    if (host_out) cudaFreeHost(host_out);
    if (done) cudaEventDestroy(done);
  }
};

}  // namespace

// Kept across calls; buffers grow, never shrink.
struct CudaSampler::State {
  SampleSlot slots[Backend::kMaxStartedSamples];
  int first = 0, started = 0;  // the oldest unfinished start's slot, and how many are unfinished
  int64_t latest_specs = 0;    // specs of the latest start (what a fed_source may name); 0 if it threw
  DeviceBuffer dev_in, work, tokens, fed;
  // What dev_in holds (a decode step of plain greedy rows sends the same
  // tasks as the step before it, and need not send them again).
  std::vector<char> sent;
  const void* sent_to = nullptr;
  std::vector<Task> greedy_tasks, general_tasks;
  std::vector<PenaltyEntry> patches;
  std::vector<int32_t> bans;
  std::vector<BiasEntry> biases;
  std::vector<uint32_t> masks;
  // Indexed by token id and all zero between calls (only touched ids are reset).
  std::vector<int32_t> output_count;
  std::vector<uint8_t> seen;
};

namespace {

using SamplerState = CudaSampler::State;

// Callers have no copy in flight on the buffer: a slot is reused only after
// its start was finished (its event waited for).
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

Task make_task(SamplerState& st, const SampleSpec& s, int32_t spec, int64_t vocab, int32_t& work_rows) {
  const SamplingParams& p = *s.params;
  Task t{};
  t.uniform = s.uniform;
  t.row = s.row;
  t.spec = spec;
  t.forced = s.forced_token;
  if (t.forced >= 0) {  // scored, not sampled: the logprobs of the raw row, nothing else
    t.greedy = 1;
    t.top_n = int32_t(std::min<int64_t>(p.logprobs, vocab));
    t.temperature = 1.0f;
    t.top_p = 1.0f;
    t.repetition = 1.0f;
    t.fed_source = -1;
    t.work_row = -1;
    t.patch_begin = int32_t(st.patches.size());
    t.ban_begin = int32_t(st.bans.size());
    t.bias_begin = int32_t(st.biases.size());
    t.mask_begin = -1;
    return t;
  }
  t.greedy = p.greedy() ? 1 : 0;
  t.temperature = p.temperature;
  t.top_k = !t.greedy && p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;
  t.top_p = !t.greedy && p.top_p < 1.0f ? p.nucleus_mass() : 1.0f;
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
  t.bias_begin = int32_t(st.biases.size());
  for (const auto& [id, bias] : p.logit_bias) {
    SERVAL_CHECK(id >= 0 && id < vocab, "logit_bias: token id ", id, " is outside the vocabulary of ", vocab);
    st.biases.push_back(BiasEntry{id, bias});
  }
  t.bias_count = int32_t(st.biases.size()) - t.bias_begin;
  t.mask_begin = -1;
  if (!s.allowed.empty()) {
    const size_t words = size_t((vocab + 31) / 32);
    SERVAL_CHECK(s.allowed.size() >= words, "cuda sampler: the allowed-token mask has ", s.allowed.size(),
                 " words, too few for a vocabulary of ", vocab);
    t.mask_begin = int32_t(st.masks.size());
    st.masks.insert(st.masks.end(), s.allowed.begin(), s.allowed.begin() + ptrdiff_t(words));
  }
  t.fed_source = p.has_penalties() ? s.fed_source : -1;  // only the penalties need it
  t.work_row =
      t.patch_count > 0 || t.ban_count > 0 || t.bias_count > 0 || t.mask_begin >= 0 || t.fed_source >= 0 ? work_rows++
                                                                                                          : -1;
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

CudaSampler::CudaSampler(CudaDevice& dev) : dev_(dev), st_(std::make_unique<State>()) {}

CudaSampler::~CudaSampler() = default;

void CudaSampler::sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) {
  SERVAL_CHECK(started() == 0, "cuda sampler: sample() while a started sample is unfinished");
  for (size_t i = 0; i < specs.size(); ++i)
    SERVAL_CHECK(specs[i].fed_source < 0, "sample: spec ", i, " has a fed token; start_sample resolves those");
  start(logits, specs);
  finish(out);
}

void CudaSampler::start(const Tensor& logits, std::span<const SampleSpec> specs) {
  constexpr int kMaxStarted = Backend::kMaxStartedSamples;
  State& st = *st_;
  SERVAL_CHECK(st.started < kMaxStarted, "cuda sampler: ", kMaxStarted,
               " samples are already started and unfinished");
  dev_.bind();
  SampleSlot& slot = st.slots[(st.first + st.started) % kMaxStarted];
  slot.spec_rows.clear();
  slot.spec_logprobs.clear();
  slot.task_of_spec.clear();
  const int64_t latest_specs = st.latest_specs;
  st.latest_specs = 0;
  if (specs.empty()) {
    ++st.started;
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
  st.patches.clear();
  st.bans.clear();
  st.biases.clear();
  st.masks.clear();
  int32_t work_rows = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SampleSpec& s = specs[i];
    SERVAL_CHECK(s.params != nullptr, "cuda sampler: spec ", i, " has no sampling parameters");
    SERVAL_CHECK(s.row >= 0 && s.row < logits.rows, "cuda sampler: spec ", i, " samples row ", s.row, " of ",
                 logits.rows);
    SERVAL_CHECK(s.fed_source < latest_specs, "cuda sampler: spec ", i, " has fed_source ", s.fed_source,
                 ", but the sample before had ", latest_specs, " specs");
    SERVAL_CHECK(s.params->logprobs <= sampling::kMaxTopLogprobs, "cuda sampler: at most ",
                 sampling::kMaxTopLogprobs, " top logprobs, got ", s.params->logprobs);
    SERVAL_CHECK(s.forced_token < 0 || (s.forced_token < vocab && s.params->logprobs >= 0), "cuda sampler: spec ", i,
                 " scores token ", s.forced_token, " (needs a token in the vocabulary of ", vocab,
                 " and logprobs >= 0, got ", s.params->logprobs, ")");
    const Task t = make_task(st, s, int32_t(i), vocab, work_rows);
    if (t.greedy && t.work_row < 0 && t.top_n < 0) {
      slot.task_of_spec.push_back(int32_t(st.greedy_tasks.size()));
      st.greedy_tasks.push_back(t);
    } else {
      slot.task_of_spec.push_back(~int32_t(st.general_tasks.size()));
      st.general_tasks.push_back(t);
    }
  }
  const int64_t n = int64_t(specs.size());
  const int64_t num_greedy = int64_t(st.greedy_tasks.size());
  const bool any_fed = std::any_of(st.general_tasks.begin(), st.general_tasks.end(),
                                   [](const Task& t) { return t.fed_source >= 0; });

  // ---- one pinned input buffer: [tasks | penalty entries | bans | biases | masks]
  const int64_t patches_at = align16(n * int64_t(sizeof(Task)));
  const int64_t bans_at = patches_at + align16(int64_t(st.patches.size() * sizeof(PenaltyEntry)));
  const int64_t biases_at = bans_at + align16(int64_t(st.bans.size() * sizeof(int32_t)));
  const int64_t masks_at = biases_at + align16(int64_t(st.biases.size() * sizeof(BiasEntry)));
  const int64_t in_bytes = masks_at + align16(int64_t(st.masks.size() * sizeof(uint32_t)));
  const int64_t out_bytes = n * int64_t(sizeof(Result));
  reserve_pinned(slot.host_in, slot.host_in_bytes, in_bytes);
  reserve_pinned(slot.host_out, slot.host_out_bytes, out_bytes);
  if (!slot.done) SERVAL_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  char* in = static_cast<char*>(slot.host_in);
  std::memcpy(in, st.greedy_tasks.data(), st.greedy_tasks.size() * sizeof(Task));
  std::memcpy(in + num_greedy * int64_t(sizeof(Task)), st.general_tasks.data(),
              st.general_tasks.size() * sizeof(Task));
  if (!st.patches.empty()) std::memcpy(in + patches_at, st.patches.data(), st.patches.size() * sizeof(PenaltyEntry));
  if (!st.bans.empty()) std::memcpy(in + bans_at, st.bans.data(), st.bans.size() * sizeof(int32_t));
  if (!st.biases.empty()) std::memcpy(in + biases_at, st.biases.data(), st.biases.size() * sizeof(BiasEntry));
  if (!st.masks.empty()) std::memcpy(in + masks_at, st.masks.data(), st.masks.size() * sizeof(uint32_t));

  // ---- device buffers (grown geometrically; sampling is never in a graph), copy in (unless
  // dev_in holds these bytes already), kernels writing the pinned results, an event. Each CUDA
  // call here costs microseconds of the step.
  const int64_t work_stride = (vocab + 3) / 4 * 4;  // rows 16-byte aligned
  char* dev_in = static_cast<char*>(dev_.host_op_scratch(st.dev_in, in_bytes));
  float* work =
      work_rows > 0 ? static_cast<float*>(dev_.host_op_scratch(st.work, int64_t(work_rows) * work_stride * 4)) : nullptr;
  int32_t* fed =
      any_fed ? static_cast<int32_t*>(dev_.host_op_scratch(st.fed, int64_t(st.general_tasks.size()) * 4)) : nullptr;
  const bool sent = st.sent_to == dev_in && int64_t(st.sent.size()) == in_bytes &&
                    std::memcmp(st.sent.data(), in, size_t(in_bytes)) == 0;
  if (!sent) {
    st.sent_to = nullptr;
    SERVAL_CUDA_CHECK(cudaMemcpyAsync(dev_in, slot.host_in, size_t(in_bytes), cudaMemcpyHostToDevice, dev_.stream()));
    st.sent.assign(in, in + in_bytes);
    st.sent_to = dev_in;
  }
  const Task* dev_tasks = reinterpret_cast<const Task*>(dev_in);
  sampling::SamplingLaunch l;
  l.tasks = dev_tasks;
  l.patches = reinterpret_cast<const PenaltyEntry*>(dev_in + patches_at);
  l.bans = reinterpret_cast<const int32_t*>(dev_in + bans_at);
  l.biases = reinterpret_cast<const BiasEntry*>(dev_in + biases_at);
  l.masks = reinterpret_cast<const uint32_t*>(dev_in + masks_at);
  l.logits = static_cast<const float*>(logits.data);
  l.vocab = vocab;
  l.work = work;
  l.work_stride = work_stride;
  l.results = static_cast<Result*>(slot.host_out);  // pinned memory is the device's too (unified addressing)
  l.fed_tokens = fed;
  l.list_limit = sampling::sampling_list_limit();
  try {
    // The fed tokens, before sampled_token_buffer may grow (which loses them)
    // and before the kernels overwrite them.
    if (fed)
      sampling::launch_read_fed_tokens(dev_tasks + num_greedy, int(st.general_tasks.size()), sampled_tokens(), fed,
                                       dev_.stream());
    l.tokens = token_buffer(n);
    sampling::launch_sampling(l, int(num_greedy), int(n - num_greedy), dev_.stream());
    SERVAL_CUDA_CHECK(cudaEventRecord(slot.done, dev_.stream()));
  } catch (...) {
    st.sent_to = nullptr;
    cudaStreamSynchronize(dev_.stream());  // the next call may rewrite the pinned buffers
    throw;
  }
  // What finish_sample needs of the specs, which may be gone by then.
  slot.vocab = vocab;
  slot.num_greedy = num_greedy;
  for (const SampleSpec& s : specs) {
    slot.spec_rows.push_back(s.row);
    slot.spec_logprobs.push_back(s.params->logprobs >= 0);
  }
  st.latest_specs = n;
  ++st.started;
}

int32_t* CudaSampler::token_buffer(int64_t n) {
  // Graphs record its address (TokenFeed): scratch() marks them stale when it moves.
  return static_cast<int32_t*>(dev_.scratch(st_->tokens, std::max<int64_t>(n, 1024) * int64_t(sizeof(int32_t))));
}

int CudaSampler::started() const { return st_->started; }

bool CudaSampler::ready() const {
  if (started() == 0) return true;
  const State& st = *st_;
  const SampleSlot& slot = st.slots[st.first];
  // An error is finish_sample's to report.
  return slot.spec_rows.empty() || cudaEventQuery(slot.done) != cudaErrorNotReady;
}

void CudaSampler::finish(std::vector<SampleResult>& out) {
  SERVAL_CHECK(started() > 0, "cuda sampler: finish_sample without a started sample");
  State& st = *st_;
  SampleSlot& slot = st.slots[st.first];
  st.first = (st.first + 1) % Backend::kMaxStartedSamples;
  --st.started;
  const size_t n = slot.spec_rows.size();
  out.assign(n, SampleResult{});
  if (n == 0) return;
  const cudaError_t err = cudaEventSynchronize(slot.done);
  if (err != cudaSuccess) {
    st.sent_to = nullptr;
    SERVAL_CUDA_CHECK(err);
  }

  // ---- results, in spec order
  const Result* results = static_cast<const Result*>(slot.host_out);
  for (size_t i = 0; i < n; ++i) {
    const int32_t k = slot.task_of_spec[i];
    const Result& r = results[k >= 0 ? k : slot.num_greedy + ~k];
    check_status(r, slot.vocab, slot.spec_rows[i]);
    out[i].token = r.token;
    if (slot.spec_logprobs[i]) {
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
