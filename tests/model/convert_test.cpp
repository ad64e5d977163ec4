// serval convert: llama2.c -> GGUF must reproduce llama.cpp's stories260K.gguf;
// Hugging Face -> GGUF must permute llama q/k like llama.cpp and carry the tokenizer.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/convert.h"
#include "model/gguf.h"
#include "model/hf_model.h"
#include "model/qk_permute.h"
#include "tokenizer/tokenizer.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;
using testing::ScratchDir;

TEST(ConvertLlama2c, Stories260KEqualsLlamaCppConversion) {
  const std::string bin = testing::shared_model("stories260K/stories260K.bin");
  const std::string tok = testing::shared_model("stories260K/tok512.bin");
  const std::string ref = testing::shared_model("stories260K/stories260K.gguf");
  SERVAL_REQUIRE_MODEL(bin);
  SERVAL_REQUIRE_MODEL(ref);
  ScratchDir dir;
  const std::string out = dir.file("converted.gguf");
  convert_to_gguf(bin, tok, out);

  auto a = GgufFile::open(out);
  auto b = GgufFile::open(ref);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const GgufTensorInfo& t : b->tensors()) {
    const GgufTensorInfo* u = a->find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->ne, t.ne) << t.name;
    EXPECT_EQ(u->ggml_type, t.ggml_type) << t.name;
    ASSERT_EQ(u->nbytes, t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(u->data, t.data, size_t(t.nbytes)), 0) << t.name;
  }
  for (const char* key : {"tokenizer.ggml.tokens"})
    EXPECT_EQ(a->get_string_array(key), b->get_string_array(key));
  EXPECT_EQ(a->get_float_array("tokenizer.ggml.scores"), b->get_float_array("tokenizer.ggml.scores"));
  EXPECT_EQ(a->get_int_array("tokenizer.ggml.token_type"), b->get_int_array("tokenizer.ggml.token_type"));
  EXPECT_EQ(a->get_string("tokenizer.ggml.model"), "llama");
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "llama.embedding_length", "llama.block_count",
                          "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
                          "llama.rope.dimension_count"})
    EXPECT_EQ(a->get_int(key), b->get_int(key)) << key;
  EXPECT_TRUE(a->get_bool("tokenizer.ggml.add_bos_token", false));

  LoadedModel m = load_model(out);
  EXPECT_EQ(m.config.rope_style, RopeStyle::Interleaved);
  EXPECT_EQ(m.config.max_position, 512);  // the checkpoint's seq_len
}

TEST(ConvertLlama2c, Llama2VocabularyMatchesRealGguf) {
  // llama2.c's export of the Llama 2 tokenizer, converted, must equal the
  // vocabulary llama.cpp embedded in llama-2-tiny-random.gguf.
  const std::string tok = testing::shared_model("llama2-tokenizer/tokenizer.bin");
  const std::string ref = testing::shared_model("llama-2-tiny-random/llama-2-tiny-random.gguf");
  SERVAL_REQUIRE_MODEL(tok);
  SERVAL_REQUIRE_MODEL(ref);
  ScratchDir dir;
  GgufWriter w;
  set_gguf_tokenizer_from_llama2c(w, read_llama2c_tokenizer(tok));
  w.write(dir.file("vocab.gguf"));
  auto a = GgufFile::open(dir.file("vocab.gguf"));
  auto b = GgufFile::open(ref);
  EXPECT_EQ(a->get_string_array("tokenizer.ggml.tokens"), b->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(a->get_float_array("tokenizer.ggml.scores"), b->get_float_array("tokenizer.ggml.scores"));
  EXPECT_EQ(a->get_int_array("tokenizer.ggml.token_type"), b->get_int_array("tokenizer.ggml.token_type"));
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A tiny byte-level BPE tokenizer.json (GPT-2 style) and its config.
void write_byte_level_tokenizer(const ScratchDir& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  const char* toks[] = {"a", "b", "c", "\xc4\xa0", "ab", "\xc4\xa0" "a"};
  for (int i = 0; i < 6; ++i) vocab[toks[i]] = i;
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "\xc4\xa0 a"}}, {"byte_fallback", false}}},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "ByteLevel"}}}}}},
      {"added_tokens", {{{"id", 6}, {"content", "<|begin_of_text|>"}, {"special", true}},
                        {{"id", 7}, {"content", "<|end_of_text|>"}, {"special", true}},
                        {{"id", 8}, {"content", "<tool>"}, {"special", false}}}},
      {"post_processor", {{"type", "TemplateProcessing"},
                          {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}}}}, {{"Sequence", {{"id", "A"}}}}}}}},
  };
  write_text(dir.file("tokenizer.json"), tok.dump());
  write_text(dir.file("tokenizer_config.json"),
             R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "chat_template": "{{ messages }}"})");
}

TEST(ConvertHf, LlamaFolderToGguf) {
  ScratchDir dir;
  ModelConfig c = testing::tiny_config("llama");
  c.vocab_size = 12;  // tokenizer has 9 tokens; the rest are padding
  write_text(dir.file("config.json"), testing::hf_config_json("LlamaForCausalLM", c,
      R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, "rope_theta": 500000.0})"));
  testing::write_hf_safetensors(dir.file("model.safetensors"), c, "{}", "BF16");
  write_byte_level_tokenizer(dir);
  const std::string out = dir.file("out.gguf");
  convert_to_gguf(dir.file(""), "", out);

  LoadedModel hf = load_model(dir.file(""));
  LoadedModel gg = load_model(out);
  EXPECT_EQ(gg.config.architecture, "llama");
  EXPECT_EQ(gg.config.rope_style, RopeStyle::Interleaved);
  EXPECT_EQ(gg.config.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_EQ(gg.config.rope_scaling.factor, 8.0f);
  EXPECT_EQ(gg.config.rope_scaling.original_max_position, 32);
  EXPECT_FLOAT_EQ(gg.config.rope_theta, 500000.0f);
  EXPECT_EQ(gg.config.head_dim, c.head_dim);
  // rope_freqs.weight equals what the HF loader computes.
  const TensorView& f1 = hf.weights.get("rope_freqs.weight");
  const TensorView& f2 = gg.weights.get("rope_freqs.weight");
  ASSERT_EQ(f1.nbytes, f2.nbytes);
  EXPECT_EQ(std::memcmp(f1.data, f2.data, size_t(f1.nbytes)), 0);
  for (const auto& [name, view] : hf.weights.all()) {
    const TensorView& g = gg.weights.get(name, view.shape);
    EXPECT_EQ(g.dtype, view.dtype);
    std::vector<uint8_t> expect(size_t(view.nbytes));
    const bool is_q = name.find(".attn_q.") != std::string::npos, is_k = name.find(".attn_k.") != std::string::npos;
    if (is_q || is_k) {
      permute_qk_rows(view.data, expect.data(), is_q ? c.num_heads : c.num_kv_heads, c.head_dim,
                      view.nbytes / view.shape[0]);
    } else {
      std::memcpy(expect.data(), view.data, expect.size());
    }
    EXPECT_EQ(std::memcmp(g.data, expect.data(), expect.size()), 0) << name;
  }
  auto f = GgufFile::open(out);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  // A plain ByteLevel pre-tokenizer is GPT-2's; the vocabulary is the tokenizer's
  // (the model's extra embedding rows have no tokens).
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "gpt2");
  const auto& tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 9u);
  EXPECT_EQ(tokens[4], "ab");
  EXPECT_EQ(tokens[6], "<|begin_of_text|>");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges"), (std::vector<std::string>{"a b", "\xc4\xa0 a"}));
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 6);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 7);
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token", false));  // TemplateProcessing adds BOS
  const auto from_json = load_tokenizer(dir.file(""));
  const auto from_gguf = load_tokenizer(out);
  for (const char* text : {"ab a", "a b<|end_of_text|>ab c", "<tool> abc"})
    EXPECT_EQ(from_gguf->encode(text, true), from_json->encode(text, true)) << text;
  EXPECT_EQ(f->get_string("tokenizer.chat_template"), "{{ messages }}");
}

TEST(ConvertHf, QwenFolderKeepsRowsAndSentencePieceTokenizerGetsScores) {
  ScratchDir dir;
  ModelConfig c = testing::tiny_config("qwen2");
  c.vocab_size = 8;
  write_text(dir.file("config.json"), testing::hf_config_json("Qwen2ForCausalLM", c));
  testing::write_hf_safetensors(dir.file("model.safetensors"), c, "{}", "F32");
  // SentencePiece-style tokenizer.json (byte fallback, "▁" pieces).
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"<0x0A>", 3}, {"\xe2\x96\x81", 4},
                          {"a", 5}, {"\xe2\x96\x81" "a", 6}, {"aa", 7}};
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"unk_token", "<unk>"}, {"byte_fallback", true},
                 {"merges", nlohmann::json::array({nlohmann::json::array({"\xe2\x96\x81", "a"}), nlohmann::json::array({"a", "a"})})}}},
      {"added_tokens", {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                        {{"id", 1}, {"content", "<s>"}, {"special", true}},
                        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
  };
  write_text(dir.file("tokenizer.json"), tok.dump());
  write_text(dir.file("tokenizer_config.json"), R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  convert_to_gguf(dir.file(""), "", dir.file("q.gguf"));
  LoadedModel hf = load_model(dir.file(""));
  LoadedModel gg = load_model(dir.file("q.gguf"));
  EXPECT_EQ(gg.config.architecture, "qwen2");
  EXPECT_EQ(gg.config.rope_style, RopeStyle::Neox);
  EXPECT_TRUE(gg.config.attention_bias);
  for (const auto& [name, view] : hf.weights.all())
    EXPECT_EQ(std::memcmp(gg.weights.get(name).data, view.data, size_t(view.nbytes)), 0) << name;
  auto f = GgufFile::open(dir.file("q.gguf"));
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{2, 3, 3, 6, 1, 1, 1, 1}));
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  // No TemplateProcessing and not a Llama tokenizer class: transformers adds no BOS.
  EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token", true));
  const auto from_json = load_tokenizer(dir.file(""));
  const auto from_gguf = load_tokenizer(dir.file("q.gguf"));
  for (const char* text : {"a aa", "aaa\n a", "</s>a"})
    EXPECT_EQ(from_gguf->encode(text, true), from_json->encode(text, true)) << text;
}

TEST(ConvertHf, RealLlama3AndQwen3Tokenizers) {
  for (const char* which : {"llama3", "qwen3"}) {
    const std::string src = testing::shared_model(std::string("tokenizers/") + which);
    SERVAL_REQUIRE_MODEL(src);
    ScratchDir dir;
    const bool llama = std::string(which) == "llama3";
    ModelConfig c = testing::tiny_config(llama ? "llama" : "qwen3");
    c.vocab_size = llama ? 128256 : 151936;
    c.num_layers = 1;
    c.tie_word_embeddings = true;
    write_text(dir.file("config.json"), testing::hf_config_json(llama ? "LlamaForCausalLM" : "Qwen3ForCausalLM", c));
    testing::write_hf_safetensors(dir.file("model.safetensors"), c, "{}", "BF16");
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(src + "/" + f, dir.file(f));
    convert_to_gguf(dir.file(""), "", dir.file("out.gguf"));
    auto g = GgufFile::open(dir.file("out.gguf"));
    EXPECT_EQ(g->get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(g->get_string("tokenizer.ggml.pre"), llama ? "llama-bpe" : "qwen2");
    const auto& tokens = g->get_string_array("tokenizer.ggml.tokens");
    EXPECT_EQ(int64_t(tokens.size()), llama ? 128256 : 151669);
    EXPECT_FALSE(g->get_string("tokenizer.chat_template", "").empty());
    if (llama) {
      EXPECT_EQ(g->get_string_array("tokenizer.ggml.merges").size(), 280147u);
      EXPECT_EQ(tokens[128000], "<|begin_of_text|>");
      EXPECT_EQ(g->get_int("tokenizer.ggml.bos_token_id"), 128000);
      EXPECT_EQ(g->get_int("tokenizer.ggml.eos_token_id"), 128001);
      // This tokenizer.json has no BOS template (see tokenizer_loader_test).
      EXPECT_FALSE(g->get_bool("tokenizer.ggml.add_bos_token", true));
    } else {
      EXPECT_EQ(g->get_string_array("tokenizer.ggml.merges").size(), 151387u);
      EXPECT_EQ(tokens[151644], "<|im_start|>");
      EXPECT_FALSE(g->has("tokenizer.ggml.bos_token_id"));
      EXPECT_EQ(g->get_int("tokenizer.ggml.eos_token_id"), 151645);  // <|im_end|>
      EXPECT_FALSE(g->get_bool("tokenizer.ggml.add_bos_token", true));
    }
  }
}

TEST(Convert, Errors) {
  ScratchDir dir;
  expect_error([&] { convert_to_gguf(dir.file("nope.bin"), "", dir.file("o.gguf")); }, {"does not exist"});
  const std::string gguf = testing::shared_model("stories260K/stories260K.gguf");
  SERVAL_REQUIRE_MODEL(gguf);
  expect_error([&] { convert_to_gguf(gguf, "x", dir.file("o.gguf")); }, {"already a GGUF file"});
  const std::string bin = testing::shared_model("stories260K/stories260K.bin");
  expect_error([&] { convert_to_gguf(bin, testing::shared_model("llama2-tokenizer/tokenizer.bin"), dir.file("o.gguf")); },
               {"has 32000 tokens", "vocabulary of 512"});
}

}  // namespace
}  // namespace serval
