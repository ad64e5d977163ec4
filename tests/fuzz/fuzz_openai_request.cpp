// libFuzzer harness: a request body as a client sends it to /v1/completions
// and /v1/chat/completions, through what the server does before the engine
// sees it: JSON parsing, the fields' types and ranges, the chat template of
// a real model (Qwen3's, which renders tools, tool calls and reasoning) and
// its tokenizer. Every body must go through or throw ApiError or
// serval::Error (a 400 naming the problem); anything else is a bug.
// Models: $SERVAL_MODELS (default ../shared/models), tokenizers/qwen3.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace {

std::unique_ptr<serval::Tokenizer> g_tokenizer;
std::unique_ptr<serval::server::ChatPrompt> g_chat;

void tokenize_prompts(const std::vector<serval::server::PromptInput>& prompts, bool add_special) {
  for (const auto& p : prompts)
    if (p.is_text) (void)g_tokenizer->encode(p.text, add_special);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("SERVAL_MODELS");
  const std::string dir = std::string(env ? env : "../shared/models") + "/tokenizers/qwen3";
  g_tokenizer = serval::load_tokenizer(dir);
  const std::string source = serval::server::chat_template_source("", dir, false);
  const std::string tool_source = serval::server::chat_template_source("", dir, true);
  g_chat = std::make_unique<serval::server::ChatPrompt>(source, tool_source, *g_tokenizer);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    const serval::server::CompletionRequest c =
        serval::server::parse_completion_request(serval::server::parse_json_object(body));
    tokenize_prompts(c.prompts, c.add_special_tokens);
  } catch (const serval::server::ApiError&) {
  } catch (const serval::Error&) {
  }
  try {
    const serval::server::ChatRequest r =
        serval::server::parse_chat_request(serval::server::parse_ordered_json_object(body));
    (void)g_tokenizer->encode(g_chat->render(r), false);
  } catch (const serval::server::ApiError&) {
  } catch (const serval::Error&) {
  }
  return 0;
}
