#include "server/json_fields.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "server/api_error.h"

namespace serval::server {
namespace {

const nlohmann::json* field(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const char* key, const char* expected, const nlohmann::json& v) {
  throw ApiError(400, str_cat("'", key, "' must be ", expected, ", got ", json_type_name(v)), key);
}

}  // namespace

namespace {
// Deeper bodies are refused while parsing: copying or printing a JSON value
// recurses, and a hostile [[[[...]]]] must not exhaust a thread's stack.
constexpr int kMaxJsonDepth = 128;

template <typename Json>
Json parse_object(const std::string& body) {
  Json j;
  try {
    j = Json::parse(body, [](int depth, nlohmann::json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth)
        throw ApiError(400, str_cat("the request body is nested deeper than ", kMaxJsonDepth, " levels"));
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, str_cat("malformed JSON in the request body: ", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, str_cat("the request body must be a JSON object, got ", j.type_name()));
  return j;
}
}  // namespace

nlohmann::json parse_json_object(const std::string& body) { return parse_object<nlohmann::json>(body); }
nlohmann::ordered_json parse_ordered_json_object(const std::string& body) {
  return parse_object<nlohmann::ordered_json>(body);
}

std::string json_type_name(const nlohmann::json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

std::optional<bool> get_bool(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

std::optional<int64_t> get_int(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi) {
  const nlohmann::json* v = field(obj, key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  bool in_range = true;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    in_range = u <= uint64_t(hi);
    x = in_range ? int64_t(u) : hi;
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) wrong_type(key, "an integer", *v);
    in_range = d >= double(lo) && d <= double(hi);
    x = in_range ? int64_t(d) : lo;
  } else {
    wrong_type(key, "an integer", *v);
  }
  if (!in_range || x < lo || x > hi)
    throw ApiError(400, str_cat("'", key, "' must be in [", lo, ", ", hi, "], got ", v->dump()), key);
  return x;
}

std::optional<double> get_number(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) throw ApiError(400, str_cat("'", key, "' must be finite"), key);
  return d;
}

std::optional<float> get_float(const nlohmann::json& obj, const char* key) {
  const std::optional<double> d = get_number(obj, key);
  if (d && std::fabs(*d) > double(std::numeric_limits<float>::max()))
    throw ApiError(400, str_cat("'", key, "' is too large for a 32-bit float (at most 3.4e38), got ", obj.at(key).dump()),
                   key);
  return d ? std::optional<float>(float(*d)) : std::nullopt;
}

const nlohmann::json* get_object(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = field(obj, key);
  if (v && !v->is_object()) wrong_type(key, "an object", *v);
  return v;
}

}  // namespace serval::server
