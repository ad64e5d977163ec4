#include "grammar/json_schema_grammar.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "grammar/json_number_grammar.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/regex_to_grammar.h"

namespace serval::grammar {

namespace {

const char* const kUnsupported[] = {"not",          "if",                   "then",
                                    "else",         "dependentRequired",    "dependentSchemas",
                                    "dependencies", "patternProperties",    "propertyNames",
                                    "unevaluatedProperties", "unevaluatedItems", "contains",
                                    "minContains",  "maxContains",          "multipleOf",
                                    "$dynamicRef",  "$recursiveRef",        "contentSchema"};

bool in(const std::string& k, const auto& list) {
  return std::any_of(std::begin(list), std::end(list), [&](const char* x) { return k == x; });
}

}  // namespace

bool is_unsupported_keyword(const std::string& k) { return in(k, kUnsupported); }

namespace {

// Keywords that constrain values. Any other keyword (annotations, vendor
// extensions such as OpenAPI's "nullable" or "discriminator") is ignored, as
// validators ignore it.
const char* const kValidation[] = {"type",          "enum",          "const",           "properties",
                                   "required",      "additionalProperties", "items",   "prefixItems",
                                   "additionalItems", "minItems",    "maxItems",        "uniqueItems",
                                   "minLength",     "maxLength",     "pattern",         "format",
                                   "minimum",       "maximum",       "exclusiveMinimum", "exclusiveMaximum",
                                   "minProperties", "maxProperties", "anyOf",           "oneOf",
                                   "allOf",         "$ref"};

bool is_validation_keyword(const std::string& k) { return in(k, kValidation) || is_unsupported_keyword(k); }

std::optional<Decimal> number_of(const ojson& s, const char* key, const std::string& path) {
  auto it = s.find(key);
  if (it == s.end() || it->is_boolean()) return std::nullopt;
  if (!it->is_number()) SchemaCompiler::error(path, "'", key, "' must be a number");
  return Decimal::parse(it->dump());
}

// The lower or upper bound of a number schema, the tighter of the inclusive
// and exclusive keywords (draft 4's boolean exclusiveMinimum included).
std::optional<NumberBound> bound_of(const ojson& s, bool lower, const std::string& path) {
  const char* incl = lower ? "minimum" : "maximum";
  const char* excl = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  std::optional<NumberBound> out;
  if (auto v = number_of(s, incl, path)) {
    bool draft4 = s.contains(excl) && s[excl].is_boolean() && s[excl].get<bool>();
    out = NumberBound{*v, draft4};
  }
  if (auto v = number_of(s, excl, path)) {
    int c = out ? compare(*v, out->value) : 0;
    if (!out || (lower ? c >= 0 : c <= 0)) out = NumberBound{*v, true};
  }
  return out;
}

// For integers: x > b is x >= b + 1/2 rounded up (and x < b alike).
Decimal nudge_half(const Decimal& d, bool up) {
  if (!d.frac_digits.empty()) return d;
  Decimal r = d;
  r.frac_digits = "5";
  bool away = up != d.negative;  // moving away from zero
  if (d.is_zero()) {
    r.negative = !up;
  } else if (!away) {
    // |d| - 1/2: the integer part drops by one.
    std::string m = d.int_digits;
    for (size_t i = m.size(); i-- > 0;) {
      if (m[i] != '0') {
        --m[i];
        break;
      }
      m[i] = '9';
    }
    size_t nz = m.find_first_not_of('0');
    r.int_digits = nz == std::string::npos ? "0" : m.substr(nz);
  }
  return r;
}

std::string sanitize(const std::string& hint) {
  std::string out;
  for (char c : hint) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) out += c;
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "schema" : out;
}

}  // namespace

std::string SchemaCompiler::fresh_name(const std::string& hint) {
  std::string base = sanitize(hint);
  std::string name = base;
  for (int i = 2; names_.count(name) || is_json_builtin(name) || name == "root"; ++i) name = base + "-" + std::to_string(i);
  names_.insert(name);
  return name;
}

ExprPtr SchemaCompiler::as_rule(const std::string& hint, ExprPtr body) {
  std::string name = fresh_name(hint);
  g_.set(name, std::move(body));
  return rule_ref(name);
}

Grammar SchemaCompiler::run() {
  add_json_builtins(g_, opts_);
  names_.insert("root");
  g_.set("root", value(doc_, "#"));
  // The root rule first, as printed grammars usually read.
  std::stable_partition(g_.rules.begin(), g_.rules.end(), [](const auto& r) { return r.first == "root"; });
  return std::move(g_);
}

const ojson& SchemaCompiler::resolve(const std::string& ref, const std::string& path) const {
  if (ref == "#") return doc_;
  if (ref.rfind("#/", 0) != 0) error(path, "$ref \"", ref, "\" is not supported (only references into this schema, like #/$defs/name)");
  try {
    return doc_.at(ojson::json_pointer(ref.substr(1)));
  } catch (const nlohmann::json::exception&) {
    error(path, "$ref \"", ref, "\" points to nothing in the schema");
  }
}

ExprPtr SchemaCompiler::ref_value(const std::string& ref, const std::string& path) {
  auto it = ref_rules_.find(ref);
  if (it != ref_rules_.end()) return rule_ref(it->second);
  const ojson& target = resolve(ref, path);
  std::string name = fresh_name(ref.size() > 2 ? ref.substr(2) : "ref-root");
  ref_rules_[ref] = name;  // before the body: recursive references find it
  g_.set(name, empty());
  g_.set(name, value(target, ref));
  return rule_ref(name);
}

ExprPtr SchemaCompiler::value(const ojson& s, const std::string& path) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return rule_ref(kJsonValue);
    error(path, "the schema false allows no value");
  }
  if (!s.is_object()) error(path, "a schema must be an object or a boolean, not ", s.type_name());
  for (const auto& [k, v] : s.items())
    if (is_unsupported_keyword(k)) error(path, "keyword '", k, "' is not supported");
  auto has_siblings = [&](const char* keyword) {
    for (const auto& [k, v] : s.items())
      if (k != keyword && is_validation_keyword(k)) return k;
    return std::string();
  };
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) error(path, "'$ref' must be a string");
    std::string other = has_siblings("$ref");
    if (!other.empty()) error(path, "keyword '", other, "' beside '$ref' is not supported");
    return ref_value(s["$ref"].get<std::string>(), path);
  }
  if (s.contains("allOf")) {
    const ojson& all = s["allOf"];
    if (!all.is_array() || all.size() != 1) error(path, "'allOf' is only supported with a single schema");
    std::string other = has_siblings("allOf");
    if (!other.empty()) error(path, "keyword '", other, "' beside 'allOf' is not supported");
    return value(all[0], path + "/allOf/0");
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    if (!s.contains(comb)) continue;
    const ojson& list = s[comb];
    if (!list.is_array() || list.empty()) error(path, "'", comb, "' must be a non-empty array");
    std::string other = has_siblings(comb);
    if (!other.empty()) error(path, "keyword '", other, "' beside '", comb, "' is not supported");
    std::vector<ExprPtr> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string p = str_cat(path, "/", comb, "/", i);
      if (std::string(comb) == "oneOf")
        for (size_t j = 0; j < i; ++j)
          if (!disjoint(list[j], list[i], 0))
            error(p, "'oneOf' alternatives ", j, " and ", i,
                  " may both match a value (only oneOf with mutually exclusive alternatives is supported; use anyOf)");
      if (list[i].is_boolean() && !list[i].get<bool>()) continue;  // matches nothing: no alternative
      alts.push_back(value(list[i], p));
    }
    if (alts.empty()) error(path, "every '", comb, "' alternative is the schema false");
    return alt(std::move(alts));
  }
  if (s.contains("const") || s.contains("enum")) return literal_values(s, path);

  std::vector<std::string> types;
  if (s.contains("type")) {
    const ojson& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) error(path, "'type' must name types");
        types.push_back(x.get<std::string>());
      }
    } else {
      error(path, "'type' must be a string or a non-empty array of strings");
    }
  } else {
    // Without a type, the keywords present suggest one; generating only that
    // type is a subset of what the schema allows.
    auto any = [&](std::initializer_list<const char*> ks) {
      return std::any_of(ks.begin(), ks.end(), [&](const char* k) { return s.contains(k); });
    };
    if (any({"properties", "required", "additionalProperties", "minProperties", "maxProperties"})) types.push_back("object");
    if (any({"items", "prefixItems", "minItems", "maxItems", "additionalItems", "uniqueItems"})) types.push_back("array");
    if (any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    if (types.empty()) return rule_ref(kJsonValue);
  }
  std::vector<ExprPtr> alts;
  for (const auto& t : types) alts.push_back(typed(s, t, path));
  return alt(std::move(alts));
}

ExprPtr SchemaCompiler::typed(const ojson& s, const std::string& type, const std::string& path) {
  if (type == "string") return string_value(s, path);
  if (type == "integer") return integer_value(s, path);
  if (type == "number") return number_value(s, path);
  if (type == "boolean") return alt({lit("true"), lit("false")});
  if (type == "null") return lit("null");
  if (type == "object") return object_value(s, path);
  if (type == "array") return array_value(s, path);
  error(path, "unknown type '", type, "'");
}

// The type of a JSON value as schemas name it.
static bool value_has_type(const ojson& v, const std::string& t) {
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

ExprPtr SchemaCompiler::literal_values(const ojson& s, const std::string& path) {
  for (const auto& [k, v] : s.items())
    if (k != "const" && k != "enum" && k != "type" && is_validation_keyword(k))
      error(path, "keyword '", k, "' beside 'enum' or 'const' is not supported");
  std::vector<ojson> values;
  if (s.contains("const")) values.push_back(s["const"]);
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) error(path, "'enum' must be a non-empty array");
    if (s.contains("const")) {
      bool found = std::find(s["enum"].begin(), s["enum"].end(), s["const"]) != s["enum"].end();
      if (!found) error(path, "'const' is not among the 'enum' values");
    } else {
      for (const auto& v : s["enum"]) values.push_back(v);
    }
  }
  std::vector<ExprPtr> alts;
  for (const auto& v : values) {
    bool ok = !s.contains("type");
    if (!ok) {
      const ojson& t = s["type"];
      if (t.is_string()) ok = value_has_type(v, t.get<std::string>());
      for (const auto& x : t.is_array() ? t : ojson::array()) ok = ok || (x.is_string() && value_has_type(v, x.get<std::string>()));
    }
    if (ok) alts.push_back(lit(v.dump()));
  }
  if (alts.empty()) error(path, "no 'enum' or 'const' value has the schema's 'type'");
  return alt(std::move(alts));
}

ExprPtr SchemaCompiler::string_value(const ojson& s, const std::string& path) {
  auto length = [&](const char* key) -> std::optional<uint32_t> {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number_unsigned()) error(path, "'", key, "' must be a non-negative integer");
    uint64_t v = s[key].get<uint64_t>();
    if (v > 100000) error(path, "'", key, "' ", v, " is too large (at most 100000)");
    return uint32_t(v);
  };
  auto min_len = length("minLength"), max_len = length("maxLength");
  if (s.contains("format") && s["format"].is_string()) {
    std::string f = s["format"].get<std::string>();
    if (s.contains("pattern") || min_len || max_len)
      error(path, "'format' together with 'pattern', 'minLength' or 'maxLength' is not supported");
    ExprPtr e = json_format(f);
    if (!e) error(path, "format '", f, "' is not supported (supported: date, time, date-time, uuid, email, ipv4)");
    return seq({lit("\""), e, lit("\"")});
  }
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) error(path, "'pattern' must be a string");
    if (min_len || max_len) error(path, "'pattern' together with 'minLength' or 'maxLength' is not supported");
    ExprPtr e;
    try {
      e = regex_to_expr(s["pattern"].get<std::string>());
    } catch (const Error& err) {
      error(path, "'pattern': ", err.what());
    }
    return seq({lit("\""), json_escape_expr(e), lit("\"")});
  }
  uint32_t lo = min_len.value_or(0), hi = max_len.value_or(kUnbounded);
  if (lo > hi) error(path, "'minLength' is larger than 'maxLength'");
  if (lo == 0 && hi == kUnbounded) return rule_ref(kJsonString);
  return seq({lit("\""), repeat(rule_ref(kJsonChar), lo, hi), lit("\"")});
}

ExprPtr SchemaCompiler::integer_value(const ojson& s, const std::string& path) {
  auto lo = bound_of(s, true, path), hi = bound_of(s, false, path);
  if (!lo && !hi) return rule_ref(kJsonInteger);
  std::optional<Decimal> l, h;
  if (lo) l = lo->exclusive ? nudge_half(lo->value, true) : lo->value;
  if (hi) h = hi->exclusive ? nudge_half(hi->value, false) : hi->value;
  try {
    return integer_range(l, h);
  } catch (const Error& e) {
    error(path, "'minimum'/'maximum': ", e.what());
  }
}

ExprPtr SchemaCompiler::number_value(const ojson& s, const std::string& path) {
  auto lo = bound_of(s, true, path), hi = bound_of(s, false, path);
  if (!lo && !hi) return rule_ref(kJsonNumber);
  try {
    return number_range(lo, hi);
  } catch (const Error& e) {
    error(path, "'minimum'/'maximum': ", e.what());
  }
}

Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opts) {
  return SchemaCompiler(schema, opts).run();
}

Grammar json_schema_text_to_grammar(std::string_view schema_text, const JsonSchemaOptions& opts) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    fail("json schema: not valid JSON: ", e.what());
  }
  return json_schema_to_grammar(schema, opts);
}

}  // namespace serval::grammar
