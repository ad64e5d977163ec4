// GBNF parsing: the syntax llama.cpp and vLLM's guided_grammar use, errors
// that name line and column, and printing that parses back to the same tree.
#include "grammar/ebnf_parser.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar_test_util.h"

namespace serval::grammar {
namespace {

using testing::compile_gbnf;
using testing::matches;

std::string parse_error(const char* text) {
  try {
    parse_gbnf(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarParser, ReadsRulesAcrossLinesWithComments) {
  Grammar g = parse_gbnf(R"(
    # a comment
    root ::= greeting ", " name   # trailing comment
           | "bye"
    greeting ::= "hello" | "hi"
    name-x_2 ::= [A-Z] [a-z]*
    name ::= name-x_2
  )");
  ASSERT_EQ(g.rules.size(), 4u);
  EXPECT_EQ(g.rules[0].first, "root");
  auto c = CompiledGrammar::compile(g);
  EXPECT_TRUE(matches(c, "hello, Ada"));
  EXPECT_TRUE(matches(c, "bye"));
  EXPECT_FALSE(matches(c, "hi, ada"));
}

TEST(GrammarParser, LlamaCppStyleLayout) {
  // Groups spread over lines with comments inside, an empty first
  // alternative, and rules whose alternatives start on the next line.
  auto g = compile_gbnf(R"(
    root ::=
      "[" sp (
            item   # the first one
        ("," sp item)*
      )? "]"
    item ::= [0-9]+ | "\"" [^"\\\x7F\x00-\x1F]* "\""
    sp ::= | " " | "\n" [ \t]{0,4}
  )");
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[ 1,\n  \"a b\",2]"));
  EXPECT_FALSE(matches(g, "[1,  2]"));
  EXPECT_FALSE(matches(g, "[\"\x7F\"]"));
}

TEST(GrammarParser, EscapesInLiteralsAndClasses) {
  auto g = compile_gbnf(R"(root ::= "\x41\u00e9\U0001F600\t\"\\" [\]\-\x30-\x39] [^\n])");
  EXPECT_TRUE(matches(g, "Aé😀\t\"\\]x"));
  EXPECT_TRUE(matches(g, "Aé😀\t\"\\-x"));
  EXPECT_TRUE(matches(g, "Aé😀\t\"\\5x"));
  EXPECT_FALSE(matches(g, "Aé😀\t\"\\5\n"));
}

TEST(GrammarParser, RepetitionForms) {
  Grammar g = parse_gbnf(R"(root ::= "a"? "b"* "c"+ "d"{2} "e"{1,} "f"{,3} "g"{1,2})");
  EXPECT_EQ(to_gbnf(*g.rules[0].second), R"("a"? "b"* "c"+ "d"{2} "e"+ "f"{0,3} "g"{1,2})");
}

TEST(GrammarParser, PrintingRoundTrips) {
  const char* text = R"(
    root ::= (a | "x" [^a-c\n]) b{2,5} ("y" | "z" "w")* .
    a ::= "quote\"d" [é-ë😀]? | ""
    b ::= [\x00-\x1F] | "\\"
  )";
  Grammar g = parse_gbnf(text);
  Grammar again = parse_gbnf(to_gbnf(g));
  ASSERT_EQ(g.rules.size(), again.rules.size());
  for (size_t i = 0; i < g.rules.size(); ++i) {
    EXPECT_EQ(g.rules[i].first, again.rules[i].first);
    EXPECT_TRUE(equal(*g.rules[i].second, *again.rules[i].second)) << to_gbnf(g);
  }
}

TEST(GrammarParser, ErrorsNameLineColumnAndProblem) {
  EXPECT_EQ(parse_error("root ::= \"a\" b"), "grammar: line 1, column 14: undefined rule 'b'");
  EXPECT_EQ(parse_error("start ::= \"a\""), "grammar: line 1, column 14: the grammar has no 'root' rule");
  EXPECT_EQ(parse_error("root ::= \"a\nx\""), "grammar: line 1, column 10: unclosed string literal (newline inside)");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(parse_error("root ::= (\"a\" | \"b\""), "grammar: line 1, column 10: unclosed '('");
  EXPECT_EQ(parse_error("root ::= [a-"), "grammar: line 1, column 10: unclosed character class");
  EXPECT_EQ(parse_error("root ::= \"\\q\""), "grammar: line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,2}"), "grammar: line 1, column 13: repetition {3,2} has min > max");
  EXPECT_EQ(parse_error("root = \"a\""), "grammar: line 1, column 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(parse_error("root ::= [z-a]"), "grammar: line 1, column 10: character range is out of order");
  EXPECT_EQ(parse_error("root ::= \"a\" )"), "grammar: line 1, column 14: unmatched ')'");
  EXPECT_EQ(parse_error("root ::= \"\\uD800\""), "grammar: line 1, column 11: surrogate code point in escape");
}

TEST(GrammarCompile, RefusesLeftRecursion) {
  auto error_of = [](const char* text) {
    try {
      compile_gbnf(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("left recursion: rule 'root'"), std::string::npos);
  std::string indirect = error_of("root ::= x \"a\"\nx ::= opt root | \"b\"\nopt ::= \"c\"?");
  EXPECT_NE(indirect.find("left recursion"), std::string::npos) << indirect;
  EXPECT_NE(indirect.find("root -> x -> root"), std::string::npos) << indirect;
  // Right recursion and tail cycles are fine.
  EXPECT_NO_THROW(compile_gbnf("root ::= \"a\" root | \"b\""));
  EXPECT_NO_THROW(compile_gbnf("root ::= x\nx ::= root | \"b\""));
}

TEST(GrammarCompile, RefusesRulesThatCannotFinish) {
  EXPECT_THROW(compile_gbnf("root ::= \"a\" loop\nloop ::= \"b\" loop"), Error);
  EXPECT_THROW(compile_gbnf("root ::= [^\\x00-\\U0010FFFF]"), Error);
  EXPECT_THROW(compile_gbnf("root ::= \"a\"{0,100000}{0,100000}"), Error);  // too large
}

TEST(GrammarCompile, MinBytesToEnd) {
  auto g = compile_gbnf(R"(root ::= "ab" x "cd"
                           x ::= "long-alternative" | [0-9]{3})");
  GrammarMatcher m(g);
  EXPECT_EQ(m.min_bytes_to_end(), 7u);
  ASSERT_TRUE(m.accept_bytes("ab1"));
  EXPECT_EQ(m.min_bytes_to_end(), 4u);
  ASSERT_TRUE(m.accept_bytes("23c"));
  EXPECT_EQ(m.min_bytes_to_end(), 1u);
  ASSERT_TRUE(m.accept_bytes("d"));
  EXPECT_EQ(m.min_bytes_to_end(), 0u);
}

}  // namespace
}  // namespace serval::grammar
