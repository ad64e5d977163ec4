// llama.cpp's tokenizer test vectors (made with the HF tokenizers of Llama 2,
// Llama 3 and Qwen1.5) and the stories260K prompt from PROVENANCE.md.
#include <gtest/gtest.h>

#include <sstream>

#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

void check_vectors(const char* tokenizer_rel, const std::string& name) {
  const Tokenizer* tok = shared_tokenizer(tokenizer_rel);
  ASSERT_NE(tok, nullptr);
  auto vs = read_vectors(name);
  // 46 strings, each followed by the separator (Python's split shows a 47th, empty, piece).
  ASSERT_EQ(vs.size(), 46u) << name;
  for (const auto& v : vs) EXPECT_EQ(tok->encode(v.text, false), v.ids) << name << " text: \"" << v.text << "\"";
}

TEST(TokenizerVectors, LlamaSpmFromGguf) { check_vectors(kLlama2Gguf, "ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerVectors, LlamaBpeFromTokenizerJson) { check_vectors(kLlama3Json, "ggml-vocab-llama-bpe.gguf"); }
TEST(TokenizerVectors, Qwen2FromTokenizerJson) { check_vectors(kQwen3Json, "ggml-vocab-qwen2.gguf"); }

TEST(TokenizerVectors, Stories260KPrompt) {
  const Tokenizer* tok = shared_tokenizer(kStoriesGguf);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  // PROVENANCE.md: these 16 greedy ids read "Once upon a time, there was ... loved to play".
  std::vector<int32_t> ids = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298,
                              315, 421, 395, 317, 426, 338, 401, 396, 267, 337};
  EXPECT_EQ(tok->decode(ids), "Once upon a time, there was a little girl named Lily. She loved to play");
}

}  // namespace
}  // namespace serval
