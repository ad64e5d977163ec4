// Objects and arrays of json_schema_to_grammar (see json_schema_compiler.h).
#include <algorithm>
#include <functional>

#include "core/error.h"
#include "grammar/json_schema_compiler.h"

namespace serval::grammar {

namespace {

std::optional<uint64_t> count_of(const ojson& s, const char* key, const std::string& path) {
  if (!s.contains(key)) return std::nullopt;
  if (!s[key].is_number_unsigned()) SchemaCompiler::error(path, "'", key, "' must be a non-negative integer");
  return s[key].get<uint64_t>();
}

}  // namespace

ExprPtr SchemaCompiler::object_value(const ojson& s, const std::string& path) {
  struct Prop {
    std::string name;
    const ojson* schema;
    bool required;
    std::string path;
  };
  static const ojson kAny = true;
  const ojson* additional = s.contains("additionalProperties") ? &s["additionalProperties"] : &kAny;
  if (!additional->is_boolean() && !additional->is_object())
    error(path, "'additionalProperties' must be a boolean or a schema");
  bool extras = !opts_.strict && !(additional->is_boolean() && !additional->get<bool>());

  std::vector<Prop> props;
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) error(path, "'properties' must be an object");
    for (const auto& [name, sub] : s["properties"].items())
      props.push_back({name, &sub, false, path + "/properties/" + name});
  }
  if (s.contains("required")) {
    if (!s["required"].is_array()) error(path, "'required' must be an array");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) error(path, "'required' must list property names");
      std::string name = r.get<std::string>();
      auto it = std::find_if(props.begin(), props.end(), [&](const Prop& p) { return p.name == name; });
      if (it != props.end()) {
        it->required = true;
        continue;
      }
      if (!extras) error(path, "required property '", name, "' is not in 'properties' and no other property is allowed");
      props.push_back({name, additional, true, path + "/additionalProperties"});
    }
  }
  // A property whose schema is false can only be absent (it stays listed, so
  // no extra property takes its name).
  std::vector<std::string> listed;
  for (const auto& p : props) listed.push_back(p.name);
  std::erase_if(props, [&](const Prop& p) {
    bool never = p.schema->is_boolean() && !p.schema->get<bool>();
    if (never && p.required) error(p.path, "required property '", p.name, "' has the schema false");
    return never;
  });
  size_t n = props.size();
  size_t n_required = size_t(std::count_if(props.begin(), props.end(), [](const Prop& p) { return p.required; }));
  if (auto m = count_of(s, "minProperties", path); m && *m > n_required)
    error(path, "keyword 'minProperties' is only supported when 'required' already has that many properties");
  if (auto m = count_of(s, "maxProperties", path); m && (extras || *m < props.size()))
    error(path, "keyword 'maxProperties' is only supported when the listed properties are all there can be");

  std::string base = fresh_name(path == "#" ? "root-object" : path.substr(2));
  ExprPtr comma = seq({ws(), lit(","), ws()});
  std::vector<ExprPtr> items;
  for (size_t i = 0; i < n; ++i) {
    ExprPtr v = value(*props[i].schema, props[i].path);
    items.push_back(as_rule(base + "-" + props[i].name, seq({json_string_literal(props[i].name), ws(), lit(":"), ws(), v})));
  }
  ExprPtr extra;
  if (extras) {
    ExprPtr key = seq({lit("\""), json_string_rest_not_in(listed, g_, base + "-key-")});
    ExprPtr v = value(*additional, path + "/additionalProperties");
    extra = as_rule(base + "-extra", seq({key, ws(), lit(":"), ws(), v}));
  }
  // rest_i: the members from i on, each after a comma (some present already);
  // first_i: the members from i on, at least one, the first without a comma.
  ExprPtr rest = extra ? star(seq({comma, extra})) : empty();
  ExprPtr first = extra ? seq({extra, star(seq({comma, extra}))}) : nullptr;
  for (size_t i = n; i-- > 0;) {
    ExprPtr with = seq({comma, items[i], rest});
    ExprPtr new_rest = props[i].required ? with : alt({with, rest});
    ExprPtr starts = seq({items[i], rest});
    ExprPtr new_first = (props[i].required || !first) ? starts : alt({starts, first});
    rest = as_rule(base + "-rest", new_rest);
    first = as_rule(base + "-first", new_first);
  }
  ExprPtr full = first ? seq({lit("{"), ws(), first, ws(), lit("}")}) : nullptr;
  ExprPtr none = seq({lit("{"), ws(), lit("}")});
  if (n_required > 0) return full;
  return full ? alt({none, full}) : none;
}

ExprPtr SchemaCompiler::array_value(const ojson& s, const std::string& path) {
  static const ojson kAny = true;
  const ojson* prefix = nullptr;
  const ojson* items = &kAny;
  std::string items_path = path + "/items";
  if (s.contains("prefixItems")) {
    prefix = &s["prefixItems"];
    if (s.contains("items")) items = &s["items"];
  } else if (s.contains("items") && s["items"].is_array()) {
    prefix = &s["items"];  // draft 7 tuples
    items_path = path + "/additionalItems";
    if (s.contains("additionalItems")) items = &s["additionalItems"];
  } else if (s.contains("items")) {
    items = &s["items"];
  }
  if (prefix && !prefix->is_array()) error(path, "'prefixItems' must be an array");
  size_t p = prefix ? prefix->size() : 0;
  bool more = !(items->is_boolean() && !items->get<bool>());
  uint64_t min = count_of(s, "minItems", path).value_or(0);
  std::optional<uint64_t> max = count_of(s, "maxItems", path);
  if (!more) max = std::min<uint64_t>(max.value_or(p), p);
  if (max && min > *max) error(path, "no array length satisfies 'minItems', 'maxItems' and the item schemas");
  if (min > 100000 || (max && *max > 100000)) error(path, "'minItems'/'maxItems' above 100000 are not supported");
  if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && s["uniqueItems"].get<bool>() && !(max && *max <= 1))
    error(path, "keyword 'uniqueItems' is not supported");

  ExprPtr none = seq({lit("["), ws(), lit("]")});
  if (max && *max == 0) return none;
  ExprPtr comma = seq({ws(), lit(","), ws()});
  ExprPtr item = more ? as_rule(path == "#" ? "root-item" : path.substr(2) + "-item", value(*items, items_path)) : nullptr;
  auto slot = [&](size_t i) { return i < p ? value((*prefix)[i], str_cat(path, "/prefixItems/", i)) : item; };
  // The items after the first i, each after a comma.
  std::function<ExprPtr(size_t)> tail = [&](size_t i) -> ExprPtr {
    if (max && i >= *max) return empty();
    if (i >= p) {
      uint32_t lo = uint32_t(min > i ? min - i : 0);
      uint32_t hi = max ? uint32_t(*max - i) : kUnbounded;
      return repeat(seq({comma, item}), lo, hi);
    }
    ExprPtr one = seq({comma, slot(i), tail(i + 1)});
    return i < min ? one : opt(one);
  };
  ExprPtr full = seq({lit("["), ws(), slot(0), tail(1), ws(), lit("]")});
  return min == 0 ? alt({none, full}) : full;
}

}  // namespace serval::grammar
