#pragma once
// Every request field Serval knows on /v1/completions and
// /v1/chat/completions (OpenAI's schemas and vLLM's extra fields), each
// honoured, refused or an accepted no-op (docs/SERVER.md, "Request fields",
// is this table in prose). check_request_fields() runs before a body is
// parsed: a refused field asking for something Serval does not do gets a 400
// naming it and saying why; a no-op field has its type checked; a field in
// no list is accepted and logged to stderr, once per field name per process.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::server {

enum class Endpoint : uint8_t { kCompletions = 1, kChat = 2 };

enum class FieldStatus {
  kHonoured,  // parsed and acted on (openai_request.cpp and the handlers)
  kRefused,   // 400 unless the value asks for nothing (null, or its neutral value)
  kNoop,      // accepted, changes nothing Serval outputs (type checked)
};

struct FieldRule {
  const char* name;
  uint8_t endpoints;  // Endpoint bits
  FieldStatus status;
  // kRefused: a JSON array of the values accepted because they ask for
  // nothing (e.g. "[false]"; nullptr: only null). kNoop: the JSON type the
  // value must have ("string", "boolean", "object"; nullptr: any).
  const char* accepts;
  const char* why;  // kRefused: the reason given in the 400
};

const std::vector<FieldRule>& request_field_rules();

// 400 (naming the field) for a refused field that asks for something, or a
// no-op field of the wrong type; logs unknown fields (once per name, the
// names of nested stream_options fields included).
void check_request_fields(const nlohmann::json& body, Endpoint endpoint);

// Logs "serval: warning: ..." for `name` unless it was logged before (true
// when it was logged now). At most kMaxLoggedNames names are remembered (by
// their first 256 bytes); past them one line says further names are not logged.
bool log_unknown_field(const std::string& name, const char* path);
inline constexpr size_t kMaxLoggedNames = 1024;

}  // namespace serval::server
