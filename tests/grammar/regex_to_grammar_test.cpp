// Regular expressions as grammars: the features JSON Schema patterns and
// guided_regex use, matched against tables, and refusals that name the
// construct.
#include "grammar/regex_to_grammar.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar_test_util.h"

namespace serval::grammar {
namespace {

using testing::matches;

struct Row {
  const char* pattern;
  std::vector<const char*> yes, no;
};

TEST(RegexToGrammar, MatchesTables) {
  const Row rows[] = {
      {"abc", {"abc"}, {"ab", "abcd", ""}},
      {"^a.c$", {"abc", "a-c", "aéc"}, {"a\nc", "ac", "abbc"}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"(ab)+c?", {"ab", "ababc"}, {"abc c", "a", "c"}},
      {"(?:x|y){2,3}", {"xy", "yyy"}, {"x", "xyxy"}},
      {"(?<word>[a-z]+)-(?P<n>\\d{1,3})", {"ab-1", "z-123"}, {"ab-1234", "-1", "AB-1"}},
      {"\\d+\\.\\d*", {"1.", "12.5"}, {".5", "1"}},
      {"\\w\\s\\W", {"a !", "_\t-", "a  "}, {"ab!", "a b"}},
      {"[^\\d\\s]+", {"ab!", "x"}, {"a1", "a b", ""}},
      {"[\\w.-]+@[a-z]+", {"a.b-c@x"}, {"@x", "a@X"}},
      {"[a-c]{0,2}z{3}", {"zzz", "abzzz"}, {"abczzz", "zz"}},
      {"a{2,}", {"aa", "aaaaa"}, {"a"}},
      {"a{,2}b", {"b", "aab"}, {"aaab"}},
      {"x{y", {"x{y"}, {"xy"}},
      {"\\x41\\u00e9\\t\\n\\/\\[\\]", {"Aé\t\n/[]"}, {"Ae\t\n/[]"}},
      {"[\\]\\-a]+", {"]-a"}, {"b"}},
      {"[-a]b[a-]", {"-ba", "ab-"}, {"bb-"}},
      {"[]a]", {"]", "a"}, {"b"}},
      {"a+?b*?c??", {"a", "aabbc"}, {""}},
      {"é[α-γ]+😀", {"éαβγ😀"}, {"éδ😀"}},
      {"^(a|b)$|^c$", {"a", "c"}, {"ab"}},
  };
  for (const auto& r : rows) {
    auto g = CompiledGrammar::compile(regex_to_grammar(r.pattern));
    for (const char* y : r.yes) EXPECT_TRUE(matches(g, y)) << r.pattern << " should match \"" << y << "\"";
    for (const char* n : r.no) EXPECT_FALSE(matches(g, n)) << r.pattern << " should not match \"" << n << "\"";
  }
}

TEST(RegexToGrammar, NegatedShorthandsStayAscii) {
  // Python's \d and \w are Unicode: a non-ASCII digit or letter from \D or
  // \W would not match the pattern there.
  auto g = CompiledGrammar::compile(regex_to_grammar("\\D\\W\\S"));
  EXPECT_TRUE(matches(g, "a!x"));
  EXPECT_FALSE(matches(g, "\xD9\xA3!x"));  // U+0663 ARABIC-INDIC DIGIT THREE
  EXPECT_FALSE(matches(g, "aéx"));
  auto neg = CompiledGrammar::compile(regex_to_grammar("[^\\d]"));
  EXPECT_TRUE(matches(neg, "a"));
  EXPECT_FALSE(matches(neg, "é"));
  // A plain negated class is the same in every flavour.
  EXPECT_TRUE(matches(CompiledGrammar::compile(regex_to_grammar("[^a]")), "é"));
}

std::string refusal(const char* pattern) {
  try {
    regex_to_grammar(pattern);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RegexToGrammar, RefusesWhatItCannotExpress) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreferences"},     {"(?<n>a)\\k<n>", "backreferences"}, {"(?P<n>a)(?P=n)", "backreferences"},
      {"a(?=b)", "lookahead"},          {"a(?!b)", "lookahead"},            {"(?<=a)b", "lookbehind"},
      {"(?<!a)b", "lookbehind"},        {"\\bword\\b", "word boundaries"},   {"(?i)abc", "inline flags"},
      {"a++", "possessive"},            {"\\p{L}", "Unicode property"},     {"a^b", "anchor ^"},
      {"a$b", "anchor $"},              {"(a", "unclosed '('"},             {"a)", "unmatched ')'"},
      {"*a", "nothing to repeat"},      {"a**", "quantifier cannot follow"}, {"[a-", "unclosed character class"},
      {"[z-a]", "out of order"},        {"\\q", "unknown escape"},          {"a{3,1}", "min > max"},
      {"[^\\W]", "negated class"},
  };
  for (const auto& [pattern, words] : cases) {
    std::string msg = refusal(pattern);
    EXPECT_NE(msg.find(words), std::string::npos) << pattern << " -> \"" << msg << "\"";
    EXPECT_NE(msg.find(pattern), std::string::npos) << "the message names the pattern: " << msg;
  }
}

}  // namespace
}  // namespace serval::grammar
