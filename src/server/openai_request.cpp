#include "server/openai_request.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace serval::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using ojson = nlohmann::ordered_json;

std::vector<int32_t> token_ids(const json& arr, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& v : arr) {
    if (!v.is_number_integer() && !v.is_number_unsigned())
      throw ApiError(400, str_cat("'", param, "' must hold token ids (integers), got ", json_type_name(v)), param);
    const int64_t id = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), 1ull << 40))
                                              : v.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw ApiError(400, str_cat("'", param, "' holds token id ", v.dump(), ", not a valid id"), param);
    ids.push_back(int32_t(id));
  }
  return ids;
}

void parse_stop(const json& body, GenerationOptions& g) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    g.stop.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const json& s : *it) {
      if (!s.is_string()) throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
      g.stop.push_back(s.get<std::string>());
    }
  } else {
    throw ApiError(400, str_cat("'stop' must be a string or a list of strings, got ", json_type_name(*it)), "stop");
  }
  // An empty stop string matches nowhere: ignored, as OpenAI does (vLLM refuses it).
  std::erase_if(g.stop, [](const std::string& s) { return s.empty(); });
}

// vLLM's request_id becomes the response id and goes into a header and the
// access log: printable ASCII without spaces, at most 128 characters.
std::string request_id(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 128 &&
                  std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
  if (!ok)
    throw ApiError(400, "'request_id' must be 1 to 128 printable ASCII characters without spaces", "request_id");
  return id;
}

// Fields common to both endpoints (sampling, stopping, streaming).
GenerationOptions parse_generation(const json& body) {
  GenerationOptions g;
  if (auto m = get_string(body, "model")) g.model = *m;
  SamplingParams& p = g.params;
  if (auto v = get_float(body, "temperature")) p.temperature = *v;
  if (auto v = get_float(body, "top_p")) p.top_p = *v;
  if (auto v = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())) p.top_k = int32_t(*v);
  if (auto v = get_float(body, "min_p")) p.min_p = *v;
  if (auto v = get_float(body, "presence_penalty")) p.presence_penalty = *v;
  if (auto v = get_float(body, "frequency_penalty")) p.frequency_penalty = *v;
  if (auto v = get_float(body, "repetition_penalty")) p.repetition_penalty = *v;
  if (auto v = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    p.seed = uint64_t(*v);
  if (auto v = get_int(body, "max_tokens", 0, kMaxTokensLimit)) g.max_tokens = int32_t(*v);
  if (auto v = get_int(body, "min_tokens", 0, kMaxTokensLimit)) g.min_tokens = int32_t(*v);
  if (auto v = get_int(body, "n", 1, kMaxN)) g.n = int32_t(*v);
  // OpenAI: best_of must be at least n (its schema's minimum of 0 contradicts that for any n >= 1).
  if (auto v = get_int(body, "best_of", 0, kMaxN)) {
    if (*v < g.n) throw ApiError(400, str_cat("'best_of' must be at least n (", g.n, "), got ", *v), "best_of");
    g.best_of = int32_t(*v);
  }
  parse_stop(body, g);
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw ApiError(400, "'stop_token_ids' must be a list of token ids", "stop_token_ids");
    g.stop_token_ids = token_ids(*it, "stop_token_ids");
  }
  if (auto v = get_int(body, "prompt_logprobs", 0, SamplingParams::kMaxLogprobs)) {
    g.prompt_logprobs = int32_t(*v);
    p.prompt_logprobs = int32_t(*v);
  }
  g.constraint = parse_constraint(body);
  if (auto v = get_bool(body, "ignore_eos")) g.ignore_eos = *v;
  if (auto v = get_bool(body, "include_stop_str_in_output")) g.include_stop_str_in_output = *v;
  if (auto v = get_bool(body, "skip_special_tokens")) g.skip_special_tokens = *v;
  if (auto v = get_bool(body, "speculative")) g.speculative = *v;
  if (auto v = get_bool(body, "stream")) g.stream = *v;
  if (const json* so = get_object(body, "stream_options")) {
    if (!g.stream) throw ApiError(400, "'stream_options' is only allowed with stream: true", "stream_options");
    if (auto v = get_bool(*so, "include_usage")) g.include_usage = *v;
    if (auto v = get_bool(*so, "continuous_usage_stats")) g.continuous_usage = *v && g.include_usage;
  }
  // As OpenAI: the best choices are known only once all are done.
  if (g.stream && g.best_of > g.n)
    throw ApiError(400, str_cat("'best_of' (", g.best_of, ") above n (", g.n, ") cannot be streamed"), "best_of");
  if (auto v = get_int(body, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()))
    g.priority = int32_t(*v);
  if (auto v = get_string(body, "request_id")) g.request_id = request_id(*v);
  if (auto v = get_int(body, "truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max())) {
    if (*v == 0)
      throw ApiError(400, "'truncate_prompt_tokens' must be -1 (the context length) or at least 1, got 0",
                     "truncate_prompt_tokens");
    g.truncate_prompt_tokens = int32_t(*v);
  }
  if (auto v = get_bool(body, "return_token_ids")) g.return_token_ids = *v;
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      throw ApiError(400, str_cat("'logit_bias' must map token ids to biases, got ", json_type_name(*it)), "logit_bias");
    for (const auto& [key, value] : it->items()) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > std::numeric_limits<int32_t>::max())
        throw ApiError(400, str_cat("'logit_bias' keys must be token ids, got \"", key, "\""), "logit_bias");
      if (!value.is_number())
        throw ApiError(400, str_cat("'logit_bias' values must be numbers, got ", json_type_name(value), " for token ", key),
                       "logit_bias");
      const double bias = value.get<double>();
      if (!(bias >= -SamplingParams::kMaxLogitBias && bias <= SamplingParams::kMaxLogitBias))
        throw ApiError(400, str_cat("'logit_bias' values must be in [-100, 100], got ", value.dump(), " for token ", key),
                       "logit_bias");
      for (const auto& [seen, b] : p.logit_bias)
        if (seen == int32_t(id)) throw ApiError(400, str_cat("'logit_bias' names token ", id, " twice"), "logit_bias");
      p.logit_bias.emplace_back(int32_t(id), float(bias));
    }
  }
  try {
    p.validate();
  } catch (const Error& e) {
    throw to_api_error(e);
  }
  if (g.min_tokens > 0 && g.max_tokens && g.min_tokens > *g.max_tokens)
    throw ApiError(400, str_cat("'min_tokens' (", g.min_tokens, ") must not exceed max_tokens (", *g.max_tokens, ")"),
                   "min_tokens");
  return g;
}

std::string content_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw ApiError(400, str_cat("'", param, "' must be a string or a list of text parts, got ", json_type_name(content)),
                   param);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string where = str_cat(param, "[", i, "]");
    if (!part.is_object()) throw ApiError(400, str_cat("'", where, "' must be an object"), where);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text")
      throw ApiError(400, str_cat("'", where, ".type' must be \"text\" (only text parts are supported)"),
                     where + ".type");
    auto t = part.find("text");
    if (t == part.end() || !t->is_string())
      throw ApiError(400, str_cat("'", where, ".text' must be a string"), where + ".text");
    if (i > 0) text += "\n";
    text += t->get<std::string>();
  }
  return text;
}

}  // namespace

std::vector<PromptInput> parse_prompts(const json& prompt) {
  std::vector<PromptInput> out;
  auto bad = [&] {
    return ApiError(400, "'prompt' must be a string, a list of token ids, or a list of either", "prompt");
  };
  if (prompt.is_string()) {
    out.push_back({true, prompt.get<std::string>(), {}});
  } else if (prompt.is_array()) {
    if (prompt.empty()) throw ApiError(400, "'prompt' is empty", "prompt");
    if (prompt[0].is_number()) {
      out.push_back({false, "", token_ids(prompt, "prompt")});
    } else {
      for (const json& p : prompt) {
        if (p.is_string()) out.push_back({true, p.get<std::string>(), {}});
        else if (p.is_array()) out.push_back({false, "", token_ids(p, "prompt")});
        else throw bad();
      }
    }
  } else {
    throw bad();
  }
  for (const PromptInput& p : out)
    if (!p.is_text && p.ids.empty()) throw ApiError(400, "'prompt' holds an empty list of token ids", "prompt");
  return out;
}

ojson normalize_messages(const ojson& messages) {
  if (!messages.is_array() || messages.empty())
    throw ApiError(400, "'messages' must be a non-empty list of messages", "messages");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = str_cat("messages[", i, "]");
    const ojson& m = messages[i];
    if (!m.is_object()) throw ApiError(400, str_cat("'", where, "' must be an object"), where);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw ApiError(400, str_cat("'", where, ".role' must be a string"), where + ".role");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      throw ApiError(400, str_cat("'", where, ".role' must be system, user, assistant, tool or developer, got \"",
                                  r, "\""), where + ".role");
    ojson n = m;
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (r != "assistant") throw ApiError(400, str_cat("'", where, ".content' is missing"), where + ".content");
      n["content"] = "";  // an assistant turn of tool calls only; templates test `'x' in content`
    } else {
      n["content"] = content_text(*content, where + ".content");
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) throw ApiError(400, str_cat("'", where, ".tool_calls' must be a list"), where + ".tool_calls");
      for (ojson& call : n["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          throw ApiError(400, str_cat("'", where, ".tool_calls' entries need a 'function' object"), where + ".tool_calls");
        ojson& args = call["function"]["arguments"];
        if (args.is_string()) {  // the templates print arguments with tojson: give them the object
          ojson parsed = ojson::parse(args.get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) args = parsed;
        }
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

CompletionRequest parse_completion_request(const json& body) {
  CompletionRequest r;
  r.gen = parse_generation(body);
  auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
  r.prompts = parse_prompts(*prompt);
  if (auto v = get_bool(body, "echo")) r.echo = *v;
  if (auto v = get_bool(body, "add_special_tokens")) r.add_special_tokens = *v;
  if (auto v = get_int(body, "logprobs", 0, SamplingParams::kMaxLogprobs)) r.gen.params.logprobs = int32_t(*v);
  if (auto s = get_string(body, "suffix")) r.suffix = *s;
  if (!r.suffix.empty() && r.echo)
    throw ApiError(400,
                   "'suffix' cannot be combined with echo: the model reads the prompt rearranged around its "
                   "fill-in-the-middle tokens, so there is no prompt text to echo",
                   "suffix");
  // The echoed prompt's tokens come with their logprobs and top n (lm-eval's likelihood tasks).
  if (r.echo && r.gen.params.logprobs >= 0)
    r.gen.params.prompt_logprobs = std::max(r.gen.params.prompt_logprobs, r.gen.params.logprobs);
  return r;
}

ChatRequest parse_chat_request(const ojson& ordered) {
  const json body = ordered;  // typed fields; messages and tools keep their order below
  ChatRequest r;
  r.gen = parse_generation(body);
  if (auto v = get_int(body, "max_completion_tokens", 0, kMaxTokensLimit)) r.gen.max_tokens = int32_t(*v);
  auto messages = ordered.find("messages");
  if (messages == ordered.end() || messages->is_null()) throw ApiError(400, "'messages' is required", "messages");
  r.messages = normalize_messages(*messages);
  if (auto it = ordered.find("tools"); it != ordered.end() && !it->is_null()) {
    if (!it->is_array()) throw ApiError(400, "'tools' must be a list of tools", "tools");
    if (!it->empty()) r.tools = *it;
  }
  r.tool_choice = parse_tool_choice(body, r.tools);
  if (auto v = get_bool(body, "parallel_tool_calls")) r.parallel_tool_calls = *v;
  const std::optional<bool> generation_prompt = get_bool(body, "add_generation_prompt");
  if (generation_prompt) r.add_generation_prompt = *generation_prompt;
  if (auto v = get_bool(body, "continue_final_message")) r.continue_final_message = *v;
  if (r.continue_final_message) {
    if (generation_prompt.value_or(false))
      throw ApiError(400, "'continue_final_message' and 'add_generation_prompt' cannot both be true",
                     "continue_final_message");
    r.add_generation_prompt = false;  // vLLM's default of true gives way
  }
  if (auto v = get_bool(body, "add_special_tokens")) r.add_special_tokens = *v;
  if (auto v = get_bool(body, "echo")) r.echo = *v;
  if (get_object(body, "chat_template_kwargs")) r.template_kwargs = ordered["chat_template_kwargs"];
  // Template variables, as vLLM passes them (templates that do not read them ignore them).
  if (auto v = get_string(body, "reasoning_effort")) r.template_kwargs["reasoning_effort"] = *v;
  if (auto it = ordered.find("documents"); it != ordered.end() && !it->is_null()) {
    if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const ojson& d) { return d.is_object(); }))
      throw ApiError(400, "'documents' must be a list of objects (such as {\"title\", \"text\"})", "documents");
    r.template_kwargs["documents"] = *it;
  }
  if (auto v = get_bool(body, "logprobs")) r.logprobs = *v;
  if (auto v = get_int(body, "top_logprobs", 0, SamplingParams::kMaxLogprobs)) {
    if (!r.logprobs) throw ApiError(400, "'top_logprobs' needs logprobs: true", "top_logprobs");
    r.top_logprobs = int32_t(*v);
  }
  r.gen.params.logprobs = r.logprobs ? r.top_logprobs : -1;
  return r;
}

}  // namespace serval::server
