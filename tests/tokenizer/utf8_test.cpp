#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace serval {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, SanitizeKeepsValidText) {
  std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x99\x82";  // aé中🙂
  EXPECT_EQ(utf8::sanitize(s), s);
}

TEST(Utf8, SanitizeReplacesMaximalInvalidSubparts) {
  // Python's bytes.decode("utf-8", "replace") gives these (same rule as Rust/WHATWG).
  EXPECT_EQ(utf8::sanitize("a\xFF" "b"), "a" + kFFFD + "b");
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x99" "x"), kFFFD + "x");       // truncated 4-byte char: one U+FFFD
  EXPECT_EQ(utf8::sanitize("\xE0\x80\x80"), kFFFD + kFFFD + kFFFD);  // overlong: each byte
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);  // surrogate
  EXPECT_EQ(utf8::sanitize("\x80\x80"), kFFFD + kFFFD);
  EXPECT_EQ(utf8::sanitize("\xC3"), kFFFD);
}

TEST(Utf8, ConsumeHoldsBackIncompleteTail) {
  std::string buf = "ab\xF0\x9F", out;
  utf8::consume_valid(buf, out, false);
  EXPECT_EQ(out, "ab");
  EXPECT_EQ(buf, "\xF0\x9F");
  buf += "\x99\x82";
  utf8::consume_valid(buf, out, false);
  EXPECT_EQ(out, "ab\xF0\x9F\x99\x82");
  EXPECT_TRUE(buf.empty());
}

TEST(Utf8, PiecewiseEqualsWhole) {
  std::string s = "x\xF0\x9F\x99\x82\xE4\xB8\xAD\xFF\xC3\xA9\xF0\x9F\x99" "z\xE4";
  std::string whole = utf8::sanitize(s);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    std::string buf = s.substr(0, cut), out;
    utf8::consume_valid(buf, out, false);
    buf += s.substr(cut);
    utf8::consume_valid(buf, out, true);
    EXPECT_EQ(out, whole) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace serval
