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

namespace {

constexpr const char* kSpaces = " \t\n\r\f\v";

// continue_final_message, as transformers' apply_chat_template does it: the
// prompt ends where the final message's text ends (its end-of-turn tokens
// and anything after them cut), so the model continues that message.
std::string cut_after_final_message(const std::string& rendered, const std::string& text) {
  const size_t first = text.find_first_not_of(kSpaces);
  const std::string lstripped = first == std::string::npos ? "" : text.substr(first);
  const std::string stripped = lstripped.substr(0, lstripped.find_last_not_of(kSpaces) + 1);
  const size_t at = stripped.empty() ? rendered.size() : rendered.rfind(stripped);
  if (at == std::string::npos)
    throw ApiError(400,
                   "'continue_final_message': the final message's text does not appear in the prompt the chat "
                   "template renders, so it cannot be continued",
                   "continue_final_message");
  // The template kept the message's trailing spaces: cut after them; else after its last non-space.
  if (rendered.compare(at, lstripped.size(), lstripped) == 0 && lstripped == text)
    return rendered.substr(0, at + lstripped.size());
  return rendered.substr(0, at + stripped.size());
}

}  // namespace

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
    std::string prompt = t.render(vars);
    if (r.continue_final_message) {
      const auto& content = r.messages.back()["content"];
      prompt = cut_after_final_message(prompt, content.is_string() ? content.get<std::string>() : "");
    }
    return prompt;
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
