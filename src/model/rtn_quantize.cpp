#include "model/rtn_quantize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/fp8.h"

namespace serval {

namespace {

using Kind = LinearFormat::Kind;

float round_even(float x) { return std::nearbyint(x); }  // the default rounding mode: ties to even

float max_abs(const float* w, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

void check_format(const LinearFormat& f, const std::string& name, int64_t in) {
  SERVAL_CHECK(f.kind == Kind::Int8PerChannel || f.kind == Kind::Int4Grouped || f.kind == Kind::Fp8,
               "quantize: \"", name, "\": round to nearest writes int8, int4 or fp8, not ", f.describe());
  SERVAL_CHECK(f.kind != Kind::Fp8 || f.block_rows == 0, "quantize: \"", name, "\": fp8 is written per row");
  SERVAL_CHECK(f.kind != Kind::Int4Grouped || (f.group_size > 0 && f.group_size % 2 == 0 && in % f.group_size == 0),
               "quantize: \"", name, "\": int4 group size ", f.group_size, " does not divide its ", in, " inputs");
}

float asymmetric_code(float w, float scale, float zero) {
  return std::clamp(round_even(w / scale + zero), 0.0f, 15.0f);
}

// Sum of the squared errors of the group on the grid (q - zero) * scale, in double.
double grid_error(const float* w, int64_t n, float scale, float zero) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(asymmetric_code(w[i], scale, zero) - zero) * double(scale) - double(w[i]);
    e += d * d;
  }
  return e;
}

// The asymmetric grid of the group: of (a) the 16 codes spanning min..max
// exactly, the zero point kept as it falls (an f32), and (b) the range
// widened to hold 0 with an integer zero point (0 exact; the scale grown
// where rounding the zero would clamp an end), the one that errs less. (a)
// spends no codes on 0 for a group of one sign; (b) keeps the many small
// weights of a group stretched by an outlier unbiased at 0.
void asymmetric_grid(const float* w, int64_t n, float& scale, float& zero) {
  float lo = w[0], hi = w[0];
  for (int64_t i = 1; i < n; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
  if (hi == lo) {  // one value: code 8 holds it
    scale = lo != 0 ? std::fabs(lo) / 8.0f : 1.0f;
    zero = lo > 0 ? 0.0f : lo < 0 ? 16.0f : 8.0f;
    return;
  }
  const float sa = (hi - lo) / 15.0f, za = -lo / sa;
  const float l0 = std::min(lo, 0.0f), h0 = std::max(hi, 0.0f);
  float sb = (h0 - l0) / 15.0f;
  const float zb = round_even(-l0 / sb);
  if (zb > 0) sb = std::max(sb, -l0 / zb);
  if (zb < 15) sb = std::max(sb, h0 / (15.0f - zb));
  const bool exact_range = grid_error(w, n, sa, za) < grid_error(w, n, sb, zb);
  scale = exact_range ? sa : sb;
  zero = exact_range ? za : zb;
}

void int4_group(const float* w, int64_t n, bool symmetric, uint8_t* codes, float& scale, float& zero) {
  if (symmetric) {
    const float amax = max_abs(w, n);
    scale = amax > 0 ? amax / 7.0f : 1.0f;
    zero = 8.0f;
  } else {
    asymmetric_grid(w, n, scale, zero);
  }
  for (int64_t i = 0; i < n; i += 2) {
    uint8_t pair = 0;
    for (int64_t j = 0; j < 2; ++j) {
      const float q = symmetric ? std::clamp(round_even(w[i + j] / scale), -8.0f, 7.0f) + 8.0f
                                : asymmetric_code(w[i + j], scale, zero);
      pair |= uint8_t(uint8_t(q) << (4 * j));  // low nibble first
    }
    codes[i / 2] = pair;
  }
}

}  // namespace

int64_t rtn_row_bytes(const LinearFormat& f, int64_t in) { return f.kind == Kind::Int4Grouped ? in / 2 : in; }

int64_t rtn_row_scales(const LinearFormat& f, int64_t in) {
  return f.kind == Kind::Int4Grouped ? in / f.group_size : 1;
}

void quantize_row_rtn(const LinearFormat& f, const std::string& name, const float* w, int64_t in, uint8_t* codes,
                      float* scales, float* zeros) {
  check_format(f, name, in);
  for (int64_t i = 0; i < in; ++i)
    SERVAL_CHECK(std::isfinite(w[i]), "quantize: \"", name, "\" has a non-finite weight (", w[i], ") at column ", i);
  switch (f.kind) {
    case Kind::Int8PerChannel: {
      const float amax = max_abs(w, in), scale = amax > 0 ? amax / 127.0f : 1.0f;
      for (int64_t i = 0; i < in; ++i)
        codes[i] = uint8_t(int8_t(std::clamp(round_even(w[i] / scale), -127.0f, 127.0f)));
      scales[0] = scale;
      return;
    }
    case Kind::Fp8: {
      const float amax = max_abs(w, in), scale = amax > 0 ? amax / 448.0f : 1.0f;
      for (int64_t i = 0; i < in; ++i) codes[i] = f32_to_fp8_e4m3(w[i] / scale);
      scales[0] = scale;
      return;
    }
    case Kind::Int4Grouped: {
      const int64_t g = f.group_size;
      for (int64_t k = 0; k < in / g; ++k) {
        float zero = 0;
        int4_group(w + k * g, g, f.symmetric, codes + k * g / 2, scales[k], zero);
        if (!f.symmetric) zeros[k] = zero;
      }
      return;
    }
    default: return;
  }
}

RtnMatrix quantize_matrix_rtn(const LinearFormat& f, const std::string& name, const float* w, int64_t out,
                              int64_t in) {
  check_format(f, name, in);
  RtnMatrix m;
  const int64_t rb = rtn_row_bytes(f, in), rs = rtn_row_scales(f, in);
  const bool has_zeros = f.kind == Kind::Int4Grouped && !f.symmetric;
  m.codes.resize(size_t(out * rb));
  m.scales.resize(size_t(out * rs));
  if (has_zeros) m.zeros.resize(size_t(out * rs));
  for (int64_t r = 0; r < out; ++r)
    quantize_row_rtn(f, name, w + r * in, in, m.codes.data() + r * rb, m.scales.data() + r * rs,
                     has_zeros ? m.zeros.data() + r * rs : nullptr);
  Linear& l = m.linear;
  l.name = name;
  l.out = out;
  l.in = in;
  l.format = f;
  const DType code_type = f.kind == Kind::Fp8 ? DType::FP8_E4M3 : DType::I8;
  l.weight = {name, code_type, {out, rb}, m.codes.data(), int64_t(m.codes.size())};
  const std::vector<int64_t> scale_shape =
      f.kind == Kind::Int4Grouped ? std::vector<int64_t>{out, rs} : std::vector<int64_t>{out};
  l.scales = TensorView{name + ".scale", DType::F32, scale_shape, m.scales.data(), int64_t(m.scales.size() * 4)};
  if (has_zeros)
    l.zeros = TensorView{name + ".zero", DType::F32, scale_shape, m.zeros.data(), int64_t(m.zeros.size() * 4)};
  l.shard = ShardSpec::whole(out, in);
  l.validate();
  return m;
}

LinearFormat rtn_format_for(const LinearFormat& want, int64_t in, std::string& why) {
  why.clear();
  if (want.kind != Kind::Int4Grouped || in % want.group_size == 0) return want;
  why = str_cat(in, " columns are not whole groups of ", want.group_size, "; kept as int8 per channel");
  LinearFormat f;
  f.kind = Kind::Int8PerChannel;
  f.dtype = DType::I8;
  return f;
}

}  // namespace serval
