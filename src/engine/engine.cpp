#include "engine/engine.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <optional>

#include "core/error.h"
#include "sched/request_fit.h"
#include "sched/stop_strings.h"
#include "spec/verify.h"

namespace serval {
namespace {

// As OpenAI's API.
constexpr int32_t kMaxSamples = 128;

// The scheduler's settings that come from the runner.
EngineOptions with_runner_limits(EngineOptions o, const ModelRunner& runner) {
  if (o.scheduler.max_model_len == 0) o.scheduler.max_model_len = runner.config().max_position;
  o.scheduler.fed_penalties = runner.counts_fed_tokens();
  o.scheduler.max_scored_rows = runner.max_scored_rows();
  // Blocks behind a sliding window are released as sequences grow; the
  // prefix cache, which keeps whole prefixes, is off for such models.
  o.scheduler.kv_window = runner.attention_window();
  if (o.scheduler.kv_window > 0) o.enable_prefix_cache = false;
  return o;
}

// The scheduler's queue bound is the engine's, enforced at submit() on what
// the submitting threads can see (the waiting queue as of the last step, the
// inbox): the scheduler must not refuse a request the engine accepted
// (preemptions may lengthen the queue between the two).
SchedulerConfig unbounded_queue(SchedulerConfig c) {
  c.max_queued_requests = std::numeric_limits<int64_t>::max();
  return c;
}

}  // namespace

struct Engine::Pending {
  int64_t id = -1;
  EngineRequest request;
  std::shared_ptr<RequestChannel> channel;
  EngineClock::time_point arrival;
  std::optional<StopStringMatcher> stops;
};

Engine::Engine(ModelRunner& runner, const Tokenizer& tokenizer, EngineOptions options)
    : runner_(runner),
      tokenizer_(tokenizer),
      options_(with_runner_limits(std::move(options), runner)),
      vocab_size_(runner.config().vocab_size),
      registry_(metrics::Labels{{"model_name", options_.model_name}}),
      metrics_(registry_, options_.scheduler.max_model_len),
      kv_(runner.num_blocks(), runner.block_size(), options_.enable_prefix_cache),
      sched_(unbounded_queue(options_.scheduler), kv_),
      batch_builder_(runner.block_size()),
      constraints_(runner.config().vocab_size),
      outputs_(tokenizer, metrics_) {
  options_.speculative.validate();
  proposer_ = options_.proposer ? options_.proposer : std::shared_ptr<Proposer>(make_proposer(options_.speculative));
  // Drafts are made on the host from the tokens of the step before, which
  // a continuation does not wait for: with speculation every step is
  // planned after the commit of the one before.
  using A = EngineOptions::AsyncScheduling;
  async_scheduling_ = !proposer_ && (options_.async_scheduling == A::kOn ||
                                     (options_.async_scheduling == A::kAuto && runner.queues_steps_async()));
  if (proposer_)
    sched_.set_drafter([this](Sequence& seq, std::span<const int32_t> tokens,
                              int32_t max_tokens) { draft(seq, tokens, max_tokens); },
                       options_.speculative.num_tokens);
  kv_usage_snapshot_ = kv_.usage();
  // The gauges hold the idle pool from the first scrape, not from the first step.
  metrics_.record(scheduler_stats(kv_usage_snapshot_));
  metrics_.set_cache_config(runner.block_size(), runner.num_blocks(), options_.enable_prefix_cache);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  std::lock_guard<std::mutex> join_lock(join_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::check(const EngineRequest& request) const {
  request.params.validate();
  request.stop.validate();
  for (const auto& [id, bias] : request.params.logit_bias)
    SERVAL_CHECK(id < vocab_size_, "logit_bias: token id ", id, " is outside the vocabulary [0, ", vocab_size_, ")");
  SERVAL_CHECK(request.n >= 1 && request.n <= kMaxSamples, "n must be in [1, ", kMaxSamples,
               "], got ", request.n);
  const auto& prompt = request.prompt_ids;
  SERVAL_CHECK(!prompt.empty(), "the prompt is empty (no tokens)");
  for (int32_t id : prompt)
    SERVAL_CHECK(id >= 0 && id < vocab_size_, "prompt token id ", id,
                 " is outside the vocabulary [0, ", vocab_size_, ")");
  // The scheduler's admission check, made here so that submit() can refuse.
  check_request_fits(sched_.fit_limits(), int64_t(prompt.size()), request.stop.max_tokens, "");

  if (request.grammar)
    SERVAL_CHECK(request.grammar->vocab().size() <= vocab_size_, "the grammar's vocabulary of ",
                 request.grammar->vocab().size(), " tokens is larger than the model's ", vocab_size_);
  // Stop strings are checked by their matcher (e.g. an empty one).
  if (!request.stop_strings.empty())
    (void)StopStringMatcher(request.stop_strings, request.include_stop_str_in_output);
}

RequestHandle Engine::submit(EngineRequest request) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  return std::move(submit_all(std::move(one)).front());
}

std::vector<RequestHandle> Engine::submit_all(std::vector<EngineRequest> requests) {
  for (const EngineRequest& r : requests) check(r);
  std::vector<std::unique_ptr<Pending>> pendings;
  pendings.reserve(requests.size());
  for (EngineRequest& request : requests) {
    auto pending = std::make_unique<Pending>();
    if (!request.stop_strings.empty())
      pending->stops.emplace(request.stop_strings, request.include_stop_str_in_output);
    pending->request = std::move(request);
    pending->channel = std::make_shared<RequestChannel>(pending->request.n);
    pending->arrival = EngineClock::now();
    pendings.push_back(std::move(pending));
  }
  std::vector<RequestHandle> handles;
  handles.reserve(pendings.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw EngineStoppedError("the engine is shut down");
    const int64_t queued = num_waiting_snapshot_ + int64_t(inbox_.size());
    if (queued + int64_t(pendings.size()) > options_.scheduler.max_queued_requests)
      throw QueueFullError(str_cat("request refused: the waiting queue is full (", queued, " requests",
                                   pendings.size() > 1 ? str_cat(", ", pendings.size(), " more asked") : "",
                                   ", max_queued_requests ", options_.scheduler.max_queued_requests, ")"));
    for (auto& pending : pendings) {
      pending->id = next_id_++;
      handles.emplace_back(pending->id, pending->channel);
      inbox_.push_back(std::move(pending));
      ++num_unfinished_;
    }
  }
  cv_.notify_all();
  return handles;
}

void Engine::abort(int64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborts_.push_back(request_id);
  }
  cv_.notify_all();
}

KvUsage Engine::kv_usage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kv_usage_snapshot_;
}

int64_t Engine::num_unfinished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_unfinished_;
}

void Engine::loop() {
  std::optional<StepOutputs> done;  // the last committed step's, emitted during the next
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Sleep while idle; when work is in flight, pick up the inbox and go on.
      if (!sched_.has_unfinished() && !done)
        cv_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !aborts_.empty(); });
      if (stopping_) break;
    }
    StepOutputs now;
    take_inbox(now);
    const bool committed = step(now, done);
    if (options_.check_invariants) kv_.check_invariants();
    if (committed)
      done = std::move(now);
    else
      emit(now);
  }
  finish_continuation();
  if (done) emit(*done);
  abort_everything();
}

void Engine::take_inbox(StepOutputs& now) {
  std::vector<std::unique_ptr<Pending>> inbox;
  std::vector<int64_t> aborts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox.swap(inbox_);
    aborts.swap(aborts_);
  }
  for (auto& p : inbox) admit(*p, now.it, now.out);
  for (int64_t id : aborts) sched_.abort(id);
  if (!inbox.empty()) refresh_waiting();  // they left the inbox for the scheduler's queue
}

void Engine::admit(Pending& p, IterationStats& it, std::vector<Outgoing>& out) {
  EngineRequest& r = p.request;
  const OutputProcessor::NewRequest out_req{.id = p.id,
                                            .channel = p.channel,
                                            .n = r.n,
                                            .skip_special_tokens = r.skip_special_tokens,
                                            .want_logprobs = r.params.logprobs >= 0,
                                            .prompt_logprobs = r.params.prompt_logprobs,
                                            .num_prompt_tokens = int64_t(r.prompt_ids.size()),
                                            .max_tokens = r.stop.max_tokens,
                                            .arrival = p.arrival,
                                            .stops = &p.stops};
  try {
    Sequence seq(p.id, std::move(r.prompt_ids), r.params, r.stop, kv_.new_table());
    seq.set_num_samples(r.n);
    seq.set_speculative(r.speculative);
    sched_.add(std::move(seq), r.options);
  } catch (const std::exception& e) {
    for (int32_t i = 0; i < r.n; ++i) {
      RequestEvent ev;
      ev.request_id = p.id;
      ev.index = i;
      ev.finish = FinishReason::kError;
      ev.error = e.what();
      ev.timings.arrival = p.arrival;
      ev.timings.finish = EngineClock::now();
      out.push_back({p.channel, std::move(ev), i + 1 == r.n});
    }
    return;
  }
  it.n_params.push_back(r.n);
  outputs_.add(out_req);
  if (r.grammar) constraints_.add(p.id, r.grammar);
}

bool Engine::step(StepOutputs& now, std::optional<StepOutputs>& previous) {
  auto emit_previous = [&] {
    if (!previous) return;
    emit(*previous);
    previous.reset();
  };
  Started cur;
  IterationStats& it = now.it;
  // When the device began the step (it runs steps in the order queued):
  // when it was queued, or when the step before ended, which the host knows
  // only if it was waiting for that step's tokens then.
  EngineClock::time_point device_start;
  if (next_) {
    cur = std::move(*next_);
    next_.reset();
    device_start = std::max(cur.queued, last_done_);
  } else {
    const auto start_time = EngineClock::now();
    cur.plan = sched_.schedule(start_time);
    refresh_waiting();
    it.num_preemptions = cur.plan.num_preempted;
    if (cur.plan.empty()) {
      emit_previous();
      if (cur.plan.finished.empty() && sched_.has_unfinished()) {
        // Nothing could be scheduled (should be rare): do not spin.
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait_for(lock, std::chrono::milliseconds(1));
      }
      return false;
    }
    start(cur, start_time, /*continuation=*/false);
    device_start = std::max(start_time, last_done_);
  }
  const bool start_known = device_start > last_done_ || last_done_waited_;
  it.num_prompt_tokens += cur.num_prompt_tokens;
  // While the device runs the step. Stop strings found by emit_previous end
  // their samples at this step's commit (the scheduler holds aborts while a
  // step is in flight).
  bool delayed = false;
  if (async_scheduling_ && cur.error.empty())
    delayed = continue_while_running(cur, device_start, now, emit_previous);
  else
    emit_previous();
  // Only late continuations read the steps' times.
  const bool timed = async_scheduling_ && options_.late_continuations;
  // Not ready: the host waits, and the tokens come when the device is done.
  const bool waited = timed && !runner_.sample_ready();
  now.error = settle(cur, it.num_generation_tokens);
  // A step's time is known when the host knows when it began and waited for its end.
  if (timed && now.error.empty() && (start_known || !waited))
    continuation_timer_.step_done(device_start, cur.plan.num_tokens, last_done_, waited, delayed);
  last_done_waited_ = waited;
  if (!now.error.empty()) {
    if (next_) {  // its rows were this step's: they failed with it
      std::vector<SampledToken> ignored;
      std::vector<int32_t> no_drafts;
      if (!next_->sampling_deferred) finish(*next_, ignored, no_drafts);
      sched_.fail_step(next_->plan);
      next_.reset();
    }
    return false;
  }
  // The continuation's masks follow the tokens just committed.
  if (next_ && next_->sampling_deferred) start_deferred_sampling(*next_);
  now.sampled_keys = std::move(cur.keys);
  return true;
}

void Engine::start(Started& s, EngineClock::time_point start_time, bool continuation) {
  const StepPlan& plan = s.plan;
  for (const Sequence* seq : plan.sample_rows) s.keys.emplace_back(seq->id(), seq->sample_index());
  for (const StepPlan::Fork& f : plan.forks) s.keys.emplace_back(f.seq->id(), f.seq->sample_index());
  for (const ScheduledChunk& c : plan.items) {
    if (c.fed()) continue;
    // Before its first chunk is computed, a request's computed tokens are
    // exactly its prefix-cache hit.
    outputs_.scheduled(c.seq->id(), start_time, c.seq->num_computed_tokens());
    const int64_t prompt_left = c.seq->num_prompt_tokens() - c.first();
    s.num_prompt_tokens += std::clamp<int64_t>(prompt_left, 0, c.num_new_tokens);
  }
  try {
    if (!plan.copies.empty()) runner_.copy_blocks(plan.copies);
    batch_builder_.build(plan.items, batch_, &rows_);
    SERVAL_CHECK(rows_.sampled.size() == plan.sample_rows.size(), "batch builder made ", rows_.sampled.size(),
                 " sampling rows for ", plan.sample_rows.size(), " sampled sequences");
    // A continuation's constrained rows are masked after the tokens of the
    // step before are known (its commit): their forward pass is queued now,
    // their sampling then (start_deferred_sampling).
    if (continuation && num_constrained(s) > 0) {
      runner_.start_forward(batch_);
      s.sampling_deferred = true;
    } else {
      make_specs(s);
      runner_.start_sample(batch_, specs_);
    }
    s.queued = EngineClock::now();
  } catch (const std::exception& e) {
    s.error = e.what();
  }
}

size_t Engine::num_constrained(const Started& s) const {
  return size_t(std::count_if(s.keys.begin(), s.keys.end(), [&](const SampleKey& k) { return constraints_.has(k.first); }));
}

void Engine::start_deferred_sampling(Started& s) {
  try {
    make_specs(s);
    s.sampling_deferred = false;
    runner_.start_sampling(specs_);
  } catch (const std::exception& e) {
    s.sampling_deferred = false;
    s.error = e.what();
  }
}

void Engine::make_specs(Started& s) {
  const StepPlan& plan = s.plan;
  const size_t num_rows = plan.sample_rows.size();
  // After the commit before (deferred sampling), a continuation's samples are
  // found by key: one may have finished since, and its sequence moved. Its
  // row is then sampled for nothing (the commit drops it).
  const bool after_commit = s.sampling_deferred;
  auto sample = [&](size_t i) -> Sequence* {
    if (after_commit) return sched_.find(s.keys[i].first, s.keys[i].second);
    return i < num_rows ? plan.sample_rows[i] : plan.forks[i - num_rows].seq;
  };
  static const SamplingParams kDropped;  // greedy
  // One spec per sample; a forked sample draws from its parent's row. The
  // draws are made here, from each request's Rng, so that a seed picks the
  // same token on every backend. A fed row's output is one token longer by
  // the time it samples (that token is being sampled now), except after the
  // commit before, which appended it.
  size_t num_specs = s.keys.size();
  for (int32_t d : plan.num_draft) num_specs += size_t(d);
  s.num_sample_specs = num_specs;
  s.rewinds.clear();
  specs_.resize(num_specs);
  banned_.resize(num_specs);
  spec_outputs_.resize(num_specs);
  // The masks first (the specs point into them), a block per constrained spec.
  const size_t words = constraints_.mask_words();
  masks_.resize(num_constrained(s) * words);
  size_t mask_at = 0;
  mask_jobs_.clear();
  const auto masks_start = EngineClock::now();
  size_t k = 0;  // the spec being made
  for (size_t i = 0; i < s.keys.size(); ++i) {
    const int32_t first_row = rows_.sampled[i < num_rows ? i : size_t(plan.forks[i - num_rows].row)];
    Sequence* seq = sample(i);
    if (seq == nullptr || seq->finished()) {
      SampleSpec& spec = specs_[k];
      spec = SampleSpec{};
      spec.row = first_row;
      banned_[k++].clear();
      spec.params = &kDropped;
      if (constraints_.has(s.keys[i].first)) mask_at += words;
      continue;
    }
    const int32_t row = i < num_rows ? batch_.logits_rows[size_t(first_row)] : -1;
    const bool fed = row >= 0 && !batch_.token_source.empty() && batch_.token_source[size_t(row)] >= 0;
    const int32_t fed_source = fed && !after_commit ? batch_.token_source[size_t(row)] : -1;
    // A row with a draft samples at each of its 1 + d positions, position j
    // as if the first j draft tokens were output (spec/verify.h).
    const int32_t d = i < num_rows ? plan.draft_of(i) : 0;
    const bool greedy = seq->params().greedy();
    if (d > 0 && !greedy) s.rewinds.push_back({i, seq->rng()});
    for (int32_t j = 0; j <= d; ++j, ++k) {
      SampleSpec& spec = specs_[k];
      spec = SampleSpec{};
      spec.row = first_row + j;
      spec.fed_source = fed_source;
      banned_[k] = seq->stop().banned_tokens(int64_t(seq->output_ids().size()) + (fed_source >= 0) + j);
      spec.params = &seq->params();
      spec.prompt_ids = seq->prompt_ids();
      if (j == 0) {
        spec.output_ids = seq->output_ids();
      } else {
        std::vector<int32_t>& out = spec_outputs_[k];
        out.assign(seq->output_ids().begin(), seq->output_ids().end());
        out.insert(out.end(), seq->draft_ids().begin(), seq->draft_ids().begin() + j);
        spec.output_ids = out;
      }
      spec.banned = banned_[k];
      spec.uniform = greedy ? 0.0 : seq->rng().uniform();
      // The drafter leaves constrained samples alone: d == 0 here.
      if (constraints_.has(seq->id())) {
        const std::span<uint32_t> mask(masks_.data() + mask_at, words);
        mask_at += words;
        mask_jobs_.push_back({seq, mask});
        spec.allowed = mask;
      }
    }
  }
  const size_t masks_made = mask_jobs_.size();
  if (masks_made > 0) {
    constraints_.fill_all(mask_jobs_);
    mask_jobs_.clear();
    metrics_.structured_output_masks_total.inc(double(masks_made));
    metrics_.structured_output_mask_seconds_total.inc(
        std::chrono::duration<double>(EngineClock::now() - masks_start).count());
  }
  add_scoring_specs(s, after_commit);
}

void Engine::add_scoring_specs(Started& s, bool after_commit) {
  // One spec per scored prompt token, after the sampling ones (whose
  // indices a continuation's fed rows name): the token itself, its logprobs.
  s.num_scored = 0;
  s.scored.clear();
  for (const StepRows::Scored& r : rows_.scored) s.num_scored += size_t(r.count);
  score_params_.resize(rows_.scored.size());
  size_t k = specs_.size();
  specs_.resize(k + s.num_scored);
  for (size_t j = 0; j < rows_.scored.size(); ++j) {
    const StepRows::Scored& r = rows_.scored[j];
    // After the commit before, a request aborted there is gone: its tokens
    // are scored for nothing (id -1: finish() drops them).
    const Sequence* seq = after_commit ? sched_.find(s.plan.item_keys[r.item].first, s.plan.item_keys[r.item].second)
                                       : s.plan.items[r.item].seq;
    score_params_[j] = SamplingParams{};
    score_params_[j].temperature = 0.0f;
    score_params_[j].logprobs = seq ? seq->params().prompt_logprobs : 0;
    s.scored.push_back({seq ? seq->id() : -1, r.first_position, r.count});
    for (int32_t c = 0; c < r.count; ++c) {
      SampleSpec& spec = specs_[k++];
      spec = SampleSpec{};
      spec.row = r.first_row + c;
      spec.params = &score_params_[j];
      spec.forced_token = seq ? seq->token_at(r.first_position + c + 1) : 0;
    }
  }
}

std::string Engine::finish(const Started& s, std::vector<SampledToken>& sampled, std::vector<int32_t>& accepted) {
  sampled.assign(std::max(s.keys.size(), s.num_sample_specs), SampledToken{});
  accepted.clear();
  if (!s.error.empty()) return s.error;
  try {
    runner_.finish_sample(results_);
    SERVAL_CHECK(results_.size() == s.num_sample_specs + s.num_scored, "model runner sampled ", results_.size(),
                 " tokens for ", s.num_sample_specs, " samples and ", s.num_scored, " scored prompt tokens");
    sampled.resize(s.num_sample_specs);
    for (size_t i = 0; i < sampled.size(); ++i)
      sampled[i] = SampledToken{results_[i].token, std::move(results_[i].logprobs)};
    size_t k = sampled.size();
    for (const Started::Scored& r : s.scored) {
      if (r.id >= 0)
        outputs_.prompt_scored(r.id, r.first_position, std::span(results_).subspan(k, size_t(r.count)));
      k += size_t(r.count);
    }
    if (s.plan.has_drafts()) {
      const StepPlan& plan = s.plan;
      accepted.assign(plan.sample_rows.size(), 1);
      std::vector<int32_t> tokens;
      size_t at = 0;
      for (size_t i = 0; i < plan.sample_rows.size(); ++i) {
        const int32_t d = plan.draft_of(i);
        if (d > 0) {
          tokens.clear();
          for (int32_t j = 0; j <= d; ++j) tokens.push_back(sampled[at + size_t(j)].token);
          accepted[i] = accepted_length(plan.sample_rows[i]->draft_ids(), tokens);
          metrics_.record_draft(d, accepted[i] - 1);
        }
        at += size_t(1 + d);
      }
      // The stream continues after the draws of the tokens kept.
      for (const Started::Rewind& r : s.rewinds) {
        Rng& rng = plan.sample_rows[r.row]->rng();
        rng = r.rng;
        for (int32_t j = 0; j < accepted[r.row]; ++j) (void)rng.uniform();
      }
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string Engine::settle(const Started& s, int64_t& appended) {
  std::vector<SampledToken> sampled;
  std::vector<int32_t> accepted;
  std::string error = finish(s, sampled, accepted);
  last_done_ = EngineClock::now();
  if (error.empty())
    appended = sched_.commit(s.plan, sampled, accepted);
  else
    sched_.fail_step(s.plan);
  return error;
}

void Engine::draft(Sequence& seq, std::span<const int32_t> tokens, int32_t max_tokens) {
  // A grammar masks one token at a time, from the tokens before it.
  if (constraints_.has(seq.id())) return;
  proposer_->propose(tokens, std::min(max_tokens, options_.speculative.num_tokens), seq.draft_ids());
}

void Engine::finish_continuation() {
  if (!next_) return;
  int64_t appended = 0;
  settle(*next_, appended);
  next_.reset();
}

void Engine::refresh_waiting() {
  const int64_t waiting = sched_.num_waiting();
  std::lock_guard<std::mutex> lock(mutex_);
  num_waiting_snapshot_ = waiting;
}

void Engine::start_continuation(const Started& cur) {
  StepPlan plan = sched_.continue_plan(cur.plan);
  refresh_waiting();
  if (plan.empty()) return;
  next_.emplace();
  next_->plan = std::move(plan);
  start(*next_, EngineClock::now(), /*continuation=*/true);
}

bool Engine::continue_while_running(const Started& cur, EngineClock::time_point device_start, StepOutputs& now,
                                    const std::function<void()>& emit_previous) {
  std::optional<EngineClock::time_point> at;
  // Late only where a request arriving now would be admitted.
  if (options_.late_continuations && sched_.num_waiting() == 0 &&
      sched_.num_running() < options_.scheduler.max_num_seqs)
    at = continuation_timer_.start_time(device_start, cur.plan.num_tokens);
  if (at) {
    emit_previous();
    // Until `at`, or until the step turns out to have ended (an estimate too
    // long must not leave the device idle for long).
    constexpr auto kReadyPoll = std::chrono::microseconds(200);
    for (;;) {
      const auto t = EngineClock::now();
      if (t >= *at || runner_.sample_ready()) break;
      std::unique_lock<std::mutex> lock(mutex_);
      if (stopping_) break;
      cv_.wait_until(lock, std::min(*at, t + kReadyPoll), [&] { return stopping_; });
    }
  }
  const auto t0 = EngineClock::now();
  if (at) take_inbox(now);
  start_continuation(cur);
  continuation_timer_.host_cost(EngineClock::now() - t0);
  if (!at) emit_previous();
  return at && next_;
}

void Engine::emit(StepOutputs& o) {
  EventMap events;
  const auto now = EngineClock::now();
  // Samples still running: their new tokens; a stop string ends them.
  for (const auto& [id, index] : o.sampled_keys) {
    const Sequence* s = sched_.find(id, index);
    if (s == nullptr) continue;  // finished: drain_finished publishes it
    if (outputs_.emit_tokens(*s, events, o.it, now)) sched_.abort_sample(id, index);
  }
  drain_finished(events, o.it, o.error);
  publish(events, o.out, o.it);
}

void Engine::drain_finished(EventMap& events, IterationStats& it, const std::string& error) {
  const auto now = EngineClock::now();
  for (Sequence& s : sched_.take_finished()) outputs_.finish(s, events, it, error, now);
}

SchedulerStats Engine::scheduler_stats(const KvUsage& u) {
  const PrefixCacheStats p = kv_.prefix_cache_stats();
  const SchedulerStats ss{.num_running = sched_.num_running(), .num_waiting = sched_.num_waiting(),
                          .kv_blocks_total = u.num_blocks, .kv_blocks_used = u.used_blocks,
                          .kv_blocks_cached = u.cached_blocks, .kv_blocks_free = u.free_blocks,
                          .prefix_cache_queries = p.query_tokens - last_prefix_stats_.query_tokens,
                          .prefix_cache_hits = p.hit_tokens - last_prefix_stats_.hit_tokens};
  last_prefix_stats_ = p;
  return ss;
}

void Engine::publish(EventMap& events, std::vector<Outgoing>& out, const IterationStats& it) {
  outputs_.collect(events, out);
  const bool idle = it.num_prompt_tokens == 0 && it.num_generation_tokens == 0 &&
                    it.n_params.empty() && it.max_num_generation_tokens.empty();
  if (!idle) metrics_.record(it);
  const KvUsage usage = kv_.usage();
  const SchedulerStats ss = scheduler_stats(usage);
  metrics_.record(ss);

  int64_t finals = 0;
  for (const Outgoing& o : out) {
    if (!o.ends_request) continue;
    ++finals;
    constraints_.remove(o.event.request_id);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kv_usage_snapshot_ = usage;
    num_waiting_snapshot_ = ss.num_waiting;
    num_unfinished_ -= finals;
  }
  for (Outgoing& o : out) o.channel->push(std::move(o.event));
}

void Engine::abort_everything() {
  std::vector<std::unique_ptr<Pending>> inbox;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inbox.swap(inbox_);
    aborts_.clear();
  }
  std::vector<Outgoing> out;
  const auto now = EngineClock::now();
  for (auto& p : inbox) {
    for (int32_t i = 0; i < p->request.n; ++i) {
      RequestEvent ev;
      ev.request_id = p->id;
      ev.index = i;
      ev.finish = FinishReason::kAbort;
      ev.timings.arrival = p->arrival;
      ev.timings.finish = now;
      out.push_back({p->channel, std::move(ev), i + 1 == p->request.n});
    }
  }
  for (int64_t id : outputs_.ids()) sched_.abort(id);
  IterationStats it;
  EventMap events;
  drain_finished(events, it, "");
  publish(events, out, it);
}

}  // namespace serval
