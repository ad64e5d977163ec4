#pragma once
// OpenAI response bodies: completion and chat.completion objects, their
// streaming chunks, usage and logprobs, built from engine output.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/logprobs.h"
#include "sched/stop_criteria.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {

// Identifies a response and each of its chunks.
struct ResponseMeta {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

struct UsageCounts {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// A fresh id with the given prefix: prefix + 24 random hex digits.
std::string new_response_id(const std::string& prefix);
int64_t unix_now();

nlohmann::json usage_json(const UsageCounts& u);
// OpenAI's finish_reason: null while running, else "stop", "length", "abort", ...
nlohmann::json finish_json(FinishReason reason);
// vLLM's stop_reason: the stop string that ended the choice, or the stop
// token id, else null (EOS, length, still running).
nlohmann::json stop_reason_json(const std::optional<std::string>& stop_string, const std::optional<int32_t>& stop_token);

// The text a token stands for (raw bytes; invalid UTF-8 is replaced when dumped).
std::string token_text(const Tokenizer& tok, int32_t id);
// /v1/completions logprobs of `ids` (tokens, token_logprobs, top_logprobs,
// text_offset); `text_offset` is where the first token starts in the choice's
// text and is advanced past the tokens.
nlohmann::json completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                   const std::vector<Logprobs>& lps, int64_t& text_offset);
// The same for an echoed prompt and the output after it: the prompt's tokens
// first, with their scores (null where there is none: the first token), as
// lm-eval's likelihood tasks read them.
nlohmann::json echoed_completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                                          const std::vector<std::optional<Logprobs>>& prompt_lps,
                                          const std::vector<int32_t>& ids, const std::vector<Logprobs>& lps,
                                          int64_t& text_offset);
// vLLM's prompt_logprobs: per prompt token null (the first) or
// {"<token id>": {"logprob", "rank", "decoded_token"}} for the token and the top n.
nlohmann::json vllm_prompt_logprobs(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                                    const std::vector<std::optional<Logprobs>>& prompt_lps);
// /v1/chat/completions logprobs: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}.
nlohmann::json chat_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids,
                             const std::vector<Logprobs>& lps);

// Whole responses.
nlohmann::json completion_object(const ResponseMeta& m, nlohmann::json choices, const UsageCounts& u);
nlohmann::json chat_object(const ResponseMeta& m, nlohmann::json choices, const UsageCounts& u);
// Streaming chunks with one choice; `with_usage_null` adds "usage": null, as
// OpenAI does on every chunk when include_usage is set.
nlohmann::json completion_chunk(const ResponseMeta& m, nlohmann::json choice, bool with_usage_null);
nlohmann::json chat_chunk(const ResponseMeta& m, nlohmann::json choice, bool with_usage_null);
// The last chunk when include_usage is set: no choices, the usage.
nlohmann::json usage_chunk(const ResponseMeta& m, const char* object, const UsageCounts& u);

// JSON text for the wire (invalid UTF-8 replaced by U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace serval::server
