// Where a model's chat template comes from, and the variables the server
// hands to it (bos/eos from the tokenizer, reasoning aliases, as transformers).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_gguf.h"
#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;
using ojson = nlohmann::ordered_json;

TEST(ChatTemplateLoader, FromTokenizerConfig) {
  std::string from_dir = load_chat_template(model_path(kQwen3Dir));
  EXPECT_NE(from_dir.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(load_chat_template(model_path(kQwen3Json)), from_dir);  // beside a tokenizer.json
  const Tokenizer* tok = shared_tokenizer(kQwen3Dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->chat_template, from_dir);
  EXPECT_NE(load_chat_template(model_path(kLlama3Dir)).find("<|start_header_id|>"), std::string::npos);
}

TEST(ChatTemplateLoader, FromGguf) {
  // A GGUF converted from the Qwen3 folder carries the same template and special tokens.
  GgufWriter w;
  w.set_string("general.architecture", "qwen2");
  add_tokenizer_metadata(model_path(kQwen3Dir), w);
  std::string path =
      (std::filesystem::temp_directory_path() / ("serval_chat_" + std::to_string(::getpid()) + ".gguf")).string();
  w.write(path);
  std::string from_gguf = load_chat_template(path);
  auto tok = load_tokenizer(path);
  std::filesystem::remove(path);
  EXPECT_EQ(from_gguf, load_chat_template(model_path(kQwen3Dir)));
  EXPECT_EQ(chat_template_special_tokens(*tok), chat_template_special_tokens(*shared_tokenizer(kQwen3Dir)));
}

TEST(ChatTemplateLoader, NamedTemplatesPreferToolUseWithTools) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("serval_chat_named_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream cfg(dir / "tokenizer_config.json");
    cfg << R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})";
  }
  EXPECT_EQ(load_chat_template(dir.string()), "D");
  EXPECT_EQ(load_chat_template(dir.string(), true), "T");
  {
    std::ofstream cfg(dir / "tokenizer_config.json");
    cfg << R"({"chat_template": "only"})";
  }
  EXPECT_EQ(load_chat_template(dir.string(), true), "only");
  {
    std::ofstream cfg(dir / "tokenizer_config.json");
    cfg << R"({"bos_token": "<s>"})";
  }
  EXPECT_EQ(load_chat_template(dir.string()), "");
  fs::remove_all(dir);
}

TEST(ChatTemplateLoader, GgufWithoutTemplateIsEmpty) {
  EXPECT_EQ(load_chat_template(model_path(kStoriesGguf)), "");
  EXPECT_THROW(load_chat_template(model_path("no/such/model.gguf")), Error);
}

TEST(ChatTemplateVariables, SpecialTokensFromTheTokenizer) {
  const Tokenizer* llama3 = shared_tokenizer(kLlama3Dir);
  const Tokenizer* qwen3 = shared_tokenizer(kQwen3Dir);
  ASSERT_TRUE(llama3 && qwen3);
  EXPECT_EQ(chat_template_special_tokens(*llama3).dump(),
            R"({"bos_token":"<|begin_of_text|>","eos_token":"<|end_of_text|>"})");
  EXPECT_EQ(chat_template_special_tokens(*qwen3).dump(), R"({"eos_token":"<|im_end|>"})");  // bos_token is null
}

TEST(ChatTemplateVariables, LikeTransformers) {
  ojson messages = ojson::parse(R"([{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "ok", "reasoning": "because"}])");
  ojson vars = chat_template_variables(messages, nullptr, true, nullptr, ojson::parse(R"({"enable_thinking": false})"));
  EXPECT_EQ(vars.dump(),
            R"({"messages":[{"role":"user","content":"hi"},)"
            R"({"thinking":"because","role":"assistant","content":"ok","reasoning":"because","reasoning_content":"because"}],)"
            R"("tools":null,"documents":null,"add_generation_prompt":true,"enable_thinking":false})");
  EXPECT_THROW(chat_template_variables(ojson::array(), nullptr, false, nullptr, nullptr), Error);
  EXPECT_THROW(chat_template_variables(ojson::parse(R"(["not an object"])"), nullptr, false, nullptr, nullptr), Error);
  EXPECT_THROW(chat_template_variables(ojson::parse(R"([{"role": "user"}])"), ojson("tools?"), false, nullptr, nullptr),
               Error);
}

TEST(ChatTemplate, RendersQwen3ToolsLikeTransformers) {
  // Expected text: transformers' apply_chat_template(messages, tools, add_generation_prompt=True,
  // enable_thinking=False, tokenize=False) with the Qwen3 tokenizer_config.json.
  ChatTemplate t(load_chat_template(model_path(kQwen3Dir)));
  ojson messages = ojson::parse(R"([{"role": "user", "content": "Weather?"}])");
  ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "w", "parameters": {"z": 1, "a": "é"}}}])");
  ojson vars = chat_template_variables(messages, tools, true, shared_tokenizer(kQwen3Dir),
                                       ojson::parse(R"({"enable_thinking": false})"));
  EXPECT_EQ(t.render(vars),
            "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"z\": 1, \"a\": \"é\"}}}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace serval
