// Code point ranges as UTF-8 byte sequences: for every code point, the
// sequences accept its encoding exactly when the ranges hold it.
#include "grammar/utf8_ranges.h"

#include <gtest/gtest.h>

#include "tokenizer/utf8.h"

namespace serval::grammar {
namespace {

bool sequences_accept(const std::vector<ByteSequence>& seqs, const std::string& bytes) {
  for (const auto& s : seqs) {
    if (s.size() != bytes.size()) continue;
    bool ok = true;
    for (size_t i = 0; i < s.size() && ok; ++i) {
      uint8_t b = uint8_t(bytes[i]);
      ok = b >= s[i].lo && b <= s[i].hi;
    }
    if (ok) return true;
  }
  return false;
}

TEST(GrammarUtf8Ranges, MatchExactlyTheCodePoints) {
  const std::vector<std::vector<CodepointRange>> cases = {
      {{0, kMaxCodepoint}},
      {{'a', 'z'}, {0xE9, 0xE9}, {0x20AC, 0x20AC}},
      {{0x7F, 0x800}},
      {{0xD000, 0xE100}},  // across the surrogates
      {{0xFFFF, 0x10000}, {0x10FFFE, 0x10FFFF}},
      complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}),
  };
  for (const auto& ranges : cases) {
    auto seqs = utf8_sequences(ranges);
    for (uint32_t cp = 0; cp <= kMaxCodepoint; cp += (cp < 0x20000 ? 1 : 97)) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string enc;
      utf8::append(enc, cp);
      bool want = false;
      for (const auto& r : ranges) want = want || (cp >= r.lo && cp <= r.hi);
      ASSERT_EQ(sequences_accept(seqs, enc), want) << "code point " << cp;
    }
  }
}

TEST(GrammarUtf8Ranges, ComplementLeavesOutSurrogates) {
  auto c = complement_ranges({{'a', 'a'}});
  for (const auto& r : c) EXPECT_FALSE(r.lo <= 0xDFFF && r.hi >= 0xD800);
  EXPECT_EQ(c.front().lo, 0u);
  EXPECT_EQ(c.back().hi, kMaxCodepoint);
}

}  // namespace
}  // namespace serval::grammar
