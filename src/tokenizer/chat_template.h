#pragma once
// ChatTemplate: renders a model's Jinja chat template (tokenizer_config.json
// "chat_template" or GGUF tokenizer.chat_template) the way transformers'
// apply_chat_template does with jinja2 (trim_blocks, lstrip_blocks,
// raise_exception, strftime_now, tojson). A Jinja subset written for Serval:
// enough for the templates of Llama 3.x, Qwen 2.5/3 (tools, thinking) and
// Mistral.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace serval {

class ChatTemplate {
 public:
  // Parses `source`; throws serval::Error with line/column on a syntax error
  // or a construct the renderer does not support.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with `variables` as the template's globals, as
  // jinja2 Template.render(**variables): typically messages, tools,
  // add_generation_prompt, bos_token, eos_token and extra kwargs such as
  // enable_thinking. Throws serval::Error on raise_exception() or a runtime
  // error (the message names it).
  std::string render(const nlohmann::json& variables) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serval
