#pragma once
// Generation: one OpenAI generation request in flight — its engine requests
// (one per prompt, n samples each), the output accumulated per choice
// (choice index = prompt * n + sample, as OpenAI numbers them), usage, and
// client-disconnect handling: a client that goes away aborts everything.
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_request.h"
#include "server/request_group.h"
#include "server/response_builder.h"

namespace serval::server {

struct ChoiceState {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<Logprobs> logprobs;
  std::vector<std::optional<Logprobs>> prompt_logprobs;  // when asked: one per prompt token
  FinishReason finish = FinishReason::kNone;
  std::string error;  // finish == kError
  std::optional<std::string> stop_string;  // vLLM's stop_reason (see RequestEvent)
  std::optional<int32_t> stop_token;
};

struct ChoiceEvent {
  size_t choice = 0;
  RequestEvent event;
};

// Engine requests for `prompts` (token ids) with the options of `gen`;
// `max_tokens` is each prompt's resolved output budget.
std::vector<EngineRequest> engine_requests(const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int32_t>& max_tokens, const GenerationOptions& gen,
                                           const Tokenizer& tok,
                                           std::shared_ptr<const grammar::TokenMasker> grammar = nullptr);

// The output budget of a prompt: `requested`, else `default_max` (0: the rest
// of the context). ApiError 400 (context_length_exceeded) with the numbers
// when prompt + max_tokens do not fit `limits` (request_fit): naming
// "prompt" where the prompt alone fills the context, else "max_tokens".
int32_t resolve_max_tokens(std::optional<int32_t> requested, int32_t default_max, int64_t prompt_len,
                           const KvFitLimits& limits);

// vLLM's truncate_prompt_tokens: keeps the last k tokens of `ids` (-1: the
// context length). True when tokens were dropped.
bool truncate_prompt(std::vector<int32_t>& ids, const GenerationOptions& gen, int64_t max_model_len);

// prefix + the client's request_id, or + a random id.
std::string response_id(const std::string& prefix, const GenerationOptions& gen);

class Generation {
 public:
  // Submits every request (an engine refusal throws, and what was already
  // submitted is aborted). A request with max_tokens 0 (OpenAI allows it) is
  // not submitted: its choices finish at once with "length" and no tokens;
  // unless it asks for prompt logprobs: then it runs for one token, which
  // its choices drop (they finish with "length", no tokens, the scores).
  // `gen`: the request's options. With best_of above n the requests carry
  // best_of samples each (engine_requests); collect() keeps each prompt's n
  // with the highest cumulative logprob (best first), and their logprobs
  // only when the client asked for them.
  Generation(Engine& engine, std::vector<EngineRequest> requests, const GenerationOptions& gen);

  // Non-streaming: waits for every choice to finish (then keeps best_of's
  // best). False when the client disconnected first (everything is aborted;
  // nothing should be sent).
  bool collect();
  // Streaming: the next event (already applied to choices()), waiting up to
  // `wait`; nullopt on timeout or when done. Sets disconnected() and aborts
  // when the client has gone.
  std::optional<ChoiceEvent> next(std::chrono::milliseconds wait);
  bool done() const { return group_.done() && immediate_.empty(); }
  bool disconnected() const { return disconnected_; }
  void abort() { group_.abort_all(); }

  const std::vector<ChoiceState>& choices() const { return choices_; }
  int32_t n() const { return n_; }  // choices per prompt
  // Every generated token counts, best_of's dropped samples included.
  UsageCounts usage() const;
  // The first error message of a choice that failed ("" when none).
  std::string error() const;

 private:
  void apply(const GroupEvent& ev);
  void keep_best();

  RequestGroup group_;
  std::vector<size_t> member_prompt_;  // the prompt of each submitted request
  std::deque<GroupEvent> immediate_;   // final events of the max_tokens-0 requests, not yet read
  std::vector<bool> scores_only_;      // by prompt: max_tokens 0 with prompt logprobs (output dropped)
  int32_t n_;                          // samples per prompt; keep_n_ after keep_best()
  int32_t keep_n_;                     // the client's n
  bool keep_logprobs_;                 // the client asked for logprobs
  int64_t completion_tokens_ = 0;
  std::vector<int64_t> prompt_lengths_, cached_tokens_;
  std::vector<ChoiceState> choices_;
  bool disconnected_ = false;
};

}  // namespace serval::server
