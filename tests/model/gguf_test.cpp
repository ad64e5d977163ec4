// GGUF reader and writer: the shared test models, round trips of every metadata
// and tensor type, and malformed files (each must fail with a clear message).
#include <cmath>
#include <cstring>
#include <fstream>

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
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  for (DType t : types) {
    bufs.push_back(testing::random_tensor_bytes(t, {3, 64}, 7));
    w.add_tensor(std::string(dtype_name(t)), t, {3, 64}, bufs.back().data(), int64_t(bufs.back().size()));
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
  for (size_t i = 0; i < 5; ++i) {
    const GgufTensorInfo* t = f->find_tensor(std::string(dtype_name(types[i])));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->offset % 64, 0u);
    EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 64}));
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
  expect_error([] { dtype_from_ggml(14, "w"); },
               {"tensor \"w\" has type Q6_K", "not support", "F32, F16, BF16, Q8_0, Q4_0"});
}

TEST(GgufModel, QuantizedWeightsAreReadable) {
  ScratchDir dir;
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    const ModelConfig c = testing::tiny_config();
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
    EXPECT_NEAR(rms, 0.5, 0.1);  // written from N(0, 0.5) floats
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

// --- malformed files --------------------------------------------------------

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::shared_ptr<GgufFile> parse_bytes(const std::vector<uint8_t>& b) { return GgufFile::parse(b.data(), b.size(), "test"); }

TEST(GgufBadFiles, TruncatedAtEveryOffset) {
  ScratchDir dir;
  const std::string path = dir.file("tiny.gguf");
  testing::write_tiny_gguf(path, testing::tiny_config());
  const std::vector<uint8_t> full = read_bytes(path);
  ASSERT_NO_THROW(parse_bytes(full));
  size_t checked = 0;
  for (size_t len = 0; len < full.size(); len += (len < 4096 ? 1 : 97)) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + len);
    try {
      parse_bytes(cut);
      ADD_FAILURE() << "truncation to " << len << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << len << ": " << e.what();
    }
    ++checked;
  }
  EXPECT_GT(checked, 1000u);
  // Through the file path too: open() names the file.
  std::ofstream(dir.file("cut.gguf"), std::ios::binary).write(reinterpret_cast<const char*>(full.data()), 1000);
  expect_error([&] { load_model(dir.file("cut.gguf")); }, {"cut.gguf", "truncated"});
}

TEST(GgufBadFiles, WrongMagicVersionAndEndianness) {
  ScratchDir dir;
  const std::string path = dir.file("tiny.gguf");
  testing::write_tiny_gguf(path, testing::tiny_config());
  const std::vector<uint8_t> good = read_bytes(path);

  std::vector<uint8_t> b = good;
  std::memcpy(b.data(), "GGML", 4);
  expect_error([&] { parse_bytes(b); }, {"not a GGUF file", "magic"});

  b = good;
  b[4] = 1;
  expect_error([&] { parse_bytes(b); }, {"GGUF version 1 is not supported", "2 and 3"});

  b = good;
  b[4] = 4;
  expect_error([&] { parse_bytes(b); }, {"unsupported GGUF version 4"});

  b = good;
  const uint32_t be3 = 0x03000000;  // version 3 written big-endian
  std::memcpy(b.data() + 4, &be3, 4);
  expect_error([&] { parse_bytes(b); }, {"big-endian", "not supported"});

  expect_error([&] { parse_bytes({}); }, {"truncated"});
  expect_error([&] { load_model(dir.file("missing.gguf")); }, {"missing.gguf", "does not exist"});
}

TEST(GgufBadFiles, UnsupportedTensorTypeFailsAtLoadNamingTheType) {
  ScratchDir dir;
  ModelConfig c = testing::tiny_config();
  c.hidden_size = 256;  // rows of whole Q4_K blocks
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_dim = 64;
  testing::TinyGguf g;
  testing::fill_tiny_gguf(g, c);
  // The same model with blk.1.attn_q.weight stored as Q4_K.
  testing::TinyGguf g2;
  {
    const std::string a = "llama";
    g2.writer.set_string("general.architecture", a);
    g2.writer.set_u32(a + ".context_length", 128);
    g2.writer.set_u32(a + ".embedding_length", 256);
    g2.writer.set_u32(a + ".feed_forward_length", uint32_t(c.intermediate_size));
    g2.writer.set_u32(a + ".block_count", uint32_t(c.num_layers));
    g2.writer.set_u32(a + ".attention.head_count", 4);
    g2.writer.set_u32(a + ".attention.head_count_kv", 2);
    uint32_t seed = 1;
    for (const TensorSpec& e : ModelDef::of(c).tensors()) {
      if (e.name == "blk.1.attn_q.weight") {
        g2.buffers.emplace_back(size_t(e.shape[0] * 144), 0);
        g2.writer.add_tensor_raw(e.name, uint32_t(GgmlType::Q4_K), e.shape, g2.buffers.back().data(),
                                 int64_t(g2.buffers.back().size()));
      } else {
        g2.add(e.name, DType::F32, e.shape, seed++);
      }
    }
  }
  const std::string path = dir.file("q4k.gguf");
  g2.writer.write(path);
  EXPECT_NO_THROW(GgufFile::open(path));  // the file itself is well-formed
  expect_error([&] { load_model(path); },
               {"q4k.gguf", "tensor \"blk.1.attn_q.weight\" has type Q4_K", "not support"});

  // An unsupported tensor the model does not use is skipped.
  std::vector<uint8_t> extra(144, 0);
  g.writer.add_tensor_raw("extra.q4k", uint32_t(GgmlType::Q4_K), {1, 256}, extra.data(), 144);
  g.writer.write(dir.file("extra.gguf"));
  LoadedModel m = load_model(dir.file("extra.gguf"));
  EXPECT_EQ(m.weights.find("extra.q4k"), nullptr);
}

TEST(GgufBadFiles, ShapeMismatchNamesTensorAndShapes) {
  ScratchDir dir;
  const ModelConfig c = testing::tiny_config();
  testing::TinyGguf g;
  testing::fill_tiny_gguf(g, c);
  // Claim a larger FFN than the tensors have.
  g.writer.set_u32("llama.feed_forward_length", 96);
  g.writer.write(dir.file("mismatch.gguf"));
  expect_error([&] { load_model(dir.file("mismatch.gguf")); },
               {"mismatch.gguf", "tensor \"blk.0.ffn_gate.weight\" has shape [64, 32], expected [96, 32]"});
}

TEST(GgufBadFiles, MissingTensor) {
  ScratchDir dir;
  ModelConfig c = testing::tiny_config();
  testing::TinyGguf g;
  testing::fill_tiny_gguf(g, c);
  g.writer.set_u32("llama.block_count", 3);
  g.writer.write(dir.file("missing.gguf"));
  expect_error([&] { load_model(dir.file("missing.gguf")); }, {"missing tensor \"blk.2.attn_norm.weight\""});
}

TEST(GgufBadFiles, UnknownArchitecture) {
  ScratchDir dir;
  testing::TinyGguf g;
  testing::fill_tiny_gguf(g, testing::tiny_config());
  g.writer.set_string("general.architecture", "gpt2");
  g.writer.write(dir.file("gpt2.gguf"));
  expect_error([&] { load_model(dir.file("gpt2.gguf")); },
               {"architecture \"gpt2\" is not supported (supported: llama, mistral, qwen2, qwen3)"});
}

// Hand-built headers for cases the writer refuses to produce.
struct RawGguf {
  std::vector<uint8_t> b;
  template <typename T>
  void put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  RawGguf(uint64_t n_tensors, uint64_t n_kv) {
    b = {'G', 'G', 'U', 'F'};
    put<uint32_t>(3);
    put<uint64_t>(n_tensors);
    put<uint64_t>(n_kv);
  }
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name);
    put<uint32_t>(uint32_t(ne.size()));
    for (uint64_t d : ne) put<uint64_t>(d);
    put<uint32_t>(type);
    put<uint64_t>(offset);
  }
  void pad_and_data(size_t data_bytes) {
    while (b.size() % 32) b.push_back(0);
    b.resize(b.size() + data_bytes, 0);
  }
};

TEST(GgufBadFiles, HostileHeaders) {
  {
    RawGguf r(0, 1);
    r.str("k");
    r.put<uint32_t>(uint32_t(GgufType::STRING));
    r.put<uint64_t>(~0ull);  // string length far past the end
    expect_error([&] { parse_bytes(r.b); }, {"truncated", "string value"});
  }
  {
    RawGguf r(0, 1);
    r.str("k");
    r.put<uint32_t>(uint32_t(GgufType::ARRAY));
    r.put<uint32_t>(uint32_t(GgufType::UINT64));
    r.put<uint64_t>(1ull << 60);  // absurd element count
    expect_error([&] { parse_bytes(r.b); }, {"array \"k\"", "claims"});
  }
  {
    RawGguf r(0, 1);
    r.str("k");
    r.put<uint32_t>(77);  // unknown value type
    expect_error([&] { parse_bytes(r.b); }, {"key \"k\" has unknown value type 77"});
  }
  {
    RawGguf r(0, 2);
    for (int i = 0; i < 2; ++i) {
      r.str("dup");
      r.put<uint32_t>(uint32_t(GgufType::UINT8));
      r.put<uint8_t>(1);
    }
    expect_error([&] { parse_bytes(r.b); }, {"duplicate metadata key \"dup\""});
  }
  {
    RawGguf r(0, 1);
    r.str("general.alignment");
    r.put<uint32_t>(uint32_t(GgufType::UINT32));
    r.put<uint32_t>(3);
    expect_error([&] { parse_bytes(r.b); }, {"general.alignment", "power of two"});
  }
  {
    RawGguf r(1ull << 40, 0);
    expect_error([&] { parse_bytes(r.b); }, {"tensor count", "claims"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {0, 4}, 0, 0);
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" has an invalid dimension 0: 0"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {1ull << 32, 1ull << 32, 1ull << 32}, 0, 0);
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\"", "overflow"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {(1ull << 62) + 4}, 0, 0);  // element count fits, byte count does not (fuzzer find)
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" is too large"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {1, 1, 1, 1, 1}, 0, 0);
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" has 5 dimensions"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {4}, 31, 0);  // removed Q4_0_4_4
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" has unknown ggml type id 31"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {31}, uint32_t(GgmlType::Q8_0), 0);  // row not a whole block
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" of type Q8_0", "block size 32"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {4}, 0, 8);  // misaligned
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" has offset 8, not a multiple of the alignment 32"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {64}, 0, 0);  // 256 bytes, only 64 present
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"truncated", "tensor \"t\""});
  }
  {
    RawGguf r(2, 0);
    r.tensor("a", {16}, 0, 0);
    r.tensor("b", {16}, 0, 32);  // a spans 0..64
    r.pad_and_data(128);
    expect_error([&] { parse_bytes(r.b); }, {"tensors \"a\" and \"b\" overlap"});
  }
  {
    RawGguf r(2, 0);
    r.tensor("a", {8}, 0, 0);
    r.tensor("a", {8}, 0, 32);
    r.pad_and_data(64);
    expect_error([&] { parse_bytes(r.b); }, {"duplicate tensor \"a\""});
  }
  {
    // Nested arrays deeper than any real metadata.
    RawGguf r(0, 1);
    r.str("deep");
    r.put<uint32_t>(uint32_t(GgufType::ARRAY));
    for (int i = 0; i < 20; ++i) {
      r.put<uint32_t>(uint32_t(GgufType::ARRAY));
      r.put<uint64_t>(1);
    }
    r.put<uint32_t>(uint32_t(GgufType::UINT8));
    r.put<uint64_t>(0);
    expect_error([&] { parse_bytes(r.b); }, {"key \"deep\" nests arrays deeper than"});
  }
}

}  // namespace
}  // namespace serval
