// Errors: syntax errors name line and column; raise_exception() passes the
// template's message through untouched; runtime errors say what jinja2 says.
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace serval {
namespace {

using ojson = nlohmann::ordered_json;

std::string parse_error(const std::string& source) {
  try {
    ChatTemplate t(source);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string render_error(const std::string& source, const ojson& vars = ojson::object()) {
  ChatTemplate t(source);
  try {
    t.render(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(parse_error("{% for m in messages %}\n  {{ m.content + }}\n{% endfor %}"),
            "chat template syntax error at line 2, column 18: unexpected end of print statement '}}'");
  EXPECT_EQ(parse_error("{% if x %}never closed"),
            "chat template syntax error at line 1, column 23: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(parse_error("a\n{% include 'x' %}"), "chat template syntax error at line 2, column 4: unknown or unsupported tag 'include'");
  EXPECT_EQ(parse_error("{{ x | nosuchfilter }}"), "chat template syntax error at line 1, column 6: no filter named 'nosuchfilter'");
  EXPECT_EQ(parse_error("{% if false %}{{ x is nosuchtest }}{% endif %}"),
            "chat template syntax error at line 1, column 20: no test named 'nosuchtest'");
  EXPECT_NE(parse_error("{% endfor %}"), "");
  EXPECT_NE(parse_error("{{ (1, }}"), "");
  EXPECT_NE(parse_error("{% set %}"), "");
}

TEST(JinjaErrors, RaiseExceptionPassesMessageThrough) {
  ChatTemplate t("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok");
  EXPECT_EQ(t.render(ojson::parse(R"({"messages": [{"role": "user"}]})")), "ok");
  try {
    t.render(ojson::parse(R"({"messages": [{"role": "assistant"}]})"));
    FAIL() << "no error";
  } catch (const ChatTemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
  }
}

TEST(JinjaErrors, RuntimeErrorsLikeJinja2) {
  EXPECT_EQ(render_error("{{ x.y.z }}", ojson::parse(R"({"x": {}})")),
            "chat template error at line 1, column 7: 'dict object' has no attribute 'y'");
  EXPECT_EQ(render_error("\n{{ 'a' + u }}"), "chat template error at line 2, column 8: 'u' is undefined");
  EXPECT_EQ(render_error("{{ 1 + 'a' }}"), "chat template error at line 1, column 6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(render_error("{% for x in none %}{% endfor %}"), "chat template error at line 1, column 4: 'NoneType' object is not iterable");
  EXPECT_NE(render_error("{{ x | tojson }}"), "");  // Undefined is not JSON serializable
  EXPECT_NE(render_error("{{ [1, 2][::0] }}"), "");
  EXPECT_NE(render_error("{% set a, b = [1] %}"), "");
  EXPECT_NE(render_error("{% set x = 1 %}{% set x.y = 2 %}"), "");
}

TEST(JinjaErrors, HostileTemplatesFailCleanly) {
  EXPECT_NE(parse_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "");
  EXPECT_NE(parse_error("{{ " + std::string(3000, '[')), "");
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_NE(parse_error(nested), "");
  EXPECT_NE(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "");
}

TEST(JinjaErrors, VariablesMustBeAnObject) {
  ChatTemplate t("x");
  EXPECT_THROW(t.render(ojson::array()), Error);
}

}  // namespace
}  // namespace serval
