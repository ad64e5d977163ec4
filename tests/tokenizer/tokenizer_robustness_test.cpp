// Inputs the reference libraries never see (invalid UTF-8, concurrent callers)
// must neither crash nor change results.
#include <gtest/gtest.h>

#include <thread>

#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

TEST(TokenizerRobustness, InvalidUtf8IsEncodedAsReplacementCharacters) {
  for (const char* rel : {kLlama2Gguf, kLlama3Json, kQwen3Json}) {
    const Tokenizer* tok = shared_tokenizer(rel);
    ASSERT_NE(tok, nullptr);
    std::string bad = "a\xFF" "b\xF0\x9F" "c\xC3";
    EXPECT_EQ(tok->encode(bad, false), tok->encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD", false)) << rel;
    EXPECT_EQ(tok->encode(std::string("nul\0byte", 8), false).empty(), false);
  }
}

TEST(TokenizerRobustness, ConcurrentEncodesAgree) {
  const Tokenizer* tok = shared_tokenizer(kLlama3Json);
  ASSERT_NE(tok, nullptr);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("request " + std::to_string(i * 7919) + " says héllo wörld 🙂 " + std::string(i % 13, ' ') + "end");
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(tok->encode(t, true));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (tok->encode(texts[(i + w * 31) % texts.size()], true) != want[(i + w * 31) % texts.size()]) ++mismatches[w];
    });
  }
  for (auto& t : threads) t.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

}  // namespace
}  // namespace serval
