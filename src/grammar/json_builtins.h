#pragma once
// The building blocks of JSON grammars: whitespace, strings, numbers, any
// JSON value, string formats, and the built-in grammars for OpenAI's
// `json_object` mode and vLLM's `guided_choice`.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace serval::grammar {

struct JsonGrammarOptions {
  // Whitespace between JSON tokens: at most this many characters, so that a
  // model cannot loop in whitespace forever. 0 = compact JSON.
  uint32_t max_whitespace = 1;
  // Whether that whitespace may hold newlines and tabs too (pretty printing).
  bool allow_newlines = false;
};

// Rule names the built-in rules use (schema rules must avoid them).
inline constexpr const char* kWs = "ws";
inline constexpr const char* kJsonValue = "json-value";
inline constexpr const char* kJsonString = "json-string";
inline constexpr const char* kJsonChar = "json-char";
inline constexpr const char* kJsonNumber = "json-number";
inline constexpr const char* kJsonInteger = "json-integer";
inline constexpr const char* kJsonObject = "json-object";
inline constexpr const char* kJsonArray = "json-array";

// Adds ws, json-value, json-object, json-array, json-string, json-char,
// json-number and json-integer to `g` (they refer to each other).
void add_json_builtins(Grammar& g, const JsonGrammarOptions& opts);
bool is_json_builtin(std::string_view rule);

// An expression over decoded characters (a regex) rewritten to match the
// same characters as written inside a JSON string (" \ and controls escaped).
ExprPtr json_escape_expr(const ExprPtr& e);
// The JSON text of a string (with its quotes), as a literal.
ExprPtr json_string_literal(std::string_view utf8);
// The contents (no quotes) of a JSON string whose decoded value is none of
// `names`, then the closing quote. Within a prefix of a name, characters are
// written unescaped, so no escape can spell a name in another way.
ExprPtr json_string_rest_not_in(const std::vector<std::string>& names, Grammar& g, const std::string& rule_prefix);

// A string format's characters (without quotes), or nullptr when the format
// is not one of: date, time, date-time, uuid, email, ipv4.
ExprPtr json_format(std::string_view format);

// Any JSON object (OpenAI's response_format json_object).
Grammar json_object_grammar(const JsonGrammarOptions& opts = {});
// Exactly one of the strings (vLLM's guided_choice).
Grammar choice_grammar(const std::vector<std::string>& choices);

}  // namespace serval::grammar
