// The filters chat templates use, with jinja2's signatures and behavior;
// tojson is transformers' override (json.dumps with ensure_ascii=False,
// indent, separators, sort_keys) rather than jinja2's HTML-safe one.
#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/jinja/pystr.h"
#include "tokenizer/utf8.h"

namespace serval::jinja {

namespace {

std::optional<std::string> opt_str(const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  return v.str();
}

// attribute="a.b" or an integer index, as jinja2's make_attrgetter.
Value get_path(const Value& v, const Value& attribute) {
  if (attribute.is_int()) return get_item(v, attribute);
  Value cur = v;
  for (const std::string& part : py_split(attribute.str(), std::string("."), -1)) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
  }
  return cur;
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.as_string()));
  return v;
}

Value f_trim(Evaluator&, const Value& v, CallArgs& a) {
  return Value(py_strip(v.str(), opt_str(arg(a, 0, "chars")), true, true));
}
Value f_length(Evaluator&, const Value& v, CallArgs&) { return Value(v.length()); }
Value f_string(Evaluator&, const Value& v, CallArgs&) { return Value(v.str()); }
Value f_lower(Evaluator&, const Value& v, CallArgs&) { return Value(py_lower(v.str())); }
Value f_upper(Evaluator&, const Value& v, CallArgs&) { return Value(py_upper(v.str())); }
Value f_title(Evaluator&, const Value& v, CallArgs&) { return Value(py_title(v.str())); }
Value f_capitalize(Evaluator&, const Value& v, CallArgs&) { return Value(py_capitalize(v.str())); }
Value f_safe(Evaluator&, const Value& v, CallArgs&) { return Value(v.str()); }

Value f_replace(Evaluator&, const Value& v, CallArgs& a) {
  Value count = arg(a, 2, "count", Value(None{}));
  return Value(py_replace(v.str(), arg(a, 0, "old").str(), arg(a, 1, "new").str(), count.is_none() ? -1 : count.as_int()));
}

Value f_join(Evaluator&, const Value& v, CallArgs& a) {
  std::string sep = arg(a, 0, "d", Value("")).str();
  Value attribute = arg(a, 1, "attribute", Value(None{}));
  std::string out;
  Array items = v.iterate();
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += (attribute.is_none() ? items[i] : get_path(items[i], attribute)).str();
  }
  return Value(out);
}

Value f_first(Evaluator&, const Value& v, CallArgs&) {
  Array items = v.iterate();
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}
Value f_last(Evaluator&, const Value& v, CallArgs&) {
  Array items = v.iterate();
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}
Value f_reverse(Evaluator&, const Value& v, CallArgs&) {
  Array items = v.iterate();
  std::reverse(items.begin(), items.end());
  if (!v.is_string()) return Value(std::move(items));
  std::string s;
  for (const auto& c : items) s += c.as_string();
  return Value(s);
}
Value f_list(Evaluator&, const Value& v, CallArgs&) { return Value(v.iterate()); }

Value f_items(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value(Array{});
  if (!v.is_object()) fail("can only get item pairs from a mapping, got ", v.type_name());
  Array out;
  for (const auto& [k, x] : v.as_object().items) out.push_back(Value::tuple(Array{Value(k), x}));
  return Value(std::move(out));
}

Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  Array out;
  Value attribute = arg(a, 99, "attribute");
  if (!attribute.is_undefined()) {
    Value def = arg(a, 99, "default");
    for (const auto& item : v.iterate()) {
      Value x = get_path(item, attribute);
      out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty()) fail("map() needs a filter name or attribute=");
  std::string filter = a.positional[0].str();
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keywords = a.keywords;
  for (const auto& item : v.iterate()) out.push_back(ev.apply_filter(filter, item, rest));
  return Value(std::move(out));
}

// select/reject(test, args...) and selectattr/rejectattr(attr, test, args...).
Value select_impl(Evaluator& ev, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t i = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = a.positional[i++];
  }
  std::string test = i < a.positional.size() ? a.positional[i++].str() : "";
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(std::min(i, a.positional.size())),
                         a.positional.end());
  rest.keywords = a.keywords;
  Array out;
  for (const auto& item : v.iterate()) {
    Value x = by_attr ? get_path(item, attribute) : item;
    bool ok = test.empty() ? x.truthy() : ev.apply_test(test, x, rest);
    if (ok == keep) out.push_back(item);
  }
  return Value(std::move(out));
}
Value f_select(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, true); }
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, false); }

Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
  return v;
}

std::optional<double> parse_float(const std::string& text) {
  std::string s = py_strip(text, std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  Value def = arg(a, 0, "default", Value(0));
  int base = static_cast<int>(arg(a, 1, "base", Value(10)).as_int());
  if (v.is_bool() || v.is_int()) return Value(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_double()) ? Value(static_cast<int64_t>(v.as_double())) : def;
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty()) {
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(s.c_str(), &end, base);
      if (end == s.c_str() + s.size() && errno == 0) return Value(static_cast<int64_t>(x));
    }
    if (auto d = parse_float(v.as_string()); d && std::isfinite(*d)) return Value(static_cast<int64_t>(*d));
  }
  return def;
}

Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  Value def = arg(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    std::string low = py_lower(py_strip(v.as_string(), std::nullopt, true, true));
    if (low == "nan" || low == "+nan" || low == "-nan") return Value(std::nan(""));
    if (auto d = parse_float(v.as_string())) return Value(*d);
  }
  return def;
}

std::string ascii_escape(const std::string& json) {
  std::string out;
  for (size_t i = 0; i < json.size();) {
    unsigned char c = static_cast<unsigned char>(json[i]);
    if (c < 0x80) {
      out += json[i++];
      continue;
    }
    uint32_t cp = utf8::next(json, i);
    auto unit = [&](uint32_t u) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    };
    if (cp >= 0x10000) {
      cp -= 0x10000;
      unit(0xD800 + (cp >> 10));
      unit(0xDC00 + (cp & 0x3FF));
    } else {
      unit(cp);
    }
  }
  return out;
}

Value f_tojson(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  bool ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
  Value indent = arg(a, 1, "indent", Value(None{}));
  Value separators = arg(a, 2, "separators", Value(None{}));
  bool sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
  std::optional<std::pair<std::string, std::string>> seps;
  if (!separators.is_none() && !separators.is_undefined()) {
    Array pair = separators.iterate();
    if (pair.size() != 2) fail("tojson separators must be a pair (item_separator, key_separator)");
    seps.emplace(pair[0].str(), pair[1].str());
  }
  int ind = indent.is_none() || indent.is_undefined() ? -1 : static_cast<int>(indent.as_int());
  std::string out = v.to_json(ind, seps, sort_keys);
  return Value(ensure_ascii ? ascii_escape(out) : out);
}

Value f_escape(Evaluator&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : v.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(out);
}

Value f_unique(Evaluator&, const Value& v, CallArgs& a) {
  bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  Value attribute = arg(a, 1, "attribute", Value(None{}));
  Array out, seen;
  for (const auto& item : v.iterate()) {
    Value key = sort_key(attribute.is_none() ? item : get_path(item, attribute), case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value(std::move(out));
}

Value f_indent(Evaluator&, const Value& v, CallArgs& a) {
  Value width = arg(a, 0, "width", Value(4));
  bool first = arg(a, 1, "first", Value(false)).truthy();
  bool blank = arg(a, 2, "blank", Value(false)).truthy();
  std::string pad = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
  std::vector<std::string> lines = py_splitlines(v.str() + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += pad;
    out += lines[i];
  }
  return Value(first ? pad + out : out);
}

Value f_abs(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_number()) return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  fail("bad operand type for abs(): '", v.type_name(), "'");
}

Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  int64_t precision = arg(a, 0, "precision", Value(0)).as_int();
  std::string method = arg(a, 1, "method", Value("common")).str();
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value(r / scale);
}

Value f_sum(Evaluator&, const Value& v, CallArgs& a) {
  Value attribute = arg(a, 0, "attribute", Value(None{}));
  Value total = arg(a, 1, "start", Value(0));
  for (const auto& item : v.iterate()) total = binary_op("+", total, attribute.is_none() ? item : get_path(item, attribute));
  return total;
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  Value attribute = arg(a, 1, "attribute", Value(None{}));
  Array items = v.iterate();
  if (items.empty()) return Value::undefined(want_max ? "No largest item, sequence was empty." : "No smallest item, sequence was empty.");
  size_t best = 0;
  auto key = [&](size_t i) { return sort_key(attribute.is_none() ? items[i] : get_path(items[i], attribute), case_sensitive); };
  for (size_t i = 1; i < items.size(); ++i)
    if (want_max ? less(key(best), key(i)) : less(key(i), key(best))) best = i;
  return items[best];
}
Value f_min(Evaluator&, const Value& v, CallArgs& a) { return min_max(v, a, false); }
Value f_max(Evaluator&, const Value& v, CallArgs& a) { return min_max(v, a, true); }

Value f_sort(Evaluator&, const Value& v, CallArgs& a) {
  bool reverse = arg(a, 0, "reverse", Value(false)).truthy();
  bool case_sensitive = arg(a, 1, "case_sensitive", Value(false)).truthy();
  Value attribute = arg(a, 2, "attribute", Value(None{}));
  Array items = v.iterate();
  auto key = [&](const Value& x) { return sort_key(attribute.is_none() ? x : get_path(x, attribute), case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value(std::move(items));
}

Value f_dictsort(Evaluator&, const Value& v, CallArgs& a) {
  bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  bool by_value = arg(a, 1, "by", Value("key")).str() == "value";
  bool reverse = arg(a, 2, "reverse", Value(false)).truthy();
  if (!v.is_object()) fail("dictsort needs a mapping, got ", v.type_name());
  Array items;
  for (const auto& [k, x] : v.as_object().items) items.push_back(Value::tuple(Array{Value(k), x}));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.as_array()[by_value ? 1 : 0], case_sensitive);
    Value ky = sort_key(y.as_array()[by_value ? 1 : 0], case_sensitive);
    return reverse ? less(ky, kx) : less(kx, ky);
  });
  return Value(std::move(items));
}

// jinja2's format: value % args (or % kwargs).
Value f_format(Evaluator&, const Value& v, CallArgs& a) {
  if (!a.positional.empty() && !a.keywords.empty()) fail("format() can't handle positional and keyword arguments at the same time");
  if (!a.keywords.empty()) {
    auto o = std::make_shared<Object>();
    for (const auto& [k, x] : a.keywords) o->set(k, x);
    return Value(percent_format(v.str(), Value(o)));
  }
  return Value(percent_format(v.str(), Value::tuple(a.positional)));
}

Value f_attr(Evaluator&, const Value& v, CallArgs& a) { return get_attr(v, arg(a, 0, "name").str()); }
Value f_wordcount(Evaluator&, const Value& v, CallArgs&) { return Value(py_split(v.str(), std::nullopt, -1).size()); }

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = {
      {"abs", f_abs},         {"attr", f_attr},       {"capitalize", f_capitalize}, {"count", f_length},
      {"d", f_default},       {"default", f_default}, {"dictsort", f_dictsort},     {"e", f_escape},
      {"escape", f_escape},   {"first", f_first},     {"float", f_float},           {"format", f_format},           {"forceescape", f_escape},
      {"indent", f_indent},   {"int", f_int},         {"items", f_items},           {"join", f_join},
      {"last", f_last},       {"length", f_length},   {"list", f_list},             {"lower", f_lower},
      {"map", f_map},         {"max", f_max},         {"min", f_min},               {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
      {"safe", f_safe},       {"select", f_select},   {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string},   {"sum", f_sum},         {"title", f_title},           {"tojson", f_tojson},
      {"trim", f_trim},       {"unique", f_unique},   {"upper", f_upper},           {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

}  // namespace serval::jinja
