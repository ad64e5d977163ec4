#include "server/generation.h"

#include <algorithm>

#include "core/error.h"
#include "sched/request_fit.h"
#include "server/access_log.h"
#include "server/api_error.h"
#include "server/http_server.h"

namespace serval::server {

std::vector<EngineRequest> engine_requests(const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int32_t>& max_tokens, const GenerationOptions& gen,
                                           const Tokenizer& tok, std::shared_ptr<const grammar::TokenMasker> grammar) {
  std::vector<EngineRequest> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.prompt_ids = prompts[i];
    r.params = gen.params;
    r.n = gen.n;
    if (gen.best_of > gen.n) {
      r.n = gen.best_of;  // ranked by the chosen tokens' logprobs: always computed
      r.params.logprobs = std::max(r.params.logprobs, 0);
    }
    r.options.priority = gen.priority;
    r.stop.max_tokens = max_tokens[i];
    r.stop.min_tokens = std::min(gen.min_tokens, max_tokens[i]);
    r.stop.eos_token_ids = tok.eos_ids;
    if (r.stop.eos_token_ids.empty() && tok.eos_id >= 0) r.stop.eos_token_ids = {tok.eos_id};
    r.stop.ignore_eos = gen.ignore_eos;
    r.stop.stop_token_ids = gen.stop_token_ids;
    r.stop_strings = gen.stop;
    r.include_stop_str_in_output = gen.include_stop_str_in_output;
    r.skip_special_tokens = gen.skip_special_tokens;
    r.speculative = gen.speculative;
    r.grammar = grammar;
    out.push_back(std::move(r));
  }
  return out;
}

int32_t resolve_max_tokens(std::optional<int32_t> requested, int32_t default_max, int64_t prompt_len,
                           const KvFitLimits& limits) {
  const int64_t room = std::clamp<int64_t>(context_room(limits, prompt_len), 0, INT32_MAX);
  const int64_t want = requested ? *requested : (default_max > 0 ? std::min<int64_t>(default_max, room) : room);
  // At least one token of output must fit (the prompt alone filling the context is the prompt's fault).
  const RequestFit fit = request_fit(limits, prompt_len, std::max<int64_t>(want, 1));
  if (fit.misfit == Misfit::kPromptFillsContext)
    throw ApiError(400, fit.reason + ": shorten the prompt", "prompt", "context_length_exceeded");
  if (!fit.fits())
    throw ApiError(400, fit.reason + (fit.misfit == Misfit::kPastContext ? ": shorten the prompt or lower max_tokens" : ""),
                   "max_tokens", "context_length_exceeded");
  return int32_t(want);
}

bool truncate_prompt(std::vector<int32_t>& ids, const GenerationOptions& gen, int64_t max_model_len) {
  if (!gen.truncate_prompt_tokens) return false;
  const int64_t keep = *gen.truncate_prompt_tokens < 0 ? max_model_len : *gen.truncate_prompt_tokens;
  if (keep <= 0 || int64_t(ids.size()) <= keep) return false;
  ids.erase(ids.begin(), ids.end() - keep);
  return true;
}

std::string response_id(const std::string& prefix, const GenerationOptions& gen) {
  return gen.request_id.empty() ? new_response_id(prefix) : prefix + gen.request_id;
}

Generation::Generation(Engine& engine, std::vector<EngineRequest> requests, const GenerationOptions& gen)
    : group_(engine), keep_n_(gen.n), keep_logprobs_(gen.params.logprobs >= 0) {
  n_ = requests.empty() ? 1 : std::max(1, requests[0].n);
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest& r = requests[i];
    prompt_lengths_.push_back(int64_t(r.prompt_ids.size()));
    cached_tokens_.push_back(0);
    scores_only_.push_back(r.stop.max_tokens == 0 && r.params.prompt_logprobs >= 0);
    if (scores_only_.back()) {
      r.stop.max_tokens = 1;  // the prompt's scores come with the first token
      r.stop.min_tokens = 0;
    } else if (r.stop.max_tokens == 0) {
      for (int32_t s = 0; s < n_; ++s) {
        GroupEvent g{i, {}};
        g.event.index = s;
        g.event.finish = FinishReason::kLength;
        immediate_.push_back(std::move(g));
      }
      continue;
    }
    member_prompt_.push_back(i);
    group_.submit(std::move(r));
  }
  choices_.resize(prompt_lengths_.size() * size_t(n_));
}

void Generation::apply(const GroupEvent& g) {
  const RequestEvent& ev = g.event;
  const size_t choice = g.request * size_t(n_) + size_t(std::clamp(ev.index, 0, n_ - 1));
  ChoiceState& c = choices_[choice];
  if (!ev.prompt_logprobs.empty()) c.prompt_logprobs = ev.prompt_logprobs;
  c.text += ev.text;
  c.token_ids.insert(c.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
  completion_tokens_ += int64_t(ev.token_ids.size());
  c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  if (ev.finished()) {
    c.finish = ev.finish;
    c.error = ev.error;
    c.stop_string = ev.stop_string;
    c.stop_token = ev.stop_token;
  }
  cached_tokens_[g.request] = std::max<int64_t>(cached_tokens_[g.request], ev.num_cached_tokens);
  if (!ev.token_ids.empty()) current_access_record().mark_first_token();
}

bool Generation::collect() {
  while (!done() && !disconnected_) next(std::chrono::milliseconds(20));
  if (!disconnected_ && keep_n_ < n_) keep_best();
  return !disconnected_;
}

// best_of: each prompt's samples ranked by cumulative logprob (the sum of the
// chosen tokens' logprobs, as vLLM's V0 engine ranked them; ties keep the
// sample order), the best keep_n_ kept, best first.
void Generation::keep_best() {
  std::vector<ChoiceState> kept;
  for (size_t p = 0; p < prompt_lengths_.size(); ++p) {
    std::vector<std::pair<double, size_t>> ranked;
    for (size_t s = 0; s < size_t(n_); ++s) {
      const ChoiceState& c = choices_[p * size_t(n_) + s];
      double sum = 0;
      for (const Logprobs& lp : c.logprobs) sum += lp.chosen;
      ranked.emplace_back(sum, s);
    }
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t k = 0; k < size_t(keep_n_); ++k) {
      kept.push_back(std::move(choices_[p * size_t(n_) + ranked[k].second]));
      if (!keep_logprobs_) kept.back().logprobs.clear();
    }
  }
  choices_ = std::move(kept);
  n_ = keep_n_;
}

std::optional<ChoiceEvent> Generation::next(std::chrono::milliseconds wait) {
  if (disconnected_ || done()) return std::nullopt;
  std::optional<GroupEvent> ev;
  if (!immediate_.empty()) {
    ev = std::move(immediate_.front());
    immediate_.pop_front();
  } else {
    ev = group_.next(wait);
    if (ev) ev->request = member_prompt_[ev->request];
  }
  // Checked after every event too: a streaming client is written to, but a
  // non-streaming one is only noticed here.
  if (client_disconnected()) {
    disconnected_ = true;
    current_access_record().status = 499;
    group_.abort_all();
    return std::nullopt;
  }
  if (!ev) return std::nullopt;
  if (scores_only_[ev->request]) {
    // The one token it ran for is dropped: it ends as max_tokens 0 does.
    RequestEvent& e = ev->event;
    e.token_ids.clear();
    e.text.clear();
    e.logprobs.clear();
    if (e.finish == FinishReason::kStop) e.finish = FinishReason::kLength;
    e.stop_string.reset();
    e.stop_token.reset();
  }
  apply(*ev);
  const size_t choice = ev->request * size_t(n_) + size_t(std::clamp(ev->event.index, 0, n_ - 1));
  return ChoiceEvent{choice, std::move(ev->event)};
}

UsageCounts Generation::usage() const {
  UsageCounts u;
  for (size_t i = 0; i < prompt_lengths_.size(); ++i) {
    u.prompt_tokens += prompt_lengths_[i];
    u.cached_tokens += cached_tokens_[i];
  }
  u.completion_tokens = completion_tokens_;  // every sample's, best_of's dropped ones included (as OpenAI bills)
  return u;
}

std::string Generation::error() const {
  for (const ChoiceState& c : choices_)
    if (c.finish == FinishReason::kError) return c.error.empty() ? "generation failed" : c.error;
  return "";
}

}  // namespace serval::server
