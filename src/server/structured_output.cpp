#include "server/structured_output.h"

#include "core/error.h"
#include "grammar/compiled_grammar.h"
#include "grammar/ebnf_parser.h"
#include "grammar/json_builtins.h"
#include "grammar/json_schema_grammar.h"
#include "grammar/regex_to_grammar.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace serval::server {
namespace {

using nlohmann::json;
using Kind = ConstraintSpec::Kind;

// A schema given as an object or as JSON text (vLLM accepts both).
std::string schema_text(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    const json parsed = json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
      throw ApiError(400, str_cat("'", field, "' must be a JSON schema (an object, or its JSON text)"), field);
    return v.get<std::string>();
  }
  throw ApiError(400, str_cat("'", field, "' must be a JSON schema, got ", json_type_name(v)), field);
}

std::string string_of(const json& v, const std::string& field) {
  if (!v.is_string() || v.get<std::string>().empty())
    throw ApiError(400, str_cat("'", field, "' must be a non-empty string"), field);
  return v.get<std::string>();
}

std::vector<std::string> choices_of(const json& v, const std::string& field) {
  if (!v.is_array() || v.empty()) throw ApiError(400, str_cat("'", field, "' must be a non-empty list of strings"), field);
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) throw ApiError(400, str_cat("'", field, "' must hold strings, got ", json_type_name(c)), field);
    out.push_back(c.get<std::string>());
  }
  return out;
}

ConstraintSpec from_response_format(const json& rf) {
  ConstraintSpec s;
  s.field = "response_format";
  if (!rf.is_object()) throw ApiError(400, "'response_format' must be an object", s.field);
  auto type = rf.find("type");
  if (type == rf.end() || !type->is_string())
    throw ApiError(400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", s.field);
  const std::string t = type->get<std::string>();
  if (t == "text") return {};
  if (t == "json_object") {
    s.kind = Kind::kJsonObject;
    return s;
  }
  if (t != "json_schema")
    throw ApiError(400, str_cat("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"", t,
                                "\""),
                   s.field);
  auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object())
    throw ApiError(400, "'response_format.json_schema' must be an object with a 'schema'", s.field);
  auto schema = js->find("schema");
  s.kind = Kind::kJsonSchema;
  // OpenAI: a json_schema without a schema means any JSON object.
  s.text = schema == js->end() || schema->is_null() ? "{\"type\": \"object\"}" : schema_text(*schema, s.field);
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null()) {
    if (!strict->is_boolean()) throw ApiError(400, "'response_format.json_schema.strict' must be a boolean", s.field);
    s.strict = strict->get<bool>();
  }
  return s;
}

// vLLM's structured_outputs object, or one guided_* field.
ConstraintSpec from_vllm(const std::string& key, const json& v) {
  ConstraintSpec s;
  s.field = key;
  if (key == "guided_json" || key == "json") {
    s.kind = Kind::kJsonSchema;
    s.text = schema_text(v, key);
  } else if (key == "guided_regex" || key == "regex") {
    s.kind = Kind::kRegex;
    s.text = string_of(v, key);
  } else if (key == "guided_choice" || key == "choice") {
    s.kind = Kind::kChoice;
    s.choices = choices_of(v, key);
  } else if (key == "guided_grammar" || key == "grammar") {
    s.kind = Kind::kGrammar;
    s.text = string_of(v, key);
  } else if (key == "json_object") {
    if (!v.is_boolean()) throw ApiError(400, "'json_object' must be a boolean", key);
    if (v.get<bool>()) s.kind = Kind::kJsonObject;
  }
  return s;
}

}  // namespace

std::string ConstraintSpec::key() const {
  json k = {{"kind", int(kind)}, {"text", text}, {"choices", choices}, {"strict", strict}};
  return k.dump();
}

ConstraintSpec parse_constraint(const json& body) {
  ConstraintSpec found;
  auto take = [&](ConstraintSpec s) {
    if (s.empty()) return;
    if (!found.empty())
      throw ApiError(400, str_cat("'", s.field, "' and '", found.field, "' both constrain the output: give one"),
                     s.field);
    found = std::move(s);
  };
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) take(from_response_format(*rf));
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"})
    if (auto v = body.find(key); v != body.end() && !v->is_null()) take(from_vllm(key, *v));
  if (auto so = body.find("structured_outputs"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) throw ApiError(400, "'structured_outputs' must be an object", "structured_outputs");
    for (const auto& [key, v] : so->items()) {
      if (v.is_null()) continue;
      if (key == "json" || key == "regex" || key == "choice" || key == "grammar" || key == "json_object") {
        ConstraintSpec s = from_vllm(key, v);
        s.field = "structured_outputs." + key;
        take(std::move(s));
      } else if (key != "disable_fallback" && key != "disable_any_whitespace" && key != "whitespace_pattern" &&
                 key != "backend" && key != "disable_additional_properties") {
        throw ApiError(400, str_cat("'structured_outputs.", key, "' is not supported"), "structured_outputs");
      }
    }
  }
  return found;
}

std::shared_ptr<const grammar::TokenMasker> GrammarCache::get(const ConstraintSpec& spec) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.at);
      return it->second.masker;
    }
    if (!vocab_) vocab_ = grammar::TokenVocabulary::from_tokenizer(tok_);
  }
  // Compiled outside the lock: a large schema must not hold up other requests.
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  try {
    grammar::Grammar g;
    switch (spec.kind) {
      case Kind::kJsonObject: g = grammar::json_object_grammar(); break;
      case Kind::kJsonSchema: {
        grammar::JsonSchemaOptions o;
        o.strict = spec.strict;
        g = grammar::json_schema_text_to_grammar(spec.text, o);
        break;
      }
      case Kind::kRegex: g = grammar::regex_to_grammar(spec.text); break;
      case Kind::kChoice: g = grammar::choice_grammar(spec.choices); break;
      case Kind::kGrammar: g = grammar::parse_gbnf(spec.text); break;
      case Kind::kNone: return nullptr;
    }
    compiled = grammar::CompiledGrammar::compile(std::move(g));
  } catch (const Error& e) {
    throw ApiError(400, str_cat("'", spec.field, "': ", e.what()), spec.field);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto masker = std::make_shared<const grammar::TokenMasker>(std::move(compiled), vocab_);
  if (auto it = map_.find(key); it != map_.end()) return it->second.masker;  // another thread compiled it meanwhile
  lru_.push_front(key);
  map_[key] = Slot{masker, lru_.begin()};
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
  return masker;
}

}  // namespace serval::server
