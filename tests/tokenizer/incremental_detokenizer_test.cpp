// Streaming detokenization: characters split across byte tokens come out once
// complete, and the streamed text equals decode() of the whole sequence.
#include <gtest/gtest.h>

#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

const std::vector<std::string> kTexts = {
    "Hello world",
    " leading space and  two",
    "🙂 emoji, 👨‍👩‍👧‍👦 family (ZWJ), 🇯🇵 flag",
    "中文字符 and 龘靐齉 rare CJK",
    "Ünïcödé ça va? ありがとう",
    "mixed\n\ttabs 123456 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
};

bool valid_utf8(const std::string& s) { return utf8::sanitize(s) == s; }

// Streams `ids` token by token; returns the pieces push() gave.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool first_in_text,
                                std::string& flushed) {
  IncrementalDetokenizer detok(tok, true, first_in_text);
  std::vector<std::string> parts;
  for (int32_t id : ids) parts.push_back(detok.push(id));
  flushed = detok.flush();
  return parts;
}

void check_streaming(const char* rel) {
  const Tokenizer* tok = shared_tokenizer(rel);
  ASSERT_NE(tok, nullptr);
  int held_back = 0;  // tokens that ended in the middle of a character
  for (const auto& text : kTexts) {
    std::vector<int32_t> ids = tok->encode(text, true);
    std::string flushed;
    auto parts = stream(*tok, ids, true, flushed);
    std::string joined;
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_TRUE(valid_utf8(parts[i])) << rel << ": piece " << i << " of \"" << text << "\"";
      if (!valid_utf8(tok->token_bytes(ids[i])) && !tok->is_special(ids[i])) ++held_back;
      joined += parts[i];
    }
    EXPECT_EQ(flushed, "");
    joined += flushed;
    EXPECT_EQ(joined, tok->decode(ids)) << rel;
    EXPECT_EQ(joined, text) << rel;  // these texts round-trip exactly
  }
  // The texts must exercise the hold-back path, or this test proves nothing.
  EXPECT_GT(held_back, 0) << rel;
}

TEST(IncrementalDetokenizer, Llama2StreamsLikeDecode) { check_streaming(kLlama2Gguf); }
TEST(IncrementalDetokenizer, Llama3StreamsLikeDecode) { check_streaming(kLlama3Json); }
TEST(IncrementalDetokenizer, Qwen3StreamsLikeDecode) { check_streaming(kQwen3Json); }

TEST(IncrementalDetokenizer, EmojiBytesComeOutOnceComplete) {
  const Tokenizer* tok = shared_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  // Llama 2 has no piece for 🙂: it is four byte tokens <0xF0><0x9F><0x99><0x82>.
  std::vector<int32_t> ids = tok->encode("🙂", false);
  ASSERT_EQ(ids, (std::vector<int32_t>{29871, 243, 162, 156, 133}));
  IncrementalDetokenizer detok(*tok, true, false);
  EXPECT_EQ(detok.push(ids[0]), " ");
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.push(ids[3]), "");
  EXPECT_EQ(detok.push(ids[4]), "🙂");
  EXPECT_EQ(detok.flush(), "");
}

TEST(IncrementalDetokenizer, IncompleteTailFlushesAsReplacementChar) {
  const Tokenizer* tok = shared_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  IncrementalDetokenizer detok(*tok, true, false);
  EXPECT_EQ(detok.push(243), "");  // <0xF0>
  EXPECT_EQ(detok.push(162), "");  // <0x9F>
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode({243, 162}), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizer, SentencePieceLeadingSpace) {
  const Tokenizer* tok = shared_tokenizer(kLlama2Gguf);
  ASSERT_NE(tok, nullptr);
  ASSERT_TRUE(tok->strips_leading_space());
  std::vector<int32_t> ids = tok->encode("Hello world", true);  // <s> ▁Hello ▁world
  ASSERT_EQ(ids, (std::vector<int32_t>{1, 15043, 3186}));
  std::string flushed, start, cont;
  for (auto& p : stream(*tok, ids, true, flushed)) start += p;
  for (auto& p : stream(*tok, ids, false, flushed)) cont += p;
  EXPECT_EQ(start, "Hello world");   // the text starts here: drop the first space
  EXPECT_EQ(cont, " Hello world");   // continuing a prompt: keep it
  EXPECT_EQ(tok->decode(ids), "Hello world");
  EXPECT_EQ(tok->decode(ids, false), "<s> Hello world");  // HF/sentencepiece keep it after a shown <s>
}

TEST(IncrementalDetokenizer, ByteLevelKeepsLeadingSpace) {
  const Tokenizer* tok = shared_tokenizer(kLlama3Json);
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->strips_leading_space());
  std::vector<int32_t> ids = tok->encode(" Hello", false);
  EXPECT_EQ(tok->decode(ids), " Hello");
}

TEST(IncrementalDetokenizer, SkipsSpecialTokensWhenAsked) {
  const Tokenizer* tok = shared_tokenizer(kLlama3Json);
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = tok->encode("<|begin_of_text|>Hi<|eot_id|>", false);
  ASSERT_EQ(ids.size(), 3u);
  IncrementalDetokenizer skip(*tok, true, true), keep(*tok, false, true);
  std::string a, b;
  for (int32_t id : ids) {
    a += skip.push(id);
    b += keep.push(id);
  }
  EXPECT_EQ(a, "Hi");
  EXPECT_EQ(b, "<|begin_of_text|>Hi<|eot_id|>");
}

}  // namespace
}  // namespace serval
