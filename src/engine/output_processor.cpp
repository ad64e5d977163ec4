#include "engine/output_processor.h"

#include <algorithm>

namespace serval {

namespace {

double seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct OutputProcessor::Sample {
  Sample(const Tokenizer& tok, bool skip_special, std::optional<StopStringMatcher> s)
      : detok(tok, skip_special, false), stops(std::move(s)) {}
  IncrementalDetokenizer detok;
  std::optional<StopStringMatcher> stops;
  bool stop_hit = false;  // a stop string matched: finish as kStop
  bool finished = false;  // its final event is made
  bool prompt_sent = false;  // the prompt's logprobs went with its first tokens
  size_t published = 0;   // output tokens already sent
  std::optional<EngineClock::time_point> first_token, last_token;
};

struct OutputProcessor::Active {
  std::shared_ptr<RequestChannel> channel;
  std::vector<std::unique_ptr<Sample>> samples;  // index = RequestEvent::index
  int32_t samples_left = 0;  // final events not yet published
  int32_t samples_finished = 0;
  int64_t max_generated = 0;  // most tokens of a finished sample
  bool want_logprobs = false;
  bool want_prompt_logprobs = false;
  std::vector<std::optional<Logprobs>> prompt_logprobs;  // one per prompt token, the first empty
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens the first admission took from the prefix cache
  int64_t max_tokens = 0;
  EngineClock::time_point arrival;
  std::optional<EngineClock::time_point> first_scheduled;
};

OutputProcessor::OutputProcessor(const Tokenizer& tokenizer, EngineMetrics& metrics)
    : tokenizer_(tokenizer), metrics_(metrics) {}

OutputProcessor::~OutputProcessor() = default;

void OutputProcessor::add(const NewRequest& r) {
  auto a = std::make_unique<Active>();
  a->channel = r.channel;
  for (int32_t i = 0; i < r.n; ++i)
    a->samples.push_back(std::make_unique<Sample>(tokenizer_, r.skip_special_tokens,
                                                  r.stops ? *r.stops : std::optional<StopStringMatcher>{}));
  a->samples_left = r.n;
  a->want_logprobs = r.want_logprobs;
  a->want_prompt_logprobs = r.prompt_logprobs >= 0;
  if (a->want_prompt_logprobs) a->prompt_logprobs.resize(size_t(r.num_prompt_tokens));
  a->num_prompt_tokens = r.num_prompt_tokens;
  a->max_tokens = r.max_tokens;
  a->arrival = r.arrival;
  active_.emplace(r.id, std::move(a));
}

std::vector<int64_t> OutputProcessor::ids() const {
  std::vector<int64_t> out;
  for (const auto& [id, a] : active_) out.push_back(id);
  return out;
}

void OutputProcessor::scheduled(int64_t id, EngineClock::time_point when, int64_t cached) {
  Active& a = *active_.at(id);
  if (a.first_scheduled) return;
  a.first_scheduled = when;
  a.num_cached_tokens = cached;
}

void OutputProcessor::prompt_scored(int64_t id, int64_t first_position, std::span<SampleResult> results) {
  auto found = active_.find(id);
  if (found == active_.end()) return;
  Active& a = *found->second;
  for (size_t i = 0; i < results.size(); ++i) {
    const size_t p = size_t(first_position) + 1 + i;
    if (p < a.prompt_logprobs.size()) a.prompt_logprobs[p] = std::move(results[i].logprobs);
  }
}

bool OutputProcessor::emit_tokens(const Sequence& seq, EventMap& events, IterationStats& it,
                                  EngineClock::time_point now) {
  Active& a = *active_.at(seq.id());
  emit_tokens(a, seq, events[{seq.id(), seq.sample_index()}], it, now);
  return a.samples[size_t(seq.sample_index())]->stop_hit;
}

void OutputProcessor::append_text(Sample& a, const std::string& piece, RequestEvent& ev) {
  if (piece.empty() || a.stop_hit) return;
  if (!a.stops) {
    ev.text += piece;
    return;
  }
  StopStringMatcher::Result r = a.stops->feed(piece);
  ev.text += r.text;
  if (r.match) a.stop_hit = true;
}

void OutputProcessor::emit_tokens(Active& a, const Sequence& seq, RequestEvent& ev, IterationStats& it,
                                  EngineClock::time_point now) {
  Sample& sample = *a.samples.at(size_t(seq.sample_index()));
  const std::vector<int32_t>& ids = seq.output_ids();
  const std::vector<Logprobs>& lps = seq.output_logprobs();
  // The prompt was scored by the step that sampled the first token.
  if (a.want_prompt_logprobs && !sample.prompt_sent && sample.published < ids.size()) {
    ev.prompt_logprobs = a.prompt_logprobs;
    sample.prompt_sent = true;
  }
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

void OutputProcessor::finish(const Sequence& s, EventMap& events, IterationStats& it, const std::string& error,
                             EngineClock::time_point now) {
  auto found = active_.find(s.id());
  if (found == active_.end()) return;
  Active& a = *found->second;
  finish_sample(a, s.id(), s.sample_index(), &s, s.finish_reason(), events, it, error, now);
  // Ended before its prompt completed: the samples it would have forked
  // end with it, without tokens.
  for (int32_t i = 1; i <= s.num_pending_forks(); ++i)
    finish_sample(a, s.id(), i, nullptr, s.finish_reason(), events, it, error, now);
}

void OutputProcessor::finish_sample(Active& a, int64_t id, int32_t index, const Sequence* seq, FinishReason reason,
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
  if (sample.stop_hit) {
    ev.stop_string = sample.stops->matched_string();
  } else if (ev.finish == FinishReason::kStop && seq && seq->stop_token()) {
    // As vLLM checks: an EOS (unless ignored) first, then the stop tokens.
    const int32_t t = *seq->stop_token();
    const StopCriteria& stop = seq->stop();
    const bool eos = !stop.ignore_eos && std::find(stop.eos_token_ids.begin(), stop.eos_token_ids.end(), t) !=
                                             stop.eos_token_ids.end();
    if (!eos) ev.stop_token = t;
  }
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

void OutputProcessor::collect(EventMap& events, std::vector<Outgoing>& out) {
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
}

}  // namespace serval
