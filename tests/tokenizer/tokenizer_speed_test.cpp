// Long inputs must not blow up quadratically (the server tokenizes on request
// threads): for each shape of text, encoding 4x the bytes may take at most 8x
// as long (linear: 4x; a quadratic merge loop: 16x, and minutes at 400 KB).
// A ratio, not a time bound, so a slow machine or a sanitizer build passes
// alike; each time is the best of five runs, the two sizes' runs interleaved
// so that a stretch of load on a shared machine slows both, not one.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>

#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

// Texts of n bytes (or a little more) of several shapes.
std::vector<std::pair<std::string, std::string>> long_inputs(size_t n) {
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

// One encode of `text`, in seconds; on the first run, checks the ids decode back.
double encode_seconds(const Tokenizer& tok, const char* rel, const std::string& name, const std::string& text,
                      int run) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text, false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(ids.empty());
  if (run == 0 && name != "mixed words") {
    EXPECT_EQ(tok.decode(ids, false), text) << rel << " " << name;
  }
  return seconds;
}

void check_speed(const char* rel) {
  const Tokenizer* tok = shared_tokenizer(rel);
  ASSERT_NE(tok, nullptr);
  const size_t n = 100 * 1024;
  const auto small = long_inputs(n), large = long_inputs(4 * n);
  for (size_t i = 0; i < small.size(); ++i) {
    const std::string& name = small[i].first;
    double s = 1e9, l = 1e9;
    for (int run = 0; run < 5; ++run) {
      s = std::min(s, encode_seconds(*tok, rel, name, small[i].second, run));
      l = std::min(l, encode_seconds(*tok, rel, name, large[i].second, run));
    }
    // Below a millisecond the clock's noise could dominate: compare from 1 ms up.
    EXPECT_LT(l, 8 * std::max(s, 1e-3)) << rel << " " << name << ": " << s << " s for " << n
                                        << " bytes, " << l << " s for 4x";
    // SERVAL_TOK_TIMES=1 prints the times.
    if (std::getenv("SERVAL_TOK_TIMES")) std::cerr << rel << " " << name << " " << s << " " << l << "\n";
  }
}

TEST(TokenizerSpeed, Llama2LongInputs) { check_speed(kLlama2Gguf); }
TEST(TokenizerSpeed, Llama3LongInputs) { check_speed(kLlama3Json); }
TEST(TokenizerSpeed, Qwen3LongInputs) { check_speed(kQwen3Json); }

}  // namespace
}  // namespace serval
