// `serval quantize --to int8|int4|fp8`: a float GGUF model rewritten with its
// linear layers in Serval's own quantized GGUF types.
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_linear_formats.h"
#include "model/quantize.h"
#include "model/rtn_quantize.h"

namespace serval {

namespace {

constexpr const char* kEmbedding = "token_embd.weight";
constexpr const char* kLmHead = "output.weight";

// Adds `name`'s codes, scales and zero points, quantized row by row from the
// [rows, cols] float tensor at `data`. Each tensor's generator quantizes the
// rows again (cheap beside writing) so that none holds the whole matrix.
void add_quantized(GgufWriter& w, const std::string& name, const LinearFormat& f, const uint8_t* data, DType from,
                   int64_t rows, int64_t cols) {
  const int64_t rb = rtn_row_bytes(f, cols), rs = rtn_row_scales(f, cols), src_row = dtype_bytes(from, cols);
  const bool has_zeros = f.kind == LinearFormat::Kind::Int4Grouped && !f.symmetric;
  enum Part { Codes, Scales, Zeros };
  auto generator = [=](Part part) {
    return [=](void* dst, int64_t) {
      std::vector<float> row(static_cast<size_t>(cols)), scales(static_cast<size_t>(rs)), zeros(scales);
      std::vector<uint8_t> codes(static_cast<size_t>(rb));
      for (int64_t r = 0; r < rows; ++r) {
        to_f32(from, data + r * src_row, row.data(), cols);
        uint8_t* c = part == Codes ? static_cast<uint8_t*>(dst) + r * rb : codes.data();
        float* s = part == Scales ? static_cast<float*>(dst) + r * rs : scales.data();
        float* z = part == Zeros ? static_cast<float*>(dst) + r * rs : zeros.data();
        quantize_row_rtn(f, name, row.data(), cols, c, s, z);
      }
    };
  };
  const bool int4 = f.kind == LinearFormat::Kind::Int4Grouped;
  const std::vector<int64_t> scale_shape = int4 ? std::vector<int64_t>{rows, rs} : std::vector<int64_t>{rows};
  w.add_tensor_generated(name, DType::I8, {rows, rb}, generator(Codes));
  w.add_tensor_generated(linear_scale_name(name), DType::F32, scale_shape, generator(Scales));
  if (has_zeros) w.add_tensor_generated(linear_zero_name(name), DType::F32, scale_shape, generator(Zeros));
  write_linear_format(w, name, f);
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

}  // namespace

FloatWeights read_layer_tensors(const std::string& path, int64_t num_layers) {
  static const char* const kParts[] = {"attn_norm.weight", "attn_q.weight",   "attn_k.weight",  "attn_v.weight",
                                       "attn_v.bias",      "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
                                       "ffn_up.weight",    "ffn_down.weight"};
  const std::shared_ptr<GgufFile> in = GgufFile::open(path);
  FloatWeights w;
  for (int64_t l = 0; l < num_layers; ++l)
    for (const char* part : kParts) {
      const GgufTensorInfo* t = in->find_tensor(str_cat("blk.", l, ".", part));
      if (t == nullptr) continue;  // awq_scale_model names what it misses
      const DType from = dtype_from_ggml(t->ggml_type, t->name);
      SERVAL_CHECK(is_float(from), "quantize: \"", t->name, "\" in \"", path, "\" is ", dtype_name(from),
                   "; calibrate from the model's f32, f16 or bf16 file");
      FloatTensor& f = w[t->name];
      f.shape = t->shape();
      int64_t n = 1;
      for (const int64_t d : f.shape) n *= d;
      f.v.resize(size_t(n));
      to_f32(from, t->data, f.v.data(), int64_t(f.v.size()));
    }
  return w;
}

std::vector<LinearQuantized> quantize_gguf_linear(const std::string& in_path, const std::string& out_path,
                                                  const LinearFormat& want, const FloatWeights* replace) {
  using Kind = LinearFormat::Kind;
  SERVAL_CHECK(want.kind == Kind::Int8PerChannel || want.kind == Kind::Int4Grouped || want.kind == Kind::Fp8,
               "quantize: ", want.describe(), " is not one of Serval's own types (int8, int4, fp8)");
  SERVAL_CHECK(want.kind != Kind::Int4Grouped || (want.group_size > 0 && want.group_size % 2 == 0),
               "quantize: int4 group size ", want.group_size, " must be even and positive");
  const std::shared_ptr<GgufFile> in = GgufFile::open(in_path);
  SERVAL_CHECK(read_linear_formats(*in).empty(), "quantize: \"", in_path, "\" is already quantized (",
               kServalQuantVersionKey, "); quantize from the model's f32, f16 or bf16 file");
  GgufWriter w;
  w.set_alignment(in->alignment());
  for (const auto& [key, value] : in->metadata())
    if (key != "general.alignment") w.set_value(key, value);

  if (want.kind == Kind::Int4Grouped) {  // a group size no matrix takes is a mistake, not a fallback
    std::string widths;
    bool fits = false;
    for (const GgufTensorInfo& t : in->tensors()) {
      if (t.ne.size() != 2 || !t.name.ends_with(".weight")) continue;
      fits = fits || t.ne[0] % want.group_size == 0;
      if (widths.find(str_cat(" ", t.ne[0], ",")) == std::string::npos) widths += str_cat(" ", t.ne[0], ",");
    }
    if (!widths.empty()) widths.pop_back();
    SERVAL_CHECK(fits, "quantize: int4 group size ", want.group_size, " divides none of the matrices' widths (",
                 widths.empty() ? "" : widths.substr(1), "): nothing would be int4");
  }

  auto replaced = [&](const GgufTensorInfo& t) -> const FloatTensor* {
    if (replace == nullptr) return nullptr;
    const auto it = replace->find(t.name);
    if (it == replace->end()) return nullptr;
    int64_t n = 1;
    for (const int64_t d : t.ne) n *= d;
    SERVAL_CHECK(it->second.shape == t.shape() && int64_t(it->second.v.size()) == n,
                 "quantize: the calibrated \"", t.name, "\" is not of the file's shape");
    return &it->second;
  };
  std::vector<LinearQuantized> out;
  auto quantize = [&](const GgufTensorInfo& t, const std::string& name, std::string note) {
    const DType from = dtype_from_ggml(t.ggml_type, t.name);
    SERVAL_CHECK(is_float(from), "quantize: \"", t.name, "\" in \"", in_path, "\" is ", dtype_name(from),
                 "; quantize from the model's f32, f16 or bf16 file");
    const int64_t rows = t.shape()[0], cols = t.shape()[1];
    std::string why;
    const LinearFormat f = rtn_format_for(want, cols, why);
    const FloatTensor* r = replaced(t);
    add_quantized(w, name, f, r ? reinterpret_cast<const uint8_t*>(r->v.data()) : t.data, r ? DType::F32 : from, rows, cols);
    out.push_back({name, f, why.empty() ? note : why, !why.empty()});
  };
  const GgufTensorInfo* embedding = in->find_tensor(kEmbedding);
  for (const GgufTensorInfo& t : in->tensors()) {
    const std::vector<int64_t> shape = t.shape();
    const bool matrix = shape.size() == 2 && t.name.ends_with(".weight") && t.name != kEmbedding;
    if (matrix) {
      quantize(t, t.name, "");
    } else if (const FloatTensor* r = replaced(t)) {
      w.add_tensor_raw(t.name, ggml_from_dtype(DType::F32), shape, r->v.data(), int64_t(r->v.size() * 4));
    } else {
      w.add_tensor_raw(t.name, t.ggml_type, shape, t.data, t.nbytes);
    }
  }
  if (embedding != nullptr && embedding->shape().size() == 2 && in->find_tensor(kLmHead) == nullptr)
    quantize(*embedding, kLmHead,
             str_cat("the LM head is tied to the embedding: written as its own ", kLmHead, ", the embedding stays ",
                     ggml_type_name(embedding->ggml_type)));
  w.write(out_path);
  return out;
}

}  // namespace serval
