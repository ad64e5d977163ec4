#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace serval::jinja {

const Value* Object::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(None{});
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it) o->set(it.key(), from_json(it.value()));
      return Value(o);
    }
    default: fail("chat template variables: unsupported JSON value ", j.dump());
  }
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Array>>) return !x->empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Object>>) return x->is_namespace || !x->items.empty();
        else return true;
      },
      v_);
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest precision that reads back exactly, as Python's repr.
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf is d.ddde[+-]XX; take digits and exponent apart.
  std::string s(buf);
  size_t epos = s.find('e');
  int exp10 = std::atoi(s.c_str() + epos + 1);
  std::string mant = s.substr(0, epos);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  } else if (exp10 < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else {
    size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == q) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char buf[16];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[16];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  std::string item_sep, key_sep;
  bool sort_keys;
  std::string out;

  void newline(int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  }

  void write(const Value& v, int level) {
    if (v.is_none()) out += "null";
    else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
    else if (v.is_int()) out += std::to_string(v.as_int());
    else if (v.is_float()) {
      double d = v.as_double();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(d);
    } else if (v.is_string()) json_string(out, v.as_string());
    else if (v.is_array()) {
      const Array& a = v.as_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        write(a[i], level + 1);
      }
      newline(level);
      out += ']';
    } else if (v.is_object()) {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_object().items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        json_string(out, items[i]->first);
        out += key_sep;
        write(items[i]->second, level + 1);
      }
      newline(level);
      out += '}';
    } else {
      fail("Object of type ", v.is_undefined() ? "Undefined" : "function", " is not JSON serializable");
    }
  }
};

}  // namespace

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  if (is_callable()) return "<function " + as_callable().name + ">";
  return repr();
}

std::string Value::repr() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return float_repr(as_double());
  if (is_string()) return repr_string(as_string());
  if (is_array()) {
    std::string out = is_tuple() ? "(" : "[";
    const Array& a = as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += ", ";
      out += a[i].repr();
    }
    if (is_tuple()) return out + (a.size() == 1 ? ",)" : ")");
    return out + "]";
  }
  if (is_object()) {
    const Object& o = as_object();
    if (o.is_namespace) return "<Namespace>";
    std::string out = "{";
    for (size_t i = 0; i < o.items.size(); ++i) {
      if (i) out += ", ";
      out += repr_string(o.items[i].first) + ": " + o.items[i].second.repr();
    }
    return out + "}";
  }
  return "<function " + as_callable().name + ">";
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_array()) return is_tuple() ? "tuple" : "list";
  if (is_object()) return as_object().is_namespace ? "Namespace" : "dict";
  return "function";
}

std::string Value::to_json(int indent, const std::optional<std::pair<std::string, std::string>>& separators,
                           bool sort_keys) const {
  JsonWriter w{indent, indent >= 0 ? "," : ", ", ": ", sort_keys, {}};
  if (separators) {
    w.item_sep = separators->first;
    w.key_sep = separators->second;
  }
  w.write(*this, 0);
  return w.out;
}

nlohmann::ordered_json Value::to_ordered_json() const {
  if (is_none() || is_undefined()) return nullptr;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int();
  if (is_float()) return as_double();
  if (is_string()) return as_string();
  if (is_array()) {
    auto j = nlohmann::ordered_json::array();
    for (const auto& e : as_array()) j.push_back(e.to_ordered_json());
    return j;
  }
  if (is_object()) {
    auto j = nlohmann::ordered_json::object();
    for (const auto& [k, v] : as_object().items) j[k] = v.to_ordered_json();
    return j;
  }
  return str();
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Array Value::iterate() const {
  if (is_undefined()) return {};
  if (is_array()) return as_array();
  if (is_object()) {
    Array keys;
    for (const auto& kv : as_object().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (is_string()) {
    Array chars;
    for (auto& c : utf8_chars(as_string())) chars.emplace_back(std::move(c));
    return chars;
  }
  fail("'", type_name(), "' object is not iterable");
}

size_t Value::length() const {
  if (is_undefined()) return 0;
  if (is_string()) return utf8_chars(as_string()).size();
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().items.size();
  fail("object of type '", type_name(), "' has no len()");
}

bool equals(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_object() && b.is_object()) {
    const Object &x = a.as_object(), &y = b.as_object();
    if (&x == &y) return true;
    if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !equals(v, *w)) return false;
    }
    return true;
  }
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

}  // namespace serval::jinja
