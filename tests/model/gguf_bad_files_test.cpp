// Malformed GGUF files: truncations, wrong headers, unsupported types, shape
// mismatches and hostile sizes each fail with a clear message, never a crash.
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
  c.hidden_size = 256;  // rows of whole IQ4_XS blocks
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_dim = 64;
  testing::TinyGguf g;
  testing::fill_tiny_gguf(g, c);
  // The same model with blk.1.attn_q.weight stored as IQ4_XS (136 bytes per 256).
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
        g2.buffers.emplace_back(size_t(e.shape[0] * 136), 0);
        g2.writer.add_tensor_raw(e.name, uint32_t(GgmlType::IQ4_XS), e.shape, g2.buffers.back().data(),
                                 int64_t(g2.buffers.back().size()));
      } else {
        g2.add(e.name, DType::F32, e.shape, seed++);
      }
    }
  }
  const std::string path = dir.file("iq4xs.gguf");
  g2.writer.write(path);
  EXPECT_NO_THROW(GgufFile::open(path));  // the file itself is well-formed
  expect_error([&] { load_model(path); },
               {"iq4xs.gguf", "tensor \"blk.1.attn_q.weight\" has type IQ4_XS", "not support"});

  // An unsupported tensor the model does not use is skipped; a supported one is kept.
  std::vector<uint8_t> extra(144, 0);
  g.writer.add_tensor_raw("extra.iq4xs", uint32_t(GgmlType::IQ4_XS), {1, 256}, extra.data(), 136);
  g.writer.add_tensor_raw("extra.q4k", uint32_t(GgmlType::Q4_K), {1, 256}, extra.data(), 144);
  g.writer.write(dir.file("extra.gguf"));
  LoadedModel m = load_model(dir.file("extra.gguf"));
  EXPECT_EQ(m.weights.find("extra.iq4xs"), nullptr);
  ASSERT_NE(m.weights.find("extra.q4k"), nullptr);
  EXPECT_EQ(m.weights.find("extra.q4k")->dtype, DType::Q4_K);
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
    r.tensor("t", {128, 2}, uint32_t(GgmlType::Q4_K), 0);  // rows of half a super-block
    r.pad_and_data(256);
    expect_error([&] { parse_bytes(r.b); }, {"tensor \"t\" of type Q4_K", "block size 256"});
  }
  {
    RawGguf r(1, 0);
    r.tensor("t", {256, 2}, uint32_t(GgmlType::Q6_K), 0);  // 420 bytes, only 400 present
    r.pad_and_data(400);
    expect_error([&] { parse_bytes(r.b); }, {"truncated", "tensor \"t\""});
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
