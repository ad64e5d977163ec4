// JSON Schema to grammar: what each keyword lets through and keeps out, and
// the refusals (naming keyword and path) of what a grammar cannot enforce.
#include "grammar/json_schema_grammar.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/ebnf_parser.h"
#include "grammar_test_util.h"

namespace serval::grammar {
namespace {

using testing::matches;

std::shared_ptr<const CompiledGrammar> schema(const char* text, bool strict = false, uint32_t ws = 1) {
  JsonSchemaOptions o;
  o.strict = strict;
  o.max_whitespace = ws;
  return CompiledGrammar::compile(json_schema_text_to_grammar(text, o));
}

void check(const char* s, std::initializer_list<const char*> yes, std::initializer_list<const char*> no, bool strict = false) {
  auto g = schema(s, strict);
  for (const char* y : yes) EXPECT_TRUE(matches(g, y)) << s << "\n  should accept " << y;
  for (const char* n : no) EXPECT_FALSE(matches(g, n)) << s << "\n  should refuse " << n;
}

std::string refusal(const char* text) {
  try {
    json_schema_text_to_grammar(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchemaGrammar, ScalarTypes) {
  check(R"({"type": "string"})", {R"("")", R"("a\"b\\c\u00e9\n")", R"("é😀")"}, {R"("a)", R"("\x")", "\"\x01\"", R"("\ud800")", "1"});
  check(R"({"type": "integer"})", {"0", "-12", "7"}, {"01", "1.5", "-", "1e3"});
  check(R"({"type": "number"})", {"0", "-1.25", "3e10", "2.5E-3"}, {".5", "1.", "+1", "NaN"});
  check(R"({"type": "boolean"})", {"true", "false"}, {"True", "1"});
  check(R"({"type": "null"})", {"null"}, {"nil", ""});
  check(R"({"type": ["integer", "null"]})", {"5", "null"}, {"\"5\""});
  check(R"({})", {"{}", "[1, \"a\", {\"b\": null}]", "false"}, {"", "{"});
}

TEST(JsonSchemaGrammar, ObjectsKeepPropertyOrderAndOptionalOnes) {
  const char* s = R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                      "c": {"type": "boolean"}}, "required": ["a", "c"], "additionalProperties": false})";
  check(s, {R"({"a": 1, "c": true})", R"({"a":1,"b":"x","c":false})", R"({ "a" : 1 , "c" : true })"},
        {R"({"c": true, "a": 1})", R"({"a": 1})", R"({"a": 1, "c": true, "d": 1})", R"({"a": 1,, "c": true})",
         R"({"a": 1  , "c": true})", "{\"a\": 1,\n\"c\": true}"});
  check(R"({"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "additionalProperties": false})",
        {"{}", R"({"x": 1})", R"({"y": 2})", R"({"x": 1, "y": 2})"}, {R"({,"y": 2})", R"({"x": 1,})"});
}

TEST(JsonSchemaGrammar, ExtraPropertiesUnlessForbiddenOrStrict) {
  const char* s = R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})";
  check(s, {R"({"id": 1})", R"({"id": 1, "note": [true]})", R"({"id": 1, "i": 2, "idx": 3, "": 4})"},
        {R"({"id": 1, "id": 2})", R"({"note": 1, "id": 1})"});
  // An escape cannot spell a listed name either.
  check(s, {}, {R"({"id": 1, "\u0069d": 2})", R"({"id": 1, "i\u0064": 2})"});
  check(s, {R"({"id": 1})"}, {R"({"id": 1, "note": 1})"}, /*strict=*/true);
  check(R"({"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "string"}})",
        {R"({"x": "y"})", R"({"id": 2, "x": "y"})"}, {R"({"x": 1})"});
}

TEST(JsonSchemaGrammar, FalseSchemasOnlyRemove) {
  check(R"({"properties": {"a": false, "b": {"type": "integer"}}})", {"{}", R"({"b": 1})", R"({"c": 1})"},
        {R"({"a": 1})", R"({"b": 1, "a": 2})"});
  check(R"({"anyOf": [false, {"type": "null"}]})", {"null"}, {"1"});
  EXPECT_NE(refusal(R"({"properties": {"a": false}, "required": ["a"]})").find("schema false"), std::string::npos);
}

TEST(JsonSchemaGrammar, EnumConstAndCombinators) {
  check(R"({"enum": ["a", 1, null, [1, 2], {"k": "v"}]})", {R"("a")", "1", "null", "[1,2]", R"({"k":"v"})"}, {R"("b")", "[1, 2]"});
  check(R"({"type": "string", "enum": ["a", 1]})", {R"("a")"}, {"1"});
  check(R"({"const": "x\"y"})", {R"("x\"y")"}, {R"("xy")"});
  check(R"({"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 1}]})", {"7", R"("a")"}, {"4", R"("ab")"});
  check(R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})", {R"("s")", "3"}, {"true"});
  check(R"({"allOf": [{"type": "integer", "maximum": 3}]})", {"3"}, {"4"});
}

TEST(JsonSchemaGrammar, UnknownKeywordsAreIgnoredAsValidatorsIgnoreThem) {
  check(R"({"anyOf": [{"type": "integer"}, {"type": "null"}], "nullable": true, "x-order": 3, "discriminator": {}})",
        {"1", "null"}, {"\"a\""});
  check(R"({"$ref": "#/$defs/a", "description": "d", "$defs": {"a": {"const": 1}}})", {"1"}, {"2"});
}

TEST(JsonSchemaGrammar, RefsIncludingRecursion) {
  const char* s = R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                      "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"],
                      "additionalProperties": false}}, "$ref": "#/$defs/node"})";
  check(s, {R"({"v": 1, "next": null})", R"({"v": 1, "next": {"v": 2, "next": {"v": 3, "next": null}}})"},
        {R"({"v": 1, "next": {"v": 2}})"});
  check(R"({"definitions": {"t": {"enum": ["x"]}}, "items": {"$ref": "#/definitions/t"}})", {R"(["x", "x"])"}, {R"(["y"])"});
}

TEST(JsonSchemaGrammar, Arrays) {
  check(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})", {"[1, 2]", "[1,2,3]"},
        {"[1]", "[1,2,3,4]", "[1,,2]", "[1, 2,]"});
  check(R"({"type": "array"})", {"[]", "[ ]", R"([1, "a"])"}, {"[", "[1 2]"});
  check(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})", {"[]", R"(["a"])", R"(["a", 1])"},
        {R"([1])", R"(["a", 1, 2])"});
  check(R"({"prefixItems": [{"type": "string"}], "items": {"type": "boolean"}, "minItems": 2})", {R"(["a", true])", R"(["a", true, false])"},
        {R"(["a"])", R"(["a", 1])"});
  check(R"({"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "null"}], "additionalItems": false})",
        {"[]", "[null]"}, {"[null, null]"});
}

TEST(JsonSchemaGrammar, StringLengthsCountCharactersNotBytes) {
  check(R"({"type": "string", "minLength": 2, "maxLength": 3})", {R"("ab")", R"("é😀")", R"("\n\"x")", R"("\u00e9ab")"},
        {R"("a")", R"("abcd")", R"("\u00e9abc")"});
}

TEST(JsonSchemaGrammar, PatternsAreEscapedInsideTheString) {
  check(R"({"type": "string", "pattern": "^a\"[\\\\b]+$"})", {R"("a\"\\")", R"("a\"b\\b")"}, {R"("a"b")", R"("a\"")"});
  check(R"({"type": "string", "pattern": "^[^a]$"})", {R"("\n")", R"("\u0001")", R"("\"")", R"("é")"}, {R"("a")"});
}

TEST(JsonSchemaGrammar, Formats) {
  check(R"({"type": "string", "format": "date"})", {R"("2024-02-29")", R"("2000-02-29")", R"("1999-12-31")", R"("0001-01-01")"},
        {R"("2023-02-29")", R"("1900-02-29")", R"("2024-04-31")", R"("2024-13-01")", R"("0000-01-01")", R"("2024-1-01")"});
  check(R"({"format": "date-time"})", {R"("2024-05-06T07:08:09Z")", R"("2024-05-06T23:59:59.123+05:30")"},
        {R"("2024-05-06 07:08:09Z")", R"("2024-05-06T24:00:00Z")", R"("2024-05-06T07:08:09")"});
  check(R"({"format": "time"})", {R"("07:08:09Z")"}, {R"("7:08:09Z")"});
  check(R"({"format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567e89b12d3a456426614174000")"});
  check(R"({"format": "email"})", {R"("a.b@example.com")"}, {R"("ab.example.com")", R"("a@b")"});
  check(R"({"format": "ipv4"})", {R"("192.168.0.255")", R"("0.0.0.0")"}, {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")"});
}

TEST(JsonSchemaGrammar, BoundedWhitespace) {
  JsonSchemaOptions compact;
  compact.max_whitespace = 0;
  auto g = CompiledGrammar::compile(json_schema_text_to_grammar(R"({"type": "array", "items": {"type": "integer"}})", compact));
  EXPECT_TRUE(matches(g, "[1,2]"));
  EXPECT_FALSE(matches(g, "[1, 2]"));
  JsonSchemaOptions pretty;
  pretty.max_whitespace = 3;
  pretty.allow_newlines = true;
  g = CompiledGrammar::compile(json_schema_text_to_grammar(R"({"type": "array", "items": {"type": "integer"}})", pretty));
  EXPECT_TRUE(matches(g, "[\n  1,\n  2\n]"));
  EXPECT_FALSE(matches(g, "[\n    1]"));
}

TEST(JsonSchemaGrammar, RefusalsNameKeywordAndPath) {
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {R"({"properties": {"a": {"not": {"type": "string"}}}})", {"'not'", "#/properties/a"}},
      {R"({"type": "array", "uniqueItems": true})", {"uniqueItems", "at #:"}},
      {R"({"items": {"contains": {"const": 1}}})", {"'contains'", "#/items"}},
      {R"({"type": "integer", "multipleOf": 3})", {"'multipleOf'"}},
      {R"({"patternProperties": {"^x": {}}})", {"'patternProperties'"}},
      {R"({"if": {}, "then": {}})", {"'if'"}},
      {R"({"type": "string", "format": "hostname"})", {"format 'hostname'"}},
      {R"({"type": "string", "pattern": "(a)\\1"})", {"'pattern'", "backreferences"}},
      {R"({"type": "string", "pattern": "a+", "maxLength": 3})", {"'pattern' together with"}},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", {"'allOf'"}},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", {"'oneOf'", "#/oneOf/1", "anyOf"}},
      {R"({"$ref": "http://example.com/s.json"})", {"$ref", "http://example.com/s.json"}},
      {R"({"$ref": "#/$defs/missing"})", {"points to nothing"}},
      {R"({"type": "object", "minProperties": 2})", {"'minProperties'"}},
      {R"({"type": "object", "required": ["a"], "additionalProperties": false})", {"required property 'a'"}},
      {R"({"type": "number", "exclusiveMinimum": 1e20})", {"'minimum'/'maximum'", "too large"}},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", {"no integer"}},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", {"minItems"}},
      {R"({"type": "wat"})", {"unknown type 'wat'"}},
      {R"(false)", {"false allows no value"}},
      {R"({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"dependentRequired": {}}}}}})",
       {"'dependentRequired'", "#/properties/a/properties/b"}},
      {R"({"type": )", {"not valid JSON"}},
  };
  for (const auto& [text, words] : cases) {
    std::string msg = refusal(text);
    EXPECT_FALSE(msg.empty()) << text << " was not refused";
    for (const char* w : words) EXPECT_NE(msg.find(w), std::string::npos) << text << " -> \"" << msg << "\" lacks " << w;
  }
}

TEST(JsonSchemaGrammar, OneOfWithDiscriminatorOrForbiddenPropertyIsAccepted) {
  EXPECT_NO_THROW(schema(R"({"oneOf": [
      {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
      {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]})"));
  EXPECT_NO_THROW(schema(R"({"oneOf": [
      {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": false},
      {"type": "object", "properties": {"b": {}}, "required": ["b"], "additionalProperties": false}]})"));
  EXPECT_FALSE(refusal(R"({"oneOf": [{"type": "object", "properties": {"a": {}}, "required": ["a"]},
                                     {"type": "object", "properties": {"b": {}}, "required": ["b"]}]})").empty());
}

TEST(JsonSchemaGrammar, JsonObjectAndChoiceGrammars) {
  auto obj = CompiledGrammar::compile(json_object_grammar());
  EXPECT_TRUE(matches(obj, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(matches(obj, "[1]"));
  EXPECT_FALSE(matches(obj, "{} "));
  auto choice = CompiledGrammar::compile(choice_grammar({"yes", "no", "yes sir"}));
  EXPECT_TRUE(matches(choice, "yes"));
  EXPECT_TRUE(matches(choice, "yes sir"));
  EXPECT_FALSE(matches(choice, "ye"));
  EXPECT_FALSE(matches(choice, "no!"));
}

TEST(JsonSchemaGrammar, PrintedGrammarParsesBack) {
  Grammar g = json_schema_text_to_grammar(R"({"type": "object", "properties": {"n": {"type": "number", "minimum": 0.5},
      "s": {"type": "string", "pattern": "^[a-z]{2}\\d$"}, "d": {"format": "date"}}, "required": ["n"]})");
  auto direct = CompiledGrammar::compile(g);
  auto reparsed = CompiledGrammar::compile(parse_gbnf(to_gbnf(g)));
  for (const char* t : {R"({"n": 0.5})", R"({"n": 1, "s": "ab1"})", R"({"n": 0.4})", R"({"n": 2, "d": "2020-02-30"})"})
    EXPECT_EQ(matches(direct, t), matches(reparsed, t)) << t;
}

}  // namespace
}  // namespace serval::grammar
