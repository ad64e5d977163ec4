#pragma once
// Inside json_schema_to_grammar: one compiler over a schema document. Values
// are in json_schema_grammar.cpp, objects and arrays in
// json_schema_containers.cpp, the oneOf overlap test in json_schema_oneof.cpp.
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/json_schema_grammar.h"

namespace serval::grammar {

using ojson = nlohmann::ordered_json;

class SchemaCompiler {
 public:
  SchemaCompiler(const ojson& doc, const JsonSchemaOptions& opts) : doc_(doc), opts_(opts) {}
  Grammar run();

  // The expression of a value valid under `s` (found at `path`).
  ExprPtr value(const ojson& s, const std::string& path);

  template <typename... Args>
  [[noreturn]] static void error(const std::string& path, const Args&... args) {
    fail("json schema: at ", path, ": ", args...);
  }

 private:
  ExprPtr typed(const ojson& s, const std::string& type, const std::string& path);
  ExprPtr string_value(const ojson& s, const std::string& path);
  ExprPtr integer_value(const ojson& s, const std::string& path);
  ExprPtr number_value(const ojson& s, const std::string& path);
  ExprPtr object_value(const ojson& s, const std::string& path);
  ExprPtr array_value(const ojson& s, const std::string& path);
  ExprPtr literal_values(const ojson& s, const std::string& path);
  ExprPtr ref_value(const std::string& ref, const std::string& path);

  // The schema a "$ref" points to (only references into this document).
  const ojson& resolve(const std::string& ref, const std::string& path) const;
  // oneOf: whether no value can be valid under both schemas (a sound,
  // incomplete test: false means "could not prove it").
  bool disjoint(const ojson& a, const ojson& b, int depth) const;
  unsigned type_mask(const ojson& s, int depth) const;

  // Defines a rule with a fresh name made from `hint` and returns a reference.
  ExprPtr as_rule(const std::string& hint, ExprPtr body);
  std::string fresh_name(const std::string& hint);
  ExprPtr ws() const { return rule_ref(kWs); }

  const ojson& doc_;
  JsonSchemaOptions opts_;
  Grammar g_;
  std::map<std::string, std::string> ref_rules_;  // "$ref" target -> rule
  std::set<std::string> names_;
};

// Keywords that constrain values in ways the grammar does not express (refused).
bool is_unsupported_keyword(const std::string& k);

}  // namespace serval::grammar
