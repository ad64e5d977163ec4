// TEMPORARY (removed when wt-chat's ChatTemplate is merged): weak definitions
// so the server links before the real renderer lands; they refuse to render.
#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace serval {
struct ChatTemplate::Impl {};
__attribute__((weak)) ChatTemplate::ChatTemplate(const std::string&) : impl_(std::make_unique<Impl>()) {}
__attribute__((weak)) ChatTemplate::~ChatTemplate() = default;
__attribute__((weak)) std::string ChatTemplate::render(const nlohmann::json&) const {
  fail("chat templates are not implemented yet");
}
}  // namespace serval
