// jinja::Value: Python's str/repr of floats and containers, json.dumps as
// transformers' tojson calls it, truthiness and comparisons. Expected strings
// are what CPython prints for the same values.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/jinja/value.h"

namespace serval::jinja {
namespace {

using ojson = nlohmann::ordered_json;

TEST(JinjaValue, FloatReprMatchesPython) {
  EXPECT_EQ(float_repr(1.0), "1.0");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(0.00001), "1e-05");
  EXPECT_EQ(float_repr(123.456), "123.456");
  EXPECT_EQ(float_repr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(float_repr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(float_repr(-0.0), "-0.0");
  EXPECT_EQ(float_repr(1.5e300), "1.5e+300");
}

TEST(JinjaValue, ReprOfContainers) {
  Value v = Value::from_json(ojson::parse(R"([1, "a", "it's", {"k": null}, true, 1.5])"));
  EXPECT_EQ(v.repr(), R"([1, 'a', "it's", {'k': None}, True, 1.5])");
  EXPECT_EQ(v.str(), v.repr());
  EXPECT_EQ(Value::tuple({Value(1), Value("x")}).repr(), "(1, 'x')");
  EXPECT_EQ(Value::tuple({Value(1)}).repr(), "(1,)");
  EXPECT_EQ(Value("tab\there\n").repr(), "'tab\\there\\n'");
  EXPECT_EQ(Value("s").str(), "s");
  EXPECT_EQ(Value(None{}).str(), "None");
  EXPECT_EQ(Value::undefined("x").str(), "");
}

TEST(JinjaValue, JsonLikePythonDumps) {
  Value v = Value::from_json(ojson::parse(R"({"b": {}, "a": [1, 2.0, "é\"\n", null, true]})"));
  EXPECT_EQ(v.to_json(), R"({"b": {}, "a": [1, 2.0, "é\"\n", null, true]})");
  EXPECT_EQ(v.to_json(2), "{\n  \"b\": {},\n  \"a\": [\n    1,\n    2.0,\n    \"é\\\"\\n\",\n    null,\n    true\n  ]\n}");
  EXPECT_EQ(v.to_json(-1, std::nullopt, true), R"({"a": [1, 2.0, "é\"\n", null, true], "b": {}})");
  EXPECT_EQ(v.to_json(-1, std::make_pair(std::string(","), std::string(":"))), R"({"b":{},"a":[1,2.0,"é\"\n",null,true]})");
  EXPECT_EQ(Value(std::string("\x01\x7f")).to_json(), "\"\\u0001\x7f\"");
  EXPECT_THROW(Value::undefined("u").to_json(), Error);
}

TEST(JinjaValue, KeyOrderIsKept) {
  Value v = Value::from_json(ojson::parse(R"({"z": 1, "a": 2, "m": 3})"));
  EXPECT_EQ(v.to_json(), R"({"z": 1, "a": 2, "m": 3})");
}

TEST(JinjaValue, TruthinessAndEquality) {
  EXPECT_FALSE(Value::undefined("").truthy());
  EXPECT_FALSE(Value(None{}).truthy());
  EXPECT_FALSE(Value("").truthy());
  EXPECT_FALSE(Value(Array{}).truthy());
  EXPECT_FALSE(Value::object().truthy());
  EXPECT_FALSE(Value(0.0).truthy());
  EXPECT_TRUE(Value(" ").truthy());
  EXPECT_TRUE(equals(Value(1), Value(1.0)));
  EXPECT_TRUE(equals(Value(true), Value(1)));
  EXPECT_FALSE(equals(Value("1"), Value(1)));
  EXPECT_FALSE(equals(Value::tuple({Value(1)}), Value(Array{Value(1)})));
  EXPECT_TRUE(equals(Value::undefined("a"), Value::undefined("b")));
  EXPECT_TRUE(less(Value("a"), Value("b")));
  EXPECT_TRUE(less(Value(Array{Value(1), Value(2)}), Value(Array{Value(1), Value(3)})));
  EXPECT_THROW(less(Value(1), Value("a")), Error);
}

TEST(JinjaValue, IterateAndLength) {
  EXPECT_EQ(Value("héllo").length(), 5u);
  EXPECT_EQ(Value("héllo").iterate()[1].as_string(), "é");
  EXPECT_EQ(Value::undefined("").length(), 0u);
  EXPECT_EQ(Value::from_json(ojson::parse(R"({"a": 1, "b": 2})")).iterate()[1].as_string(), "b");
  EXPECT_THROW(Value(1).iterate(), Error);
  EXPECT_THROW(Value(1).length(), Error);
}

}  // namespace
}  // namespace serval::jinja
