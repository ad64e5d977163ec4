// random-model: real shapes, sensible value scales, reproducible from the seed.
#include <cmath>
#include <cstring>
#include <fstream>

#include "model/gguf.h"
#include "model/random_model.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;
using testing::ScratchDir;

int64_t parameter_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const TensorSpec& e : ModelDef::of(c).tensors()) {
    int64_t k = 1;
    for (int64_t d : e.shape) k *= d;
    n += k;
  }
  return n;
}

TEST(RandomModel, KnownShapes) {
  // Parameter counts as published (Llama 3.1 8B: 8.03B, Llama 3.2 1B: 1.24B,
  // Llama 2 7B: 6.74B, Qwen2.5 7B: 7.62B).
  const ModelConfig l8 = random_model_config("llama-3.1-8b");
  EXPECT_NEAR(double(parameter_count(l8)) / 1e9, 8.03, 0.01);
  EXPECT_EQ(l8.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_EQ(l8.num_kv_heads, 8);
  const ModelConfig l1 = random_model_config("llama-3.2-1b");
  EXPECT_NEAR(double(parameter_count(l1)) / 1e9, 1.24, 0.01);
  EXPECT_TRUE(l1.tie_word_embeddings);
  EXPECT_NEAR(double(parameter_count(random_model_config("llama-2-7b"))) / 1e9, 6.74, 0.01);
  const ModelConfig q = random_model_config("qwen2.5-7b");
  EXPECT_NEAR(double(parameter_count(q)) / 1e9, 7.62, 0.01);
  EXPECT_TRUE(q.attention_bias);
  expect_error([] { random_model_config("gpt-5"); }, {"\"gpt-5\"", "llama-3.1-8b"});
}

TEST(RandomModel, WritesLoadableReproducibleWeights) {
  ScratchDir dir;
  // A scaled-down config.json (the path form of --like).
  ModelConfig c = testing::tiny_config("qwen2");
  c.vocab_size = 600;
  std::ofstream(dir.file("config.json")) << testing::hf_config_json("Qwen2ForCausalLM", c);
  write_random_model(dir.file("config.json"), DType::BF16, dir.file("a.gguf"), 7);
  write_random_model(dir.file("config.json"), DType::BF16, dir.file("b.gguf"), 7);
  write_random_model(dir.file("config.json"), DType::BF16, dir.file("c.gguf"), 8);
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>{std::istreambuf_iterator<char>(in), {}};
  };
  EXPECT_EQ(read(dir.file("a.gguf")), read(dir.file("b.gguf")));
  EXPECT_NE(read(dir.file("a.gguf")), read(dir.file("c.gguf")));

  LoadedModel m = load_model(dir.file("a.gguf"));
  EXPECT_EQ(m.config.architecture, "qwen2");
  EXPECT_EQ(m.config.vocab_size, 600);
  EXPECT_TRUE(m.config.attention_bias);
  auto stats = [](const TensorView& t) {
    std::vector<float> v(size_t(t.numel()));
    to_f32(t.dtype, t.data, v.data(), t.numel());
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / double(v.size());
    return std::pair{mean, std::sqrt(s2 / double(v.size()) - mean * mean)};
  };
  const TensorView& embd = m.weights.get("token_embd.weight");
  EXPECT_EQ(embd.dtype, DType::BF16);
  auto [mean, std] = stats(embd);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std, 0.02, 0.002);
  const TensorView& norm = m.weights.get("blk.0.attn_norm.weight");
  EXPECT_EQ(norm.dtype, DType::F32);
  EXPECT_NEAR(stats(norm).first, 1.0, 0.02);

  auto f = GgufFile::open(dir.file("a.gguf"));
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 600u);
}

TEST(RandomModel, Llama2StyleVocabAndQuantizedDtype) {
  ScratchDir dir;
  ModelConfig c = testing::tiny_config("llama");
  c.vocab_size = 300;
  write_random_model(c, DType::Q8_0, dir.file("q.gguf"), 1);
  auto f = GgufFile::open(dir.file("q.gguf"));
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  const auto& tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 300u);
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")[10], 6);
  LoadedModel m = load_model(dir.file("q.gguf"));
  EXPECT_EQ(m.weights.get("blk.0.ffn_up.weight").dtype, DType::Q8_0);
}

// Timing check for the 8B case (16 GB): run by hand with
//   --gtest_also_run_disabled_tests --gtest_filter='*Llama31_8B*'  (SERVAL_RANDOM_MODEL_OUT=path)
TEST(RandomModel, DISABLED_Llama31_8B_Bf16) {
  const char* out = std::getenv("SERVAL_RANDOM_MODEL_OUT");
  const std::string path = out ? out : "/tmp/serval-llama-3.1-8b-random.gguf";
  const auto t0 = std::chrono::steady_clock::now();
  write_random_model("llama-3.1-8b", DType::BF16, path, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s in %.1f s\n", path.c_str(), s);
  LoadedModel m = load_model(path);
  EXPECT_EQ(m.config.num_layers, 32);
}

}  // namespace
}  // namespace serval
