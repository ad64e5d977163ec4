#include "server/chat_prompt.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "server/api_error.h"

namespace serval::server {

ChatPrompt::ChatPrompt(const std::string& source, const Tokenizer& tok) {
  if (!source.empty()) template_ = std::make_unique<ChatTemplate>(source);
  if (tok.bos_id >= 0) bos_token_ = tok.token_piece(tok.bos_id);
  if (tok.eos_id >= 0) eos_token_ = tok.token_piece(tok.eos_id);
}

std::string ChatPrompt::render(const ChatRequest& r) const {
  if (!template_)
    throw ApiError(400,
                   "this model has no chat template, so /v1/chat/completions cannot format messages: "
                   "start the server with --chat-template FILE, or use /v1/completions",
                   "messages", "no_chat_template");
  nlohmann::json vars = {{"messages", r.messages},
                         {"add_generation_prompt", r.add_generation_prompt},
                         {"bos_token", bos_token_},
                         {"eos_token", eos_token_}};
  vars["tools"] = r.tools;
  for (auto it = r.template_kwargs.begin(); it != r.template_kwargs.end(); ++it) vars[it.key()] = it.value();
  try {
    return template_->render(vars);
  } catch (const Error& e) {
    throw ApiError(400, str_cat("the chat template refused the messages: ", e.what()), "messages");
  }
}

std::string chat_template_source(const std::string& file, const Tokenizer& tok) {
  if (file.empty()) return tok.chat_template;
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read the chat template file ", file, " (--chat-template)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace serval::server
