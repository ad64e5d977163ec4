// safetensors reader: round trips through the writer, and malformed headers.
#include <cstring>
#include <fstream>

#include "model/safetensors.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;
using testing::ScratchDir;

TEST(Safetensors, RoundTrip) {
  ScratchDir dir;
  std::vector<SafetensorsWriteTensor> ts = {
      {"a.f32", "F32", {2, 3}, testing::random_tensor_bytes(DType::F32, {2, 3}, 1)},
      {"b.f16", "F16", {4}, testing::random_tensor_bytes(DType::F16, {4}, 2)},
      {"c.bf16", "BF16", {1, 2, 2}, testing::random_tensor_bytes(DType::BF16, {1, 2, 2}, 3)},
      {"d.i64", "I64", {2}, std::vector<uint8_t>(16, 9)},
      {"e.empty", "F32", {0, 5}, {}},
  };
  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, ts, {{"format", "pt"}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->tensors().size(), ts.size());
  for (const auto& w : ts) {
    const SafetensorsTensor* t = f->find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->shape, w.shape);
    ASSERT_EQ(t->nbytes, int64_t(w.bytes.size()));
    if (t->nbytes) {
      EXPECT_EQ(std::memcmp(t->data, w.bytes.data(), w.bytes.size()), 0);
    }
  }
  EXPECT_EQ(dtype_from_safetensors("BF16", "x"), DType::BF16);
  expect_error([] { dtype_from_safetensors("I64", "d.i64"); },
               {"tensor \"d.i64\" has dtype I64", "not support", "F32, F16, BF16"});
}

std::vector<uint8_t> image(const std::string& header, size_t data_bytes, int64_t claimed_len = -1) {
  // Sized once and copied into (GCC 12 warns, -Warray-bounds, on inserting after the length).
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0);
  const uint64_t n = claimed_len < 0 ? header.size() : uint64_t(claimed_len);
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

void expect_bad(const std::vector<uint8_t>& b, std::initializer_list<std::string> pieces) {
  expect_error([&] { SafetensorsFile::parse(b.data(), b.size(), "bad.safetensors"); }, pieces);
}

TEST(Safetensors, BadHeaders) {
  expect_bad({1, 2, 3}, {"bad.safetensors", "truncated"});
  expect_bad(image("{}", 0, 1000), {"truncated", "header claims 1000 bytes"});
  expect_bad(image("{\"a\": ", 0), {"not valid JSON"});
  expect_bad(image("[1, 2]", 0), {"must be a JSON object"});
  expect_bad(image(R"({"a": 3})", 0), {"tensor \"a\" must be a JSON object"});
  expect_bad(image(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4), {"tensor \"a\" has no dtype"});
  expect_bad(image(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), {"tensor \"a\" has no shape"});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [1]}})", 4), {"tensor \"a\" needs data_offsets"});
  expect_bad(image(R"({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}})", 4),
             {"tensor \"a\" has unknown dtype \"Q9\""});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
             {"tensor \"a\" dimension", "non-negative"});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8),
             {"tensor \"a\" (F32 [2]) needs 2 x 4 bytes", "span 4"});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8),
             {"truncated", "tensor \"a\" ends at data offset 16", "8 bytes"});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8), {"end before begin"});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
             {"tensors \"a\" and \"b\" overlap"});
  expect_bad(image(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296],
                       "data_offsets": [0, 4]}})", 4),
             {"tensor \"a\" has too many elements"});
  expect_bad(image(R"({"__metadata__": {"k": 1}})", 0), {"__metadata__ value \"k\" must be a string"});
}

TEST(Safetensors, TruncatedFileOnDisk) {
  ScratchDir dir;
  const ModelConfig c = testing::tiny_config();
  testing::write_hf_safetensors(dir.file("full.safetensors"), c, testing::hf_config_json("LlamaForCausalLM", c), "F32");
  std::ifstream in(dir.file("full.safetensors"), std::ios::binary);
  std::vector<char> b{std::istreambuf_iterator<char>(in), {}};
  for (size_t len : {size_t(0), size_t(5), size_t(100), b.size() / 2, b.size() - 1}) {
    std::ofstream(dir.file("cut.safetensors"), std::ios::binary | std::ios::trunc).write(b.data(), std::streamsize(len));
    expect_error([&] { SafetensorsFile::open(dir.file("cut.safetensors")); },
                 {len == 0 ? "is empty" : "truncated"});
  }
}

}  // namespace
}  // namespace serval
