// Long inputs must not blow up quadratically (the server tokenizes on request
// threads): 100 KB of text of several shapes encodes in well under a second
// (a quadratic merge loop would take minutes on these).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>

#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

std::vector<std::pair<std::string, std::string>> long_inputs() {
  const size_t n = 100 * 1024;
  std::vector<std::pair<std::string, std::string>> v;
  v.emplace_back("one letter", std::string(n, 'a'));
  v.emplace_back("spaces", std::string(n, ' '));
  v.emplace_back("spaces then word", std::string(n, ' ') + "word");
  v.emplace_back("digits", std::string(n, '7'));
  v.emplace_back("newlines", std::string(n, '\n'));
  v.emplace_back("punctuation", std::string(n, '!'));
  std::string words;
  std::mt19937 rng(1);
  const char* pool[] = {"the ", "quick ", "brown ", "fox's ", "123 ", "\n", "中文", "🙂 ", "  ", "naïve ", "<s>", "<|"};
  while (words.size() < n) words += pool[rng() % 12];
  v.emplace_back("mixed words", words);
  std::string cjk;
  while (cjk.size() < n) cjk += "龘靐齉爩";
  v.emplace_back("rare CJK", cjk);
  return v;
}

void check_speed(const char* rel) {
  const Tokenizer* tok = shared_tokenizer(rel);
  ASSERT_NE(tok, nullptr);
  for (const auto& [name, text] : long_inputs()) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> ids = tok->encode(text, false);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 0.75) << rel << " " << name << ": " << s << " s";
    // SERVAL_TOK_TIMES=1 prints the times (~0.01-0.08 s each in Release).
    if (std::getenv("SERVAL_TOK_TIMES")) std::cerr << rel << " " << name << " " << s << "\n";
    EXPECT_FALSE(ids.empty());
    if (name != "mixed words") {
      EXPECT_EQ(tok->decode(ids, false), text) << rel << " " << name;
    }
  }
}

TEST(TokenizerSpeed, Llama2LongInputs) { check_speed(kLlama2Gguf); }
TEST(TokenizerSpeed, Llama3LongInputs) { check_speed(kLlama3Json); }
TEST(TokenizerSpeed, Qwen3LongInputs) { check_speed(kQwen3Json); }

}  // namespace
}  // namespace serval
