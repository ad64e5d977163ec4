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
#include "model/int_unpack.h"
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
  expect_error([] { parse(R"({"quant_method": "bitsandbytes", "load_in_4bit": true})"); },
               {"quantization_config.quant_method = \"bitsandbytes\"", "supported: fp8, compressed-tensors, awq, gptq"});
  expect_error([] { parse(R"({"bits": 4})"); }, {"quantization_config has no quant_method"});
  expect_error([&] { parse(ct_config(fp8w).replace(ct_config(fp8w).find("float-quantized"), 15, "int-quantized")); },
               {"weights.type = \"float\"", "in quantization_config.format \"int-quantized\""});
  expect_error([] { parse(ct_config(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128})")); },
               {"quantization_config.config_groups.group_0.weights.type = \"int\"", "num_bits = 4"});
  expect_error([] { parse(ct_config(R"({"num_bits": 8, "type": "float", "symmetric": false})")); },
               {"weights.symmetric = false"});
  expect_error([] { parse(ct_config(R"({"num_bits": 8, "type": "float", "strategy": "block"})")); },
               {"weights.block_structure is missing"});
  // A static 8-bit kv_cache_scheme loads (--kv-cache-dtype reads its scales); others are refused.
  EXPECT_EQ(parse(ct_config(fp8w, "[]", R"(, "kv_cache_scheme": {"num_bits": 8, "type": "int"})")).kv_code_max, 127.0f);
  EXPECT_EQ(parse(ct_config(fp8w, "[]", R"(, "kv_cache_scheme": {"num_bits": 8})")).kv_code_max, 448.0f);
  expect_error([&] { parse(ct_config(fp8w, "[]", R"(, "kv_cache_scheme": {"num_bits": 8, "dynamic": true})")); },
               {"quantization_config.kv_cache_scheme.dynamic = true"});
  expect_error([&] { parse(ct_config(fp8w, "[]", R"(, "kv_cache_scheme": {"num_bits": 4})")); },
               {"quantization_config.kv_cache_scheme.num_bits"});
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

std::string ct_int_config(const std::string& format, const std::string& weights, const std::string& acts = "null") {
  return R"({"quant_method": "compressed-tensors", "format": ")" + format +
         R"(", "quantization_status": "compressed", "config_groups": {"group_0": {"targets": ["Linear"], "weights": )" +
         weights + R"(, "input_activations": )" + acts + R"(, "format": ")" + format +
         R"("}}, "ignore": ["lm_head"], "sparsity_config": {}, "transform_config": {}})";
}

TEST(HfQuant, ReadsIntConfigs) {
  using S = HfQuantization::Storage;
  HfQuantization q = parse(ct_int_config("int-quantized", R"({"num_bits": 8, "type": "int", "symmetric": true,
      "strategy": "channel", "dynamic": false})", R"({"num_bits": 8, "type": "int", "strategy": "token", "dynamic": true})"));
  EXPECT_EQ(q.storage, S::Int8);
  EXPECT_EQ(q.scales, HfQuantization::Scales::Channel);
  EXPECT_NE(q.describe().find("int8 dynamic per token"), std::string::npos) << q.describe();
  EXPECT_NE(q.describe().find("not emulated"), std::string::npos) << q.describe();
  q = parse(ct_int_config("pack-quantized", R"({"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group",
      "group_size": 64, "actorder": "group"})"));
  EXPECT_EQ(q.storage, S::CtPacked);
  EXPECT_EQ(q.group_size, 64);
  EXPECT_FALSE(q.symmetric);
  EXPECT_TRUE(q.act_order);
  q = parse(R"({"quant_method": "awq", "zero_point": true, "group_size": 128, "bits": 4, "version": "GEMM",
                "modules_to_not_convert": ["visual"]})");
  EXPECT_EQ(q.storage, S::Awq);
  EXPECT_FALSE(q.quantizes("model.visual.proj"));
  EXPECT_TRUE(q.quantizes("model.layers.0.mlp.up_proj"));
  q = parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": true, "desc_act": true})");
  EXPECT_EQ(q.storage, S::Gptq);
  EXPECT_TRUE(q.zeros_minus_one);  // AutoGPTQ's v1 unless the config says gptq_v2
  EXPECT_TRUE(q.act_order);
  q = parse(R"({"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"})");
  EXPECT_EQ(q.scales, HfQuantization::Scales::Channel);
  EXPECT_FALSE(q.zeros_minus_one);
}

TEST(HfQuant, RefusesIntVariantsItDoesNotLoad) {
  expect_error([] { parse(R"({"quant_method": "gptq", "bits": 3, "group_size": 128})"); },
               {"quantization_config.bits = 3 is not supported (supported: 4, 8)"});
  expect_error([] { parse(R"({"quant_method": "gptq", "bits": 8, "group_size": 128})"); },
               {"quantization_config.bits = 8", "group_size = -1"});
  expect_error([] { parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})"); },
               {"quantization_config.checkpoint_format = \"marlin\""});
  expect_error([] { parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 0})"); },
               {"quantization_config.group_size = 0"});
  expect_error([] { parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"-:.*": {}}})"); },
               {"quantization_config.dynamic"});
  for (const char* v : {"gemv", "gemv_fast", "exllama", "marlin", "ipex"})
    expect_error([&] { parse(str_cat(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": ")", v, "\"}")); },
                 {str_cat("quantization_config.version = \"", v, "\" is not supported")});
  expect_error([] { parse(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})"); },
               {"quantization_config.zero_point = false"});
  expect_error([] { parse(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "backend": "llm-awq"})"); },
               {"quantization_config.backend = \"llm-awq\""});
  expect_error([] { parse(ct_int_config("int-quantized", R"({"num_bits": 8, "type": "int", "symmetric": false})")); },
               {"weights.symmetric = false is not supported with 8-bit int"});
  expect_error([] { parse(ct_int_config("pack-quantized", R"({"num_bits": 4, "type": "int", "strategy": "group",
                                                              "group_size": 63})")); },
               {"weights.group_size = 63"});
  expect_error([] { parse(ct_int_config("pack-quantized", R"({"num_bits": 8, "type": "int", "strategy": "group",
                                                              "group_size": 64})")); },
               {"weights.strategy = \"group\" is not supported with 8-bit int"});
  expect_error([] { parse(ct_int_config("int-quantized", R"({"num_bits": 8, "type": "int", "actorder": "group"})")); },
               {"weights.actorder = \"group\""});
}

TEST(IntUnpack, ReadsEachToolsPacking) {
  // Words of eight nibbles 0..7 in order, and AWQ's interleaving of the same values.
  const uint32_t natural = 0x76543210u, awq = 0x75316420u;
  std::vector<uint8_t> b(8);
  std::memcpy(b.data(), &natural, 4);
  std::memcpy(b.data() + 4, &awq, 4);
  EXPECT_EQ(unpack_int32_rows(b.data(), 1, 1, 4, 8), (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(unpack_int32_rows(b.data() + 4, 1, 1, 4, 8, kAwqNibble), (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Down the rows: word (0, c) holds rows 0..7 of column c.
  EXPECT_EQ(unpack_int32_cols(b.data(), 8, 2, 4),
            (std::vector<uint8_t>{0, 0, 1, 2, 2, 4, 3, 6, 4, 1, 5, 3, 6, 5, 7, 7}));
  EXPECT_EQ(unpack_int32_rows(b.data(), 1, 1, 8, 4), (std::vector<uint8_t>{0x10, 0x32, 0x54, 0x76}));

  UnpackedInt u;
  u.out = 2, u.in = 4, u.groups = 2, u.bits = 4;
  u.q = {0, 15, 3, 4, 8, 9, 10, 11};
  u.scale = {0.5f, 2.0f, 1.0f, 0.25f};
  u.zero = {8, 1, 8, 8};
  EXPECT_TRUE(u.contiguous_groups());
  EXPECT_FALSE(u.zeros_are_midpoint());
  EXPECT_EQ(u.int4_bytes(), (std::vector<uint8_t>{0xF0, 0x43, 0x98, 0xBA}));
  EXPECT_EQ(u.dequantize(), (std::vector<float>{-4.0f, 3.5f, 4.0f, 6.0f, 0.0f, 1.0f, 0.5f, 0.75f}));
  u.g_idx = {1, 0, 1, 0};  // act order: not contiguous, dequantized by each column's group
  EXPECT_FALSE(u.contiguous_groups());
  EXPECT_EQ(u.dequantize()[0], (0.0f - 1.0f) * 2.0f);
}

// A tiny GPTQ v1 folder: every layer's linear weights [out, in] as qweight / qzeros /
// scales / g_idx with groups of 16, asymmetric; the lm_head plain.
TEST(HfQuant, LoadsGptqAsInt4GroupedExactly) {
  ScratchDir dir;
  const ModelConfig c = testing::tiny_config("llama");  // hidden 32, ffn 64
  write_text(dir.file("config.json"),
             testing::hf_config_json("LlamaForCausalLM", c,
                                     R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 16,
                                         "sym": false, "desc_act": false, "checkpoint_format": "gptq"}})"));
  std::vector<SafetensorsWriteTensor> ts;
  std::mt19937 rng(5);
  for (const SafetensorsWriteTensor& t : testing::hf_tensors(c, "F32")) {
    if (t.shape.size() != 2 || t.name.find("model.layers.") != 0) {
      ts.push_back(t);
      continue;
    }
    const int64_t out = t.shape[0], in = t.shape[1], groups = in / 16;
    const std::string m = t.name.substr(0, t.name.size() - 7);
    std::vector<uint32_t> qw(size_t(in / 8 * out)), qz(size_t(groups * out / 8));
    for (auto& w : qw) w = rng();
    for (auto& w : qz) w = rng();
    std::vector<float> s(size_t(groups * out));
    for (auto& v : s) v = 0.01f * float(1 + rng() % 50);
    std::vector<int32_t> g(static_cast<size_t>(in));
    for (int64_t i = 0; i < in; ++i) g[size_t(i)] = int32_t(i / 16);
    auto bytes = [](const void* p, size_t n) { return std::vector<uint8_t>((const uint8_t*)p, (const uint8_t*)p + n); };
    ts.push_back({m + ".qweight", "I32", {in / 8, out}, bytes(qw.data(), qw.size() * 4)});
    ts.push_back({m + ".qzeros", "I32", {groups, out / 8}, bytes(qz.data(), qz.size() * 4)});
    ts.push_back({m + ".scales", "F32", {groups, out}, f32_bytes(s)});
    ts.push_back({m + ".g_idx", "I32", {in}, bytes(g.data(), g.size() * 4)});
  }
  write_safetensors(dir.file("model.safetensors"), ts);
  LoadedModel m = load_model(dir.file(""));
  EXPECT_EQ(m.config.quant_method, "gptq");
  const ModelDef def = ModelDef::of(m.config);
  const LayerWeights w = def.load_layer(m.weights, 1, WeightTransforms{false});
  EXPECT_EQ(w.down.format.describe(), "int4 g16 asym");
  // Element (row 5, column 37) of down_proj [32, 64] by hand from the packed words.
  const std::vector<float> d = dequantize_linear(w.down);
  const SafetensorsWriteTensor* qw = nullptr, *qz = nullptr, *sc = nullptr;
  for (const auto& t : ts) {
    if (t.name == "model.layers.1.mlp.down_proj.qweight") qw = &t;
    if (t.name == "model.layers.1.mlp.down_proj.qzeros") qz = &t;
    if (t.name == "model.layers.1.mlp.down_proj.scales") sc = &t;
  }
  uint32_t word, zword;
  float scale;
  std::memcpy(&word, qw->bytes.data() + ((37 / 8) * 32 + 5) * 4, 4);
  std::memcpy(&zword, qz->bytes.data() + ((37 / 16) * 4 + 5 / 8) * 4, 4);
  std::memcpy(&scale, sc->bytes.data() + ((37 / 16) * 32 + 5) * 4, 4);
  const float q = float((word >> (4 * (37 % 8))) & 0xF), zero = float(((zword >> (4 * (5 % 8))) & 0xF) + 1);
  EXPECT_EQ(d[5 * 64 + 37], (q - zero) * scale);
  // Permuted q rows go through their dequantized values.
  const LayerWeights permuted = def.load_layer(m.weights, 0, WeightTransforms{true});
  EXPECT_EQ(permuted.q.format, LinearFormat::dense(DType::F32));
  EXPECT_EQ(permuted.v.format.kind, LinearFormat::Kind::Int4Grouped);
}

}  // namespace
}  // namespace serval
