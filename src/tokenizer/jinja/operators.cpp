// Operators, attribute and item access, and slicing with Python semantics.
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/evaluator.h"

namespace serval::jinja {

void undefined_error(const Value& u) { fail(u.undefined_hint().empty() ? "undefined value" : u.undefined_hint()); }

namespace {

std::string object_desc(const Value& v) {
  if (v.is_none()) return "'None'";
  std::string desc = "'";  // appended, not "'" + temporary: GCC 12 warns (-Wrestrict) on that
  desc += v.type_name();
  return desc + " object'";
}

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(object_desc(obj) + " has no attribute '" + name + "'");
}

constexpr uint64_t kMaxRepeat = uint64_t{1} << 26;  // bound for hostile templates ('x' * 10**12)

int64_t python_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

int64_t python_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.is_string()) fail("can only concatenate str (not \"", b.type_name(), "\") to str");
  if (op == "+" && a.is_array()) fail("can only concatenate list (not \"", b.type_name(), "\") to list");
  fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

Value repeat(const Value& seq, int64_t n) {
  size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_array().size();
  if (n > 0 && unit > 0 && static_cast<uint64_t>(n) > kMaxRepeat / unit) fail("repetition result too large");
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(out);
  }
  Array out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_array().begin(), seq.as_array().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  bool nums = a.is_number() && b.is_number();
  bool floats = nums && (a.is_float() || b.is_float());
  if (op == "+") {
    if (nums) return floats ? Value(a.as_double() + b.as_double()) : Value(a.as_int() + b.as_int());
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_array() && b.is_array()) {
      Array out = a.as_array();
      out.insert(out.end(), b.as_array().begin(), b.as_array().end());
      return Value(std::move(out));
    }
  } else if (op == "-") {
    if (nums) return floats ? Value(a.as_double() - b.as_double()) : Value(a.as_int() - b.as_int());
  } else if (op == "*") {
    if (nums) return floats ? Value(a.as_double() * b.as_double()) : Value(a.as_int() * b.as_int());
    if ((a.is_string() || a.is_array()) && b.is_int()) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_array()) && a.is_int()) return repeat(b, a.as_int());
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0) fail("division by zero");
      return Value(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (nums) {
      if (b.as_double() == 0) fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (!floats) return Value(op == "//" ? python_floordiv(a.as_int(), b.as_int()) : python_mod(a.as_int(), b.as_int()));
      double x = a.as_double(), y = b.as_double();
      if (op == "//") return Value(std::floor(x / y));
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
    if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  } else if (op == "**") {
    if (nums) {
      if (!floats && b.as_int() >= 0) {  // square-and-multiply; Python's ints are unbounded, ours are not
        int64_t r = 1, base = a.as_int(), e = b.as_int();
        bool overflow = false;
        while (e > 0 && !overflow) {
          if (e & 1) overflow |= __builtin_mul_overflow(r, base, &r);
          e >>= 1;
          if (e > 0) overflow |= __builtin_mul_overflow(base, base, &base);
        }
        if (overflow) fail("integer result of ** does not fit in 64 bits");
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
  }
  unsupported(op, a, b);
}

}  // namespace

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (item.is_undefined()) undefined_error(item);
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not ", item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const auto& e : container.as_array())
      if (equals(e, item)) return true;
    return false;
  }
  if (container.is_object()) return item.is_string() && container.as_object().find(item.as_string()) != nullptr;
  fail("argument of type '", container.type_name(), "' is not iterable");
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.str() + b.str());
  if (op == "==") return Value(equals(a, b));
  if (op == "!=") return Value(!equals(a, b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (op == "<") return Value(less(a, b));
  if (op == ">") return Value(less(b, a));
  if (op == "<=") return Value(!less(b, a));
  if (op == ">=") return Value(!less(a, b));
  return arithmetic(op, a, b);
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_object()) {
    const Object& o = obj.as_object();
    if (!o.is_namespace) {
      Value m = bound_method(obj, name);
      if (!m.is_undefined()) return m;
    }
    if (const Value* v = o.find(name)) return *v;
    return no_attribute(obj, name);
  }
  Value m = bound_method(obj, name);
  if (!m.is_undefined()) return m;
  return no_attribute(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    Array items = obj.is_array() ? Array() : obj.iterate();
    const Array& seq = obj.is_array() ? obj.as_array() : items;
    int64_t i = key.as_int(), n = static_cast<int64_t>(seq.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(object_desc(obj) + " has no element " + key.repr());
    return seq[static_cast<size_t>(i)];
  }
  if (obj.is_object() && key.is_string()) {
    if (const Value* v = obj.as_object().find(key.as_string())) return *v;
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(object_desc(obj) + " has no element " + key.repr());
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!obj.is_array() && !obj.is_string()) fail("'", obj.type_name(), "' object is not subscriptable");
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail("slice ", what, " must be an integer or None, got ", v.type_name());
    return v.as_int();
  };
  Array items = obj.iterate();
  int64_t n = static_cast<int64_t>(items.size());
  int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  auto norm = [&](std::optional<int64_t> v, int64_t def) -> int64_t {
    if (!v) return def;
    int64_t i = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t start = norm(as_index(start_v, "start"), step > 0 ? 0 : n - 1);
  int64_t stop = norm(as_index(stop_v, "stop"), step > 0 ? n : -1);
  Array out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[static_cast<size_t>(i)]);
  if (obj.is_array()) return obj.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
  std::string s;
  for (const auto& c : out) s += c.as_string();
  return Value(s);
}

}  // namespace serval::jinja
