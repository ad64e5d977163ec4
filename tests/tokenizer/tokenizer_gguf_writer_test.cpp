// tokenizer.json -> GGUF metadata -> load_tokenizer gives the same tokenizer:
// this also covers the GGUF byte-level path ("gpt2" with pre llama-bpe / qwen2).
#include "tokenizer/tokenizer_gguf.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/gguf.h"
#include "tokenizer_test_util.h"

namespace serval {
namespace {

using namespace serval::testing;

std::string write_gguf(const std::string& source, const std::string& name) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  add_tokenizer_metadata(source, w);
  std::string path = (std::filesystem::temp_directory_path() /
                      ("serval_tok_" + name + "_" + std::to_string(::getpid()) + ".gguf"))
                         .string();
  w.write(path);
  return path;
}

void check_round_trip(const char* dir, const std::string& vectors, const char* pre) {
  const Tokenizer* json_tok = shared_tokenizer(dir);
  ASSERT_NE(json_tok, nullptr);
  std::string path = write_gguf(model_path(dir), vectors);
  auto g = GgufFile::open(path);
  EXPECT_EQ(g->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g->get_string("tokenizer.ggml.pre"), pre);
  auto tok = load_tokenizer(*g);
  std::filesystem::remove(path);
  EXPECT_EQ(tok->vocab_size(), json_tok->vocab_size());
  EXPECT_EQ(tok->bos_id, json_tok->bos_id);
  EXPECT_EQ(tok->eos_id, json_tok->eos_id);
  EXPECT_EQ(tok->add_bos, json_tok->add_bos);
  EXPECT_EQ(tok->eos_ids, json_tok->eos_ids);
  EXPECT_EQ(tok->chat_template, json_tok->chat_template);
  auto vs = read_vectors(vectors);
  ASSERT_EQ(vs.size(), 46u);
  for (const auto& v : vs) EXPECT_EQ(tok->encode(v.text, false), v.ids) << v.text;
  for (const char* text : {"<|begin_of_text|>Hi<|eot_id|>", "<|im_start|>user\nx<|im_end|>", "<think>café</think>",
                           "Tôi có nhiều việc", "Cafe\xCC\x81 NFD"}) {
    EXPECT_EQ(tok->encode(text, true), json_tok->encode(text, true)) << text;
    for (int32_t id : json_tok->encode(text, false)) EXPECT_EQ(tok->is_special(id), json_tok->is_special(id));
  }
}

TEST(TokenizerGguf, Llama3JsonToGgufKeepsTokenization) {
  check_round_trip(kLlama3Dir, "ggml-vocab-llama-bpe.gguf", "llama-bpe");
}

TEST(TokenizerGguf, Qwen3JsonToGgufKeepsTokenization) {
  check_round_trip(kQwen3Dir, "ggml-vocab-qwen2.gguf", "qwen2");
}

TEST(TokenizerGguf, DigitsThenByteLevelIsWrittenAsSmolLM) {
  // SmolLM2's pre-tokenizer as llama.cpp names it ("smollm"); read back, it splits the same.
  std::string json = (std::filesystem::temp_directory_path() /
                      ("serval_tok_digits_" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream f(json);
    f << R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true},
              {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},
            "model": {"type": "BPE", "vocab": {"a": 0, "Ġ": 1, "1": 2, "ĠĠ": 3, "2": 4, "12": 5},
                      "merges": ["Ġ Ġ", "1 2"]}})";
  }
  std::string path = write_gguf(json, "digits");
  std::filesystem::remove(json);
  auto g = GgufFile::open(path);
  EXPECT_EQ(g->get_string("tokenizer.ggml.pre"), "smollm");
  auto tok = load_tokenizer(*g);
  std::filesystem::remove(path);
  EXPECT_EQ(tok->encode("a  12", false), (std::vector<int32_t>{0, 3, 2, 4}));
}

}  // namespace
}  // namespace serval
