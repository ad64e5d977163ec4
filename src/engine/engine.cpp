#include "engine/engine.h"

#include <algorithm>
#include <exception>
#include <optional>

#include "core/error.h"
#include "sched/request_fit.h"
#include "sched/stop_strings.h"

namespace serval {
namespace {

// As OpenAI's API.
constexpr int32_t kMaxSamples = 128;

double seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }

// The scheduler's settings that come from the runner.
EngineOptions with_runner_limits(EngineOptions o, const ModelRunner& runner) {
  if (o.scheduler.max_model_len == 0) o.scheduler.max_model_len = runner.config().max_position;
  o.scheduler.fed_penalties = runner.counts_fed_tokens();
  // Blocks behind a sliding window are released as sequences grow; the
  // prefix cache, which keeps whole prefixes, is off for such models.
  o.scheduler.kv_window = runner.attention_window();
  if (o.scheduler.kv_window > 0) o.enable_prefix_cache = false;
  return o;
}

}  // namespace

struct Engine::Pending {
  int64_t id = -1;
  EngineRequest request;
  std::shared_ptr<RequestChannel> channel;
  EngineClock::time_point arrival;
  std::optional<StopStringMatcher> stops;
};

struct Engine::Sample {
  Sample(const Tokenizer& tok, bool skip_special, std::optional<StopStringMatcher> s)
      : detok(tok, skip_special, false), stops(std::move(s)) {}
  IncrementalDetokenizer detok;
  std::optional<StopStringMatcher> stops;
  bool stop_hit = false;  // a stop string matched: finish as kStop
  bool finished = false;  // its final event is made
  size_t published = 0;   // output tokens already sent
  std::optional<EngineClock::time_point> first_token, last_token;
};

struct Engine::Active {
  std::shared_ptr<RequestChannel> channel;
  std::vector<std::unique_ptr<Sample>> samples;  // index = RequestEvent::index
  int32_t samples_left = 0;  // final events not yet published
  int32_t samples_finished = 0;
  int64_t max_generated = 0;  // most tokens of a finished sample
  bool want_logprobs = false;
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens the first admission took from the prefix cache
  int64_t max_tokens = 0;
  EngineClock::time_point arrival;
  std::optional<EngineClock::time_point> first_scheduled;
};

Engine::Engine(ModelRunner& runner, const Tokenizer& tokenizer, EngineOptions options)
    : runner_(runner),
      tokenizer_(tokenizer),
      options_(with_runner_limits(std::move(options), runner)),
      vocab_size_(runner.config().vocab_size),
      registry_(metrics::Labels{{"model_name", options_.model_name}}),
      metrics_(registry_, options_.scheduler.max_model_len),
      kv_(runner.num_blocks(), runner.block_size(), options_.enable_prefix_cache),
      sched_(options_.scheduler, kv_),
      batch_builder_(runner.block_size()) {
  using A = EngineOptions::AsyncScheduling;
  async_scheduling_ = options_.async_scheduling == A::kOn ||
                      (options_.async_scheduling == A::kAuto && runner.queues_steps_async());
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
  SERVAL_CHECK(request.n >= 1 && request.n <= kMaxSamples, "n must be in [1, ", kMaxSamples,
               "], got ", request.n);
  const auto& prompt = request.prompt_ids;
  SERVAL_CHECK(!prompt.empty(), "the prompt is empty (no tokens)");
  for (int32_t id : prompt)
    SERVAL_CHECK(id >= 0 && id < vocab_size_, "prompt token id ", id,
                 " is outside the vocabulary [0, ", vocab_size_, ")");
  // The scheduler's admission check, made here so that submit() can refuse.
  check_request_fits(sched_.fit_limits(), int64_t(prompt.size()), request.stop.max_tokens, "");

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
}

void Engine::admit(Pending& p, IterationStats& it, std::vector<Outgoing>& out) {
  EngineRequest& r = p.request;
  auto a = std::make_unique<Active>();
  a->channel = p.channel;
  for (int32_t i = 0; i < r.n; ++i)
    a->samples.push_back(std::make_unique<Sample>(tokenizer_, r.skip_special_tokens, p.stops));
  a->samples_left = r.n;
  a->want_logprobs = r.params.logprobs >= 0;
  a->num_prompt_tokens = int64_t(r.prompt_ids.size());
  a->max_tokens = r.stop.max_tokens;
  a->arrival = p.arrival;
  try {
    Sequence seq(p.id, std::move(r.prompt_ids), r.params, r.stop, kv_.new_table());
    seq.set_num_samples(r.n);
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
  active_.emplace(p.id, std::move(a));
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
    start(cur, start_time);
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
      finish(*next_, ignored);
      sched_.fail_step(next_->plan);
      next_.reset();
    }
    return false;
  }
  now.sampled_keys = std::move(cur.keys);
  return true;
}

void Engine::start(Started& s, EngineClock::time_point start_time) {
  const StepPlan& plan = s.plan;
  for (const Sequence* seq : plan.sample_rows) s.keys.emplace_back(seq->id(), seq->sample_index());
  for (const StepPlan::Fork& f : plan.forks) s.keys.emplace_back(f.seq->id(), f.seq->sample_index());
  for (const ScheduledChunk& c : plan.items) {
    if (c.fed()) continue;
    Active& a = *active_.at(c.seq->id());
    if (!a.first_scheduled) {
      a.first_scheduled = start_time;
      // Before its first chunk is computed, a request's computed tokens
      // are exactly its prefix-cache hit.
      a.num_cached_tokens = c.seq->num_computed_tokens();
    }
    const int64_t prompt_left = c.seq->num_prompt_tokens() - c.first();
    s.num_prompt_tokens += std::clamp<int64_t>(prompt_left, 0, c.num_new_tokens);
  }
  const size_t num_rows = plan.sample_rows.size(), num_specs = s.keys.size();
  try {
    if (!plan.copies.empty()) runner_.copy_blocks(plan.copies);
    batch_builder_.build(plan.items, batch_);
    SERVAL_CHECK(batch_.logits_rows.size() == num_rows, "batch builder made ", batch_.logits_rows.size(),
                 " logits rows for ", num_rows, " sampled sequences");
    // One spec per sample; a forked sample draws from its parent's row. The
    // draws are made here, from each request's Rng, so that a seed picks
    // the same token on every backend. A fed row's output is one token
    // longer by the time it samples (that token is being sampled now).
    specs_.resize(num_specs);
    banned_.resize(num_specs);
    for (size_t i = 0; i < num_specs; ++i) {
      Sequence& seq = i < num_rows ? *plan.sample_rows[i] : *plan.forks[i - num_rows].seq;
      const int32_t row = i < num_rows ? batch_.logits_rows[i] : -1;
      const int32_t fed_source = row >= 0 && !batch_.token_source.empty() ? batch_.token_source[size_t(row)] : -1;
      banned_[i] = seq.stop().banned_tokens(int64_t(seq.output_ids().size()) + (fed_source >= 0));
      SampleSpec& spec = specs_[i];
      spec.fed_source = fed_source;
      spec.row = i < num_rows ? int32_t(i) : plan.forks[i - num_rows].row;
      spec.params = &seq.params();
      spec.prompt_ids = seq.prompt_ids();
      spec.output_ids = seq.output_ids();
      spec.banned = banned_[i];
      spec.uniform = seq.params().greedy() ? 0.0 : seq.rng().uniform();
    }
    runner_.start_sample(batch_, specs_);
    s.queued = EngineClock::now();
  } catch (const std::exception& e) {
    s.error = e.what();
  }
}

std::string Engine::finish(const Started& s, std::vector<SampledToken>& sampled) {
  sampled.assign(s.keys.size(), SampledToken{});
  if (!s.error.empty()) return s.error;
  try {
    runner_.finish_sample(results_);
    SERVAL_CHECK(results_.size() == sampled.size(), "model runner sampled ", results_.size(), " tokens for ",
                 sampled.size(), " samples");
    for (size_t i = 0; i < sampled.size(); ++i)
      sampled[i] = SampledToken{results_[i].token, std::move(results_[i].logprobs)};
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string Engine::settle(const Started& s, int64_t& appended) {
  std::vector<SampledToken> sampled;
  std::string error = finish(s, sampled);
  last_done_ = EngineClock::now();
  if (error.empty())
    appended = sched_.commit(s.plan, sampled);
  else
    sched_.fail_step(s.plan);
  return error;
}

void Engine::finish_continuation() {
  if (!next_) return;
  int64_t appended = 0;
  settle(*next_, appended);
  next_.reset();
}

void Engine::start_continuation(const Started& cur) {
  StepPlan plan = sched_.continue_plan(cur.plan);
  if (plan.empty()) return;
  next_.emplace();
  next_->plan = std::move(plan);
  start(*next_, EngineClock::now());
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
    Active& a = *active_.at(id);
    emit_tokens(a, *s, events[{id, index}], o.it, now);
    if (a.samples[size_t(index)]->stop_hit) sched_.abort_sample(id, index);
  }
  drain_finished(events, o.it, o.error);
  publish(events, o.out, o.it);
}

void Engine::append_text(Sample& a, const std::string& piece, RequestEvent& ev) {
  if (piece.empty() || a.stop_hit) return;
  if (!a.stops) {
    ev.text += piece;
    return;
  }
  StopStringMatcher::Result r = a.stops->feed(piece);
  ev.text += r.text;
  if (r.match) a.stop_hit = true;
}

void Engine::emit_tokens(Active& a, const Sequence& seq, RequestEvent& ev, IterationStats& it,
                         EngineClock::time_point now) {
  Sample& sample = *a.samples.at(size_t(seq.sample_index()));
  const std::vector<int32_t>& ids = seq.output_ids();
  const std::vector<Logprobs>& lps = seq.output_logprobs();
  // Up to the token that completes a stop string: tokens after it (the
  // emission runs a step behind the device) are never sent nor counted.
  for (; sample.published < ids.size() && !sample.stop_hit; ++sample.published) {
    const size_t i = sample.published;
    ev.token_ids.push_back(ids[i]);
    if (a.want_logprobs && i < lps.size()) ev.logprobs.push_back(lps[i]);
    if (!sample.first_token) {
      sample.first_token = now;
      it.time_to_first_token_s.push_back(seconds(now - a.arrival));
    } else {
      it.inter_token_latency_s.push_back(seconds(now - *sample.last_token));
    }
    sample.last_token = now;
    append_text(sample, sample.detok.push(ids[i]), ev);
  }
}

void Engine::drain_finished(EventMap& events, IterationStats& it, const std::string& error) {
  const auto now = EngineClock::now();
  for (Sequence& s : sched_.take_finished()) {
    auto found = active_.find(s.id());
    if (found == active_.end()) continue;
    Active& a = *found->second;
    finish_sample(a, s.id(), s.sample_index(), &s, s.finish_reason(), events, it, error, now);
    // Ended before its prompt completed: the samples it would have forked
    // end with it, without tokens.
    for (int32_t i = 1; i <= s.num_pending_forks(); ++i)
      finish_sample(a, s.id(), i, nullptr, s.finish_reason(), events, it, error, now);
  }
}

void Engine::finish_sample(Active& a, int64_t id, int32_t index, const Sequence* seq, FinishReason reason,
                           EventMap& events, IterationStats& it, const std::string& error,
                           EngineClock::time_point now) {
  Sample& sample = *a.samples.at(size_t(index));
  if (sample.finished) return;
  sample.finished = true;
  RequestEvent& ev = events[{id, index}];
  if (seq) emit_tokens(a, *seq, ev, it, now);
  if (!sample.stop_hit) {
    append_text(sample, sample.detok.flush(), ev);
    if (!sample.stop_hit && sample.stops) ev.text += sample.stops->flush();
  }
  ev.finish = sample.stop_hit ? FinishReason::kStop : reason;
  if (ev.finish == FinishReason::kError)
    ev.error = error.empty() ? std::string("the request failed") : error;
  ev.timings.finish = now;

  FinishedRequestStats f;
  f.finish_reason = finish_reason_name(ev.finish);
  f.num_prompt_tokens = a.num_prompt_tokens;
  f.num_generation_tokens = seq ? int64_t(sample.stop_hit ? sample.published : seq->output_ids().size()) : 0;
  const auto last = sample.last_token.value_or(now);
  f.e2e_latency_s = seconds(last - a.arrival);
  if (a.first_scheduled) {
    f.queued_time_s = seconds(*a.first_scheduled - a.arrival);
    if (sample.first_token) {
      f.prefill_time_s = seconds(*sample.first_token - *a.first_scheduled);
      f.decode_time_s = seconds(last - *sample.first_token);
    }
  }
  f.max_tokens_param = a.max_tokens;
  metrics_.record(f);
  a.max_generated = std::max(a.max_generated, f.num_generation_tokens);
  if (++a.samples_finished == int32_t(a.samples.size()))
    it.max_num_generation_tokens.push_back(a.max_generated);
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
  for (auto& [key, ev] : events) {
    auto found = active_.find(key.first);
    if (found == active_.end()) continue;
    Active& a = *found->second;
    if (!ev.finished() && ev.token_ids.empty() && ev.text.empty()) continue;
    ev.request_id = key.first;
    ev.index = key.second;
    ev.timings.arrival = a.arrival;
    ev.timings.first_token = a.samples.at(size_t(key.second))->first_token;
    if (a.first_scheduled) {
      ev.num_prompt_tokens = int32_t(a.num_prompt_tokens);
      ev.num_cached_tokens = int32_t(a.num_cached_tokens);
    }
    const bool ends = ev.finished() && --a.samples_left == 0;
    out.push_back({a.channel, std::move(ev), ends});
    if (ends) active_.erase(found);
  }
  const bool idle = it.num_prompt_tokens == 0 && it.num_generation_tokens == 0 &&
                    it.n_params.empty() && it.max_num_generation_tokens.empty();
  if (!idle) metrics_.record(it);
  const KvUsage usage = kv_.usage();
  const SchedulerStats ss = scheduler_stats(usage);
  metrics_.record(ss);

  int64_t finals = 0;
  for (const Outgoing& o : out) finals += o.ends_request ? 1 : 0;
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
  std::vector<int64_t> ids;
  for (const auto& [id, a] : active_) ids.push_back(id);
  for (int64_t id : ids) sched_.abort(id);
  IterationStats it;
  EventMap events;
  drain_finished(events, it, "");
  publish(events, out, it);
}

}  // namespace serval
