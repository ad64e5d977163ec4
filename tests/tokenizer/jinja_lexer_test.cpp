// jinja lexer: tokens, string escapes, and whitespace control with
// trim_blocks/lstrip_blocks (expected texts are jinja2's).
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/jinja/lexer.h"

namespace serval::jinja {
namespace {

std::string texts(const std::string& src) {
  std::string out;
  for (const Token& t : tokenize(src))
    if (t.kind == TokenKind::Text) out += "[" + t.text + "]";
  return out;
}

TEST(JinjaLexer, ExpressionTokens) {
  auto toks = tokenize("{{ a.b[0] ~ 'x' // 2.5e1 }}");
  std::vector<std::pair<TokenKind, std::string>> want = {
      {TokenKind::VarBegin, "{{"}, {TokenKind::Name, "a"},       {TokenKind::Operator, "."},
      {TokenKind::Name, "b"},      {TokenKind::Operator, "["},   {TokenKind::Integer, "0"},
      {TokenKind::Operator, "]"},  {TokenKind::Operator, "~"},   {TokenKind::String, "x"},
      {TokenKind::Operator, "//"}, {TokenKind::Float, "2.5e1"}, {TokenKind::VarEnd, "}}"},
      {TokenKind::Eof, ""}};
  ASSERT_EQ(toks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(toks[i].kind, want[i].first) << i;
    EXPECT_EQ(toks[i].text, want[i].second) << i;
  }
}

TEST(JinjaLexer, StringEscapesLikePython) {
  auto toks = tokenize(R"({{ "a\tb\u00e9\x41\n" ~ 'it\'s' ~ 'unknown \q' }})");
  EXPECT_EQ(toks[1].text, "a\tbéA\n");
  EXPECT_EQ(toks[3].text, "it's");
  EXPECT_EQ(toks[5].text, "unknown \\q");
}

TEST(JinjaLexer, DictLiteralClosingBracesAreNotTagEnd) {
  auto toks = tokenize("{{ {'a': {'b': 1}} }}");
  EXPECT_EQ(toks[toks.size() - 2].kind, TokenKind::VarEnd);
  EXPECT_EQ(toks[toks.size() - 3].text, "}");
}

TEST(JinjaLexer, TrimAndLstripBlocks) {
  // A block tag alone on its line takes its indentation and its newline.
  EXPECT_EQ(texts("  {% if x %}\n    x\n  {% endif %}\n  y\n"), "[    x\n][  y]");
  // Variables keep their surroundings.
  EXPECT_EQ(texts("  {{ x }}\n"), "[  ]");  // and the one trailing newline goes
  // Comments behave like blocks.
  EXPECT_EQ(texts("a {# c #} b\n{# line #}\nc"), "[a ][ b\n][c]");
  // Text before the tag on the same line is not whitespace: no lstrip.
  EXPECT_EQ(texts("a  {% if x %}"), "[a  ]");
  // {%+ turns lstrip off.
  EXPECT_EQ(texts("  {%+ if x %}"), "[  ]");
}

TEST(JinjaLexer, MinusStripsAllWhitespace) {
  EXPECT_EQ(texts("a \n {%- if x -%} \n\n b"), "[a][b]");
  EXPECT_EQ(texts("a \n {{- x -}} \n b"), "[a][b]");
  EXPECT_EQ(texts("a \n {#- c -#} \n b"), "[a][b]");
}

TEST(JinjaLexer, RawAndTrailingNewline) {
  EXPECT_EQ(texts("{% raw %}{{ x }}{% endraw %}"), "[{{ x }}]");
  EXPECT_EQ(texts("text\n"), "[text]");  // keep_trailing_newline=False
  EXPECT_EQ(texts("a\r\nb"), "[a\nb]");
}

TEST(JinjaLexer, ErrorsNameLineAndColumn) {
  try {
    tokenize("line one\n  {{ x ");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  try {
    tokenize("{{ 'open }}");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 1, column 4: unterminated string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tokenize("{# never closed"), Error);
  EXPECT_THROW(tokenize("{{ a $ b }}"), Error);
}

}  // namespace
}  // namespace serval::jinja
