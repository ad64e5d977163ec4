#pragma once
// Typed reads of request fields that name the parameter when the type or range
// is wrong (ApiError 400 with param set). A missing field or JSON null means
// "not given": the getters return nullopt.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace serval::server {

// The body parsed as a JSON object; 400 on malformed JSON or a non-object.
nlohmann::json parse_json_object(const std::string& body);
// The same, keeping the client's key order.
nlohmann::ordered_json parse_ordered_json_object(const std::string& body);

// "string", "number", "array", ... as a client would call it.
std::string json_type_name(const nlohmann::json& v);

std::optional<bool> get_bool(const nlohmann::json& obj, const char* key);
std::optional<std::string> get_string(const nlohmann::json& obj, const char* key);
// Integers in [lo, hi]; a float with an integral value (16.0) is accepted.
std::optional<int64_t> get_int(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi);
// Finite numbers.
std::optional<double> get_number(const nlohmann::json& obj, const char* key);
// Finite numbers that a 32-bit float holds (1e300 is refused as too large,
// rather than becoming inf on its way into a float field).
std::optional<float> get_float(const nlohmann::json& obj, const char* key);
// An object (e.g. stream_options); 400 when present and not an object.
const nlohmann::json* get_object(const nlohmann::json& obj, const char* key);

}  // namespace serval::server
