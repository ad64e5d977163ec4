// Methods callable on template values: the str, dict and list methods chat
// templates use (message.content.strip(), message.get('x'), d.items()...).
// Mutating methods are absent, as in jinja2's ImmutableSandboxedEnvironment.
#include <unicode/uchar.h>

#include "core/error.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/jinja/pystr.h"
#include "tokenizer/utf8.h"

namespace serval::jinja {

namespace {

std::optional<std::string> opt_string(const Value& v, const char* fn) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!v.is_string()) fail(fn, " arg must be None or str, not ", v.type_name());
  return v.as_string();
}

std::string need_string(const Value& v, const char* fn) {
  if (!v.is_string()) fail(fn, "() argument must be str, not ", v.type_name());
  return v.as_string();
}

Array strings(const std::vector<std::string>& parts) {
  Array out;
  for (const auto& p : parts) out.emplace_back(p);
  return out;
}

// startswith/endswith accept a string or a tuple of strings.
bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* fn) {
  auto one = [&](const Value& a) {
    const std::string& x = need_string(a, fn);
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_array()) {
    for (const auto& a : affix.as_array())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!pred(static_cast<UChar32>(utf8::next(s, i)))) return false;
  return true;
}

bool cased_check(const std::string& s, bool want_lower) {
  bool any_cased = false;
  for (size_t i = 0; i < s.size();) {
    auto cp = static_cast<UChar32>(utf8::next(s, i));
    if (u_isupper(cp) || u_istitle(cp)) {
      if (want_lower) return false;
      any_cased = true;
    } else if (u_islower(cp)) {
      if (!want_lower) return false;
      any_cased = true;
    }
  }
  return any_cased;
}

Value method(std::string name, std::function<Value(CallArgs&)> fn) { return Value(Callable{std::move(name), std::move(fn)}); }

Value string_method(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return method(name, [s, name](CallArgs& a) {
      check_args(a, name.c_str(), 1, {});
      return Value(py_strip(s, opt_string(arg(a, 0, ""), name.c_str()), name != "rstrip", name != "lstrip"));
    });
  if (name == "split" || name == "rsplit")
    return method(name, [s, name](CallArgs& a) {
      check_args(a, name.c_str(), 2, {"sep", "maxsplit"});
      auto sep = opt_string(arg(a, 0, "sep"), name.c_str());
      Value max = arg(a, 1, "maxsplit", Value(-1));
      if (sep && sep->empty()) fail("empty separator");
      return Value(strings(name == "split" ? py_split(s, sep, max.as_int()) : py_rsplit(s, sep, max.as_int())));
    });
  if (name == "splitlines") return method(name, [s](CallArgs&) { return Value(strings(py_splitlines(s))); });
  if (name == "startswith" || name == "endswith")
    return method(name, [s, name](CallArgs& a) {
      check_args(a, name.c_str(), 1, {});
      return Value(affix_match(s, arg(a, 0, ""), name == "startswith", name.c_str()));
    });
  if (name == "removeprefix" || name == "removesuffix")
    return method(name, [s, name](CallArgs& a) {
      std::string x = need_string(arg(a, 0, ""), name.c_str());
      bool pre = name == "removeprefix";
      if (!affix_match(s, Value(x), pre, name.c_str())) return Value(s);
      return Value(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    });
  if (name == "replace")
    return method(name, [s](CallArgs& a) {
      check_args(a, "replace", 3, {"count"});
      Value count = arg(a, 2, "count", Value(-1));
      return Value(py_replace(s, need_string(arg(a, 0, ""), "replace"), need_string(arg(a, 1, ""), "replace"),
                              count.as_int()));
    });
  if (name == "lower") return method(name, [s](CallArgs&) { return Value(py_lower(s)); });
  if (name == "upper") return method(name, [s](CallArgs&) { return Value(py_upper(s)); });
  if (name == "title") return method(name, [s](CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize") return method(name, [s](CallArgs&) { return Value(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex")
    return method(name, [s, name](CallArgs& a) {
      int64_t i = py_find(s, need_string(arg(a, 0, ""), name.c_str()), name[0] == 'r');
      if (i < 0 && name.find("index") != std::string::npos) fail("substring not found");
      return Value(i);
    });
  if (name == "count")
    return method(name, [s](CallArgs& a) { return Value(py_count(s, need_string(arg(a, 0, ""), "count"))); });
  if (name == "join")
    return method(name, [s](CallArgs& a) {
      std::string out;
      Array items = arg(a, 0, "").iterate();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += s;
        out += need_string(items[i], "join");
      }
      return Value(out);
    });
  if (name == "isdigit") return method(name, [s](CallArgs&) { return Value(all_chars(s, [](UChar32 c) { return u_isdigit(c) != 0; })); });
  if (name == "isalpha") return method(name, [s](CallArgs&) { return Value(all_chars(s, [](UChar32 c) { return u_isalpha(c) != 0; })); });
  if (name == "isalnum") return method(name, [s](CallArgs&) { return Value(all_chars(s, [](UChar32 c) { return u_isalnum(c) != 0; })); });
  if (name == "isspace")
    return method(name, [s](CallArgs&) { return Value(!s.empty() && py_strip(s, std::nullopt, true, true).empty()); });
  if (name == "islower") return method(name, [s](CallArgs&) { return Value(cased_check(s, true)); });
  if (name == "isupper") return method(name, [s](CallArgs&) { return Value(cased_check(s, false)); });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name == "get")
    return method(name, [obj](CallArgs& a) {
      check_args(a, "get", 2, {});
      Value key = arg(a, 0, "");
      const Value* v = key.is_string() ? obj.as_object().find(key.as_string()) : nullptr;
      return v ? *v : arg(a, 1, "", Value(None{}));
    });
  if (name == "items")
    return method(name, [obj](CallArgs&) {
      Array out;
      for (const auto& [k, v] : obj.as_object().items) out.push_back(Value::tuple(Array{Value(k), v}));
      return Value(std::move(out));
    });
  if (name == "keys")
    return method(name, [obj](CallArgs&) {
      Array out;
      for (const auto& kv : obj.as_object().items) out.emplace_back(kv.first);
      return Value(std::move(out));
    });
  if (name == "values")
    return method(name, [obj](CallArgs&) {
      Array out;
      for (const auto& kv : obj.as_object().items) out.push_back(kv.second);
      return Value(std::move(out));
    });
  return Value::undefined("'dict object' has no attribute '" + name + "'");
}

Value list_method(const Value& obj, const std::string& name) {
  if (name == "index")
    return method(name, [obj](CallArgs& a) {
      Value x = arg(a, 0, "");
      const Array& items = obj.as_array();
      for (size_t i = 0; i < items.size(); ++i)
        if (equals(items[i], x)) return Value(i);
      fail(x.repr(), " is not in list");
    });
  if (name == "count")
    return method(name, [obj](CallArgs& a) {
      Value x = arg(a, 0, "");
      int64_t n = 0;
      for (const auto& e : obj.as_array()) n += equals(e, x) ? 1 : 0;
      return Value(n);
    });
  return Value::undefined("'list object' has no attribute '" + name + "'");
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj.as_string(), name);
  if (obj.is_object() && !obj.as_object().is_namespace) return dict_method(obj, name);
  if (obj.is_array()) return list_method(obj, name);
  std::string message = "'";  // appended, not "'" + temporary: GCC 12 warns (-Wrestrict) on that
  message += obj.type_name();
  message += " object' has no attribute '" + name + "'";
  return Value::undefined(message);
}

}  // namespace serval::jinja
