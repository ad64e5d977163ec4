#include "model/linear.h"

#include <cmath>

#include "core/error.h"
#include "core/fp8.h"

namespace serval {

namespace {

void check_tensor(const Linear& w, const TensorView& t, DType dtype, const std::vector<int64_t>& shape,
                  const char* what) {
  SERVAL_CHECK(t.dtype == dtype && t.shape == shape && t.data != nullptr, "linear \"", w.name, "\" (",
               w.format.describe(), "): its ", what, " \"", t.name, "\" is ", dtype_name(t.dtype), " ", t.shape_str(),
               ", expected ", dtype_name(dtype), " ", shape_string(shape));
}

}  // namespace

LinearFormat LinearFormat::of_dtype(DType t) {
  if (dtype_block_elems(t) > 1) return {Kind::GgufBlock, t, 0, true};
  return dense(t);
}

std::string LinearFormat::describe() const {
  switch (kind) {
    case Kind::Dense:
    case Kind::GgufBlock: return std::string(dtype_name(dtype));
    case Kind::Int8PerChannel: return "int8 per channel";
    case Kind::Int4Grouped: return str_cat("int4 g", group_size, symmetric ? " sym" : " asym");
    case Kind::Fp8:
      return block_rows > 0 ? str_cat("fp8 e4m3 block ", block_rows, "x", block_cols) : std::string("fp8 e4m3");
  }
  return "unknown";
}

int64_t Linear::stored_bytes() const {
  int64_t bytes = weight.nbytes;
  if (scales) bytes += scales->nbytes;
  if (zeros) bytes += zeros->nbytes;
  return bytes;
}

void Linear::validate() const {
  SERVAL_CHECK(out > 0 && in > 0, "linear \"", name, "\" has shape [", out, ", ", in, "]");
  using K = LinearFormat::Kind;
  switch (format.kind) {
    case K::Dense:
      SERVAL_CHECK(format.dtype == DType::F32 || format.dtype == DType::F16 || format.dtype == DType::BF16,
                   "linear \"", name, "\": a dense weight is f32, f16 or bf16, not ", dtype_name(format.dtype));
      check_tensor(*this, weight, format.dtype, {out, in}, "weight");
      SERVAL_CHECK(!scales && !zeros, "linear \"", name, "\": a dense weight has no scales or zero points");
      return;
    case K::GgufBlock:
      SERVAL_CHECK(dtype_block_elems(format.dtype) > 1, "linear \"", name, "\": ", dtype_name(format.dtype),
                   " is not a block type");
      check_tensor(*this, weight, format.dtype, {out, in}, "weight");
      return;
    case K::Int8PerChannel:
      check_tensor(*this, weight, DType::I8, {out, in}, "weight");
      SERVAL_CHECK(scales.has_value() && !zeros, "linear \"", name, "\": int8 per channel needs scales, no zeros");
      check_tensor(*this, *scales, DType::F32, {out}, "scales");
      return;
    case K::Fp8:
      check_tensor(*this, weight, DType::FP8_E4M3, {out, in}, "weight");
      SERVAL_CHECK(scales.has_value() && !zeros, "linear \"", name, "\": fp8 needs scales, no zeros");
      SERVAL_CHECK((format.block_rows > 0) == (format.block_cols > 0), "linear \"", name, "\": fp8 block ",
                   format.block_rows, "x", format.block_cols, " needs both sizes");
      if (format.block_rows > 0) {
        const int64_t br = format.block_rows, bc = format.block_cols;
        check_tensor(*this, *scales, DType::F32, {(out + br - 1) / br, (in + bc - 1) / bc}, "block scales");
      } else {
        check_tensor(*this, *scales, DType::F32,
                     scales->shape == std::vector<int64_t>{1} ? std::vector<int64_t>{1} : std::vector<int64_t>{out},
                     "scales");
      }
      return;
    case K::Int4Grouped: {
      SERVAL_CHECK(format.group_size > 0 && format.group_size % 2 == 0 && in % format.group_size == 0, "linear \"",
                   name, "\": group size ", format.group_size, " must be even and divide its ", in, " inputs");
      check_tensor(*this, weight, DType::I8, {out, in / 2}, "packed weight");
      const std::vector<int64_t> groups{out, in / format.group_size};
      SERVAL_CHECK(scales.has_value(), "linear \"", name, "\": int4 needs scales");
      check_tensor(*this, *scales, DType::F32, groups, "scales");
      SERVAL_CHECK(zeros.has_value() != format.symmetric, "linear \"", name, "\": int4 ",
                   format.symmetric ? "symmetric has no" : "asymmetric needs", " zero points");
      if (zeros) check_tensor(*this, *zeros, DType::F32, groups, "zero points");
      return;
    }
  }
}

Linear linear_of(const TensorView& view) {
  SERVAL_CHECK(view.shape.size() == 2, "tensor \"", view.name, "\" is not a matrix: ", view.shape_str());
  Linear w;
  w.name = view.name;
  w.out = view.shape[0];
  w.in = view.shape[1];
  w.format = LinearFormat::of_dtype(view.dtype);
  w.weight = view;
  w.shard = ShardSpec::whole(w.out, w.in);
  return w;
}

std::vector<float> dequantize_linear(const Linear& w) {
  w.validate();
  std::vector<float> out(size_t(w.out * w.in));
  float* dst = out.data();
  const auto* bytes = static_cast<const uint8_t*>(w.weight.data);
  using K = LinearFormat::Kind;
  switch (w.format.kind) {
    case K::Dense:
    case K::GgufBlock: to_f32(w.format.dtype, w.weight.data, dst, w.out * w.in); break;
    case K::Int8PerChannel: {
      const auto* q = static_cast<const int8_t*>(w.weight.data);
      const auto* scale = static_cast<const float*>(w.scales->data);
      for (int64_t r = 0; r < w.out; ++r)
        for (int64_t c = 0; c < w.in; ++c) dst[r * w.in + c] = float(q[r * w.in + c]) * scale[r];
      break;
    }
    case K::Fp8: {
      const auto* scale = static_cast<const float*>(w.scales->data);
      if (w.format.block_rows > 0) {
        const int64_t br = w.format.block_rows, bc = w.format.block_cols, cols = (w.in + bc - 1) / bc;
        for (int64_t r = 0; r < w.out; ++r)
          for (int64_t c = 0; c < w.in; ++c)
            dst[r * w.in + c] = fp8_e4m3_to_f32(bytes[r * w.in + c]) * scale[(r / br) * cols + c / bc];
        break;
      }
      const bool per_row = w.scales->numel() == w.out && w.out > 1;
      for (int64_t r = 0; r < w.out; ++r)
        for (int64_t c = 0; c < w.in; ++c)
          dst[r * w.in + c] = fp8_e4m3_to_f32(bytes[r * w.in + c]) * scale[per_row ? r : 0];
      break;
    }
    case K::Int4Grouped: {
      const int64_t g = w.format.group_size, groups = w.in / g;
      const auto* scale = static_cast<const float*>(w.scales->data);
      const auto* zero = w.zeros ? static_cast<const float*>(w.zeros->data) : nullptr;
      for (int64_t r = 0; r < w.out; ++r)
        for (int64_t c = 0; c < w.in; ++c) {
          const uint8_t pair = bytes[r * (w.in / 2) + c / 2];
          const int q = (c % 2 == 0) ? (pair & 0xF) : (pair >> 4);
          const int64_t gi = r * groups + c / g;
          dst[r * w.in + c] = (float(q) - (zero ? zero[gi] : 8.0f)) * scale[gi];
        }
      break;
    }
  }
  return out;
}

}  // namespace serval
