#pragma once
// Fill-in-the-middle (OpenAI's `suffix` on /v1/completions): a model trained
// for infilling reads PRE prefix SUF suffix MID (the "PSM" order) and writes
// the middle. The three tokens come from GGUF metadata
// (tokenizer.ggml.fim_pre/suf/mid_token_id) or are found by their text in the
// vocabulary, in the styles of the families that have them:
//   Qwen2.5-Coder, StarCoder2:  <|fim_prefix|> <|fim_suffix|> <|fim_middle|>
//   StarCoder, SantaCoder:      <fim_prefix> <fim_suffix> <fim_middle>
//   CodeLlama:                  ▁<PRE> ▁<SUF> ▁<MID> (some GGUFs: <PRE> <SUF> <MID>)
//   DeepSeek-Coder:             <｜fim▁begin｜> <｜fim▁hole｜> <｜fim▁end｜>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace serval {

struct FimTokens {
  int32_t prefix = -1, suffix = -1, middle = -1;
};

// The model's FIM tokens, or nullopt when it has none (all three are needed).
std::optional<FimTokens> find_fim_tokens(const Tokenizer& tok);

// [BOS when add_special and the tokenizer adds one] PRE prefix SUF suffix MID.
// The prefix is encoded as a text's start (SentencePiece's dummy "▁" gives
// CodeLlama's documented "▁<PRE> {prefix}"), the suffix as a continuation
// (no dummy "▁": "▁<SUF>{suffix}"), as CodeLlama's reference infilling does;
// byte-level tokenizers add no space either way.
std::vector<int32_t> fim_prompt(const Tokenizer& tok, const FimTokens& fim, std::string_view prefix,
                                std::string_view suffix, bool add_special);
// The same with the prefix given as token ids: a BOS the ids start with stays
// first, before PRE; nothing else is added.
std::vector<int32_t> fim_prompt(const Tokenizer& tok, const FimTokens& fim, const std::vector<int32_t>& prefix_ids,
                                std::string_view suffix);

}  // namespace serval
