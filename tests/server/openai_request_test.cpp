// Request parsing: types and ranges are checked with the parameter named;
// prompts in all four shapes; chat messages normalized (text parts joined,
// tool-call arguments turned into objects, key order kept).
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

namespace serval::server {
namespace {

using nlohmann::json;

// The 400 a completion body is refused with (a failure if it is accepted).
ApiError refusal_of(const json& body) {
  try {
    parse_completion_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return ApiError(400, "accepted", "");
}

std::string param_of_failure(const json& body) { return refusal_of(body).param(); }

TEST(OpenAiRequest, CompletionFieldsParsed) {
  const CompletionRequest r = parse_completion_request(json::parse(R"({
      "model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
      "min_p": 0.1, "n": 2, "stop": ["a", "b"], "seed": 3, "logprobs": 2, "echo": false,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "ignore_eos": true,
      "min_tokens": 3, "stream": true, "stream_options": {"include_usage": true}})"));
  EXPECT_EQ(r.gen.model, "m");
  EXPECT_EQ(*r.gen.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.gen.params.temperature, 0.5f);
  EXPECT_EQ(r.gen.params.top_k, 5);
  EXPECT_EQ(r.gen.n, 2);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*r.gen.params.seed, 3u);
  EXPECT_EQ(r.gen.params.logprobs, 2);
  EXPECT_TRUE(r.gen.ignore_eos && r.gen.stream && r.gen.include_usage);
  EXPECT_EQ(r.gen.min_tokens, 3);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hi");
}

TEST(OpenAiRequest, PromptShapes) {
  EXPECT_EQ(parse_prompts(json::parse(R"([1, 2, 3])"))[0].ids, (std::vector<int32_t>{1, 2, 3}));
  const auto batch = parse_prompts(json::parse(R"(["a", [4, 5], "b"])"));
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_TRUE(batch[0].is_text && !batch[1].is_text && batch[2].is_text);
  EXPECT_THROW(parse_prompts(json::array()), ApiError);
  EXPECT_THROW(parse_prompts(json::parse(R"([[]])")), ApiError);
  EXPECT_THROW(parse_prompts(json::parse(R"([-1])")), ApiError);
  EXPECT_THROW(parse_prompts(json(3)), ApiError);
}

TEST(OpenAiRequest, WrongTypesAndRangesNameTheParameter) {
  const json base = {{"prompt", "x"}};
  const std::vector<std::pair<std::string, json>> cases = {
      {"temperature", "hot"}, {"max_tokens", "5"},  {"max_tokens", -1},   {"max_tokens", 2.5},
      {"n", 0},               {"n", 1e30},          {"top_p", 1.5},       {"top_k", -2},
      {"seed", "s"},          {"stop", 5},          {"stop", json::array({1})}, {"stream", 1},
      {"logprobs", 21},       {"presence_penalty", 9}, {"min_p", -0.1},   {"echo", "yes"},
      {"stream_options", 1},  {"logit_bias", {{"1", 200}}}, {"min_tokens", -3}, {"temperature", 1e300},
      {"repetition_penalty", -1e39}};
  for (const auto& [field, value] : cases) {
    json body = base;
    body[field] = value;
    if (field == "stream_options") body["stream"] = true;
    EXPECT_EQ(param_of_failure(body), field) << field << " = " << value.dump();
  }
}

TEST(OpenAiRequest, FloatFieldsRefuseWhatAFloatCannotHold) {
  json body = {{"prompt", "x"}, {"temperature", 1e300}};
  std::string msg = refusal_of(body).what();
  EXPECT_NE(msg.find("too large for a 32-bit float"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1e+300"), std::string::npos) << msg;
  body["temperature"] = 3e38;  // a float: the sampling range check names it
  msg = refusal_of(body).what();
  EXPECT_NE(msg.find("temperature must be in"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("inf"), std::string::npos) << msg;
  body["temperature"] = 0.5;
  EXPECT_FLOAT_EQ(parse_completion_request(body).gen.params.temperature, 0.5f);
}

TEST(OpenAiRequest, SpecValidEdgeValuesAreAccepted) {
  const CompletionRequest r = parse_completion_request(
      json::parse(R"({"prompt": "", "top_p": 0, "stop": ["", "end", ""], "max_tokens": 0, "best_of": 1})"));
  EXPECT_EQ(r.gen.params.top_p, 0.0f);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"end"});  // empty stop strings are ignored
  EXPECT_EQ(*r.gen.max_tokens, 0);
  EXPECT_TRUE(parse_completion_request(json::parse(R"({"prompt": "x", "stop": ""})")).gen.stop.empty());
  const ChatRequest c = parse_chat_request(
      nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})"));
  EXPECT_EQ(*c.gen.max_tokens, 0);
  // best_of below n contradicts OpenAI's own rule (best_of >= n).
  const ApiError e = refusal_of(json::parse(R"({"prompt": "x", "best_of": 0})"));
  EXPECT_EQ(e.param(), "best_of");
  EXPECT_NE(std::string(e.what()).find("at least n (1)"), std::string::npos) << e.what();
  EXPECT_EQ(param_of_failure(json::parse(R"({"prompt": "x", "best_of": 2, "n": 3})")), "best_of");
}

TEST(OpenAiRequest, NullMeansNotGiven) {
  const CompletionRequest r = parse_completion_request(json::parse(R"({"prompt": "x", "max_tokens": null, "stop": null})"));
  EXPECT_FALSE(r.gen.max_tokens.has_value());
  EXPECT_TRUE(r.gen.stop.empty());
}

TEST(OpenAiRequest, ChatMessagesNormalized) {
  const auto body = nlohmann::ordered_json::parse(R"({
      "messages": [
        {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}}]},
        {"role": "tool", "content": "r"}],
      "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3,
      "chat_template_kwargs": {"enable_thinking": false}})");
  const ChatRequest r = parse_chat_request(body);
  EXPECT_EQ(r.messages[0]["content"], "a\nb");
  EXPECT_EQ(r.messages[1]["content"], "");
  const auto& args = r.messages[1]["tool_calls"][0]["function"]["arguments"];
  ASSERT_TRUE(args.is_object());
  EXPECT_EQ(args.dump(), R"({"z":1,"a":2})");  // the client's key order
  EXPECT_EQ(*r.gen.max_tokens, 9);
  EXPECT_EQ(r.gen.params.logprobs, 3);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
}

TEST(OpenAiRequest, ChatErrorsNameTheMessageField) {
  auto param = [](const char* text) {
    try {
      parse_chat_request(nlohmann::ordered_json::parse(text));
    } catch (const ApiError& e) {
      return e.param();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(param(R"({"messages": []})"), "messages");
  EXPECT_EQ(param(R"({"messages": [{"role": "bot", "content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(param(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(param(R"({"messages": [{"role": "user"}]})"), "messages[0].content");
  EXPECT_EQ(param(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"), "top_logprobs");
}

TEST(OpenAiRequest, BestOfAboveNIsHonouredButNotStreamed) {
  const CompletionRequest r = parse_completion_request(json::parse(R"({"prompt": "x", "best_of": 4, "n": 2})"));
  EXPECT_EQ(r.gen.best_of, 4);
  EXPECT_EQ(r.gen.n, 2);
  const ApiError e = refusal_of(json::parse(R"({"prompt": "x", "best_of": 2, "stream": true})"));
  EXPECT_EQ(e.param(), "best_of");
  EXPECT_NO_THROW(parse_completion_request(json::parse(R"({"prompt": "x", "best_of": 2, "n": 2, "stream": true})")));
}

TEST(OpenAiRequest, VllmExtraFieldsParsed) {
  const CompletionRequest r = parse_completion_request(json::parse(R"({
      "prompt": "x", "suffix": "y", "priority": -3, "request_id": "abc", "truncate_prompt_tokens": 5,
      "return_token_ids": true, "stream": true,
      "stream_options": {"include_usage": true, "continuous_usage_stats": true}})"));
  EXPECT_EQ(r.suffix, "y");
  EXPECT_EQ(r.gen.priority, -3);
  EXPECT_EQ(r.gen.request_id, "abc");
  EXPECT_EQ(*r.gen.truncate_prompt_tokens, 5);
  EXPECT_TRUE(r.gen.return_token_ids && r.gen.continuous_usage);
  EXPECT_EQ(param_of_failure(json::parse(R"({"prompt": "x", "truncate_prompt_tokens": 0})")), "truncate_prompt_tokens");
  EXPECT_EQ(param_of_failure(json::parse(R"({"prompt": "x", "truncate_prompt_tokens": -2})")), "truncate_prompt_tokens");
  EXPECT_EQ(param_of_failure(json::parse(R"({"prompt": "x", "request_id": "a\nb"})")), "request_id");
  EXPECT_EQ(param_of_failure(json::parse(R"({"prompt": "x", "suffix": "y", "echo": true})")), "suffix");
  // continuous_usage_stats needs include_usage.
  EXPECT_FALSE(parse_completion_request(json::parse(R"({"prompt": "x", "stream": true,
      "stream_options": {"continuous_usage_stats": true}})")).gen.continuous_usage);
}

TEST(OpenAiRequest, ChatVllmFields) {
  const ChatRequest r = parse_chat_request(nlohmann::ordered_json::parse(R"({
      "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
      "continue_final_message": true, "echo": true, "add_special_tokens": true, "reasoning_effort": "low",
      "documents": [{"title": "t"}], "chat_template_kwargs": {"a": 1}})"));
  EXPECT_TRUE(r.continue_final_message && r.echo && r.add_special_tokens);
  EXPECT_FALSE(r.add_generation_prompt);  // gives way to continue_final_message
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "low");
  EXPECT_EQ(r.template_kwargs["documents"][0]["title"], "t");
  EXPECT_EQ(r.template_kwargs["a"], 1);
  try {
    parse_chat_request(nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "x"}],
        "continue_final_message": true, "add_generation_prompt": true})"));
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "continue_final_message");
  }
}

TEST(JsonFields, MalformedAndDeepBodiesAre400) {
  EXPECT_THROW(parse_json_object("{"), ApiError);
  EXPECT_THROW(parse_json_object("[]"), ApiError);
  EXPECT_THROW(parse_json_object("{\"a\": \"\xff\"}"), ApiError);  // invalid UTF-8
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THROW(parse_json_object(deep), ApiError);
  EXPECT_NO_THROW(parse_json_object("{\"a\": [[[1]]]}"));
}

}  // namespace
}  // namespace serval::server
