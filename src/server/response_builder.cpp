#include "server/response_builder.h"

#include <chrono>
#include <random>

namespace serval::server {

using nlohmann::json;

std::string new_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json usage_json(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json finish_json(FinishReason reason) {
  const char* name = finish_reason_name(reason);
  return name ? json(name) : json(nullptr);
}

json stop_reason_json(const std::optional<std::string>& stop_string, const std::optional<int32_t>& stop_token) {
  if (stop_string) return *stop_string;
  if (stop_token) return *stop_token;
  return nullptr;
}

std::string token_text(const Tokenizer& tok, int32_t id) { return tok.token_bytes(id); }

namespace {

// The four parallel lists of /v1/completions logprobs.
struct CompletionLogprobs {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();

  // One token; `lp` null: no score (nulls, as for an echoed prompt's first token).
  void add(const Tokenizer& tok, int32_t id, const Logprobs* lp, int64_t& text_offset) {
    const std::string t = token_text(tok, id);
    tokens.push_back(t);
    offsets.push_back(text_offset);
    text_offset += int64_t(t.size());
    if (lp == nullptr) {
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
      return;
    }
    token_lps.push_back(lp->chosen);
    json top = json::object();
    for (const TokenLogprob& e : lp->top) top[token_text(tok, e.token)] = e.logprob;
    top[t] = lp->chosen;  // the token itself is always listed, as vLLM does
    tops.push_back(std::move(top));
  }
  void add_all(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<Logprobs>& lps,
               int64_t& text_offset) {
    for (size_t i = 0; i < ids.size(); ++i) add(tok, ids[i], i < lps.size() ? &lps[i] : nullptr, text_offset);
  }
  json to_json() {
    return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(token_lps)}, {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
  }
};

}  // namespace

json completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<Logprobs>& lps,
                         int64_t& text_offset) {
  CompletionLogprobs out;
  out.add_all(tok, ids, lps, text_offset);
  return out.to_json();
}

json echoed_completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                                const std::vector<std::optional<Logprobs>>& prompt_lps,
                                const std::vector<int32_t>& ids, const std::vector<Logprobs>& lps,
                                int64_t& text_offset) {
  CompletionLogprobs out;
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    const Logprobs* lp = i < prompt_lps.size() && prompt_lps[i] ? &*prompt_lps[i] : nullptr;
    out.add(tok, prompt_ids[i], lp, text_offset);
  }
  out.add_all(tok, ids, lps, text_offset);
  return out.to_json();
}

json vllm_prompt_logprobs(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                          const std::vector<std::optional<Logprobs>>& prompt_lps) {
  json out = json::array();
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (i >= prompt_lps.size() || !prompt_lps[i]) {
      out.push_back(nullptr);
      continue;
    }
    const Logprobs& lp = *prompt_lps[i];
    json entry = json::object();
    for (size_t k = 0; k < lp.top.size(); ++k)
      entry[std::to_string(lp.top[k].token)] = {
          {"logprob", lp.top[k].logprob}, {"rank", k + 1}, {"decoded_token", token_text(tok, lp.top[k].token)}};
    entry[std::to_string(prompt_ids[i])] = {
        {"logprob", lp.chosen}, {"rank", lp.chosen_rank}, {"decoded_token", token_text(tok, prompt_ids[i])}};
    out.push_back(std::move(entry));
  }
  return out;
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}
}  // namespace

json chat_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<Logprobs>& lps) {
  json content = json::array();
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    const std::string t = token_text(tok, ids[i]);
    json top = json::array();
    for (const TokenLogprob& e : lps[i].top) {
      const std::string et = token_text(tok, e.token);
      top.push_back({{"token", et}, {"logprob", e.logprob}, {"bytes", bytes_of(et)}});
    }
    content.push_back({{"token", t}, {"logprob", lps[i].chosen}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

namespace {
json envelope(const ResponseMeta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}
}  // namespace

json completion_object(const ResponseMeta& m, json choices, const UsageCounts& u) {
  json j = envelope(m, "text_completion");
  j["choices"] = std::move(choices);
  j["usage"] = usage_json(u);
  return j;
}

json chat_object(const ResponseMeta& m, json choices, const UsageCounts& u) {
  json j = envelope(m, "chat.completion");
  j["choices"] = std::move(choices);
  j["usage"] = usage_json(u);
  return j;
}

json completion_chunk(const ResponseMeta& m, json choice, bool with_usage_null) {
  json j = envelope(m, "text_completion");
  j["choices"] = json::array({std::move(choice)});
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

json chat_chunk(const ResponseMeta& m, json choice, bool with_usage_null) {
  json j = envelope(m, "chat.completion.chunk");
  j["choices"] = json::array({std::move(choice)});
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseMeta& m, const char* object, const UsageCounts& u) {
  json j = envelope(m, object);
  j["choices"] = json::array();
  j["usage"] = usage_json(u);
  return j;
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace serval::server
