// The byte-level matcher: accept/reject tables over GBNF grammars, partial
// input, rollback, ambiguity and stack growth.
#include "grammar/grammar_matcher.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar_test_util.h"

namespace serval::grammar {
namespace {

using testing::compile_gbnf;
using testing::is_prefix;
using testing::matches;

struct Case {
  const char* text;
  bool full;
};

void check_table(const char* gbnf, std::initializer_list<Case> cases) {
  auto g = compile_gbnf(gbnf);
  for (const auto& c : cases) EXPECT_EQ(matches(g, c.text), c.full) << gbnf << "\n  text: \"" << c.text << "\"";
}

TEST(GrammarMatcher, LiteralsAlternativesAndGroups) {
  check_table(R"(root ::= "ab" ("c" | "de")? "f")",
              {{"abf", true}, {"abcf", true}, {"abdef", true}, {"abdf", false}, {"ab", false}, {"abcff", false},
               {"", false}});
}

TEST(GrammarMatcher, Repetitions) {
  check_table(R"(root ::= "a"* "b"+ "c"{2} "d"{1,3} "e"{2,})",
              {{"bccdee", true}, {"aaabbccdddeeee", true}, {"ccdee", false}, {"bcdee", false}, {"bccddddee", false},
               {"bccde", false}});
  check_table(R"(root ::= [0-9]{,2} "x")", {{"x", true}, {"1x", true}, {"12x", true}, {"123x", false}});
}

TEST(GrammarMatcher, CharacterClassesAreUtf8) {
  check_table(R"(root ::= [a-zé€😀]+)",
              {{"abc", true}, {"é", true}, {"a€b😀", true}, {"A", false}, {"è", false}, {"\xC3", false}});
  check_table(R"(root ::= [^"\\]*)", {{"", true}, {"héllo 😀", true}, {"a\"", false}, {"\\", false}});
  check_table(R"(root ::= .)", {{"a", true}, {"\n", true}, {"é", true}, {"ab", false}, {"\xFF", false}});
}

TEST(GrammarMatcher, PartialCharactersArePrefixes) {
  auto g = compile_gbnf(R"(root ::= "é" [😀-😂])");
  EXPECT_TRUE(is_prefix(g, "\xC3"));
  EXPECT_TRUE(is_prefix(g, "é\xF0\x9F"));
  EXPECT_FALSE(is_prefix(g, "\xC4"));
  EXPECT_TRUE(matches(g, "é😁"));
}

TEST(GrammarMatcher, RuleReferencesAndRecursion) {
  const char* g = R"(
    root  ::= value
    value ::= "[" ( value ("," value)* )? "]" | [0-9]+
  )";
  check_table(g, {{"1", true}, {"[]", true}, {"[1,[2,[]],3]", true}, {"[1,]", false}, {"[[1]", false}, {"[1]]", false}});
}

TEST(GrammarMatcher, AcceptIsAllOrNothing) {
  GrammarMatcher m(compile_gbnf(R"(root ::= "abc" | "abd")"));
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_FALSE(m.accept_bytes("x"));
  EXPECT_FALSE(m.accept_bytes("cx"));  // 'c' alone would pass: nothing is kept
  EXPECT_TRUE(m.accept_bytes("d"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.is_dead());
  EXPECT_FALSE(m.accept_bytes("d"));
}

TEST(GrammarMatcher, RollbackRestoresEarlierStates) {
  GrammarMatcher m(compile_gbnf(R"(root ::= "a" ("b" | "c") "d")"));
  ASSERT_TRUE(m.accept_bytes("a"));
  ASSERT_TRUE(m.accept_bytes("b"));
  ASSERT_TRUE(m.accept_bytes("d"));
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(m.num_steps(), 3u);
  m.rollback(2);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("cd"));
  EXPECT_TRUE(m.can_end());
  EXPECT_THROW(m.rollback(5), Error);
  m.rollback(2);
  EXPECT_EQ(m.num_steps(), 0u);
  EXPECT_FALSE(m.accept_bytes("b"));
}

TEST(GrammarMatcher, BoundedRollbackHistory) {
  GrammarMatcher m(compile_gbnf(R"(root ::= [a-z]*)"));
  m.set_max_rollback(3);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(m.accept_bytes("x"));
  EXPECT_GE(m.num_steps(), 3u);
  EXPECT_LE(m.num_steps(), 8u);
  m.rollback(3);
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("y"));
}

TEST(GrammarMatcher, CopiesAreIndependent) {
  GrammarMatcher a(compile_gbnf(R"(root ::= "x" [0-9]+)"));
  ASSERT_TRUE(a.accept_bytes("x1"));
  GrammarMatcher b = a;
  EXPECT_TRUE(b.accept_bytes("23"));
  EXPECT_FALSE(a.accept_bytes("y"));
  EXPECT_TRUE(a.can_end());
  EXPECT_TRUE(b.can_end());
}

TEST(GrammarMatcher, AmbiguousGrammarsStayBounded) {
  // Every split of the a's is a parse; equal stacks are merged, so the count
  // of stacks stays small however long the input.
  GrammarMatcher m(compile_gbnf(R"(
    root ::= x x x
    x    ::= "a"*
  )"));
  std::string text(2000, 'a');
  EXPECT_TRUE(m.accept_bytes(text));
  EXPECT_TRUE(m.can_end());
  EXPECT_LE(m.stacks().size(), 8u);
}

TEST(GrammarMatcher, LongInputsReuseStackMemory) {
  // A star in tail position runs in constant depth; compaction keeps the
  // node pool small over a long run.
  GrammarMatcher m(compile_gbnf(R"(root ::= ("ab" | "c")*)"));
  for (int i = 0; i < 200000; ++i) ASSERT_TRUE(m.accept_bytes(i % 2 ? "ab" : "c"));
  EXPECT_TRUE(m.can_end());
  EXPECT_LT(m.pool().size(), 100000u);
}

TEST(GrammarMatcher, NestedOptionalStarsTerminate) {
  check_table(R"(root ::= ("a"?)* "b")", {{"b", true}, {"aaab", true}, {"aa", false}});
  check_table(R"(root ::= a
                 a ::= b | "x"
                 b ::= a | "y")",
              {{"x", true}, {"y", true}, {"xy", false}});
}

TEST(GrammarMatcher, ManyLiteralAlternativesShareStacks) {
  // Compiled as a byte trie: one stack per distinct prefix.
  std::string text = "root ::= \"\"";
  for (int i = 0; i < 500; ++i) text += " | \"item" + std::to_string(i) + "\"";
  auto g = compile_gbnf(text);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.can_end());
  EXPECT_LE(m.stacks().size(), 2u);
  ASSERT_TRUE(m.accept_bytes("item4"));
  EXPECT_TRUE(m.can_end());
  EXPECT_LE(m.stacks().size(), 11u);
  EXPECT_TRUE(matches(g, "item499"));
  EXPECT_TRUE(matches(g, "item0"));
  EXPECT_FALSE(matches(g, "item500"));
  EXPECT_FALSE(matches(g, "item"));
  check_table(R"(root ::= ("a" | "ab" | "abc" | "b" | "bc" | "" | "c" | "ca" | "a") "!")",
              {{"!", true}, {"a!", true}, {"abc!", true}, {"ca!", true}, {"cb!", false}, {"abcd!", false}});
}

TEST(GrammarMatcher, BoundedRepetitionOfLargeCounts) {
  auto g = compile_gbnf(R"(root ::= [a-z]{0,5000} "!")");
  EXPECT_TRUE(matches(g, std::string(5000, 'q') + "!"));
  EXPECT_FALSE(matches(g, std::string(5001, 'q') + "!"));
}

}  // namespace
}  // namespace serval::grammar
