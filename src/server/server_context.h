#pragma once
// What the endpoint handlers share: the engine, the tokenizer, the chat
// prompt, the served model name and the context length.
#include <atomic>
#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "server/openai_request.h"
#include "server/chat_prompt.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {

struct ServerContext {
  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatPrompt& chat;
  std::string model_name;
  int64_t max_model_len = 0;
  int64_t engine_vocab_size = 0;     // the model's (may exceed the tokenizer's)
  int64_t created = 0;               // start time, for /v1/models
  std::atomic<bool> engine_alive{true};  // false once the engine is shut down
  GrammarCache* grammars = nullptr;      // structured output's compiled grammars
  ToolFormat tool_format = ToolFormat::kNone;  // how the model writes tool calls

  // The masker of `gen`'s constraint (null when none); ApiError 400 when it
  // does not compile.
  std::shared_ptr<const grammar::TokenMasker> grammar_of(const GenerationOptions& gen) const;

  // ApiError 404 when `requested` is given and is not the served model.
  void check_model(const std::string& requested) const;
  // ApiError 400 naming `param` when an id is outside the vocabulary.
  void check_token_ids(const std::vector<int32_t>& ids, const char* param) const;
};

}  // namespace serval::server
