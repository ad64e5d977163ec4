#pragma once
// ChatPrompt: turns a chat request's messages into the prompt text with the
// model's chat template (or the one given with --chat-template), as
// transformers' apply_chat_template(messages, tools=..., add_generation_prompt=...,
// **chat_template_kwargs) renders it. The text is then tokenized without
// adding special tokens (the template writes BOS itself), as vLLM does.
#include <memory>
#include <string>

#include "server/openai_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {

class ChatPrompt {
 public:
  // `source` empty: the model has no template and chat requests get a 400
  // saying so. `tool_source`: the template for requests with tools (a
  // model's "tool_use" template); empty: `source`. Throws serval::Error when
  // a template does not parse. `tok` must outlive this object.
  ChatPrompt(const std::string& source, const std::string& tool_source, const Tokenizer& tok);
  bool available() const { return template_ != nullptr; }
  // ApiError 400 when there is no template or the template refuses the
  // messages (raise_exception), with the template's message.
  std::string render(const ChatRequest& request) const;

 private:
  std::unique_ptr<ChatTemplate> template_, tool_template_;
  const Tokenizer& tok_;
};

// The template text: the file given with --chat-template when not empty
// (throws serval::Error when unreadable), else the model's own
// (load_chat_template: with `with_tools`, its tool_use template if it has
// one; empty when it has none).
std::string chat_template_source(const std::string& file, const std::string& model_path, bool with_tools);

}  // namespace serval::server
