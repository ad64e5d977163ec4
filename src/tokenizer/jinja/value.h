#pragma once
// jinja::Value: the values a chat template computes with, modelled on the
// Python objects jinja2 sees (None, bool, int, float, str, list, dict,
// Undefined, callables) so that truthiness, str(), repr(), ==, < and json.dumps
// come out byte for byte as in Python.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::jinja {

class Value;
using Array = std::vector<Value>;

// A Python dict with string keys: insertion-ordered, like dicts since 3.7.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // jinja2 namespace(): attributes settable with {% set ns.x %}

  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Arguments of a call: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

// jinja2's default Undefined: falsey, renders empty, iterates as empty; using
// it further (attribute, arithmetic) is an error naming `hint`.
struct Undefined {
  std::string hint;  // "'x' is undefined" or "'dict object' has no attribute 'x'"
};
struct None {};

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>,
                               std::shared_ptr<Object>, std::shared_ptr<Callable>>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(size_t i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(std::shared_ptr<Array> a) : v_(std::move(a)) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
  Value(Callable c) : v_(std::make_shared<Callable>(std::move(c))) {}

  // A Python tuple: a list that prints as (a, b).
  static Value tuple(Array a) {
    Value v(std::move(a));
    v.tuple_ = true;
    return v;
  }
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value object() { return Value(std::make_shared<Object>()); }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // bool is an int in Python
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }
  bool is_tuple() const { return tuple_ && is_array(); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;     // int or bool
  double as_double() const;   // int, bool or float
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  // Python truthiness (Undefined is false).
  bool truthy() const;
  // str(value) as jinja2 prints it ({{ x }}): Undefined gives "", None "None".
  std::string str() const;
  // repr(value): 'quoted' strings, [1, 'a'], {'k': None}.
  std::string repr() const;
  // The Python type name used in error messages ("dict object", "str object"...).
  std::string type_name() const;
  // json.dumps(value, ensure_ascii=False, indent, separators, sort_keys).
  // separators: (item, key); nullopt gives json.dumps' defaults.
  std::string to_json(int indent = -1,
                      const std::optional<std::pair<std::string, std::string>>& separators = std::nullopt,
                      bool sort_keys = false) const;
  nlohmann::ordered_json to_ordered_json() const;

  // The items of an iterable as jinja2's for loop sees them (dict -> keys,
  // string -> characters); throws for a non-iterable.
  Array iterate() const;
  // Python len(); throws for a value without one.
  size_t length() const;

 private:
  Storage v_;
  bool tuple_ = false;
};

// Python ==, < (numbers across int/float/bool, strings, lists element-wise).
bool equals(const Value& a, const Value& b);
// a < b; throws serval::Error when Python would raise TypeError.
bool less(const Value& a, const Value& b);
// repr() of a Python float (shortest round-trip form: 1.0, 0.1, 1e+16).
std::string float_repr(double d);
// Splits UTF-8 text into characters (code points), as Python iterates a str.
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace serval::jinja
