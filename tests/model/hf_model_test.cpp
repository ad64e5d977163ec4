// Hugging Face folders: config.json parsing for the three architectures, tensor
// renaming, sharded checkpoints and errors.
#include <cmath>
#include <fstream>

#include "model/hf_model.h"
#include "model/model_def.h"
#include "model/rope_factors.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;
using testing::ScratchDir;

// Abridged from the published config.json files of each model.
constexpr const char* kLlama31Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})";

constexpr const char* kQwen25Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584,
  "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "use_sliding_window": false, "vocab_size": 152064})";

constexpr const char* kQwen3Config = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "use_sliding_window": false, "vocab_size": 151936})";

TEST(HfConfig, Llama31WithLlama3RopeScaling) {
  const ModelConfig c = config_from_hf_json(kLlama31Config);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // hidden / heads
  EXPECT_EQ(c.max_position, 131072);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_style, RopeStyle::Neox);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);

  // The per-frequency divisors: 1 for short wavelengths, `factor` for long ones,
  // a smooth blend between (values as transformers' _compute_llama3_parameters).
  const std::vector<float> f = llama3_rope_factors(c);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[63], 8.0f);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
  // Frequency i = 40: wavelen = 2*pi*500000^(80/128) ~= 22474, between 2048 and 8192:
  // smooth = (8192 / wavelen - 1) / 3, factor = 1 / ((1 - smooth) / 8 + smooth).
  const double wavelen = 2 * M_PI * std::pow(500000.0, 80.0 / 128.0);
  const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
  if (wavelen > 2048 && wavelen < 8192) {
    EXPECT_NEAR(f[40], 1.0 / ((1 - smooth) / 8 + smooth), 1e-4);
  } else {
    EXPECT_TRUE(f[40] == 1.0f || f[40] == 8.0f);
  }
}

TEST(HfConfig, Qwen2HasBiasByDefault) {
  const ModelConfig c = config_from_hf_json(kQwen25Config);
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::None);
}

TEST(HfConfig, Qwen3HeadDimAndQkNorm) {
  const ModelConfig c = config_from_hf_json(kQwen3Config);
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_EQ(c.head_dim, 128);  // from config, not 1024 / 16
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
}

// Mistral slides on every layer; Qwen2 only with use_sliding_window, from
// max_window_layers on, or where layer_types says so; Llama never.
TEST(HfConfig, SlidingWindows) {
  const std::string dims = R"("vocab_size": 32000, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "num_attention_heads": 4, "max_position_embeddings": 32768)";
  ModelConfig m = config_from_hf_json(R"({"architectures": ["MistralForCausalLM"], "sliding_window": 4096, )" + dims + "}");
  EXPECT_EQ(m.architecture, "mistral");
  EXPECT_EQ(m.sliding_window, 4096);
  const ModelDef md = ModelDef::of(m);
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(md.layer(l).attention.window, 4096);
  EXPECT_EQ(md.widest_window(), 4096);
  EXPECT_EQ(md.kv_spec(1, DType::BF16), (KvLayerSpec{DType::BF16, 4, 16, 4096}));

  ModelConfig off = config_from_hf_json(R"({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
      "use_sliding_window": false, )" + dims + "}");
  EXPECT_EQ(off.sliding_window, 0);
  ModelConfig q = config_from_hf_json(R"({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
      "use_sliding_window": true, "max_window_layers": 2, )" + dims + "}");
  const ModelDef qd = ModelDef::of(q);
  EXPECT_EQ(qd.layer(1).attention.window, 0);
  EXPECT_EQ(qd.layer(2).attention.window, 4096);
  EXPECT_EQ(qd.widest_window(), 0);  // layers 0-1 read everything
  ModelConfig t = config_from_hf_json(R"({"architectures": ["Qwen3ForCausalLM"], "sliding_window": 8,
      "use_sliding_window": true, "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
      "full_attention"], )" + dims + "}");
  EXPECT_EQ(ModelDef::of(t).layer(0).attention.window, 8);
  EXPECT_EQ(ModelDef::of(t).layer(1).attention.window, 0);
  ModelConfig l = config_from_hf_json(R"({"architectures": ["LlamaForCausalLM"], "sliding_window": 8, )" + dims + "}");
  EXPECT_EQ(l.sliding_window, 0);
  expect_error([&] {
    config_from_hf_json(R"({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 8, "use_sliding_window": true,
        "layer_types": ["sliding_attention"], )" + dims + "}");
  }, {"layer_types", "4 layers"});
}

TEST(HfConfig, ModelTypeFallbackLinearScalingAndErrors) {
  ModelConfig c = config_from_hf_json(R"({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "sliding_window": null,
      "rope_scaling": {"type": "linear", "factor": 2.0}})");
  EXPECT_EQ(c.architecture, "mistral");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::Linear);
  EXPECT_EQ(c.rope_scaling.factor, 2.0f);
  EXPECT_EQ(c.num_kv_heads, 4);

  expect_error([] { config_from_hf_json(R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 5})", "cfg.json"); },
               {"cfg.json", "architecture \"GPT2LMHeadModel\" is not supported (supported: llama, mistral, qwen2, qwen3)"});
  expect_error([] { config_from_hf_json(R"({"model_type": "gemma"})"); },
               {"architecture \"gemma\" is not supported (supported: llama, mistral, qwen2, qwen3)"});
  expect_error([] {
    config_from_hf_json(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})");
  }, {"rope_scaling type \"yarn\" is not supported"});
  expect_error([] { config_from_hf_json(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 5})"); },
               {"missing \"hidden_size\""});
  expect_error([] { config_from_hf_json("{not json"); }, {"not valid JSON"});
  expect_error([] {
    config_from_hf_json(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3})");
  }, {"num_heads (4) must be a multiple of num_kv_heads (3)"});
}

TEST(HfNames, MapToGguf) {
  EXPECT_EQ(gguf_name_from_hf("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_name_from_hf("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_name_from_hf("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.12.self_attn.q_proj.weight"), "blk.12.attn_q.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.self_attn.o_proj.weight"), "blk.3.attn_output.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.self_attn.q_norm.weight"), "blk.3.attn_q_norm.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.mlp.gate_proj.weight"), "blk.3.ffn_gate.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.input_layernorm.weight"), "blk.3.attn_norm.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.post_attention_layernorm.weight"), "blk.3.ffn_norm.weight");
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.self_attn.rotary_emb.inv_freq"), "");
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(HfModel, LoadsSingleFileAndShardedFolders) {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    ScratchDir dir;
    ModelConfig c = testing::tiny_config(arch);
    c.tie_word_embeddings = std::string(arch) == "qwen3";
    const std::string cls = std::string(arch) == "llama" ? "LlamaForCausalLM"
                            : std::string(arch) == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
    write_text(dir.file("config.json"), testing::hf_config_json(cls, c));
    testing::write_hf_safetensors(dir.file("model.safetensors"), c, "{}", "BF16");
    LoadedModel m = load_model(dir.file(""));
    EXPECT_EQ(m.format, "hf");
    EXPECT_EQ(m.config.architecture, arch);
    EXPECT_EQ(m.config.rope_style, RopeStyle::Neox);
    EXPECT_EQ(m.weights.get("blk.1.attn_v.weight", {c.kv_dim(), c.hidden_size}).dtype, DType::BF16);
    EXPECT_EQ(m.weights.find("output.weight") == nullptr, c.tie_word_embeddings);
  }
  {
    // Two shards and an index; llama3 rope scaling adds rope_freqs.weight.
    ScratchDir dir;
    const ModelConfig c = testing::tiny_config("llama");
    write_text(dir.file("config.json"), testing::hf_config_json("LlamaForCausalLM", c,
        R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})"));
    std::vector<SafetensorsWriteTensor> all = testing::hf_tensors(c, "F16");
    std::vector<SafetensorsWriteTensor> a(all.begin(), all.begin() + all.size() / 2);
    std::vector<SafetensorsWriteTensor> b(all.begin() + all.size() / 2, all.end());
    write_safetensors(dir.file("model-00001-of-00002.safetensors"), a);
    write_safetensors(dir.file("model-00002-of-00002.safetensors"), b);
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
    for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    write_text(dir.file("model.safetensors.index.json"), index.dump());
    LoadedModel m = load_model(dir.file(""));
    EXPECT_EQ(m.weights.get("token_embd.weight").dtype, DType::F16);
    const TensorView& rf = m.weights.get("rope_freqs.weight", {c.rope_dim / 2});
    EXPECT_EQ(rf.dtype, DType::F32);

    // An index naming a tensor its shard lacks.
    index["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "model-00002-of-00002.safetensors";
    write_text(dir.file("model.safetensors.index.json"), index.dump());
    expect_error([&] { load_model(dir.file("")); }, {"model.layers.0.self_attn.q_proj.weight", "listed in the index"});
    index["weight_map"]["x"] = "../evil.safetensors";
    write_text(dir.file("model.safetensors.index.json"), index.dump());
    expect_error([&] { load_model(dir.file("")); }, {"bad shard file name"});
  }
}

TEST(HfModel, BadFolders) {
  ScratchDir dir;
  const ModelConfig c = testing::tiny_config("llama");
  expect_error([&] { load_model(dir.file("")); }, {"has no config.json"});
  write_text(dir.file("config.json"), testing::hf_config_json("LlamaForCausalLM", c));
  expect_error([&] { load_model(dir.file("")); }, {"neither model.safetensors nor model.safetensors.index.json"});
  // Shape mismatch: the config claims a wider FFN than the weights have.
  testing::write_hf_safetensors(dir.file("model.safetensors"), c, "{}", "F32");
  write_text(dir.file("config.json"), testing::hf_config_json("LlamaForCausalLM", c, R"({"intermediate_size": 96})"));
  expect_error([&] { load_model(dir.file("")); },
               {"tensor \"blk.0.ffn_gate.weight\" has shape [64, 32], expected [96, 32]"});
  // Unsupported dtype in a tensor the model uses.
  std::vector<SafetensorsWriteTensor> ts = testing::hf_tensors(c, "F32");
  ts[0].dtype = "I32";
  write_safetensors(dir.file("model.safetensors"), ts);
  write_text(dir.file("config.json"), testing::hf_config_json("LlamaForCausalLM", c));
  expect_error([&] { load_model(dir.file("")); }, {"has dtype I32", "not support"});
}

}  // namespace
}  // namespace serval
