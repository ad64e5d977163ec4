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

std::string token_text(const Tokenizer& tok, int32_t id) { return tok.token_bytes(id); }

json completion_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<Logprobs>& lps,
                         int64_t& text_offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string t = token_text(tok, ids[i]);
    tokens.push_back(t);
    offsets.push_back(text_offset);
    text_offset += int64_t(t.size());
    if (i < lps.size()) {
      token_lps.push_back(lps[i].chosen);
      json top = json::object();
      for (const TokenLogprob& e : lps[i].top) top[token_text(tok, e.token)] = e.logprob;
      top[t] = lps[i].chosen;  // the sampled token is always listed, as vLLM does
      tops.push_back(std::move(top));
    } else {
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
    }
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
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
