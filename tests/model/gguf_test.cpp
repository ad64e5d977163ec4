// GGUF reader and writer: the shared test models, round trips of every metadata
// and tensor type, config flags (malformed files: gguf_bad_files_test.cpp).
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/mapped_file.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;
using testing::ScratchDir;

TEST(GgufRead, Stories260KHeaderAndConfig) {
  const std::string path = testing::shared_model("stories260K/stories260K.gguf");
  SERVAL_REQUIRE_MODEL(path);
  auto f = GgufFile::open(path);
  // Values from shared/models/PROVENANCE.md.
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), 8);
  EXPECT_FLOAT_EQ(float(f->get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f->get_int("llama.context_length"), 2048);
  EXPECT_FALSE(f->has("llama.rope.freq_base"));
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f->get_int("tokenizer.ggml.unknown_token_id"), 0);

  const GgufTensorInfo* embd = f->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->shape(), (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(embd->ggml_type, uint32_t(GgmlType::F32));
  EXPECT_EQ(f->find_tensor("blk.4.attn_k.weight")->shape(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->shape(), (std::vector<int64_t>{64, 172}));
  // output.weight is a byte-equal copy of token_embd.
  const GgufTensorInfo* out = f->find_tensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(std::memcmp(out->data, embd->data, size_t(embd->nbytes)), 0);

  const ModelConfig c = config_from_gguf(*f);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_dim, 8);
  EXPECT_EQ(c.max_position, 2048);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_style, RopeStyle::Interleaved);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::None);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);

  LoadedModel m = load_model(path);
  EXPECT_EQ(m.format, "gguf");
  EXPECT_EQ(m.weights.size(), 48u);
  const TensorView& q = m.weights.get("blk.0.attn_q.weight", {64, 64});
  EXPECT_EQ(q.dtype, DType::F32);
  EXPECT_EQ(q.nbytes, 64 * 64 * 4);
}

TEST(GgufRead, TinyRandomLlama2HasF16Tensors) {
  const std::string path = testing::shared_model("llama-2-tiny-random/llama-2-tiny-random.gguf");
  SERVAL_REQUIRE_MODEL(path);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 12u);
  EXPECT_EQ(f->metadata().size(), 18u);
  EXPECT_EQ(f->get_string("general.name"), "LLaMA v2");
  EXPECT_EQ(f->get_int("general.file_type"), 1);
  // The tensor data ends exactly at the end of the file.
  uint64_t end = 0;
  for (const auto& t : f->tensors()) end = std::max(end, f->data_offset() + t.offset + uint64_t(t.nbytes));
  EXPECT_EQ(end, f->file_size());

  LoadedModel m = load_model(path);
  EXPECT_EQ(m.config.vocab_size, 32000);
  EXPECT_EQ(m.config.hidden_size, 8);
  EXPECT_EQ(m.config.head_dim, 4);
  EXPECT_EQ(m.config.max_position, 4096);
  const TensorView& embd = m.weights.get("token_embd.weight", {32000, 8});
  EXPECT_EQ(embd.dtype, DType::F16);
  EXPECT_EQ(m.weights.get("blk.0.ffn_down.weight", {8, 32}).dtype, DType::F16);
  EXPECT_EQ(m.weights.get("blk.0.attn_norm.weight", {8}).dtype, DType::F32);
  // F16 values decode to finite numbers.
  std::vector<float> row(8);
  to_f32(DType::F16, embd.data, row.data(), 8);
  for (float x : row) EXPECT_TRUE(std::isfinite(x));
}

GgufValue array_of(GgufType elem) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.elem_type = elem;
  return v;
}

TEST(GgufWriteRead, RoundTripsEveryMetadataType) {
  ScratchDir dir;
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w;
    w.set_version(version);
    w.set_u8("u8", 250);
    w.set_i8("i8", -120);
    w.set_u16("u16", 65000);
    w.set_i16("i16", -32000);
    w.set_u32("u32", 4000000000u);
    w.set_i32("i32", -2000000000);
    w.set_u64("u64", 18000000000000000000ull);
    w.set_i64("i64", -9000000000000000000ll);
    w.set_f32("f32", 1.5f);
    w.set_f64("f64", 3.141592653589793);
    w.set_bool("bool", true);
    w.set_string("str", "h\xc3\xa9llo\n\0x");
    w.set_string("empty", "");
    w.set_string_array("strs", {"a", "", "\xe2\x96\x81the"});
    w.set_f32_array("f32s", {0.5f, -2.25f});
    w.set_i32_array("i32s", {1, -2, 3});
    const GgufType int_types[] = {GgufType::UINT8, GgufType::INT8, GgufType::UINT16, GgufType::INT16,
                                  GgufType::UINT32, GgufType::INT32, GgufType::UINT64, GgufType::INT64,
                                  GgufType::BOOL};
    for (GgufType t : int_types) {
      GgufValue a = array_of(t);
      a.ints = {0, 1, t == GgufType::BOOL ? 0 : 100};
      w.set_value(std::string("arr.") + std::string(gguf_type_name(t)), a);
    }
    GgufValue f64s = array_of(GgufType::FLOAT64);
    f64s.nums = {1e300, -0.1};
    w.set_value("f64s", f64s);
    GgufValue nested = array_of(GgufType::ARRAY);
    GgufValue inner1 = array_of(GgufType::STRING);
    inner1.strs = {"x", "y"};
    GgufValue inner2 = array_of(GgufType::INT32);
    inner2.ints = {7};
    GgufValue inner3 = array_of(GgufType::ARRAY);  // array of (empty) arrays
    inner3.arrays = {array_of(GgufType::FLOAT32)};
    nested.arrays = {inner1, inner2, inner3};
    w.set_value("nested", nested);
    w.set_value("empty_arr", array_of(GgufType::UINT32));
    const std::string path = dir.file("meta" + std::to_string(version) + ".gguf");
    w.write(path);

    auto f = GgufFile::open(path);
    EXPECT_EQ(f->version(), version);
    EXPECT_EQ(f->metadata().size(), 28u);
    EXPECT_EQ(f->find("u8")->type, GgufType::UINT8);
    EXPECT_EQ(f->get_int("u8"), 250);
    EXPECT_EQ(f->get_int("i8"), -120);
    EXPECT_EQ(f->get_int("u16"), 65000);
    EXPECT_EQ(f->get_int("i16"), -32000);
    EXPECT_EQ(f->get_int("u32"), 4000000000ll);
    EXPECT_EQ(f->get_int("i32"), -2000000000);
    EXPECT_EQ(f->find("u64")->u, 18000000000000000000ull);
    EXPECT_EQ(f->get_int("i64"), -9000000000000000000ll);
    EXPECT_EQ(f->get_float("f32"), 1.5);
    EXPECT_EQ(f->get_float("f64"), 3.141592653589793);
    EXPECT_TRUE(f->get_bool("bool", false));
    EXPECT_EQ(f->get_string("str"), std::string("h\xc3\xa9llo\n"));  // the literal stops at \0
    EXPECT_EQ(f->get_string("empty"), "");
    EXPECT_EQ(f->get_string_array("strs"), (std::vector<std::string>{"a", "", "\xe2\x96\x81the"}));
    EXPECT_EQ(f->get_float_array("f32s"), (std::vector<double>{0.5, -2.25}));
    EXPECT_EQ(f->get_int_array("i32s"), (std::vector<int64_t>{1, -2, 3}));
    for (GgufType t : int_types) {
      const GgufValue* a = f->find(std::string("arr.") + std::string(gguf_type_name(t)));
      ASSERT_NE(a, nullptr);
      EXPECT_EQ(a->elem_type, t);
      EXPECT_EQ(a->ints, (std::vector<int64_t>{0, 1, t == GgufType::BOOL ? 0 : 100}));
    }
    EXPECT_EQ(f->get_float_array("f64s"), (std::vector<double>{1e300, -0.1}));
    const GgufValue* n = f->find("nested");
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->array_size(), 3u);
    EXPECT_EQ(n->arrays[0].strs, (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(n->arrays[1].ints, (std::vector<int64_t>{7}));
    ASSERT_EQ(n->arrays[2].arrays.size(), 1u);
    EXPECT_EQ(n->arrays[2].arrays[0].elem_type, GgufType::FLOAT32);
    EXPECT_EQ(f->find("empty_arr")->array_size(), 0u);
    // Typed getters name the key when the type is wrong or the key is missing.
    expect_error([&] { f->get_string("u8"); }, {"\"u8\"", "string", "UINT8"});
    expect_error([&] { f->get_int("nope"); }, {"missing metadata key \"nope\""});
    EXPECT_EQ(f->get_int("nope", 42), 42);
  }
}

TEST(GgufWriteRead, RoundTripsEveryTensorType) {
  ScratchDir dir;
  GgufWriter w;
  w.set_alignment(64);
  std::vector<std::vector<uint8_t>> bufs;
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                         DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types) {
    bufs.push_back(testing::random_tensor_bytes(t, {3, 256}, 7));
    w.add_tensor(std::string(dtype_name(t)), t, {3, 256}, bufs.back().data(), int64_t(bufs.back().size()));
  }
  std::vector<uint8_t> q4k(2 * 144, 0x5a);  // 2 rows of one Q4_K block each
  w.add_tensor_raw("q4k", uint32_t(GgmlType::Q4_K), {2, 256}, q4k.data(), int64_t(q4k.size()));
  w.add_tensor_generated("gen", DType::F32, {5}, [](void* dst, int64_t nbytes) {
    float* p = static_cast<float*>(dst);
    for (int64_t i = 0; i < nbytes / 4; ++i) p[i] = float(i);
  });
  const std::string path = dir.file("tensors.gguf");
  w.write(path);

  auto f = GgufFile::open(path);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  for (size_t i = 0; i < std::size(types); ++i) {
    const GgufTensorInfo* t = f->find_tensor(std::string(dtype_name(types[i])));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->offset % 64, 0u);
    EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 256}));
    EXPECT_EQ(ggml_type_name(t->ggml_type), ggml_type_name(ggml_from_dtype(types[i])));
    EXPECT_EQ(dtype_from_ggml(t->ggml_type, t->name), types[i]);
    ASSERT_EQ(t->nbytes, int64_t(bufs[i].size()));
    EXPECT_EQ(std::memcmp(t->data, bufs[i].data(), bufs[i].size()), 0);
  }
  const GgufTensorInfo* k = f->find_tensor("q4k");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(ggml_type_name(k->ggml_type), "Q4_K");
  EXPECT_EQ(k->nbytes, 288);
  EXPECT_EQ(std::memcmp(k->data, q4k.data(), q4k.size()), 0);
  const float* g = reinterpret_cast<const float*>(f->find_tensor("gen")->data);
  EXPECT_EQ(g[4], 4.0f);
}

TEST(GgufTypes, NamesFollowLlamaCpp) {
  EXPECT_EQ(ggml_type_name(0), "F32");
  EXPECT_EQ(ggml_type_name(8), "Q8_0");
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(ggml_type_name(16), "IQ2_XXS");
  EXPECT_EQ(ggml_type_name(23), "IQ4_XS");
  EXPECT_EQ(ggml_type_name(28), "F64");
  EXPECT_EQ(ggml_type_name(29), "IQ1_M");
  EXPECT_EQ(ggml_type_name(30), "BF16");
  EXPECT_EQ(ggml_type_name(34), "TQ1_0");
  EXPECT_EQ(ggml_type_name(35), "TQ2_0");
  EXPECT_EQ(ggml_type_name(39), "MXFP4");
  EXPECT_EQ(ggml_type_name(4), "type 4");  // removed Q4_2
  expect_error([] { dtype_from_ggml(23, "w"); },
               {"tensor \"w\" has type IQ4_XS", "not support",
                "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"});
  // The block types map both ways under llama.cpp's ids.
  const std::pair<uint32_t, DType> ids[] = {{3, DType::Q4_1},  {6, DType::Q5_0},  {7, DType::Q5_1},
                                            {10, DType::Q2_K}, {11, DType::Q3_K}, {12, DType::Q4_K},
                                            {13, DType::Q5_K}, {14, DType::Q6_K}};
  for (auto [id, t] : ids) {
    EXPECT_EQ(dtype_from_ggml(id, "w"), t) << id;
    EXPECT_EQ(ggml_from_dtype(t), id) << dtype_name(t);
    EXPECT_EQ(ggml_type_traits(id)->block_elems, dtype_block_elems(t)) << id;
    EXPECT_EQ(ggml_type_traits(id)->block_bytes, dtype_block_bytes(t)) << id;
  }
}

TEST(GgufModel, QuantizedWeightsAreReadable) {
  ScratchDir dir;
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    ModelConfig c = testing::tiny_config();
    if (dtype_block_elems(t) == 256) {  // every matrix's rows whole super-blocks
      c.hidden_size = 256;
      c.intermediate_size = 256;
      c.head_dim = 64;
      c.rope_dim = 64;
    }
    const std::string path = dir.file(std::string(dtype_name(t)) + ".gguf");
    testing::write_tiny_gguf(path, c, t);
    LoadedModel m = load_model(path);
    const TensorView& q = m.weights.get("blk.1.attn_q.weight", {c.q_dim(), c.hidden_size});
    EXPECT_EQ(q.dtype, t);
    EXPECT_EQ(q.nbytes, dtype_bytes(t, q.numel()));
    // The blocks dequantize to the values they were made from (within quantization error).
    std::vector<float> deq(size_t(q.numel()));
    to_f32(t, q.data, deq.data(), q.numel());
    double sumsq = 0;
    for (float x : deq) sumsq += double(x) * x;
    const double rms = std::sqrt(sumsq / double(deq.size()));
    // Written from N(0, 0.5) floats; Q2_K's 4 levels lose a little more.
    EXPECT_NEAR(rms, 0.5, t == DType::Q2_K ? 0.15 : 0.1) << dtype_name(t);
  }
}

TEST(GgufModel, ConfigFlagsFromTensorsAndKeys) {
  ScratchDir dir;
  {
    ModelConfig c = testing::tiny_config("qwen2");
    c.tie_word_embeddings = true;
    const std::string path = dir.file("qwen2.gguf");
    testing::write_tiny_gguf(path, c);
    LoadedModel m = load_model(path);
    EXPECT_EQ(m.config.architecture, "qwen2");
    EXPECT_EQ(m.config.rope_style, RopeStyle::Neox);
    EXPECT_TRUE(m.config.attention_bias);
    EXPECT_FALSE(m.config.qk_norm);
    EXPECT_TRUE(m.config.tie_word_embeddings);
    EXPECT_EQ(m.weights.find("output.weight"), nullptr);
    m.weights.get("blk.1.attn_k.bias", {c.kv_dim()});
  }
  {
    ModelConfig c = testing::tiny_config("qwen3");
    c.head_dim = 16;  // != hidden / heads, as in Qwen3
    c.rope_dim = 16;
    testing::TinyGguf g;
    testing::fill_tiny_gguf(g, c);
    g.writer.set_u32("qwen3.attention.key_length", 16);
    const std::string path = dir.file("qwen3.gguf");
    g.writer.write(path);
    LoadedModel m = load_model(path);
    EXPECT_TRUE(m.config.qk_norm);
    EXPECT_FALSE(m.config.attention_bias);
    EXPECT_EQ(m.config.head_dim, 16);
    EXPECT_EQ(m.config.q_dim(), 64);
    m.weights.get("blk.0.attn_q_norm.weight", {16});
  }
  {
    // llama3 rope scaling: llama.cpp's rope_freqs.weight plus our own keys.
    ModelConfig c = testing::tiny_config("llama");
    testing::TinyGguf g;
    testing::fill_tiny_gguf(g, c);
    g.writer.set_f32("llama.rope.scaling.factor", 8.0f);
    g.writer.set_u32("llama.rope.scaling.original_context_length", 8192);
    g.writer.set_f32("serval.rope.scaling.low_freq_factor", 1.0f);
    g.writer.set_f32("serval.rope.scaling.high_freq_factor", 4.0f);
    g.add("rope_freqs.weight", DType::F32, {c.rope_dim / 2}, 99);
    const std::string path = dir.file("llama3.gguf");
    g.writer.write(path);
    LoadedModel m = load_model(path);
    EXPECT_EQ(m.config.rope_scaling.type, RopeScaling::Type::Llama3);
    EXPECT_EQ(m.config.rope_scaling.factor, 8.0f);
    EXPECT_EQ(m.config.rope_scaling.original_max_position, 8192);
    EXPECT_EQ(m.config.rope_scaling.high_freq_factor, 4.0f);
    EXPECT_NE(m.weights.find("rope_freqs.weight"), nullptr);
  }
  {
    ModelConfig c = testing::tiny_config("llama");
    testing::TinyGguf g;
    testing::fill_tiny_gguf(g, c);
    g.writer.set_string("llama.rope.scaling.type", "linear");
    g.writer.set_f32("llama.rope.scaling.factor", 2.0f);
    const std::string path = dir.file("linear.gguf");
    g.writer.write(path);
    LoadedModel m = load_model(path);
    EXPECT_EQ(m.config.rope_scaling.type, RopeScaling::Type::Linear);
    EXPECT_EQ(m.config.rope_scaling.factor, 2.0f);
  }
}

}  // namespace
}  // namespace serval
