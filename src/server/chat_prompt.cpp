#include "server/chat_prompt.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "server/api_error.h"

namespace serval::server {

ChatPrompt::ChatPrompt(const std::string& source, const std::string& tool_source, const Tokenizer& tok)
    : tok_(tok) {
  if (!source.empty()) template_ = std::make_unique<ChatTemplate>(source);
  if (!tool_source.empty() && tool_source != source) tool_template_ = std::make_unique<ChatTemplate>(tool_source);
}

std::string ChatPrompt::render(const ChatRequest& r) const {
  if (!template_)
    throw ApiError(400,
                   "this model has no chat template, so /v1/chat/completions cannot format messages: "
                   "start the server with --chat-template FILE, or use /v1/completions",
                   "messages", "no_chat_template");
  const nlohmann::ordered_json vars =
      chat_template_variables(r.messages, r.tools, r.add_generation_prompt, &tok_, r.template_kwargs);
  const ChatTemplate& t = !r.tools.is_null() && tool_template_ ? *tool_template_ : *template_;
  try {
    return t.render(vars);
  } catch (const ChatTemplateRaisedError& e) {
    throw ApiError(400, str_cat("the chat template refused the messages: ", e.what()), "messages");
  } catch (const Error& e) {
    throw ApiError(400, str_cat("the chat template failed on these messages: ", e.what()), "messages");
  }
}

std::string chat_template_source(const std::string& file, const std::string& model_path, bool with_tools) {
  if (file.empty()) return load_chat_template(model_path, with_tools);
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read the chat template file ", file, " (--chat-template)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace serval::server
