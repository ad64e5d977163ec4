#include "model/quantize.h"

#include <vector>

#include "core/error.h"
#include "model/convert.h"
#include "model/gguf.h"

namespace serval {

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// A row of `cols` values of `from` at src, as `to` at dst.
void requantize_row(DType from, const void* src, DType to, void* dst, int64_t cols, std::vector<float>& f) {
  f.resize(size_t(cols));
  to_f32(from, src, f.data(), cols);
  from_f32(to, f.data(), dst, cols);
}

}  // namespace

DType quantized_type_for(DType want, int64_t cols) {
  if (cols % dtype_block_elems(want) == 0) return want;
  DType narrower = DType::F16;
  switch (want) {
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: narrower = DType::Q5_0; break;
    case DType::Q5_K: narrower = DType::Q5_1; break;
    case DType::Q6_K: narrower = DType::Q8_0; break;
    default: break;
  }
  return cols % dtype_block_elems(narrower) == 0 ? narrower : DType::F16;
}

std::vector<QuantizedTensor> quantize_gguf(const std::string& in_path, const std::string& out_path, DType to) {
  SERVAL_CHECK(dtype_block_elems(to) > 1, "quantize: --to ", dtype_name(to), " is not a GGUF block type (q8_0, ",
               "q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k)");
  const std::shared_ptr<GgufFile> in = GgufFile::open(in_path);
  GgufWriter w;
  w.set_alignment(in->alignment());
  for (const auto& [key, value] : in->metadata())
    if (key != "general.alignment") w.set_value(key, value);
  w.set_u32("general.file_type", gguf_file_type_of(to));

  std::vector<QuantizedTensor> out;
  for (const GgufTensorInfo& t : in->tensors()) {
    const std::vector<int64_t> shape = t.shape();
    const bool matrix = shape.size() == 2 && t.name.size() > 7 && t.name.ends_with(".weight");
    if (!matrix) {
      w.add_tensor_raw(t.name, t.ggml_type, shape, t.data, t.nbytes);
      continue;
    }
    const DType from = dtype_from_ggml(t.ggml_type, t.name);
    SERVAL_CHECK(is_float(from), "quantize: \"", t.name, "\" in \"", in_path, "\" is already ", dtype_name(from),
                 "; quantize from the model's f32, f16 or bf16 file");
    const int64_t rows = shape[0], cols = shape[1];
    const DType got = quantized_type_for(to, cols);
    out.push_back({t.name, from, got,
                   got == to ? "" : str_cat(cols, " columns are not whole blocks of ", dtype_block_elems(to))});
    const int64_t src_row = dtype_bytes(from, cols), dst_row = dtype_bytes(got, cols);
    w.add_tensor_generated(t.name, got, shape, [data = t.data, from, got, rows, cols, src_row, dst_row](void* dst,
                                                                                                       int64_t) {
      std::vector<float> f;
      for (int64_t r = 0; r < rows; ++r)
        requantize_row(from, data + r * src_row, got, static_cast<uint8_t*>(dst) + r * dst_row, cols, f);
    });
  }
  w.write(out_path);
  return out;
}

}  // namespace serval
