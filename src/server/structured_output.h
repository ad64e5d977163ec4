#pragma once
// Structured output: the request fields that constrain the text, as one
// grammar. OpenAI's response_format ({"type": "json_object"}, {"type":
// "json_schema", "json_schema": {"schema", "strict"}}) and vLLM's
// guided_json, guided_regex, guided_choice, guided_grammar (GBNF) and
// structured_outputs {"json", "regex", "choice", "grammar", "json_object"}.
// At most one may be given. A grammar compiles once per distinct spec
// (GrammarCache), and its TokenMasker, which caches masks, is shared by the
// requests that use it. Unsupported schema features are a 400 naming the
// field and the feature (docs/STRUCTURED_OUTPUT.md).
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/token_mask.h"
#include "grammar/token_vocab.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {

struct ConstraintSpec {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kNone;
  std::string field;                 // the request field it came from, for errors
  std::string text;                  // the schema (JSON text), regex or GBNF
  std::vector<std::string> choices;  // kChoice
  bool strict = false;               // kJsonSchema: no properties beyond those listed

  bool empty() const { return kind == Kind::kNone; }
  // Identifies the grammar (the cache key).
  std::string key() const;
};

// The constraint a request body asks for (kNone when none). ApiError 400
// naming the field when malformed or when two are given.
ConstraintSpec parse_constraint(const nlohmann::json& body);

class GrammarCache {
 public:
  explicit GrammarCache(const Tokenizer& tok, size_t capacity = 256) : tok_(tok), capacity_(capacity) {}
  // The masker of `spec`'s grammar, compiled on first use (thread-safe);
  // ApiError 400 naming spec.field when it cannot be compiled.
  std::shared_ptr<const grammar::TokenMasker> get(const ConstraintSpec& spec);

 private:
  const Tokenizer& tok_;
  size_t capacity_;
  std::mutex mu_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;  // built on first use
  std::list<std::string> lru_;                              // most recent first
  struct Slot {
    std::shared_ptr<const grammar::TokenMasker> masker;
    std::list<std::string>::iterator at;
  };
  std::unordered_map<std::string, Slot> map_;
};

}  // namespace serval::server
