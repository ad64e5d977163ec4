// Fill-in-the-middle prompts: the FIM tokens found by text (Qwen3's
// <|fim_prefix|>, a CodeLlama-style "▁<PRE>" vocabulary) or by GGUF metadata,
// and the PSM prompt built from them.
#include "tokenizer/fim.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "model/gguf.h"
#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(Fim, Qwen3TokensFoundByText) {
  const Tokenizer* tok = shared_tokenizer(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  const auto fim = find_fim_tokens(*tok);
  ASSERT_TRUE(fim.has_value());
  EXPECT_EQ(fim->prefix, *tok->token_id("<|fim_prefix|>"));
  EXPECT_EQ(fim->suffix, *tok->token_id("<|fim_suffix|>"));
  EXPECT_EQ(fim->middle, *tok->token_id("<|fim_middle|>"));
  const std::string prefix = "def add(a, b):\n    ", suffix = "\n\nprint(add(1, 2))\n";
  const std::vector<int32_t> ids = fim_prompt(*tok, *fim, prefix, suffix, /*add_special=*/true);
  EXPECT_EQ(ids, concat({{fim->prefix}, tok->encode(prefix, false), {fim->suffix}, tok->encode(suffix, false),
                         {fim->middle}}));
  EXPECT_EQ(tok->decode(ids, false), "<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>");
  // The same text encoded whole gives the same tokens (Qwen adds no BOS).
  EXPECT_EQ(ids, tok->encode("<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>", true));
  // A prefix of token ids goes in as given.
  const std::vector<int32_t> pre_ids = tok->encode(prefix, false);
  EXPECT_EQ(fim_prompt(*tok, *fim, pre_ids, suffix), ids);
}

TEST(Fim, ModelsWithoutFimTokens) {
  for (const char* rel : {kLlama3Dir, kStoriesGguf, kLlama2Gguf}) {
    const Tokenizer* tok = shared_tokenizer(rel);
    ASSERT_NE(tok, nullptr);
    EXPECT_FALSE(find_fim_tokens(*tok).has_value()) << rel;
  }
}

// A SentencePiece vocabulary with CodeLlama's infilling tokens; `metadata`:
// other names for them, given by tokenizer.ggml.fim_*_token_id instead.
std::unique_ptr<Tokenizer> codellama_like(bool metadata) {
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "x", "y", "\xe2\x96\x81x",
                                           "\xe2\x96\x81y", metadata ? "<a>" : "\xe2\x96\x81<PRE>",
                                           metadata ? "<b>" : "\xe2\x96\x81<SUF>", metadata ? "<c>" : "\xe2\x96\x81<MID>"};
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", pieces);
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -2, -1, -1, 0, 0, 0});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 3, 3, 3});
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  if (metadata) {
    w.set_u32("tokenizer.ggml.fim_pre_token_id", 8);
    w.set_u32("tokenizer.ggml.fim_suf_token_id", 9);
    w.set_u32("tokenizer.ggml.fim_mid_token_id", 10);
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("serval_fim_" + std::to_string(metadata) + "_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  w.write(path);
  auto g = GgufFile::open(path);
  auto tok = load_tokenizer(*g);
  std::filesystem::remove(path);
  return tok;
}

TEST(Fim, CodeLlamaStyleSpacing) {
  for (bool metadata : {false, true}) {
    const auto tok = codellama_like(metadata);
    const auto fim = find_fim_tokens(*tok);
    ASSERT_TRUE(fim.has_value()) << metadata;
    EXPECT_EQ(fim->prefix, 8);
    EXPECT_EQ(fim->suffix, 9);
    EXPECT_EQ(fim->middle, 10);
    // "<s>▁<PRE> {prefix} ▁<SUF>{suffix} ▁<MID>": the prefix gets the dummy
    // "▁" (the space after PRE), the suffix none.
    EXPECT_EQ(fim_prompt(*tok, *fim, "x", "y", true), (std::vector<int32_t>{1, 8, 6, 9, 5, 10}));
    EXPECT_EQ(fim_prompt(*tok, *fim, "x", " y", true), (std::vector<int32_t>{1, 8, 6, 9, 7, 10}));
    EXPECT_EQ(fim_prompt(*tok, *fim, "x", "y", false), (std::vector<int32_t>{8, 6, 9, 5, 10}));
    // Token-id prefixes: a leading BOS stays first.
    EXPECT_EQ(fim_prompt(*tok, *fim, std::vector<int32_t>{1, 6}, "y"), (std::vector<int32_t>{1, 8, 6, 9, 5, 10}));
    EXPECT_EQ(fim_prompt(*tok, *fim, std::vector<int32_t>{6}, "y"), (std::vector<int32_t>{8, 6, 9, 5, 10}));
  }
}

TEST(Fim, ContinuationHasNoDummyPrefix) {
  const Tokenizer* tok = shared_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  for (const char* text : {"return x", "hello world", "x = 1\n"}) {
    EXPECT_EQ(tok->encode_continuation(std::string(" ") + text), tok->encode(text, false)) << text;
    EXPECT_NE(tok->encode_continuation(text), tok->encode(text, false)) << text;
  }
  const Tokenizer* qwen = shared_tokenizer(kQwen3Dir);
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->encode_continuation("return x"), qwen->encode("return x", false));
}

}  // namespace
}  // namespace serval
