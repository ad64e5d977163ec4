// oneOf in json_schema_to_grammar: a value must match exactly one
// alternative, so the alternatives are compiled as plain alternatives only
// when no value can match two of them. The test here is sound but partial:
// different types, disjoint const/enum values, or objects told apart by a
// required property (a discriminator with different constants, or a property
// one alternative requires and the other forbids).
#include <algorithm>
#include <cmath>

#include "grammar/json_schema_compiler.h"

namespace serval::grammar {

namespace {

enum : unsigned {
  kNull = 1,
  kBool = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,     // numbers with an integral value
  kFraction = 64,    // numbers with a fractional part
  kAll = 127,
};

unsigned mask_of_type(const std::string& t) {
  if (t == "null") return kNull;
  if (t == "boolean") return kBool;
  if (t == "object") return kObject;
  if (t == "array") return kArray;
  if (t == "string") return kString;
  if (t == "integer") return kInteger;
  if (t == "number") return kInteger | kFraction;
  return 0;
}

unsigned mask_of_value(const ojson& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBool;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  if (v.is_number_integer()) return kInteger;
  double d = v.get<double>();
  return std::floor(d) == d ? kInteger : kFraction;
}

// The values a schema allows, when it lists them (const or enum).
const ojson* listed_values(const ojson& s, ojson& storage) {
  if (!s.is_object()) return nullptr;
  if (s.contains("const")) {
    storage = ojson::array({s["const"]});
    return &storage;
  }
  if (s.contains("enum") && s["enum"].is_array()) return &s["enum"];
  return nullptr;
}

bool forbids_extra(const ojson& s) {
  return s.contains("additionalProperties") && s["additionalProperties"].is_boolean() &&
         !s["additionalProperties"].get<bool>();
}

bool is_required(const ojson& s, const std::string& name) {
  if (!s.contains("required") || !s["required"].is_array()) return false;
  return std::find(s["required"].begin(), s["required"].end(), name) != s["required"].end();
}

}  // namespace

unsigned SchemaCompiler::type_mask(const ojson& s, int depth) const {
  if (depth > 16) return kAll;
  if (s.is_boolean()) return s.get<bool>() ? unsigned(kAll) : 0u;
  if (!s.is_object()) return kAll;
  if (s.contains("$ref") && s["$ref"].is_string()) return type_mask(resolve(s["$ref"].get<std::string>(), "#"), depth + 1);
  ojson storage;
  if (const ojson* vals = listed_values(s, storage)) {
    unsigned m = 0;
    for (const auto& v : *vals) m |= mask_of_value(v);
    return m;
  }
  unsigned m = kAll;
  if (s.contains("type")) {
    const ojson& t = s["type"];
    m = 0;
    if (t.is_string()) m = mask_of_type(t.get<std::string>());
    if (t.is_array())
      for (const auto& x : t)
        if (x.is_string()) m |= mask_of_type(x.get<std::string>());
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    if (!s.contains(comb) || !s[comb].is_array()) continue;
    unsigned u = 0;
    for (const auto& sub : s[comb]) u |= type_mask(sub, depth + 1);
    m &= u;
  }
  if (s.contains("allOf") && s["allOf"].is_array())
    for (const auto& sub : s["allOf"]) m &= type_mask(sub, depth + 1);
  return m;
}

bool SchemaCompiler::disjoint(const ojson& a0, const ojson& b0, int depth) const {
  if (depth > 16) return false;
  const ojson& a = a0.is_object() && a0.contains("$ref") && a0["$ref"].is_string() ? resolve(a0["$ref"].get<std::string>(), "#") : a0;
  const ojson& b = b0.is_object() && b0.contains("$ref") && b0["$ref"].is_string() ? resolve(b0["$ref"].get<std::string>(), "#") : b0;
  if (&a != &a0 || &b != &b0) return disjoint(a, b, depth + 1);
  unsigned ma = type_mask(a, depth), mb = type_mask(b, depth);
  if ((ma & mb) == 0) return true;
  ojson sa, sb;
  const ojson* va = listed_values(a, sa);
  const ojson* vb = listed_values(b, sb);
  if (va && vb) {
    for (const auto& x : *va)
      if (std::find(vb->begin(), vb->end(), x) != vb->end()) return false;
    return true;
  }
  // Objects: a property both require, with disjoint schemas; or one that a
  // requires and b does not allow.
  if ((ma & mb) != kObject || !a.is_object() || !b.is_object()) return false;
  auto props = [](const ojson& s) { return s.contains("properties") && s["properties"].is_object() ? &s["properties"] : nullptr; };
  const ojson* pa = props(a);
  const ojson* pb = props(b);
  for (int side = 0; side < 2; ++side) {
    const ojson& x = side ? b : a;
    const ojson& y = side ? a : b;
    const ojson* px = side ? pb : pa;
    const ojson* py = side ? pa : pb;
    if (!x.contains("required") || !x["required"].is_array()) continue;
    for (const auto& r : x["required"]) {
      if (!r.is_string()) continue;
      std::string name = r.get<std::string>();
      bool y_lists = py && py->contains(name);
      if (!y_lists && forbids_extra(y)) return true;  // (strict changes the grammar, not the validator)
      if (y_lists && px && px->contains(name) && is_required(y, name) && disjoint((*px)[name], (*py)[name], depth + 1))
        return true;
    }
  }
  return false;
}

}  // namespace serval::grammar
