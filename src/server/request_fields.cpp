#include "server/request_fields.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace serval::server {
namespace {

using nlohmann::json;

constexpr uint8_t C = uint8_t(Endpoint::kCompletions), H = uint8_t(Endpoint::kChat), B = C | H;
constexpr FieldStatus kOk = FieldStatus::kHonoured, kNo = FieldStatus::kRefused, kNop = FieldStatus::kNoop;

const std::vector<FieldRule> kRules = {
    // OpenAI, both endpoints.
    {"model", B, kOk, nullptr, nullptr},
    {"n", B, kOk, nullptr, nullptr},
    {"best_of", B, kOk, nullptr, nullptr},
    {"echo", B, kOk, nullptr, nullptr},  // completions: OpenAI's; chat: vLLM's
    {"frequency_penalty", B, kOk, nullptr, nullptr},
    {"presence_penalty", B, kOk, nullptr, nullptr},
    {"logit_bias", B, kOk, nullptr, nullptr},
    {"logprobs", B, kOk, nullptr, nullptr},
    {"max_tokens", B, kOk, nullptr, nullptr},
    {"seed", B, kOk, nullptr, nullptr},
    {"stop", B, kOk, nullptr, nullptr},
    {"stream", B, kOk, nullptr, nullptr},
    {"stream_options", B, kOk, nullptr, nullptr},
    {"temperature", B, kOk, nullptr, nullptr},
    {"top_p", B, kOk, nullptr, nullptr},
    {"user", B, kNop, "string", nullptr},
    // OpenAI, completions.
    {"prompt", C, kOk, nullptr, nullptr},
    {"suffix", C, kOk, nullptr, nullptr},
    // OpenAI, chat.
    {"messages", H, kOk, nullptr, nullptr},
    {"max_completion_tokens", H, kOk, nullptr, nullptr},
    {"top_logprobs", H, kOk, nullptr, nullptr},
    {"reasoning_effort", H, kOk, nullptr, nullptr},
    {"audio", H, kNo, nullptr, "Serval's models write text only"},
    {"modalities", H, kNo, R"([["text"], []])", "Serval's models write text only"},
    {"moderation", H, kNo, nullptr, "Serval does not moderate requests or outputs"},
    {"verbosity", H, kNo, R"(["medium"])", "Serval's models have no verbosity control"},
    {"web_search_options", H, kNo, nullptr, "Serval has no web search"},
    {"metadata", H, kNop, "object", nullptr},
    {"store", H, kNop, "boolean", nullptr},
    {"service_tier", H, kNop, "string", nullptr},
    {"prompt_cache_key", H, kNop, "string", nullptr},
    {"prompt_cache_options", H, kNop, "object", nullptr},
    {"prompt_cache_retention", H, kNop, "string", nullptr},
    {"safety_identifier", H, kNop, "string", nullptr},
    {"prediction", H, kNop, "object", nullptr},
    // vLLM's sampling fields.
    {"top_k", B, kOk, nullptr, nullptr},
    {"min_p", B, kOk, nullptr, nullptr},
    {"repetition_penalty", B, kOk, nullptr, nullptr},
    {"stop_token_ids", B, kOk, nullptr, nullptr},
    {"include_stop_str_in_output", B, kOk, nullptr, nullptr},
    {"ignore_eos", B, kOk, nullptr, nullptr},
    {"min_tokens", B, kOk, nullptr, nullptr},
    {"skip_special_tokens", B, kOk, nullptr, nullptr},
    {"truncate_prompt_tokens", B, kOk, nullptr, nullptr},
    {"prompt_logprobs", B, kOk, nullptr, nullptr},
    {"spaces_between_special_tokens", B, kNop, "boolean", nullptr},
    {"use_beam_search", B, kNo, "[false]", "Serval has no beam search"},
    {"length_penalty", B, kNo, "[1]", "it weighs beam search, which Serval does not do"},
    {"allowed_token_ids", B, kNo, nullptr,
     "restricting sampling to a list of tokens is not implemented (logit_bias can favour or ban tokens)"},
    {"bad_words", B, kNo, "[[]]", "banning words is not implemented (logit_bias can ban single tokens)"},
    {"max_repetition_pattern_size", B, kNo, "[0]", "stopping on repeated token patterns is not implemented"},
    {"min_repetition_pattern_size", B, kNo, "[0]", "stopping on repeated token patterns is not implemented"},
    {"repetition_min_count", B, kNo, "[0]", "stopping on repeated token patterns is not implemented"},
    // vLLM's other extra fields.
    {"add_special_tokens", B, kOk, nullptr, nullptr},
    {"priority", B, kOk, nullptr, nullptr},
    {"request_id", B, kOk, nullptr, nullptr},
    {"return_token_ids", B, kOk, nullptr, nullptr},
    // Serval's own: false keeps the request's rows free of draft tokens
    // (speculative decoding; docs/SPECULATIVE.md).
    {"speculative", B, kOk, nullptr, nullptr},
    {"add_generation_prompt", H, kOk, nullptr, nullptr},
    {"continue_final_message", H, kOk, nullptr, nullptr},
    {"chat_template_kwargs", H, kOk, nullptr, nullptr},
    {"documents", H, kOk, nullptr, nullptr},
    {"mm_processor_kwargs", H, kNop, "object", nullptr},
    {"prompt_embeds", C, kNo, nullptr, "prompts are text or token ids"},
    {"chat_template", H, kNo, nullptr,
     "a request may not bring its own template (templates run in the server): start the server with --chat-template"},
    {"include_reasoning", H, kNo, "[true]", "Serval does not separate reasoning from the reply (it stays in content)"},
    {"logits_processors", B, kNo, "[[]]", "Serval loads no logits processors"},
    {"return_tokens_as_token_ids", B, kNo, "[false]", "logprobs name tokens by their text"},
    {"cache_salt", B, kNo, nullptr,
     "the prefix cache is shared by all requests (start the server with --no-prefix-cache to keep them apart)"},
    {"kv_transfer_params", B, kNo, "[{}]", "Serval has no KV transfer (disaggregated prefill)"},
    {"vllm_xargs", B, kNo, "[{}]", "Serval has no extensions that read them"},
    // Structured output and tools (server/structured_output.cpp, tool_calls.cpp).
    {"response_format", B, kOk, nullptr, nullptr},
    {"structured_outputs", B, kOk, nullptr, nullptr},
    {"guided_json", B, kOk, nullptr, nullptr},
    {"guided_regex", B, kOk, nullptr, nullptr},
    {"guided_choice", B, kOk, nullptr, nullptr},
    {"guided_grammar", B, kOk, nullptr, nullptr},
    {"tools", H, kOk, nullptr, nullptr},
    {"tool_choice", H, kOk, nullptr, nullptr},
    {"parallel_tool_calls", H, kOk, nullptr, nullptr},
    {"guided_decoding_backend", B, kNop, "string", nullptr},  // one backend: Serval's grammar engine
    {"guided_whitespace_pattern", B, kNo, nullptr,
     "JSON grammars allow their own whitespace (at most one space between tokens, no newlines)"},
    {"structural_tag", H, kNo, nullptr, "structural tags are not supported: use response_format, guided_* or tools"},
    {"functions", H, kNo, nullptr, "the deprecated functions API: use tools"},
    {"function_call", H, kNo, nullptr, "the deprecated functions API: use tool_choice"},
};

// stream_options' fields: include_usage (OpenAI) and continuous_usage_stats
// (vLLM) honoured, include_obfuscation (OpenAI's padding against length side
// channels) a no-op.
const char* const kStreamOptions[] = {"include_usage", "continuous_usage_stats", "include_obfuscation"};

struct Lookup {
  std::unordered_map<std::string, const FieldRule*> by_name;
  std::unordered_map<const FieldRule*, json> accepted;  // parsed `accepts` of refused fields
  Lookup() {
    for (const FieldRule& r : kRules) {
      SERVAL_CHECK(by_name.emplace(r.name, &r).second, "request field ", r.name, " listed twice");
      if (r.status == FieldStatus::kRefused) accepted[&r] = r.accepts ? json::parse(r.accepts) : json::array();
    }
  }
};

const Lookup& lookup() {
  static const Lookup l;
  return l;
}

bool has_type(const json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  return true;
}

// The name as a log line may show it: printable ASCII, at most 64 characters.
std::string printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name.substr(0, 64)) {
    if (c >= 32 && c < 127) {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return name.size() > 64 ? out + "..." : out;
}

}  // namespace

const std::vector<FieldRule>& request_field_rules() { return kRules; }

bool log_unknown_field(const std::string& name, const char* path) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  static bool full = false;
  // Remembered by their first 256 bytes: hostile names of megabytes would
  // otherwise pile up (at most kMaxLoggedNames of them).
  const std::string key = name.substr(0, 256);
  std::lock_guard<std::mutex> lock(mu);
  if (seen.count(key) || full) return false;
  std::string line;
  if (seen.size() >= kMaxLoggedNames) {
    full = true;
    line = str_cat("serval: warning: more than ", kMaxLoggedNames,
                   " unknown request field names seen; further ones are not logged\n");
  } else {
    seen.insert(key);
    line = str_cat("serval: warning: unknown request field '", printable(name), "' in ", path,
                   " ignored (logged once per field name)\n");
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
  return !full;
}

void check_request_fields(const json& body, Endpoint endpoint) {
  const char* path = endpoint == Endpoint::kChat ? "POST /v1/chat/completions" : "POST /v1/completions";
  const Lookup& l = lookup();
  for (const auto& [name, value] : body.items()) {
    auto it = l.by_name.find(name);
    const FieldRule* rule = it == l.by_name.end() ? nullptr : it->second;
    if (!rule || !(rule->endpoints & uint8_t(endpoint))) {
      log_unknown_field(name, path);
      continue;
    }
    if (value.is_null()) continue;  // not given
    if (rule->status == FieldStatus::kRefused) {
      const json& ok = l.accepted.at(rule);
      if (std::find(ok.begin(), ok.end(), value) == ok.end())
        throw ApiError(400, str_cat("'", name, "' is not supported: ", rule->why), name);
    } else if (rule->status == FieldStatus::kNoop && rule->accepts && !has_type(value, rule->accepts)) {
      throw ApiError(400, str_cat("'", name, "' must be a", rule->accepts[0] == 'o' ? "n " : " ", rule->accepts,
                                  ", got ", json_type_name(value)),
                     name);
    }
  }
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    for (const auto& [name, value] : so->items()) {
      if (std::find(std::begin(kStreamOptions), std::end(kStreamOptions), name) == std::end(kStreamOptions))
        log_unknown_field("stream_options." + name, path);
      else if (name == "include_obfuscation" && !value.is_null() && !value.is_boolean())
        throw ApiError(400, "'stream_options.include_obfuscation' must be a boolean", "stream_options.include_obfuscation");
    }
  }
}

}  // namespace serval::server
