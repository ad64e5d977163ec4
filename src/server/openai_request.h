#pragma once
// OpenAI request bodies -> validated Serval requests. Parsing checks types and
// ranges and throws ApiError 400 naming the parameter; tokenizing, the chat
// template and the context-length check happen later, in the handlers.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"

namespace serval::server {

// What /v1/completions and /v1/chat/completions share.
struct GenerationOptions {
  std::string model;                 // "" when not given
  SamplingParams params;             // logprobs filled per endpoint
  std::optional<int32_t> max_tokens; // not given: endpoint default
  int32_t min_tokens = 0;
  int32_t n = 1;
  // Samples per prompt (OpenAI's best_of): when above n, the n with the
  // highest cumulative logprob are returned (not with stream). 0: n.
  int32_t best_of = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool speculative = true;           // Serval's "speculative": false opts out of draft tokens
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  bool continuous_usage = false;     // stream_options.continuous_usage_stats (vLLM), with include_usage
  int32_t priority = 0;              // vLLM's: lower is scheduled first
  std::string request_id;            // vLLM's: the response id is cmpl-/chatcmpl- + this ("" = random)
  // vLLM's truncate_prompt_tokens: keep the prompt's last k tokens; -1: the
  // context length. Unset: no truncation.
  std::optional<int32_t> truncate_prompt_tokens;
  bool return_token_ids = false;     // vLLM's: token_ids and prompt_token_ids in the response
  // vLLM's prompt_logprobs field (0..20): the response carries them. The
  // engine's params.prompt_logprobs may be set without it (echo + logprobs).
  std::optional<int32_t> prompt_logprobs;
  ConstraintSpec constraint;  // structured output (response_format, guided_*, structured_outputs)
};

// A prompt: text to tokenize, or token ids.
struct PromptInput {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> ids;
};

struct CompletionRequest {
  GenerationOptions gen;
  std::vector<PromptInput> prompts;  // at least one
  bool echo = false;
  bool add_special_tokens = true;    // BOS before text prompts, as the model's tokenizer does
  std::string suffix;                // fill-in-the-middle: the text after the completion ("" = none)
};

struct ChatRequest {
  GenerationOptions gen;
  // Kept in the client's key order (ordered_json): templates print tool
  // schemas and arguments with tojson, as Python dicts keep insertion order.
  nlohmann::ordered_json messages;  // normalized: content as a string (or null)
  nlohmann::ordered_json tools;     // null when none
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = false;   // vLLM's: BOS on top of what the template writes
  bool echo = false;                 // vLLM's: the reply starts with the last message when it has the reply's role
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // tool_choice ("none" | "auto" | "required" | a function) and
  // parallel_tool_calls; see server/tool_calls.h.
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
};

// Bounds that keep numbers sane before the engine sees them.
constexpr int64_t kMaxTokensLimit = 1 << 24;
constexpr int64_t kMaxN = 128;

CompletionRequest parse_completion_request(const nlohmann::json& body);
// The body parsed with parse_ordered_json_object (key order kept).
ChatRequest parse_chat_request(const nlohmann::ordered_json& body);

// The "prompt" field of /v1/completions or /tokenize.
std::vector<PromptInput> parse_prompts(const nlohmann::json& prompt);
// The "messages" field, normalized (text parts joined, tool-call arguments
// given as JSON strings turned into objects as the templates expect).
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages);

}  // namespace serval::server
