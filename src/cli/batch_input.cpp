#include "cli/batch_input.h"

#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace serval::cli {
namespace {

using nlohmann::json;

// Throws `field "name": expected ..., got <type>`.
[[noreturn]] void bad(const std::string& field, const std::string& expected, const json& got) {
  fail("field \"", field, "\": expected ", expected, ", got ", got.dump(-1, ' ', false,
       json::error_handler_t::replace));
}

int64_t integer(const json& v, const std::string& field) {
  if (!v.is_number_integer()) bad(field, "an integer", v);
  return v.get<int64_t>();
}

int32_t int32(const json& v, const std::string& field) {
  const int64_t x = integer(v, field);
  if (x < INT32_MIN || x > INT32_MAX) bad(field, "a 32-bit integer", v);
  return int32_t(x);
}

float number(const json& v, const std::string& field) {
  if (!v.is_number()) bad(field, "a number", v);
  return v.get<float>();
}

std::vector<int32_t> token_ids(const json& v, const std::string& field) {
  if (!v.is_array()) bad(field, "a list of token ids", v);
  std::vector<int32_t> ids;
  for (const json& x : v) {
    if (!x.is_number_integer()) bad(field, "a list of token ids (integers)", v);
    ids.push_back(int32(x, field));
  }
  return ids;
}

std::vector<std::string> strings(const json& v, const std::string& field) {
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) bad(field, "a string or a list of strings", v);
  std::vector<std::string> out;
  for (const json& x : v) {
    if (!x.is_string()) bad(field, "a string or a list of strings", v);
    out.push_back(x.get<std::string>());
  }
  return out;
}

EngineRequest parse_request(const std::string& text, const Tokenizer& tok,
                            const EngineRequest& defaults, bool add_special) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail("expected a JSON object (an OpenAI completions request)");
  if (!j.contains("prompt")) fail("field \"prompt\" is missing");
  EngineRequest r = defaults;
  r.stop_strings.clear();
  r.stop.stop_token_ids.clear();
  for (const auto& [key, v] : j.items()) {
    if (key == "prompt") {
      if (v.is_string()) {
        r.prompt_ids = tok.encode(v.get<std::string>(), add_special);
      } else if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
        r.prompt_ids = token_ids(v, key);
      } else {
        bad(key, "a string or a list of token ids (one prompt per line)", v);
      }
      continue;
    }
    if (v.is_null()) continue;  // OpenAI's "not set"
    if (key == "max_tokens") r.stop.max_tokens = int32(v, key);
    else if (key == "min_tokens") r.stop.min_tokens = int32(v, key);
    else if (key == "temperature") r.params.temperature = number(v, key);
    else if (key == "top_p") r.params.top_p = number(v, key);
    else if (key == "top_k") r.params.top_k = int32(v, key);
    else if (key == "min_p") r.params.min_p = number(v, key);
    else if (key == "presence_penalty") r.params.presence_penalty = number(v, key);
    else if (key == "frequency_penalty") r.params.frequency_penalty = number(v, key);
    else if (key == "repetition_penalty") r.params.repetition_penalty = number(v, key);
    else if (key == "seed") {
      const int64_t seed = integer(v, key);
      if (seed < 0) bad(key, "a non-negative integer", v);
      r.params.seed = uint64_t(seed);
    } else if (key == "logprobs") r.params.logprobs = int32(v, key);
    else if (key == "n") r.n = int32(v, key);
    else if (key == "stop") r.stop_strings = strings(v, key);
    else if (key == "stop_token_ids") r.stop.stop_token_ids = token_ids(v, key);
    else if (key == "ignore_eos") {
      if (!v.is_boolean()) bad(key, "true or false", v);
      r.stop.ignore_eos = v.get<bool>();
    } else if (key == "stream") {
      if (!v.is_boolean() || v.get<bool>()) bad(key, "false (batch results are not streamed)", v);
    } else if (key != "model" && key != "user") {
      fail("field \"", key, "\" is not supported");
    }
  }
  // Named errors for the values (the engine checks lengths and ids later).
  r.params.validate();
  r.stop.validate();
  if (r.n < 1) fail("field \"n\": must be at least 1, got ", r.n);
  return r;
}

}  // namespace

std::vector<BatchItem> read_batch_input(std::istream& in, const Tokenizer& tok,
                                        const EngineRequest& defaults, bool add_special) {
  std::vector<BatchItem> items;
  std::vector<std::string> errors;
  size_t num_errors = 0;
  std::string text;
  for (int64_t line = 0; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      items.push_back(BatchItem{line, parse_request(text, tok, defaults, add_special)});
    } catch (const Error& e) {
      if (++num_errors <= 20) errors.push_back(str_cat("line ", line + 1, ": ", e.what()));
    }
  }
  if (num_errors > 0) {
    std::string msg = str_cat(num_errors, " bad request line", num_errors > 1 ? "s" : "",
                              " in the input (nothing was run):");
    for (const std::string& e : errors) msg += "\n  " + e;
    if (num_errors > errors.size()) msg += str_cat("\n  ... and ", num_errors - errors.size(), " more");
    fail(msg);
  }
  SERVAL_CHECK(!items.empty(), "the input has no requests (one JSON object per line)");
  return items;
}

}  // namespace serval::cli
