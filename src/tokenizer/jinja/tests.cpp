// jinja2's tests (x is defined, x is string, ...) and the globals transformers
// gives chat templates: range, namespace, dict, raise_exception, strftime_now.
#include <ctime>
#include <map>

#include "core/error.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/jinja/pystr.h"

namespace serval::jinja {

namespace {

Value first_arg(const CallArgs& a, const char* test) {
  if (a.positional.empty() && a.keywords.empty()) fail("test '", test, "' needs an argument");
  return a.positional.empty() ? a.keywords[0].second : a.positional[0];
}

bool t_defined(Evaluator&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Evaluator&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Evaluator&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Evaluator&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Evaluator&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Evaluator&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Evaluator&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Evaluator&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Evaluator&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Evaluator&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Evaluator&, const Value& v, CallArgs&) { return v.is_object() && !v.as_object().is_namespace; }
bool t_iterable(Evaluator&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_array() || (v.is_object() && !v.as_object().is_namespace);
}
bool t_sequence(Evaluator&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_array() || (v.is_object() && !v.as_object().is_namespace);
}
bool t_callable(Evaluator&, const Value& v, CallArgs&) { return v.is_callable(); }
bool t_lower(Evaluator&, const Value& v, CallArgs&) {
  std::string s = v.str();
  return s == py_lower(s) && s != py_upper(s);
}
bool t_upper(Evaluator&, const Value& v, CallArgs&) {
  std::string s = v.str();
  return s == py_upper(s) && s != py_lower(s);
}
bool t_odd(Evaluator&, const Value& v, CallArgs&) { return binary_op("%", v, Value(2)).as_int() == 1; }
bool t_even(Evaluator&, const Value& v, CallArgs&) { return binary_op("%", v, Value(2)).as_int() == 0; }
bool t_divisibleby(Evaluator&, const Value& v, CallArgs& a) {
  return equals(binary_op("%", v, first_arg(a, "divisibleby")), Value(0));
}
bool t_eq(Evaluator&, const Value& v, CallArgs& a) { return equals(v, first_arg(a, "eq")); }
bool t_ne(Evaluator&, const Value& v, CallArgs& a) { return !equals(v, first_arg(a, "ne")); }
bool t_lt(Evaluator&, const Value& v, CallArgs& a) { return binary_op("<", v, first_arg(a, "lt")).truthy(); }
bool t_le(Evaluator&, const Value& v, CallArgs& a) { return binary_op("<=", v, first_arg(a, "le")).truthy(); }
bool t_gt(Evaluator&, const Value& v, CallArgs& a) { return binary_op(">", v, first_arg(a, "gt")).truthy(); }
bool t_ge(Evaluator&, const Value& v, CallArgs& a) { return binary_op(">=", v, first_arg(a, "ge")).truthy(); }
bool t_in(Evaluator&, const Value& v, CallArgs& a) { return contains(first_arg(a, "in"), v); }
// Python `is`: singletons and scalars by value and type, containers by identity.
bool t_sameas(Evaluator&, const Value& v, CallArgs& a) {
  Value o = first_arg(a, "sameas");
  if (v.is_array() && o.is_array()) return &v.as_array() == &o.as_array();
  if (v.is_object() && o.is_object()) return &v.as_object() == &o.as_object();
  return v.type_name() == o.type_name() && equals(v, o);
}
bool t_escaped(Evaluator&, const Value&, CallArgs&) { return false; }
bool t_filter(Evaluator&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.as_string()) != nullptr; }
bool t_test(Evaluator&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.as_string()) != nullptr; }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = {
      {"!=", t_ne},          {"<", t_lt},          {"<=", t_le},           {"==", t_eq},
      {">", t_gt},           {">=", t_ge},         {"boolean", t_boolean}, {"callable", t_callable},
      {"defined", t_defined}, {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq},
      {"escaped", t_escaped}, {"even", t_even},    {"false", t_false},     {"filter", t_filter},
      {"float", t_float},    {"ge", t_ge},         {"greaterthan", t_gt},  {"gt", t_gt},
      {"in", t_in},          {"integer", t_integer}, {"iterable", t_iterable}, {"le", t_le},
      {"lessthan", t_lt},    {"lower", t_lower},   {"lt", t_lt},           {"mapping", t_mapping},
      {"ne", t_ne},          {"none", t_none},     {"number", t_number},   {"odd", t_odd},
      {"sameas", t_sameas},  {"sequence", t_sequence}, {"string", t_string}, {"test", t_test},
      {"true", t_true},      {"undefined", t_undefined}, {"upper", t_upper},
  };
  return table;
}

Value g_range(CallArgs& a) {
  if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments, got ", a.positional.size());
  for (const auto& v : a.positional)
    if (!v.is_int() && !v.is_bool()) fail("'", v.type_name(), "' object cannot be interpreted as an integer");
  int64_t start = 0, stop, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  Array out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.emplace_back(i);
    if (out.size() > 100000) fail("range too big (more than 100000 items)");
  }
  return Value(std::move(out));
}

// dict(mapping, **kwargs) / namespace(mapping, **kwargs).
Value make_dict(CallArgs& a, bool is_namespace) {
  auto o = std::make_shared<Object>();
  o->is_namespace = is_namespace;
  if (a.positional.size() > 1) fail(is_namespace ? "namespace" : "dict", "() takes at most 1 positional argument");
  if (!a.positional.empty()) {
    const Value& m = a.positional[0];
    if (m.is_object()) {
      for (const auto& [k, v] : m.as_object().items) o->set(k, v);
    } else {
      for (const auto& pair : m.iterate()) {
        Array kv = pair.iterate();
        if (kv.size() != 2) fail("dictionary update sequence element has length ", kv.size(), "; 2 is required");
        o->set(kv[0].str(), kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.keywords) o->set(k, v);
  return Value(o);
}

Value g_raise_exception(CallArgs& a) {
  throw TemplateRaisedError(a.positional.empty() ? std::string() : a.positional[0].str());
}

Value g_strftime_now(CallArgs& a) {
  std::string format = a.positional.empty() ? std::string() : a.positional[0].str();
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
  return Value(std::string(buf, n));
}

}  // namespace

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

void add_builtin_globals(std::unordered_map<std::string, Value>& frame) {
  frame["range"] = Value(Callable{"range", g_range});
  frame["namespace"] = Value(Callable{"namespace", [](CallArgs& a) { return make_dict(a, true); }});
  frame["dict"] = Value(Callable{"dict", [](CallArgs& a) { return make_dict(a, false); }});
  frame["raise_exception"] = Value(Callable{"raise_exception", g_raise_exception});
  frame["strftime_now"] = Value(Callable{"strftime_now", g_strftime_now});
}

}  // namespace serval::jinja
