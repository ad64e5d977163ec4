// Quantized Hugging Face folders (model/hf_quant.h): quantization_config read
// or refused, FP8 weights with block scales loaded as Fp8 Linears, and q/k rows
// permuted (RopePermute::On, the GPU's order) through their dequantized values.
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "model/hf_model.h"
#include "model/hf_quant.h"
#include "model/model_def.h"
#include "model/qk_permute.h"
#include "test_models.h"

namespace serval {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::ScratchDir;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

HfQuantization parse(const std::string& qc) {
  return hf_quantization_from_json(json::parse(R"({"quantization_config": )" + qc + "}"));
}

std::string ct_config(const std::string& weights, const std::string& ignore = R"(["lm_head"])",
                      const std::string& extra = "") {
  return R"({"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": )" +
         weights + R"(, "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true},
    "output_activations": null, "format": null}}, "kv_cache_scheme": null, "ignore": )" +
         ignore + extra + "}";
}

TEST(HfQuant, ReadsFp8AndCompressedTensorsConfigs) {
  EXPECT_EQ(hf_quantization_from_json(json::parse("{}")).method, HfQuantization::Method::None);
  HfQuantization q = parse(R"({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                               "modules_to_not_convert": null, "scale_fmt": "float"})");
  EXPECT_EQ(q.method, HfQuantization::Method::Fp8);
  EXPECT_EQ(q.scales, HfQuantization::Scales::Block);
  EXPECT_EQ(q.block_rows, 128);
  EXPECT_TRUE(q.quantizes("model.layers.0.self_attn.q_proj"));
  q = parse(R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": null,
                "modules_to_not_convert": ["lm_head", "model.layers.1"]})");
  EXPECT_EQ(q.scales, HfQuantization::Scales::Tensor);
  EXPECT_FALSE(q.quantizes("lm_head"));
  EXPECT_FALSE(q.quantizes("model.layers.1.mlp.up_proj"));
  EXPECT_TRUE(q.quantizes("model.layers.11.mlp.up_proj"));  // a module boundary, not a prefix
  // AutoFP8's configs name no block size: the scale's shape decides.
  EXPECT_EQ(parse(R"({"quant_method": "fp8", "activation_scheme": "static"})").scales,
            HfQuantization::Scales::BlockOrTensor);

  q = parse(ct_config(R"({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel", "dynamic": false})",
                      R"(["lm_head", "re:.*layers\\.1\\.mlp\\..*"])"));
  EXPECT_EQ(q.method, HfQuantization::Method::CompressedTensors);
  EXPECT_EQ(q.scales, HfQuantization::Scales::Channel);
  EXPECT_TRUE(q.quantizes("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(q.quantizes("model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(q.quantizes("lm_head"));
  EXPECT_NE(q.describe().find("dynamic per token"), std::string::npos) << q.describe();
  q = parse(ct_config(R"({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": "16x24"})", "[]"));
  EXPECT_EQ(q.block_rows, 16);
  EXPECT_EQ(q.block_cols, 24);
  EXPECT_TRUE(q.quantizes("lm_head"));
}

TEST(HfQuant, RefusesWhatItDoesNotLoad) {
  const std::string fp8w = R"({"num_bits": 8, "type": "float", "strategy": "tensor"})";
  expect_error([] { parse(R"({"quant_method": "gptq", "bits": 4})"); },
               {"quantization_config.quant_method = \"gptq\"", "supported: fp8, compressed-tensors"});
  expect_error([] { parse(R"({"bits": 4})"); }, {"quantization_config has no quant_method"});
  expect_error([&] { parse(ct_config(fp8w).replace(ct_config(fp8w).find("float-quantized"), 15, "int-quantized")); },
               {"quantization_config.format = \"int-quantized\""});
  expect_error([] { parse(ct_config(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128})")); },
               {"quantization_config.config_groups.group_0.weights.type = \"int\""});
  expect_error([] { parse(ct_config(R"({"num_bits": 8, "type": "float", "symmetric": false})")); },
               {"weights.symmetric = false"});
  expect_error([] { parse(ct_config(R"({"num_bits": 8, "type": "float", "strategy": "block"})")); },
               {"weights.block_structure is missing"});
  expect_error([&] { parse(ct_config(fp8w, "[]", R"(, "kv_cache_scheme": {"num_bits": 8})")); },
               {"quantization_config.kv_cache_scheme"});
  expect_error([&] { parse(ct_config(fp8w, "[]", R"(, "sparsity_config": {"format": "sparse-24-bitmask"})")); },
               {"quantization_config.sparsity_config"});
  expect_error([&] { parse(ct_config(fp8w, R"(["re:)" + std::string(300, 'a') + R"("])")); },
               {"quantization_config.ignore", "at most 256"});
  expect_error([&] { parse(ct_config(fp8w, R"(["re:(unclosed"])")); }, {"\"(unclosed\" is not a regular expression"});
  expect_error([] { parse(R"({"quant_method": "fp8", "scale_fmt": "ue8m0"})"); },
               {"quantization_config.scale_fmt = \"ue8m0\""});
  expect_error([] { parse(R"({"quant_method": "fp8", "weight_block_size": [128]})"); },
               {"quantization_config.weight_block_size = [128]"});
  expect_error([] { parse(R"({"quant_method": "fp8", "activation_scheme": "weird"})"); },
               {"quantization_config.activation_scheme = \"weird\""});
}

// Random e4m3 bytes, NaN codes (0x7f, 0xff) left out.
std::vector<uint8_t> random_fp8(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(size_t(n), 0);
  for (auto& b : out) {
    do b = uint8_t(rng() & 0xff); while ((b & 0x7f) == 0x7f || (b & 0x78) == 0x78);  // |x| < 256
  }
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& f) {
  std::vector<uint8_t> b(f.size() * 4);
  std::memcpy(b.data(), f.data(), b.size());
  return b;
}

TEST(HfQuant, LoadsFp8BlockWeightsAndPermutesTheirRowsDequantized) {
  ScratchDir dir;
  const ModelConfig c = testing::tiny_config("llama");  // hidden 32, ffn 64, q 32 rows, kv 16
  write_text(dir.file("config.json"),
             testing::hf_config_json("LlamaForCausalLM", c,
                                     R"({"quantization_config": )" +
                                         ct_config(R"({"num_bits": 8, "type": "float", "strategy": "block",
                                                       "block_structure": [16, 24]})") +
                                         "}"));
  std::vector<SafetensorsWriteTensor> ts = testing::hf_tensors(c, "F32");
  uint32_t seed = 100;
  for (SafetensorsWriteTensor& t : std::vector<SafetensorsWriteTensor>(ts)) {
    if (t.shape.size() != 2 || t.name.find("model.layers.") != 0) continue;
    const int64_t out = t.shape[0], in = t.shape[1];
    for (auto& u : ts)
      if (u.name == t.name) u = {t.name, "F8_E4M3", t.shape, random_fp8(out * in, seed++)};
    const int64_t rows = (out + 15) / 16, cols = (in + 23) / 24;
    std::vector<float> s(size_t(rows * cols));
    for (size_t i = 0; i < s.size(); ++i) s[i] = 0.01f * float(i + seed % 7 + 1);
    ts.push_back({t.name.substr(0, t.name.size() - 6) + "weight_scale", "F32", {rows, cols}, f32_bytes(s)});
  }
  write_safetensors(dir.file("model.safetensors"), ts);
  LoadedModel m = load_model(dir.file(""));
  EXPECT_EQ(m.config.quant_method, "compressed-tensors");
  EXPECT_EQ(m.config.fp8_block_rows, 16);
  EXPECT_EQ(m.weights.get("blk.0.attn_q.weight").dtype, DType::FP8_E4M3);
  EXPECT_EQ(m.weights.get("blk.0.attn_q.weight_scale").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(m.weights.get("blk.1.ffn_down.weight_scale").shape, (std::vector<int64_t>{2, 3}));  // [32, 64]

  const ModelDef def = ModelDef::of(m.config);
  const LayerWeights plain = def.load_layer(m.weights, 0, WeightTransforms{false});
  EXPECT_EQ(plain.q.format.kind, LinearFormat::Kind::Fp8);
  EXPECT_EQ(plain.q.format.describe(), "fp8 e4m3 block 16x24");
  EXPECT_EQ(plain.down.format.block_cols, 24);
  EXPECT_FALSE(def.lm_head(m.weights)->format.kind == LinearFormat::Kind::Fp8);  // ignored: lm_head
  // An element by hand: row 20, column 30 lies in block (1, 1).
  const std::vector<float> q = dequantize_linear(plain.q);
  const auto* qb = static_cast<const uint8_t*>(plain.q.weight.data);
  const auto* qs = static_cast<const float*>(plain.q.scales->data);
  EXPECT_EQ(q[20 * 32 + 30], fp8_e4m3_to_f32(qb[20 * 32 + 30]) * qs[1 * 2 + 1]);

  const LayerWeights permuted = def.load_layer(m.weights, 0, WeightTransforms{true});
  for (const auto& [p, w] : {std::pair{&permuted.q, &plain.q}, std::pair{&permuted.k, &plain.k}}) {
    EXPECT_EQ(p->format, LinearFormat::dense(DType::F32));
    const std::vector<float> want = dequantize_linear(*w);
    std::vector<float> rows(want.size());
    permute_qk_rows(want.data(), rows.data(), w->out / c.head_dim, c.head_dim, w->in * 4, c.rope_dim);
    EXPECT_EQ(dequantize_linear(*p), rows) << w->name;
  }
  EXPECT_EQ(permuted.v.format.kind, LinearFormat::Kind::Fp8);  // only q and k move
}

}  // namespace
}  // namespace serval
