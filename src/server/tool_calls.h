#pragma once
// Tool calls in /v1/chat/completions: how the model family writes them
// (chosen from the chat template, or --tool-call-parser), tool_choice, the
// grammar that makes `required` and a named function always a valid call
// (structured output), and the parser that turns the text into OpenAI's
// tool_calls (malformed calls stay text). Formats:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen2.5, Qwen3)
//   llama3_json  {"name": ..., "parameters": {...}}, several joined by "; "  (Llama 3.1/3.2)
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]       (Mistral)
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/structured_output.h"

namespace serval::server {

enum class ToolFormat { kNone, kHermes, kLlama3Json, kMistral };

// The format a chat template's tool instructions ask for (kNone: unknown).
ToolFormat detect_tool_format(const std::string& template_source);
// --tool-call-parser: "auto" (nullopt: detect), "hermes", "llama3_json",
// "mistral"; throws serval::Error naming the choices otherwise.
std::optional<ToolFormat> tool_format_named(const std::string& name);
const char* tool_format_name(ToolFormat f);

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

// tool_choice ("none" | "auto" | "required" | {"type": "function",
// "function": {"name"}}); `tools` the request's list. ApiError 400 naming
// the field when malformed, or when the named function is not in tools.
ToolChoice parse_tool_choice(const nlohmann::json& body, const nlohmann::ordered_json& tools);

// The constraint that makes the whole output tool calls in `format`: of the
// named function, or (required) of any of `tools`, one or (parallel) more.
// ApiError 400 when the format is unknown or a tool's parameters do not
// compile.
ConstraintSpec tool_call_constraint(ToolFormat format, const nlohmann::ordered_json& tools, const ToolChoice& choice,
                                    bool parallel);

struct ToolCall {
  std::string id;         // "call_" + 24 hex digits
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ParsedToolOutput {
  std::string content;          // the text outside the calls (trimmed)
  std::vector<ToolCall> calls;  // empty: none found, or malformed (the text stays content)
};

ParsedToolOutput parse_tool_calls(ToolFormat format, const std::string& text);

// Streaming: text that cannot be part of a call goes out as it comes; from
// where a call may start, it is held until the end, then parsed.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolFormat format) : format_(format) {}
  // The part of `delta` safe to send as content now.
  std::string feed(const std::string& delta);
  // At the end: the held text, parsed (content then calls).
  ParsedToolOutput finish();

 private:
  ToolFormat format_;
  std::string held_;
  bool holding_ = false;   // a call may have started: hold everything from here
  bool decided_ = false;   // llama3/mistral: the output's start has been seen
};

}  // namespace serval::server
