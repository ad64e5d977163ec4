#include "engine/engine.h"

#include <algorithm>
#include <exception>
#include <optional>

#include "core/error.h"
#include "sched/stop_strings.h"

namespace serval {
namespace {

double seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }

EngineOptions with_model_len(EngineOptions o, const ModelRunner& runner) {
  if (o.scheduler.max_model_len == 0) o.scheduler.max_model_len = runner.config().max_position;
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

struct Engine::Active {
  Active(const Tokenizer& tok, bool skip_special) : detok(tok, skip_special, false) {}
  std::shared_ptr<RequestChannel> channel;
  IncrementalDetokenizer detok;
  std::optional<StopStringMatcher> stops;
  bool stop_hit = false;  // a stop string matched: finish as kStop
  bool want_logprobs = false;
  size_t published = 0;   // output tokens already sent
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens the first admission took from the prefix cache
  int64_t max_tokens = 0;
  EngineClock::time_point arrival;
  std::optional<EngineClock::time_point> first_scheduled, first_token, last_token;
};

Engine::Engine(ModelRunner& runner, const Tokenizer& tokenizer, EngineOptions options)
    : runner_(runner),
      tokenizer_(tokenizer),
      options_(with_model_len(std::move(options), runner)),
      vocab_size_(runner.config().vocab_size),
      registry_(metrics::Labels{{"model_name", options_.model_name}}),
      metrics_(registry_, options_.scheduler.max_model_len),
      kv_(runner.num_blocks(), runner.block_size(), options_.enable_prefix_cache),
      sched_(options_.scheduler, kv_),
      batch_builder_(runner.block_size()) {
  kv_usage_snapshot_ = kv_.usage();
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

RequestHandle Engine::submit(EngineRequest request) {
  request.params.validate();
  request.stop.validate();
  const auto& prompt = request.prompt_ids;
  SERVAL_CHECK(!prompt.empty(), "the prompt is empty (no tokens)");
  for (int32_t id : prompt)
    SERVAL_CHECK(id >= 0 && id < vocab_size_, "prompt token id ", id,
                 " is outside the vocabulary [0, ", vocab_size_, ")");
  // The scheduler's admission checks, made here so that submit() can refuse.
  const int64_t max_len = int64_t(prompt.size()) + request.stop.max_tokens;
  const int64_t model_len = options_.scheduler.max_model_len;
  SERVAL_CHECK(model_len == 0 || max_len <= model_len, prompt.size(),
               " prompt tokens + max_tokens ", request.stop.max_tokens, " = ", max_len,
               " exceed the model's context of ", model_len, " tokens");
  const int64_t bs = runner_.block_size();
  const int64_t need = (max_len - 1 + bs - 1) / bs;
  SERVAL_CHECK(need <= runner_.num_blocks(), prompt.size(), " prompt tokens + max_tokens ",
               request.stop.max_tokens, " need ", need, " KV blocks of ", bs,
               " tokens but the whole cache has ", runner_.num_blocks());

  auto pending = std::make_unique<Pending>();
  if (!request.stop_strings.empty())
    pending->stops.emplace(request.stop_strings, request.include_stop_str_in_output);
  pending->request = std::move(request);
  pending->channel = std::make_shared<RequestChannel>();
  pending->arrival = EngineClock::now();
  std::shared_ptr<RequestChannel> channel = pending->channel;
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw EngineStoppedError("the engine is shut down");
    const int64_t queued = num_waiting_snapshot_ + int64_t(inbox_.size());
    if (queued >= options_.scheduler.max_queued_requests)
      throw QueueFullError(str_cat("request refused: the waiting queue is full (", queued,
                                   " requests, max_queued_requests ",
                                   options_.scheduler.max_queued_requests, ")"));
    id = next_id_++;
    pending->id = id;
    inbox_.push_back(std::move(pending));
    ++num_unfinished_;
  }
  cv_.notify_all();
  return RequestHandle(id, std::move(channel));
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
  for (;;) {
    std::vector<std::unique_ptr<Pending>> inbox;
    std::vector<int64_t> aborts;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Sleep while idle; when work is in flight, pick up the inbox and go on.
      if (!sched_.has_unfinished())
        cv_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !aborts_.empty(); });
      if (stopping_) break;
      inbox.swap(inbox_);
      aborts.swap(aborts_);
    }
    IterationStats it;
    EventMap events;
    std::vector<Outgoing> out;
    for (auto& p : inbox) admit(*p, it, out);
    for (int64_t id : aborts) sched_.abort(id);
    step(it, events);
    if (options_.check_invariants) kv_.check_invariants();
    publish(events, out, it);
  }
  abort_everything();
}

void Engine::admit(Pending& p, IterationStats& it, std::vector<Outgoing>& out) {
  EngineRequest& r = p.request;
  auto a = std::make_unique<Active>(tokenizer_, r.skip_special_tokens);
  a->channel = p.channel;
  a->stops = std::move(p.stops);
  a->want_logprobs = r.params.logprobs >= 0;
  a->num_prompt_tokens = int64_t(r.prompt_ids.size());
  a->max_tokens = r.stop.max_tokens;
  a->arrival = p.arrival;
  try {
    sched_.add(Sequence(p.id, std::move(r.prompt_ids), r.params, r.stop, kv_.new_table()),
               r.options);
  } catch (const std::exception& e) {
    RequestEvent ev;
    ev.request_id = p.id;
    ev.finish = FinishReason::kError;
    ev.error = e.what();
    ev.timings.arrival = p.arrival;
    ev.timings.finish = EngineClock::now();
    out.push_back({p.channel, std::move(ev)});
    return;
  }
  it.n_params.push_back(1);
  active_.emplace(p.id, std::move(a));
}

void Engine::step(IterationStats& it, EventMap& events) {
  const auto start = EngineClock::now();
  StepPlan plan = sched_.schedule(start);
  std::string error;
  std::vector<int64_t> row_ids;
  if (!plan.empty()) {
    for (const ScheduledChunk& c : plan.items) {
      Active& a = *active_.at(c.seq->id());
      if (!a.first_scheduled) {
        a.first_scheduled = start;
        // Before its first chunk is computed, a request's computed tokens
        // are exactly its prefix-cache hit.
        a.num_cached_tokens = c.seq->num_computed_tokens();
      }
      const int64_t prompt_left = c.seq->num_prompt_tokens() - c.seq->num_computed_tokens();
      it.num_prompt_tokens += std::clamp<int64_t>(prompt_left, 0, c.num_new_tokens);
    }
    for (const Sequence* s : plan.sample_rows) row_ids.push_back(s->id());
    std::vector<SampledToken> sampled(plan.sample_rows.size());
    try {
      if (!plan.copies.empty()) runner_.copy_blocks(plan.copies);
      batch_builder_.build(plan.items, batch_);
      runner_.forward(batch_, logits_);
      SERVAL_CHECK(logits_.size() == sampled.size() * size_t(vocab_size_), "model runner returned ",
                   logits_.size(), " logits for ", sampled.size(), " rows of vocabulary ",
                   vocab_size_);
      for (size_t row = 0; row < sampled.size(); ++row) {
        Sequence& s = *plan.sample_rows[row];
        const std::span<const float> logits(logits_.data() + row * size_t(vocab_size_),
                                            size_t(vocab_size_));
        SampleResult r = sampler_.sample(logits, s.params(), s.prompt_ids(), s.output_ids(), s.rng());
        sampled[row] = SampledToken{r.token, std::move(r.logprobs)};
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty()) {
      sched_.commit(plan, sampled);
      it.num_generation_tokens = int64_t(sampled.size());
    } else {
      sched_.fail_step(plan);
      row_ids.clear();
    }
  }
  it.num_preemptions = plan.num_preempted;
  const auto now = EngineClock::now();
  // Requests still running: their new token; a stop string ends them here.
  for (int64_t id : row_ids) {
    const Sequence* s = sched_.find(id);
    if (s == nullptr) continue;  // finished: drain_finished publishes it
    Active& a = *active_.at(id);
    emit_tokens(a, *s, events[id], it, now);
    if (a.stop_hit) sched_.abort(id);
  }
  drain_finished(events, it, error);
  if (plan.empty() && plan.finished.empty() && sched_.has_unfinished()) {
    // Nothing could be scheduled (should be rare): do not spin.
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void Engine::append_text(Active& a, const std::string& piece, RequestEvent& ev) {
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
  const std::vector<int32_t>& ids = seq.output_ids();
  const std::vector<Logprobs>& lps = seq.output_logprobs();
  for (size_t i = a.published; i < ids.size() && !a.stop_hit; ++i) {
    ev.token_ids.push_back(ids[i]);
    if (a.want_logprobs && i < lps.size()) ev.logprobs.push_back(lps[i]);
    if (!a.first_token) {
      a.first_token = now;
      it.time_to_first_token_s.push_back(seconds(now - a.arrival));
    } else {
      it.inter_token_latency_s.push_back(seconds(now - *a.last_token));
    }
    a.last_token = now;
    append_text(a, a.detok.push(ids[i]), ev);
  }
  a.published = ids.size();
}

void Engine::drain_finished(EventMap& events, IterationStats& it, const std::string& error) {
  const auto now = EngineClock::now();
  for (Sequence& s : sched_.take_finished()) {
    auto found = active_.find(s.id());
    if (found == active_.end()) continue;
    Active& a = *found->second;
    RequestEvent& ev = events[s.id()];
    emit_tokens(a, s, ev, it, now);
    if (!a.stop_hit) {
      append_text(a, a.detok.flush(), ev);
      if (!a.stop_hit && a.stops) ev.text += a.stops->flush();
    }
    ev.finish = a.stop_hit ? FinishReason::kStop : s.finish_reason();
    if (ev.finish == FinishReason::kError)
      ev.error = error.empty() ? std::string("the request failed") : error;
    ev.timings.finish = now;

    FinishedRequestStats f;
    f.finish_reason = finish_reason_name(ev.finish);
    f.num_prompt_tokens = a.num_prompt_tokens;
    f.num_generation_tokens = int64_t(s.output_ids().size());
    const auto last = a.last_token.value_or(now);
    f.e2e_latency_s = seconds(last - a.arrival);
    if (a.first_scheduled) {
      f.queued_time_s = seconds(*a.first_scheduled - a.arrival);
      if (a.first_token) {
        f.prefill_time_s = seconds(*a.first_token - *a.first_scheduled);
        f.decode_time_s = seconds(last - *a.first_token);
      }
    }
    f.max_tokens_param = a.max_tokens;
    metrics_.record(f);
    it.max_num_generation_tokens.push_back(f.num_generation_tokens);
  }
}

void Engine::publish(EventMap& events, std::vector<Outgoing>& out, const IterationStats& it) {
  for (auto& [id, ev] : events) {
    auto found = active_.find(id);
    if (found == active_.end()) continue;
    Active& a = *found->second;
    if (!ev.finished() && ev.token_ids.empty() && ev.text.empty()) continue;
    ev.request_id = id;
    ev.timings.arrival = a.arrival;
    ev.timings.first_token = a.first_token;
    if (a.first_scheduled) {
      ev.num_prompt_tokens = int32_t(a.num_prompt_tokens);
      ev.num_cached_tokens = int32_t(a.num_cached_tokens);
    }
    out.push_back({a.channel, std::move(ev)});
    if (out.back().event.finished()) active_.erase(found);
  }
  const bool idle = it.num_prompt_tokens == 0 && it.num_generation_tokens == 0 &&
                    it.n_params.empty() && it.max_num_generation_tokens.empty();
  if (!idle) metrics_.record(it);
  SchedulerStats ss;
  ss.num_running = sched_.num_running();
  ss.num_waiting = sched_.num_waiting();
  const KvUsage usage = kv_.usage();
  ss.kv_blocks_total = usage.num_blocks;
  ss.kv_blocks_used = usage.used_blocks;
  ss.kv_blocks_cached = usage.cached_blocks;
  ss.kv_blocks_free = usage.free_blocks;
  const PrefixCacheStats p = kv_.prefix_cache_stats();
  ss.prefix_cache_queries = p.query_tokens - last_prefix_stats_.query_tokens;
  ss.prefix_cache_hits = p.hit_tokens - last_prefix_stats_.hit_tokens;
  last_prefix_stats_ = p;
  metrics_.record(ss);

  int64_t finals = 0;
  for (const Outgoing& o : out) finals += o.event.finished() ? 1 : 0;
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
    RequestEvent ev;
    ev.request_id = p->id;
    ev.finish = FinishReason::kAbort;
    ev.timings.arrival = p->arrival;
    ev.timings.finish = now;
    out.push_back({p->channel, std::move(ev)});
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
