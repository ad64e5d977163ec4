// llama2.c checkpoint and tokenizer readers, checked against the GGUF that
// llama.cpp's converter made from the same stories260K checkpoint.
#include <cstring>
#include <fstream>

#include "model/gguf.h"
#include "model/llama2c.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;

TEST(Llama2c, Stories260KWeightsEqualTheGguf) {
  const std::string bin = testing::shared_model("stories260K/stories260K.bin");
  const std::string gguf = testing::shared_model("stories260K/stories260K.gguf");
  SERVAL_REQUIRE_MODEL(bin);
  SERVAL_REQUIRE_MODEL(gguf);
  LoadedModel m = load_model(bin);
  EXPECT_EQ(m.format, "llama2c");
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position, 512);
  EXPECT_EQ(c.rope_style, RopeStyle::Interleaved);
  EXPECT_TRUE(c.tie_word_embeddings);  // positive vocab_size in the header

  auto g = GgufFile::open(gguf);
  size_t compared = 0;
  for (const auto& [name, view] : m.weights.all()) {
    const GgufTensorInfo* t = g->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape(), view.shape) << name;
    ASSERT_EQ(t->nbytes, view.nbytes) << name;
    EXPECT_EQ(std::memcmp(t->data, view.data, size_t(view.nbytes)), 0) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 47u);  // all GGUF tensors but the separate output.weight copy
}

TEST(Llama2c, Tok512Tokenizer) {
  const std::string path = testing::shared_model("stories260K/tok512.bin");
  SERVAL_REQUIRE_MODEL(path);
  const Llama2cVocab v = read_llama2c_tokenizer(path);
  // Layout from PROVENANCE.md.
  EXPECT_EQ(v.max_token_length, 7);
  ASSERT_EQ(v.pieces.size(), 512u);
  EXPECT_EQ(v.pieces[0], "<unk>");
  EXPECT_EQ(v.pieces[1], "\n<s>\n");
  EXPECT_EQ(v.pieces[2], "\n</s>\n");
  EXPECT_EQ(v.pieces[3], "<0x00>");
  EXPECT_EQ(v.pieces[258], "<0xFF>");
  EXPECT_EQ(v.pieces[259], " t");
  EXPECT_EQ(v.pieces[317], " Lily");
}

TEST(Llama2c, BadFiles) {
  testing::ScratchDir dir;
  const std::string bin = testing::shared_model("stories260K/stories260K.bin");
  SERVAL_REQUIRE_MODEL(bin);
  std::ifstream in(bin, std::ios::binary);
  std::vector<char> b{std::istreambuf_iterator<char>(in), {}};
  std::ofstream(dir.file("cut.bin"), std::ios::binary).write(b.data(), 50000);
  expect_error([&] { load_model(dir.file("cut.bin")); }, {"cut.bin", "truncated"});
  std::vector<char> bad = b;
  const int32_t zero = 0;
  std::memcpy(bad.data() + 12, &zero, 4);  // n_heads = 0
  std::ofstream(dir.file("bad.bin"), std::ios::binary).write(bad.data(), std::streamsize(bad.size()));
  expect_error([&] { load_model(dir.file("bad.bin")); }, {"header field 3 = 0 is out of range"});
  std::ofstream(dir.file("tok.bin"), std::ios::binary).write("\x07\0\0\0\0\0\0\0\x50\0\0\0ab", 14);
  expect_error([&] { read_llama2c_tokenizer(dir.file("tok.bin")); }, {"token 0 has length 80"});
}

}  // namespace
}  // namespace serval
