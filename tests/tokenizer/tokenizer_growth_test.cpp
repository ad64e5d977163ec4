// Long inputs must not blow up quadratically (the server tokenizes on request
// threads): for each shape of text, encoding 4x the bytes may cost at most 5x
// the work (linear: 4x; a quadratic merge loop or a backtracking regex: 16x,
// and minutes at 400 KB). Work is counted (tokenizer/work_count.h: trie,
// regex and merge steps), not timed, so a loaded machine or a sanitizer build
// gives the same counts; bench/tokenizer_bench.cpp has the times.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>

#include "tokenizer/work_count.h"
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

// The work of one encode of `text`; checks the ids decode back.
TokenizerWork encode_work(const Tokenizer& tok, const char* rel, const std::string& name, const std::string& text) {
  CountTokenizerWork count;
  const std::vector<int32_t> ids = tok.encode(text, false);
  EXPECT_FALSE(ids.empty());
  // Mixed words hold "<s>" and "<|", which may be added tokens that decode otherwise.
  if (name != "mixed words") {
    EXPECT_EQ(tok.decode(ids, false), text) << rel << " " << name;
  }
  return count.work();
}

void check_growth(const char* rel) {
  const Tokenizer* tok = shared_tokenizer(rel);
  ASSERT_NE(tok, nullptr);
  const size_t n = 100 * 1024;
  const auto small = long_inputs(n), large = long_inputs(4 * n);
  for (size_t i = 0; i < small.size(); ++i) {
    const std::string& name = small[i].first;
    const TokenizerWork s = encode_work(*tok, rel, name, small[i].second);
    const TokenizerWork l = encode_work(*tok, rel, name, large[i].second);
    // The trie looks at every byte at least once: the counter counts.
    EXPECT_GE(s.special_steps, int64_t(n)) << rel << " " << name;
    // The BPE cache (short words) can only lower the large text's counts;
    // the slack covers words the small text did not meet.
    const auto grows_linearly = [&](const char* what, int64_t small_count, int64_t large_count) {
      EXPECT_LE(large_count, 5 * small_count + 4096)
          << rel << " " << name << ": " << what << " " << small_count << " for " << n << " bytes, " << large_count
          << " for 4x";
    };
    grows_linearly("trie steps", s.special_steps, l.special_steps);
    grows_linearly("regex steps", s.regex_steps, l.regex_steps);
    grows_linearly("words", s.words, l.words);
    grows_linearly("merge pairs", s.merge_pairs, l.merge_pairs);
    grows_linearly("merge pops", s.merge_pops, l.merge_pops);
    grows_linearly("total", s.total(), l.total());
    // SERVAL_TOK_WORK=1 prints the counts (trie, regex, words, pairs, pops).
    if (std::getenv("SERVAL_TOK_WORK")) {
      for (const TokenizerWork* w : {&s, &l})
        std::cerr << rel << " " << name << ": " << w->special_steps << " " << w->regex_steps << " " << w->words
                  << " " << w->merge_pairs << " " << w->merge_pops << "\n";
    }
  }
}

TEST(TokenizerWork, Llama2LongInputsGrowLinearly) { check_growth(kLlama2Gguf); }
TEST(TokenizerWork, Llama3LongInputsGrowLinearly) { check_growth(kLlama3Json); }
TEST(TokenizerWork, Qwen3LongInputsGrowLinearly) { check_growth(kQwen3Json); }

}  // namespace
}  // namespace serval
