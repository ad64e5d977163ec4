// libFuzzer harness: a chat template (model files carry their own, and a
// model folder is untrusted input) parsed and rendered over a conversation
// with a system prompt, tool calls, a tool result and tools, as the server
// renders a chat request. Every template must render or throw serval::Error;
// a crash, a sanitizer report, a hang (-timeout) or a blow-up of memory
// (-rss_limit_mb) is a bug: one request must not take the server down.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& conversation() {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is the weather in Paris? <think>no</think>"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"sky\": \"clear\"}"},
      {"role": "assistant", "content": "<think>\nsunny\n</think>\n\nClear skies."},
      {"role": "user", "content": "Thanks \u00e9\u4e2d"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<s>", "eos_token": "</s>"})");
  return vars;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const serval::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size));
    (void)t.render(conversation());
  } catch (const serval::Error&) {
  }
  return 0;
}
