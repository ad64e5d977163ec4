#pragma once
// ChatTemplate: renders a model's Jinja chat template (tokenizer_config.json
// "chat_template" or GGUF tokenizer.chat_template) the way transformers'
// apply_chat_template does with jinja2 (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now,
// transformers' tojson). A Jinja implementation written for Serval (see
// tokenizer/jinja/): enough for the templates of Llama 3.x, Qwen 2.5/3 (tools,
// thinking) and Mistral.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace serval {

class Tokenizer;

// Thrown when the template calls raise_exception(message): what() is the
// template's message, untouched (e.g. Mistral's "Conversation roles must
// alternate user/assistant/user/assistant/..."). The server can answer 400.
class ChatTemplateRaisedError : public Error {
 public:
  using Error::Error;
};

// Parse once, render many times: render() is const and keeps no state
// between calls, so one ChatTemplate can serve concurrent requests.
class ChatTemplate {
 public:
  // Parses `source`; throws serval::Error "chat template syntax error at line
  // L, column C: ..." on a syntax error, an unknown filter or test, or a
  // construct the renderer does not support.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with `variables` (a JSON object) as the template's globals, as
  // jinja2 Template.render(**variables): typically messages, tools,
  // add_generation_prompt, bos_token, eos_token and extra kwargs such as
  // enable_thinking. Throws ChatTemplateRaisedError on raise_exception(), or
  // serval::Error naming line and column on a runtime error (e.g. using an
  // undefined value).
  //
  // Pass an ordered_json when key order matters: templates print tool
  // schemas with tojson, and Python keeps a dict's insertion order
  // (nlohmann::json sorts keys; parse requests with nlohmann::ordered_json).
  std::string render(const nlohmann::ordered_json& variables) const;
  std::string render(const nlohmann::json& variables) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The variables transformers adds from the tokenizer's special tokens map:
// bos_token and eos_token as strings, each only when the tokenizer has one.
nlohmann::ordered_json chat_template_special_tokens(const Tokenizer& tok);

// What transformers passes to the template for apply_chat_template(messages,
// tools=tools, add_generation_prompt=..., **extra): messages, tools (null
// when absent), documents (null), add_generation_prompt, the tokenizer's
// special tokens, then `extra` (which may override any of them). Messages are
// prepared as transformers does: a reasoning text given as "reasoning_content",
// "thinking" or "reasoning" is offered under both "thinking" and
// "reasoning_content".
nlohmann::ordered_json chat_template_variables(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                               const Tokenizer* tok, const nlohmann::ordered_json& extra);

// The chat template stored with a model: GGUF tokenizer.chat_template, or
// tokenizer_config.json "chat_template" (a string, or a list of {name,
// template} from which "default" is used) in a model folder or beside a
// tokenizer.json. Empty when the model has none. With `with_tools` (the
// request has tools), a template named "tool_use" (GGUF
// tokenizer.chat_template.tool_use) is preferred, as transformers does.
// Tokenizer::chat_template holds the default one.
std::string load_chat_template(const std::string& model_path, bool with_tools = false);

}  // namespace serval
