// serval quantize (model/quantize.h) on stories260K: every matrix in the type
// asked for, or the wider type its width needs (its FFN is 172 wide), each
// row exactly from_f32 of the source's row; metadata and the other tensors as
// they were; clear errors for a type that is not a block type and for a model
// that is already quantized.
#include "model/quantize.h"

#include <cstring>

#include "model/gguf.h"
#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;
using testing::ScratchDir;

std::string stories() { return testing::shared_model("stories260K/stories260K.gguf"); }

TEST(Quantize, WidthsTheBlocksDoNotDivideFallBackToAWiderType) {
  EXPECT_EQ(quantized_type_for(DType::Q4_0, 4096), DType::Q4_0);
  EXPECT_EQ(quantized_type_for(DType::Q4_0, 172), DType::F16);
  EXPECT_EQ(quantized_type_for(DType::Q4_K, 4096), DType::Q4_K);
  EXPECT_EQ(quantized_type_for(DType::Q4_K, 64), DType::Q5_0);
  EXPECT_EQ(quantized_type_for(DType::Q5_K, 96), DType::Q5_1);
  EXPECT_EQ(quantized_type_for(DType::Q6_K, 11008 + 32), DType::Q8_0);
  EXPECT_EQ(quantized_type_for(DType::Q6_K, 172), DType::F16);
}

TEST(Quantize, StoriesMatricesAreTheirRowsRoundedToTheType) {
  SERVAL_REQUIRE_MODEL(stories());
  const auto src = GgufFile::open(stories());
  for (DType to : {DType::Q8_0, DType::Q4_K}) {
    ScratchDir dir;
    const std::string out = dir.file("q.gguf");
    const std::vector<QuantizedTensor> report = quantize_gguf(stories(), out, to);
    const auto q = GgufFile::open(out);
    ASSERT_EQ(q->tensors().size(), src->tensors().size());
    EXPECT_EQ(q->get_int("general.file_type"), to == DType::Q8_0 ? 7 : 14);
    EXPECT_EQ(q->get_string_array("tokenizer.ggml.tokens"), src->get_string_array("tokenizer.ggml.tokens"));
    EXPECT_EQ(q->get_int("llama.block_count"), src->get_int("llama.block_count"));
    int matrices = 0, wider = 0;
    for (const GgufTensorInfo& s : src->tensors()) {
      const GgufTensorInfo* t = q->find_tensor(s.name);
      ASSERT_NE(t, nullptr) << s.name;
      const std::vector<int64_t> shape = s.shape();
      ASSERT_EQ(t->shape(), shape) << s.name;
      if (shape.size() != 2) {  // norms: the same bytes
        EXPECT_EQ(t->ggml_type, s.ggml_type) << s.name;
        EXPECT_EQ(std::memcmp(t->data, s.data, size_t(s.nbytes)), 0) << s.name;
        continue;
      }
      ++matrices;
      const int64_t cols = shape[1], n = shape[0] * cols;
      const DType want = quantized_type_for(to, cols);
      const DType got = dtype_from_ggml(t->ggml_type, t->name);
      EXPECT_EQ(got, want) << s.name;
      wider += got != to;
      std::vector<float> f(static_cast<size_t>(n)), back(f.size()), mine(f.size());
      to_f32(dtype_from_ggml(s.ggml_type, s.name), s.data, f.data(), n);
      std::vector<uint8_t> bytes(size_t(dtype_bytes(want, n)));
      from_f32(want, f.data(), bytes.data(), n);
      to_f32(want, bytes.data(), back.data(), n);
      to_f32(got, t->data, mine.data(), n);
      EXPECT_EQ(mine, back) << s.name;
    }
    EXPECT_EQ(int(report.size()), matrices);
    // ffn_down reads the 172-wide FFN (f16); with q4_k the 64-wide matrices are q5_0.
    int noted = 0;
    for (const QuantizedTensor& t : report) noted += !t.note.empty();
    EXPECT_EQ(noted, wider);
    EXPECT_EQ(wider, to == DType::Q8_0 ? 5 : matrices);
  }
}

TEST(Quantize, RefusesWhatItCannotDo) {
  SERVAL_REQUIRE_MODEL(stories());
  ScratchDir dir;
  expect_error([&] { quantize_gguf(stories(), dir.file("a.gguf"), DType::F16); },
               {"--to f16 is not a GGUF block type", "q4_k"});
  quantize_gguf(stories(), dir.file("q8.gguf"), DType::Q8_0);
  expect_error([&] { quantize_gguf(dir.file("q8.gguf"), dir.file("b.gguf"), DType::Q4_0); },
               {"is already q8_0", "quantize from the model's f32, f16 or bf16 file"});
  expect_error([&] { quantize_gguf(dir.file("missing.gguf"), dir.file("c.gguf"), DType::Q4_0); }, {"missing.gguf"});
}

}  // namespace
}  // namespace serval
