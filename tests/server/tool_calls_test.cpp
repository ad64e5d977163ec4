// Tool-call parsing on outputs as the model families write them (Hermes,
// Llama 3 JSON, Mistral), malformed ones coming back as text; the format
// from chat templates; streaming that holds back only what may be a call;
// the constraint grammar's calls parse back.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include "grammar/compiled_grammar.h"
#include "grammar/ebnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "core/error.h"
#include "server/api_error.h"

namespace serval::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

TEST(ToolCalls, HermesCallsWithTextAround) {
  const auto p = parse_tool_calls(ToolFormat::kHermes,
                                  "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                                  "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
                                  "\"{\\\"a\\\": 1}\"}\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content, "Let me check.");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(json::parse(p.calls[1].arguments), json({{"a", 1}}));  // arguments given as JSON text
  EXPECT_EQ(p.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
  // An unclosed last call (the model stopped) still parses when its JSON is whole.
  EXPECT_EQ(parse_tool_calls(ToolFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}").calls.size(), 1u);
}

TEST(ToolCalls, MalformedCallsStayText) {
  for (const std::string text : {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
                                 "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>[1, 2]</tool_call>",
                                 "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>", "plain text"}) {
    const auto p = parse_tool_calls(ToolFormat::kHermes, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  for (const std::string text : {"{\"name\": \"f\"", "{\"name\": \"f\", \"parameters\": {}} trailing words",
                                 "Sure: {\"name\": \"f\", \"parameters\": {}}"}) {
    const auto p = parse_tool_calls(ToolFormat::kLlama3Json, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(ToolCalls, Llama3JsonAndMistral) {
  auto p = parse_tool_calls(ToolFormat::kLlama3Json,
                            "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": \"; }\"}}; {\"name\": \"b\", "
                            "\"parameters\": {}}");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"x", "; }"}}));
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.content, "");
  p = parse_tool_calls(ToolFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"k\": [1]}}]");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].id.size(), 9u);  // Mistral's templates check 9 characters
  EXPECT_EQ(parse_tool_calls(ToolFormat::kMistral, "[{\"name\": \"f\", \"arguments\": {}}]").calls.size(), 1u);
}

// Numbers past what a double holds are valid JSON (and valid integers for a
// schema): they come back as written, in calls of each format.
TEST(ToolCalls, NumbersPastADoubleComeBackAsWritten) {
  const std::string big(400, '7'), neg = "-" + std::string(30, '1') + ".5e-3";
  const std::string args = "{\"a\": " + big + ", \"b\": [" + neg + ", 2], \"s\": \"x\\\" 123456789012345678901\"}";
  const std::string expected = "{\"a\":" + big + ",\"b\":[" + neg + ",2],\"s\":\"x\\\" 123456789012345678901\"}";
  auto p = parse_tool_calls(ToolFormat::kLlama3Json, "{\"name\": \"add\", \"parameters\": " + args + "}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, expected);
  p = parse_tool_calls(ToolFormat::kHermes, "<tool_call>{\"name\": \"add\", \"arguments\": " + args + "}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, expected);
}

TEST(ToolCalls, FormatFromTheTemplate) {
  EXPECT_EQ(detect_tool_format("{{- '<tool_call>\\n' }}"), ToolFormat::kHermes);
  EXPECT_EQ(detect_tool_format("[TOOL_CALLS]"), ToolFormat::kMistral);
  EXPECT_EQ(detect_tool_format("Environment: ipython"), ToolFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_format("{{ messages }}"), ToolFormat::kNone);
  EXPECT_EQ(tool_format_named("auto"), std::nullopt);
  EXPECT_EQ(tool_format_named("hermes"), ToolFormat::kHermes);
  EXPECT_THROW(tool_format_named("xml"), serval::Error);
}

TEST(ToolCalls, StreamingHoldsBackOnlyWhatMayBeACall) {
  ToolCallStream h(ToolFormat::kHermes);
  EXPECT_EQ(h.feed("Hello <to"), "Hello ");  // "<to" may start the marker
  EXPECT_EQ(h.feed("day>"), "<today>");
  EXPECT_EQ(h.feed(" <tool_"), " ");
  EXPECT_EQ(h.feed("call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"), "");
  auto p = h.finish();
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "");
  ToolCallStream j(ToolFormat::kLlama3Json);
  EXPECT_EQ(j.feed("  "), "");
  EXPECT_EQ(j.feed("Hi there"), "  Hi there");
  EXPECT_EQ(j.feed(" {"), " {");  // decided at the start: text
  EXPECT_TRUE(j.finish().calls.empty());
  ToolCallStream k(ToolFormat::kLlama3Json);
  EXPECT_EQ(k.feed("{\"name\": \"f\", "), "");
  EXPECT_EQ(k.feed("\"parameters\": {}}"), "");
  EXPECT_EQ(k.finish().calls.size(), 1u);
}

TEST(ToolCalls, ConstraintGrammarsAcceptTheirOwnFormat) {
  const ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}},
    {"type": "function", "function": {"name": "g"}}])");
  struct Case {
    ToolFormat format;
    const char* text;
  } cases[] = {
      {ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"},
      {ToolFormat::kLlama3Json, "{\"name\": \"f\", \"parameters\": {\"x\": 3}}; {\"name\": \"g\", \"parameters\": {}}"},
      {ToolFormat::kMistral, "[{\"name\": \"f\", \"arguments\": {\"x\": 3}}, {\"name\": \"g\", \"arguments\": {}}]"},
  };
  ToolChoice required;
  required.mode = ToolChoice::Mode::kRequired;
  for (const Case& c : cases) {
    const ConstraintSpec spec = tool_call_constraint(c.format, tools, required, true);
    const auto g = grammar::CompiledGrammar::compile(grammar::parse_gbnf(spec.text));
    grammar::GrammarMatcher m(g);
    EXPECT_TRUE(m.accept_bytes(c.text) && m.can_end()) << tool_format_name(c.format) << "\n" << spec.text;
    EXPECT_EQ(parse_tool_calls(c.format, c.text).calls.size(), 2u) << tool_format_name(c.format);
    // Not parallel: one call only.
    const auto one = grammar::CompiledGrammar::compile(
        grammar::parse_gbnf(tool_call_constraint(c.format, tools, required, false).text));
    grammar::GrammarMatcher n(one);
    EXPECT_FALSE(n.accept_bytes(c.text) && n.can_end()) << tool_format_name(c.format);
  }
  EXPECT_THROW(tool_call_constraint(ToolFormat::kNone, tools, required, true), ApiError);
}

}  // namespace
}  // namespace serval::server
