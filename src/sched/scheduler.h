#pragma once
// Scheduler: continuous batching over the paged KV cache (DESIGN.md §3).
//
// One rule covers prefill, chunked prefill and decode: each step a request
// gets min(remaining, budget) tokens, remaining = num_tokens -
// num_computed_tokens. Per step, schedule(now):
//   1. finishes (kTimeout) every request past its deadline, waiting or running;
//   2. running requests, highest priority first: each gets its tokens and KV
//      slots; when blocks run out, the lowest-priority, latest-arrived running
//      request is preempted (blocks freed, computed tokens forgotten, back to
//      waiting; recomputed later, possibly from the prefix cache);
//   3. waiting requests in (priority, arrival) order while the token budget,
//      max_num_seqs and the KV pool allow (none in a step that preempted;
//      with static_batching, none while anything is running);
//      admission looks up the prefix cache first.
// A prompt whose tokens are scored (prompt_logprobs) is computed whole, never
// taken from the prefix cache (a cached token has no logits), in chunks of at
// most max_scored_rows tokens a step for all such prompts together; its
// blocks still enter the cache for others.
// The engine then copies plan.copies, builds the Batch from plan.items
// (BatchBuilder), runs the forward, samples one token per plan.sample_rows
// entry (the Batch's logits rows, same order) and calls commit().
//
// An engine loop step:
//   StepPlan plan = sched.schedule();
//   runner.copy_blocks(plan.copies);
//   batch_builder.build(plan.items, batch); runner.forward(batch, logits);
//   for (row, seq in plan.sample_rows) sampled[row] = sampler.sample(..., seq->rng());
//   sched.commit(plan, sampled);      // or sched.fail_step(plan) if it threw
//   for (Sequence& s : sched.take_finished()) publish(s);
//
// n > 1 samples (Sequence::set_num_samples before add): the prompt is
// computed once; in the step that completes it, schedule() forks the other
// samples (plan.forks), which share the prompt's KV blocks (copy-on-write of
// the partial last block when they append) and draw their first token from
// their parent's logits row. From then on each sample is a sequence of its
// own, keyed by (id, sample_index): scheduled, preempted (recomputing prompt
// + its own output) and finished alone; abort(id) ends them all. Admission
// reserves max_num_seqs seats for the samples still to fork.
//
// Continuation (async scheduling): while a plan is in flight, continue_plan()
// may plan the step after it, from where that plan leaves its sequences:
// every sample row and fork of the plan computes the token the plan samples
// for it (not on the host yet: the engine feeds it on the device,
// Batch::token_source), a prompt chunk is followed by the next chunk, and
// waiting requests are admitted into what budget, seats and KV blocks are
// left, forking their samples when their prompt completes, as schedule()
// would; so the device never waits for the host between steps. Only when
// everything running is in the plan, with no penalties on a row it
// continues unless the sampler counts the fed token
// (SchedulerConfig::fed_penalties), blocks enough without preempting, and
// no expired deadline while a schedule() plan is in flight; otherwise
// schedule() plans the step after the commit. A sequence aborted at the
// plan's commit is not continued. A waiting request whose prompt shares
// blocks the plan is computing waits a step for them to enter the prefix
// cache. A row that surely finishes by length at the plan's commit is left
// out; one that stops at that commit (EOS, a stop token), or is aborted or
// expires while only continuations are in flight, is computed once more for
// nothing: the continuation's commit drops its token.
//
// Speculative decoding (set_drafter): a running request about to decode one
// token (its last known token uncomputed) may carry draft tokens
// (Sequence::draft_ids), asked of the drafter as it is scheduled; the
// step computes its last token and the d draft tokens (vLLM v1's rule:
// num_tokens counts the draft for the step). The draft never goes past
// max_tokens or the context (the step appends at most d + 1 tokens), nor
// takes KV blocks it would have to preempt for: it is shortened first.
// Draft tokens take logits rows: a step's drafts and scored prompt tokens
// together stay within max_scored_rows.
// commit() appends the accepted tokens, keeps num_computed_tokens to the
// last known token and the accepted draft, releases the slots (and emptied
// blocks) of the rejected ones, and only then offers full blocks to the
// prefix cache, so a rejected token is never cached. A plan with drafts is
// not continued (continue_plan): the next step needs its tokens on the
// host. Preemption drops the draft.
//
// Priority: lower value = more important (as vLLM). Ties go by arrival; a
// preempted request keeps its place (its arrival), ahead of later arrivals.
// Engine loop thread only: no locks.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/request_fit.h"
#include "sched/sequence.h"

namespace serval {

using SchedulerClock = std::chrono::steady_clock;

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // tokens per step (the chunk budget)
  int64_t max_num_seqs = 256;             // running requests at once
  int64_t max_queued_requests = 4096;     // waiting requests; add() refuses beyond
  int64_t max_model_len = 0;              // context length; 0: unlimited
  // Static batching, the baseline continuous batching is measured against
  // (bench/batching_bench.cpp): waiting requests are admitted only in a step
  // where nothing is running, so a batch is what one step admits and it
  // drains completely before the next one starts. Off: continuous batching.
  bool static_batching = false;
  // Whether the sampler counts a row's fed token (SampleSpec::fed_source) in
  // its penalties, so that continue_plan may continue rows with penalties.
  // The engine sets it from its runner (ModelRunner::counts_fed_tokens).
  bool fed_penalties = false;
  // Sliding-window attention (the model's widest window; 0: none, or some
  // layer reads everything): KV blocks wholly behind every layer's window
  // are released as a sequence's tokens are computed. Needs the prefix cache
  // off. The engine sets it from its runner (ModelRunner::attention_window).
  int64_t kv_window = 0;
  // Prompt tokens scored per step (SamplingParams::prompt_logprobs: a
  // logits row each): chunks of prompts being scored are cut to fit. The
  // engine sets it from its runner (ModelRunner::max_scored_rows).
  int64_t max_scored_rows = 256;
  // Throws serval::Error naming the bad field.
  void validate() const;
};

// How a request is ordered and when it gives up.
struct RequestOptions {
  int32_t priority = 0;  // lower first
  std::optional<SchedulerClock::time_point> deadline;
};

// The next num_new_tokens uncomputed tokens of a sequence, from position
// `start` (-1: its num_computed_tokens, as when a test builds one; the
// scheduler always sets it: a continuation's chunks start past what the plan
// in flight computes); BatchBuilder (engine/) turns a list of these into a
// Batch.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;
  int64_t start = -1;
  // >= 0: one token at position seq->num_tokens(), not on the host yet: the
  // one the plan before samples for its logits row `source_row` (fed on the
  // device, Batch::token_source). -1: the tokens are the sequence's own.
  int32_t source_row = -1;

  int64_t first() const { return start >= 0 ? start : seq->num_computed_tokens(); }
  bool fed() const { return source_row >= 0; }
};

// What one step computes. Items point at sequences the scheduler owns; they
// stay valid until commit().
struct StepPlan {
  std::vector<ScheduledChunk> items;  // in batch order
  // The items whose step ends at their last known token, i.e. the Batch's
  // logits rows in order: one sampled token each goes to commit().
  std::vector<Sequence*> sample_rows;
  // Samples forked this step (n > 1) from sample_rows[row], whose prompt
  // this step completes: each samples its first token from that logits row
  // with its own Rng; commit() takes their tokens after the rows' ones.
  struct Fork {
    Sequence* seq = nullptr;
    int32_t row = 0;
  };
  std::vector<Fork> forks;
  // Draft tokens of sample_rows[i] (their tokens: its draft_ids()); shorter
  // than sample_rows when the rest carry none.
  std::vector<int32_t> num_draft;
  int32_t draft_of(size_t row) const { return row < num_draft.size() ? num_draft[row] : 0; }
  bool has_drafts() const {
    for (int32_t d : num_draft)
      if (d > 0) return true;
    return false;
  }
  // KV block copies (src, dst) to make before the forward (copy-on-write).
  std::vector<std::pair<int32_t, int32_t>> copies;
  // A continue_plan() plan: commit() finds its sequences by key (request
  // id, sample index), `item_keys` for items, `row_keys` for sample_rows and
  // `fork_keys` for forks, since a sequence may have finished since.
  bool continuation = false;
  std::vector<std::pair<int64_t, int32_t>> item_keys;
  std::vector<std::pair<int64_t, int32_t>> row_keys;
  std::vector<std::pair<int64_t, int32_t>> fork_keys;
  // Requests the scheduler finished itself this step (deadline: kTimeout).
  std::vector<int64_t> finished;
  int64_t num_tokens = 0;       // scheduled tokens, <= max_num_batched_tokens
  int64_t num_preempted = 0;    // preemptions during this step

  bool empty() const { return items.empty(); }
};

struct SampledToken {
  int32_t token = -1;
  std::optional<Logprobs> logprobs;
};

struct SchedulerCounts {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_preemptions = 0;        // total since construction
  int64_t prefix_query_tokens = 0;    // from the KV cache's counters
  int64_t prefix_hit_tokens = 0;
};

class Scheduler {
 public:
  // Fills seq.draft_ids() with at most max_tokens draft tokens (>= 1) to
  // follow `tokens` (its prompt and output), or leaves it empty.
  using DraftFn = std::function<void(Sequence& seq, std::span<const int32_t> tokens, int32_t max_tokens)>;

  // `kv` must outlive the scheduler; the scheduler is its only user.
  Scheduler(SchedulerConfig config, KvCacheManager& kv);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new sequence (no tokens computed, empty block table). Throws
  // serval::Error, leaving the scheduler unchanged, when the waiting queue is
  // full, the id is already known, or the request could never fit: prompt +
  // max_tokens beyond max_model_len, or more KV blocks than the whole pool.
  void add(Sequence seq, RequestOptions options = {});

  // Speculative decoding (see the top of this file): decode rows ask `drafter`
  // for drafts of at most max_draft tokens. Unset (the default): none.
  void set_drafter(DraftFn drafter, int32_t max_draft);

  // Plans the next step (see the top of this file). No plan may be in flight.
  StepPlan schedule(SchedulerClock::time_point now = SchedulerClock::now());
  // With `plan` (from schedule() or continue_plan()) the only plan in flight:
  // the step after it, or an empty plan when it cannot be continued (see the
  // top of this file). Allocates the KV slots it needs (never preempts).
  StepPlan continue_plan(const StepPlan& plan, SchedulerClock::time_point now = SchedulerClock::now());

  // After the forward and sampling of `plan`: advances computed tokens,
  // caches newly written full blocks, appends `sampled` (one per
  // plan.sample_rows entry, same order, then one per plan.forks entry),
  // applies stop criteria and frees finished sequences' blocks. Throws on a
  // size mismatch. Returns the tokens appended (a continuation drops those of
  // rows that finished at the commit before).
  // A row with d draft tokens has 1 + d entries in `sampled` (one per
  // position) of which the first accepted[row] (1..1 + d, spec/verify.h) are
  // its new tokens; `accepted` is empty or has an entry per sample row.
  int64_t commit(const StepPlan& plan, std::span<SampledToken> sampled, std::span<const int32_t> accepted = {});

  // When the forward or sampling of `plan` failed (commit() will not come):
  // finishes every request of the plan with kError and frees its blocks; the
  // engine reports its message. Other requests go on at the next schedule().
  void fail_step(const StepPlan& plan);

  // Ends a waiting or running request (all its samples) with kAbort and
  // frees its blocks; false if the id is unknown or already finished. While
  // a schedule() plan is in flight (it points at its sequences), it takes
  // effect at that plan's commit(); while only continuations are (they find
  // theirs by key), at once.
  bool abort(int64_t id);
  // The same for one sample of a request (e.g. a stop string ended it).
  bool abort_sample(int64_t id, int32_t sample_index);

  // Finished sequences (stop, length, timeout, abort) since the last call,
  // in finishing order; the scheduler forgets them.
  std::vector<Sequence> take_finished();

  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  SchedulerCounts stats() const;
  const SchedulerConfig& config() const { return config_; }
  // What add() holds a request to (sched/request_fit.h); Engine::check too.
  KvFitLimits fit_limits() const;
  // A request's sample still in the scheduler (waiting or running), or nullptr.
  const Sequence* find(int64_t id, int32_t sample_index = 0) const;
  Sequence* find(int64_t id, int32_t sample_index = 0);

 private:
  struct Entry;
  using Key = std::pair<int64_t, int32_t>;  // (request id, sample index)
  static Key key_of(const Sequence& seq) { return {seq.id(), seq.sample_index()}; }

  void check_fits(const Sequence& seq) const;
  void kv_computed(Sequence& seq, std::span<const int32_t> tokens);
  void insert_waiting(Entry* e);
  void insert_running(Entry* e);
  // Schedules running request e, preempting others (or e itself) for blocks;
  // false if e was preempted.
  bool schedule_running(Entry* e, int64_t& budget, StepPlan& plan);
  // Tokens of `seq` to compute from position `from` within `budget`; a
  // prompt being scored also within the scored rows left this step.
  int64_t chunk_tokens(const Sequence& seq, int64_t from, int64_t budget) const;
  // Counts a chunk of n tokens of `seq` against the scored rows left.
  void take_scored_rows(const Sequence& seq, int64_t n);
  // Admits waiting requests into plan. With `in_flight` (a continuation of
  // it): none while in_flight computes blocks of its prompt that the prefix
  // cache does not have yet, nor one its commit aborts.
  void admit_waiting(int64_t& budget, StepPlan& plan, const StepPlan* in_flight = nullptr);
  // Whether `in_flight` computes a whole block of e's prompt past the
  // `cached` tokens the prefix cache holds: admitted now, e would compute it
  // again; after the commit it finds it cached.
  bool computes_uncached_prefix(const StepPlan& in_flight, const Entry& e, int64_t cached);
  // Forks the pending samples of plan.sample_rows (their prompt completes).
  void fork_samples(StepPlan& plan);
  // Ends one entry now, or at commit() while a plan is in flight.
  void abort_entry(const Key& key);
  // The key of a plan's i-th item / sample row / fork: a continuation's are
  // stored (its sequences may have finished since), others from the sequence.
  static Key item_key(const StepPlan& plan, size_t i);
  static Key row_key(const StepPlan& plan, size_t i);
  static Key fork_key(const StepPlan& plan, size_t i);
  // The entry of a key, nullptr when it has finished.
  Entry* find_entry(const Key& key);
  // Whether abort() of this sample waits for the plan in flight's commit.
  bool abort_pending(const Key& key) const;
  void preempt(Entry* e);
  // The draft of running request e, decoding one token, within `budget` and
  // its max_tokens and context; empties it when none.
  void propose_draft(Entry* e, int64_t budget);
  // Appends row `row`'s accepted tokens of `sampled` and rolls back the rest
  // of its draft; returns the tokens appended.
  int64_t commit_draft_row(Entry* e, std::span<SampledToken> sampled, int32_t accepted);
  // Frees e's blocks, moves its sequence to finished_ and forgets it.
  void retire(Entry* e);
  void apply_pending_aborts();
  void expire_deadlines(SchedulerClock::time_point now, StepPlan& plan);

  SchedulerConfig config_;
  KvCacheManager& kv_;
  DraftFn drafter_;
  int32_t max_draft_ = 0;
  std::map<Key, std::unique_ptr<Entry>> entries_;
  std::deque<Entry*> waiting_;  // sorted by (priority, arrival)
  std::vector<Entry*> running_;  // sorted by (priority, arrival)
  std::vector<Sequence> finished_;
  std::vector<Key> pending_aborts_;  // abort() while a plan is in flight
  // Copy-on-write copies of slots allocated for a plan that was not made
  // (continue_plan gave up): the next plan made makes them first.
  std::vector<std::pair<int32_t, int32_t>> unused_copies_;
  int in_flight_ = 0;  // plans scheduled and not yet committed (or failed)
  int64_t scored_rows_left_ = 0;  // of the plan being made (max_scored_rows)
  bool scheduled_in_flight_ = false;  // one of them is schedule()'s
  uint64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace serval
