#pragma once
// Engine: the serving loop of DESIGN.md §1 on its own thread. It owns the
// scheduler and KV state (only the loop thread touches them, so they need no
// locks); other threads talk to it through submit()/abort(), which put work in
// a mutex-protected inbox, and read results from each request's channel.
//
// One loop iteration: drain inbox and aborts -> Scheduler::schedule ->
// copy-on-write block copies -> BatchBuilder -> ModelRunner::start_sample
// (the forward pass and one sample per logits row, queued on the runner's
// device) -> publish the previous step's RequestEvents (incremental, UTF-8
// safe text; stop strings held back and cut) and metrics while the device
// runs -> ModelRunner::finish_sample -> Scheduler::commit. A step's events thus
// go out during the next step: the host's detokenization and event pushes no
// longer leave the GPU idle. With async scheduling, a step's
// continuation (Scheduler::continue_plan: its decodes fed on the device, the
// next prompt chunks, new admissions) is started right after it, before its
// tokens are back, and is the step the next iteration finishes. A stop string
// found then ends its sample at the next commit; the token that step computed for it is neither published nor
// counted. A forward or sampling failure finishes that step's requests with
// an error event (Scheduler::fail_step); the engine keeps running.
//
// n > 1 samples: one scheduler request whose prompt is computed once, then
// forked into n sequences (see scheduler.h); each sample has its own text
// state here and its own events (RequestEvent::index). min_tokens: the
// sampler bans EOS and stop tokens while a sample's output is shorter.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/batch_builder.h"
#include "engine/constraints.h"
#include "engine/continuation_timer.h"
#include "engine/engine_metrics.h"
#include "engine/metrics.h"
#include "engine/output_processor.h"
#include "engine/request_output.h"
#include "kv/kv_cache_manager.h"
#include "runtime/model_runner.h"
#include "sampling/sampler.h"
#include "sched/scheduler.h"
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"

namespace serval {

struct EngineOptions {
  // max_model_len 0: the model's max_position.
  SchedulerConfig scheduler;
  bool enable_prefix_cache = true;
  std::string model_name = "serval";  // the metrics' model_name label
  // Tests: KvCacheManager::check_invariants() after every step; a violation
  // throws on the loop thread and so ends the process (slow: recounts the pool).
  bool check_invariants = false;
  // Async scheduling: a step is planned and queued while the one before it
  // runs, its decodes' tokens fed from that step's samples on the device
  // (Scheduler::continue_plan), so the device does not wait for the host
  // between steps. kAuto: on when the runner queues steps asynchronously (a
  // GPU); on a CPU the step would run before the one before is published.
  enum class AsyncScheduling { kAuto, kOn, kOff };
  AsyncScheduling async_scheduling = AsyncScheduling::kAuto;
  // With async scheduling: start a continuation shortly before the step it
  // continues is expected to end (ContinuationTimer), not when that step is
  // queued, so that requests arriving meanwhile join it, a step earlier.
  // Only while the scheduler could admit them (none waiting, seats free).
  bool late_continuations = true;
  // Speculative decoding (docs/SPECULATIVE.md): decode rows carry draft
  // tokens from this proposer, verified exactly (spec/verify.h). On, it
  // turns async scheduling off (drafts need the step before's tokens).
  SpeculativeConfig speculative;
  // Set: the proposer, instead of the one `speculative` names (the oracle
  // proposer of serval bench); speculative.num_tokens still bounds drafts.
  std::shared_ptr<Proposer> proposer;
};

// submit() refusals a server maps to distinct HTTP statuses (429 / 503);
// other refusals are plain serval::Error (bad request: 400).
class QueueFullError : public Error {
 public:
  using Error::Error;
};
class EngineStoppedError : public Error {
 public:
  using Error::Error;
};

struct EngineRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  // Samples of this prompt (OpenAI n): the prompt is computed once and its KV
  // blocks shared (copy-on-write); sample i draws from seed + i when a seed is set.
  // 1..128 (OpenAI's limit). Samples are scheduled, preempted and finished
  // independently; abort() ends them all.
  int32_t n = 1;
  // eos_token_ids are taken as given (the caller fills them from the tokenizer).
  StopCriteria stop;
  std::vector<std::string> stop_strings;  // end the text before the first match
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // in the text deltas
  RequestOptions options;           // priority, deadline
  // Structured output: every sample's text follows this grammar (its masker
  // holds the grammar and the tokenizer's vocabulary; share one per grammar:
  // it caches masks). Null: unconstrained.
  std::shared_ptr<const grammar::TokenMasker> grammar;
  // Whether its rows may carry draft tokens (with EngineOptions::speculative
  // on); the API's "speculative": false turns it off for the request.
  bool speculative = true;
};

class Engine {
 public:
  // `runner` and `tokenizer` must outlive the engine. Starts the loop thread.
  Engine(ModelRunner& runner, const Tokenizer& tokenizer, EngineOptions options = {});
  // shutdown().
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws serval::Error, queuing nothing, on bad sampling
  // parameters or stop criteria, an empty prompt, token ids outside the
  // vocabulary, a request that could never fit (context or KV pool), a full
  // waiting queue, or after shutdown. Thread-safe.
  RequestHandle submit(EngineRequest request);
  // Queues all or none of `requests` (the errors submit() throws), together:
  // the loop sees them in the same scheduling round. Thread-safe.
  std::vector<RequestHandle> submit_all(std::vector<EngineRequest> requests);
  // The checks submit() makes before queuing (all but the queue bound and
  // shutdown): throws serval::Error naming the problem. Thread-safe.
  void check(const EngineRequest& request) const;
  // The context and KV cache a request must fit (sched/request_fit.h); fixed
  // at construction.
  KvFitLimits fit_limits() const { return sched_.fit_limits(); }
  // Ends a request with a final kAbort event (no-op if unknown or finished).
  // Thread-safe.
  void abort(int64_t request_id);
  // Stops the loop; every unfinished request gets a final kAbort event.
  // Idempotent; thread-safe.
  void shutdown();

  // Thread-safe snapshots, updated by the loop before it publishes a step's events.
  KvUsage kv_usage() const;
  int64_t num_unfinished() const;
  // Whether steps are planned while the one before runs (EngineOptions::async_scheduling
  // resolved; off with speculative decoding).
  bool async_scheduling() const { return async_scheduling_; }

  metrics::Registry& metrics_registry() { return registry_; }

 private:
  struct Pending;   // a submitted request not yet handed to the scheduler
  using Outgoing = OutputProcessor::Outgoing;
  using SampleKey = OutputProcessor::SampleKey;
  using EventMap = OutputProcessor::EventMap;
  // What one iteration has to publish: made by admit() and step(), sent by
  // emit(), for a committed step while the next step runs.
  struct StepOutputs {
    IterationStats it;
    std::vector<Outgoing> out;            // admission errors
    std::vector<SampleKey> sampled_keys;  // the step's rows, then forks
    std::string error;                    // why the step failed ("" if it did not)
  };

  void loop();
  void admit(Pending& pending, IterationStats& it, std::vector<Outgoing>& out);
  // A plan started on the runner (or that failed to start: `error`).
  struct Started {
    // Declared, so that std::optional<Started> below sees a default
    // constructor while Engine is incomplete (clang does not, from the
    // member initializers alone).
    Started() {}
    StepPlan plan;
    std::vector<SampleKey> keys;  // its rows, then forks
    // Sampling specs of the keys: one per key, and one more per draft token
    // of a row (make_specs).
    size_t num_sample_specs = 0;
    // Rows with a draft that draw from their Rng: its state before the
    // draws, rewound after verification to the draws the kept tokens took.
    struct Rewind {
      size_t row = 0;
      Rng rng{0};
    };
    std::vector<Rewind> rewinds;
    // Prompt tokens it scores: specs after the keys' ones, in this order.
    struct Scored {
      int64_t id = -1;  // -1: the request is gone, its results are dropped
      int64_t first_position = 0;
      int32_t count = 0;
    };
    std::vector<Scored> scored;
    size_t num_scored = 0;     // their tokens, summed
    // A continuation with constrained rows: forwarded, its specs made and its
    // sampling started after the step before is committed.
    bool sampling_deferred = false;
    int64_t num_prompt_tokens = 0;
    std::string error;
    EngineClock::time_point queued;  // start() done: the device has all of it
  };
  // Schedules and starts a step (or takes the continuation started last
  // time), starts its continuation when it can, emits `previous` (if any)
  // while the device runs, then commits the step. True when a step was
  // committed: `now` is then emitted during the next step; otherwise it is
  // ready at once.
  bool step(StepOutputs& now, std::optional<StepOutputs>& previous);
  // Copies, builds and starts `s.plan` (a continuation's fed rows take their
  // tokens on the device); a failure goes to s.error. Requests first
  // scheduled now are so from `start_time`. A continuation with constrained
  // rows is only forwarded (s.sampling_deferred).
  void start(Started& s, EngineClock::time_point start_time, bool continuation);
  // Samples a forwarded continuation, once the step before it is committed.
  void start_deferred_sampling(Started& s);
  // The samples (keys) of `s` that draw under a grammar.
  size_t num_constrained(const Started& s) const;
  // specs_ (with masks_ and banned_) for `s`: its samples, then its scored prompt tokens.
  void make_specs(Started& s);
  // Appends to specs_ the specs scoring the prompt tokens of rows_.scored
  // (after_commit: the sequences found by key, see make_specs).
  void add_scoring_specs(Started& s, bool after_commit);
  // Waits for the tokens of `s` (one per sampling spec) and verifies its
  // drafts (`accepted`: tokens kept per row, Scheduler::commit); returns why
  // it failed, or "".
  std::string finish(const Started& s, std::vector<SampledToken>& sampled, std::vector<int32_t>& accepted);
  // The draft of a decode row (Scheduler::DraftFn).
  void draft(Sequence& seq, std::span<const int32_t> tokens, int32_t max_tokens);
  // finish(), then commits `s` (`appended`: the tokens the scheduler took)
  // or, when it failed, fails its requests; returns why it failed, or "".
  std::string settle(const Started& s, int64_t& appended);
  // Starts the continuation of `cur` into next_, when the scheduler makes one.
  void start_continuation(const Started& cur);
  // Emits `previous` and starts the continuation of `cur`, which the device
  // began at `device_start`: the continuation first, or late (see
  // EngineOptions::late_continuations), taking the requests that arrived.
  // True when a continuation was started late.
  bool continue_while_running(const Started& cur, EngineClock::time_point device_start, StepOutputs& now,
                              const std::function<void()>& emit_previous);
  // Admits the submitted requests and applies the aborts asked for.
  void take_inbox(StepOutputs& now);
  // The waiting queue's length for submit()'s bound, as it is now.
  void refresh_waiting();
  // Takes the tokens of a continuation still in flight and commits it (the
  // loop is ending).
  void finish_continuation();
  // Events of the samples `o` sampled (a stop string ends one), final events
  // of finished sequences, then publish().
  void emit(StepOutputs& o);
  // Final events for the scheduler's finished sequences.
  void drain_finished(EventMap& events, IterationStats& it, const std::string& error);
  // Records metrics, updates the snapshots, then pushes the events.
  void publish(EventMap& events, std::vector<Outgoing>& out, const IterationStats& it);
  // Scheduler and KV state for the gauges; the prefix-cache counts since the last call.
  SchedulerStats scheduler_stats(const KvUsage& usage);
  void abort_everything();

  ModelRunner& runner_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  int64_t vocab_size_;
  metrics::Registry registry_;
  EngineMetrics metrics_;

  // Loop thread only.
  KvCacheManager kv_;
  Scheduler sched_;
  BatchBuilder batch_builder_;
  Batch batch_;
  // One step's sampling: a spec per sample (pointing into the sequences and
  // banned_), and its results. Kept across steps to reuse their memory.
  std::vector<SampleSpec> specs_;
  std::vector<std::vector<int32_t>> banned_;
  std::vector<std::vector<int32_t>> spec_outputs_;  // a draft position's output: output + draft before it
  std::shared_ptr<Proposer> proposer_;  // null: no speculative decoding
  std::vector<Constraints::Job> mask_jobs_;  // make_specs' masks, filled together
  StepRows rows_;                          // which logits rows sample, which score
  Constraints constraints_;                // grammar state of constrained samples
  std::vector<uint32_t> masks_;            // this start's allowed-token masks, a block per constrained spec
  std::vector<SamplingParams> score_params_;  // of the scoring specs, one per scored run
  std::vector<SampleResult> results_;
  OutputProcessor outputs_;  // the requests in the scheduler, as their clients see them
  bool async_scheduling_ = false;
  std::optional<Started> next_;  // a continuation started and not yet committed
  ContinuationTimer continuation_timer_;
  EngineClock::time_point last_done_;  // when the last step's tokens came back
  bool last_done_waited_ = false;      // the host was waiting for them: the step ended then
  PrefixCacheStats last_prefix_stats_;

  // Shared with submitting threads, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Pending>> inbox_;
  std::vector<int64_t> aborts_;
  bool stopping_ = false;
  int64_t num_waiting_snapshot_ = 0;
  int64_t num_unfinished_ = 0;  // submitted, final event not yet published
  KvUsage kv_usage_snapshot_;
  int64_t next_id_ = 0;

  std::mutex join_mutex_;
  std::thread thread_;
};

}  // namespace serval
