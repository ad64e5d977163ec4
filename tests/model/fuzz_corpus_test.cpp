// Writes the fuzzers' seed corpora (tests/fuzz/corpus/{gguf,safetensors}) with
// Serval's own writers. Disabled in normal runs; regenerate with (one line)
//   SERVAL_FUZZ_CORPUS_OUT=tests/fuzz/corpus ./build/serval_tests
//     --gtest_also_run_disabled_tests --gtest_filter='FuzzCorpus.*'
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "test_models.h"

namespace serval {
namespace {

ModelConfig micro_config(const std::string& arch) {
  ModelConfig c = testing::tiny_config(arch);
  c.vocab_size = 8;
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.rope_dim = 4;
  return c;
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Keeps a file and adds a truncated and a bit-flipped variant of it.
void add_variants(const std::string& path) {
  const std::vector<uint8_t> b = slurp(path);
  spit(path + ".trunc", std::vector<uint8_t>(b.begin(), b.begin() + b.size() * 2 / 3));
  std::vector<uint8_t> m = b;
  for (size_t i = 9; i < m.size(); i += 97) m[i] ^= 0x40;
  spit(path + ".flip", m);
}

TEST(FuzzCorpus, DISABLED_WriteSeedCorpus) {
  const char* out = std::getenv("SERVAL_FUZZ_CORPUS_OUT");
  ASSERT_NE(out, nullptr) << "set SERVAL_FUZZ_CORPUS_OUT";
  const std::string gg = std::string(out) + "/gguf/";
  const std::string st = std::string(out) + "/safetensors/";
  std::filesystem::create_directories(gg);
  std::filesystem::create_directories(st);

  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    ModelConfig c = micro_config(arch);
    c.tie_word_embeddings = std::string(arch) == "qwen2";
    const std::string p = gg + arch + ".gguf";
    testing::write_tiny_gguf(p, c, std::string(arch) == "qwen3" ? DType::F16 : DType::F32);
    add_variants(p);
  }
  {
    ModelConfig c = micro_config("llama");
    c.hidden_size = 32;
    c.num_heads = 4;
    c.head_dim = 8;
    c.rope_dim = 8;
    c.intermediate_size = 32;
    testing::write_tiny_gguf(gg + "q8_0.gguf", c, DType::Q8_0);
    testing::TinyGguf g;
    testing::fill_tiny_gguf(g, c, DType::Q4_0);
    g.writer.set_alignment(64);
    g.writer.set_version(2);
    g.add("rope_freqs.weight", DType::F32, {4}, 5);
    g.writer.set_f32("llama.rope.scaling.factor", 8.0f);
    g.writer.write(gg + "q4_0_v2_llama3.gguf");
  }
  {
    // Every metadata type, nested arrays, a raw Q4_K tensor.
    GgufWriter w;
    w.set_u8("u8", 1); w.set_i8("i8", -1); w.set_u16("u16", 2); w.set_i16("i16", -2);
    w.set_u64("u64", 3); w.set_i64("i64", -3); w.set_f64("f64", 0.5); w.set_bool("b", true);
    w.set_string("general.architecture", "llama");
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    w.set_f32_array("tokenizer.ggml.scores", {0.f, -1.f});
    GgufValue nested;
    nested.type = GgufType::ARRAY;
    nested.elem_type = GgufType::ARRAY;
    GgufValue inner;
    inner.type = GgufType::ARRAY;
    inner.elem_type = GgufType::INT32;
    inner.ints = {1, 2};
    nested.arrays = {inner, inner};
    w.set_value("nested", nested);
    std::vector<uint8_t> q4k(144, 7);
    w.add_tensor_raw("token_embd.weight", uint32_t(GgmlType::Q4_K), {1, 256}, q4k.data(), 144);
    w.write(gg + "metadata.gguf");
  }
  for (auto [cls, arch, extra] : {std::tuple{"LlamaForCausalLM", "llama",
                                             R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 32}})"},
                                  std::tuple{"Qwen2ForCausalLM", "qwen2", ""},
                                  std::tuple{"Qwen3ForCausalLM", "qwen3", R"({"attention_bias": false})"}}) {
    ModelConfig c = micro_config(arch);
    c.tie_word_embeddings = std::string(arch) != "llama";
    const std::string p = st + arch + ".safetensors";
    testing::write_hf_safetensors(p, c, testing::hf_config_json(cls, c, extra), std::string(arch) == "llama" ? "F32" : "BF16");
    add_variants(p);
  }
  {
    // FP8 checkpoints: compressed-tensors with block scales (partial blocks), and
    // transformers' fp8 per tensor; F8_E4M3 weights beside their scales.
    ModelConfig c = micro_config("llama");
    c.intermediate_size = 12;
    const std::string ct = R"({"quantization_config": {"quant_method": "compressed-tensors",
        "format": "float-quantized", "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "block", "block_structure": [4, 8]}}}}})";
    const std::string fp8 = R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
        "weight_block_size": null}})";
    for (const auto& [name, extra, block] : {std::tuple{"fp8_ct_block", ct, true}, std::tuple{"fp8_tensor", fp8, false}}) {
      std::vector<SafetensorsWriteTensor> ts;
      uint32_t seed = 1;
      for (const TensorSpec& e : ModelDef::of(c).tensors()) {
        const std::string hf = testing::hf_name_from_gguf(e.name);
        const bool quantized = e.shape.size() == 2 && hf.rfind("model.layers.", 0) == 0;
        if (!quantized) {
          ts.push_back({hf, "F32", e.shape, testing::random_tensor_bytes(DType::F32, e.shape, seed++)});
          continue;
        }
        std::vector<uint8_t> q(size_t(e.shape[0] * e.shape[1]));
        for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t((i * 37 + seed) % 0x7e);
        ts.push_back({hf, "F8_E4M3", e.shape, q});
        const std::vector<int64_t> s = block ? std::vector<int64_t>{(e.shape[0] + 3) / 4, (e.shape[1] + 7) / 8}
                                             : std::vector<int64_t>{};
        int64_t n = 1;
        for (int64_t d : s) n *= d;
        std::vector<float> f(size_t(n), 0.125f);
        std::vector<uint8_t> b(f.size() * 4);
        std::memcpy(b.data(), f.data(), b.size());
        ts.push_back({hf.substr(0, hf.size() - 6) + (block ? "weight_scale" : "weight_scale_inv"), "F32", s, b});
        ++seed;
      }
      const std::string p = st + name + ".safetensors";
      write_safetensors(p, ts, {{"format", "pt"}, {"config", testing::hf_config_json("LlamaForCausalLM", c, extra)}});
      add_variants(p);
    }
  }
  {
    // Int checkpoints: GPTQ v1 (groups of 4, asymmetric), compressed-tensors
    // pack-quantized (groups of 4, zero points packed down the rows) and
    // int-quantized (int8 per channel); packed int32 words beside their scales.
    ModelConfig c = micro_config("llama");
    const std::string gptq = R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 4,
        "sym": false, "desc_act": true, "checkpoint_format": "gptq"}})";
    const std::string pack = R"({"quantization_config": {"quant_method": "compressed-tensors",
        "format": "pack-quantized", "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
        "symmetric": false, "strategy": "group", "group_size": 4}}}}})";
    const std::string int8 = R"({"quantization_config": {"quant_method": "compressed-tensors",
        "format": "int-quantized", "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int",
        "strategy": "channel"}}}}})";
    auto words = [](int64_t n, uint32_t seed) {
      std::vector<uint8_t> b(size_t(n * 4));
      for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t((i * 131 + seed * 7) & 0xff);
      return b;
    };
    auto floats = [](int64_t n) {
      std::vector<float> f(size_t(n), 0.125f);
      std::vector<uint8_t> b(f.size() * 4);
      std::memcpy(b.data(), f.data(), b.size());
      return b;
    };
    for (const auto& [name, extra] : {std::pair{"int4_gptq", gptq}, std::pair{"int4_ct_pack", pack},
                                      std::pair{"int8_ct", int8}}) {
      std::vector<SafetensorsWriteTensor> ts;
      uint32_t seed = 1;
      for (const TensorSpec& e : ModelDef::of(c).tensors()) {
        const std::string hf = testing::hf_name_from_gguf(e.name);
        if (e.shape.size() != 2 || hf.rfind("model.layers.", 0) != 0) {
          ts.push_back({hf, "F32", e.shape, testing::random_tensor_bytes(DType::F32, e.shape, seed++)});
          continue;
        }
        const std::string m = hf.substr(0, hf.size() - 7);
        const int64_t out = e.shape[0], in = e.shape[1], groups = in / 4;
        if (std::string(name) == "int4_gptq") {
          std::vector<uint8_t> g(size_t(in * 4), 0);
          for (int64_t i = 0; i < in; ++i) g[size_t(i * 4)] = uint8_t((i * 3) % groups);
          ts.push_back({m + ".qweight", "I32", {in / 8, out}, words(in / 8 * out, seed++)});
          ts.push_back({m + ".qzeros", "I32", {groups, (out + 7) / 8}, words(groups * ((out + 7) / 8), seed++)});
          ts.push_back({m + ".scales", "F32", {groups, out}, floats(groups * out)});
          ts.push_back({m + ".g_idx", "I32", {in}, g});
        } else if (std::string(name) == "int4_ct_pack") {
          std::vector<uint8_t> shape(16, 0);
          std::memcpy(shape.data(), &out, 8);
          std::memcpy(shape.data() + 8, &in, 8);
          ts.push_back({m + ".weight_packed", "I32", {out, in / 8}, words(out * in / 8, seed++)});
          ts.push_back({m + ".weight_scale", "F32", {out, groups}, floats(out * groups)});
          ts.push_back({m + ".weight_zero_point", "I32", {(out + 7) / 8, groups}, words((out + 7) / 8 * groups, seed++)});
          ts.push_back({m + ".weight_shape", "I64", {2}, shape});
        } else {
          std::vector<uint8_t> q(size_t(out * in));
          for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i * 37 + seed);
          ts.push_back({hf, "I8", e.shape, q});
          ts.push_back({m + ".weight_scale", "F32", {out, 1}, floats(out)});
          ++seed;
        }
      }
      const std::string p = st + name + ".safetensors";
      write_safetensors(p, ts, {{"format", "pt"}, {"config", testing::hf_config_json("LlamaForCausalLM", c, extra)}});
      add_variants(p);
    }
  }
  {
    // A header with an unsupported dtype and an empty tensor.
    write_safetensors(st + "other_dtypes.safetensors",
                      {{"a", "I64", {2}, std::vector<uint8_t>(16, 1)}, {"b", "F16", {0, 3}, {}},
                       {"model.norm.weight", "F32", {8}, std::vector<uint8_t>(32, 0)}});
  }
}

}  // namespace
}  // namespace serval
