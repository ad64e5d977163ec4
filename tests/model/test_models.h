#pragma once
// Helpers for model tests: tiny models written with Serval's own writers, the
// shared test models' paths, and a scratch directory.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "model/model_def.h"
#include "model/safetensors.h"

namespace serval::testing {

inline std::string shared_model(const std::string& rel) { return models_dir() + "/" + rel; }

// Fails the test when a shared model is missing: a skip would hide a broken setup.
#define SERVAL_REQUIRE_MODEL(path)                                                    \
  do {                                                                                \
    if (!std::filesystem::exists(path)) GTEST_FAIL() << "missing test model " << path << " (set SERVAL_MODELS)"; \
  } while (0)

// A fresh directory under the system temp dir, removed at destruction.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("serval_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline ModelConfig tiny_config(const std::string& arch = "llama") {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.rope_dim = 8;
  c.max_position = 128;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.attention_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  return c;
}

// Random bytes for a tensor of `dtype` (quantized blocks built from random floats).
inline std::vector<uint8_t> random_tensor_bytes(DType dtype, const std::vector<int64_t>& shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> f(static_cast<size_t>(n));
  for (float& x : f) x = dist(rng);
  std::vector<uint8_t> out(size_t(dtype_bytes(dtype, n)));
  from_f32(dtype, f.data(), out.data(), n);
  return out;
}

// Holds tensor bytes for a GgufWriter until write().
struct TinyGguf {
  GgufWriter writer;
  std::vector<std::vector<uint8_t>> buffers;
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, uint32_t seed) {
    buffers.push_back(random_tensor_bytes(dtype, shape, seed));
    writer.add_tensor(name, dtype, shape, buffers.back().data(), int64_t(buffers.back().size()));
  }
};

// Writes GGUF metadata for `c` (llama.cpp keys) and random tensors of its shapes.
inline void fill_tiny_gguf(TinyGguf& g, const ModelConfig& c, DType dtype = DType::F32) {
  const std::string a = c.architecture;
  g.writer.set_string("general.architecture", a);
  g.writer.set_string("general.name", "tiny");
  g.writer.set_u32(a + ".context_length", uint32_t(c.max_position));
  g.writer.set_u32(a + ".embedding_length", uint32_t(c.hidden_size));
  g.writer.set_u32(a + ".feed_forward_length", uint32_t(c.intermediate_size));
  g.writer.set_u32(a + ".block_count", uint32_t(c.num_layers));
  g.writer.set_u32(a + ".attention.head_count", uint32_t(c.num_heads));
  g.writer.set_u32(a + ".attention.head_count_kv", uint32_t(c.num_kv_heads));
  g.writer.set_u32(a + ".rope.dimension_count", uint32_t(c.rope_dim));
  g.writer.set_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  g.writer.set_f32(a + ".rope.freq_base", c.rope_theta);
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < c.vocab_size; ++i) tokens.push_back(std::string("t").append(std::to_string(i)));  // not "t" + temporary: GCC 12's -Wrestrict
  g.writer.set_string("tokenizer.ggml.model", "gpt2");
  g.writer.set_string_array("tokenizer.ggml.tokens", tokens);
  uint32_t seed = 1;
  for (const TensorSpec& e : ModelDef::of(c).tensors()) {
    const bool is_vector = e.shape.size() == 1;
    g.add(e.name, is_vector ? DType::F32 : dtype, e.shape, seed++);
  }
}

inline void write_tiny_gguf(const std::string& path, const ModelConfig& c, DType dtype = DType::F32) {
  TinyGguf g;
  fill_tiny_gguf(g, c, dtype);
  g.writer.write(path);
}

// A config.json text for `c` (HF keys); `extra` is a JSON object merged in.
inline std::string hf_config_json(const std::string& arch_class, const ModelConfig& c, const std::string& extra = "") {
  nlohmann::json j = {{"architectures", {arch_class}}, {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
                      {"num_key_value_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
                      {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"max_position_embeddings", 64},
                      {"tie_word_embeddings", c.tie_word_embeddings}, {"hidden_act", "silu"}};
  if (!extra.empty()) j.update(nlohmann::json::parse(extra));
  return j.dump();
}

// The Hugging Face name of a GGUF tensor name (inverse of the loader's renaming).
inline std::string hf_name_from_gguf(std::string n) {
  auto rep = [&](const std::string& from, const std::string& to) {
    const size_t p = n.find(from);
    if (p != std::string::npos) n.replace(p, from.size(), to);
  };
  if (n == "token_embd.weight") return "model.embed_tokens.weight";
  if (n == "output_norm.weight") return "model.norm.weight";
  if (n == "output.weight") return "lm_head.weight";
  rep("blk.", "model.layers.");
  rep("attn_norm", "input_layernorm");
  rep("ffn_norm", "post_attention_layernorm");
  rep("attn_q_norm", "self_attn.q_norm");
  rep("attn_k_norm", "self_attn.k_norm");
  rep("attn_output", "self_attn.o_proj");
  rep("attn_q.", "self_attn.q_proj.");
  rep("attn_k.", "self_attn.k_proj.");
  rep("attn_v.", "self_attn.v_proj.");
  rep("ffn_gate", "mlp.gate_proj");
  rep("ffn_up", "mlp.up_proj");
  rep("ffn_down", "mlp.down_proj");
  return n;
}

// Random HF-named tensors of `c`'s shapes; the config text goes into __metadata__.
inline std::vector<SafetensorsWriteTensor> hf_tensors(const ModelConfig& c, const std::string& dtype) {
  std::vector<SafetensorsWriteTensor> ts;
  uint32_t seed = 1;
  const DType dt = dtype == "F32" ? DType::F32 : dtype == "F16" ? DType::F16 : DType::BF16;
  for (const TensorSpec& e : ModelDef::of(c).tensors())
    ts.push_back({hf_name_from_gguf(e.name), dtype, e.shape, random_tensor_bytes(dt, e.shape, seed++)});
  return ts;
}

inline void write_hf_safetensors(const std::string& path, const ModelConfig& c, const std::string& config_json,
                                 const std::string& dtype) {
  write_safetensors(path, hf_tensors(c, dtype), {{"format", "pt"}, {"config", config_json}});
}

// Asserts that `fn` throws serval::Error whose message contains every piece.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected serval::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace serval::testing
