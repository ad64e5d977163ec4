// Each format's weights into the packed layout (backend/gpu_block_pack.h):
// its quants, and its scales and mins as the layout's f16 d and m.
#include <cstring>

#include "backend/gpu_block_pack.h"
#include "backend/gpu_block_pack_writer.h"
#include "core/error.h"
#include "core/k_quants.h"
#include "model/linear.h"

namespace serval {

namespace {

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// A scale or min past f16's range (the formats that keep them in f32, or
// Q4_K's d * sc) cannot be packed: checked once the rows are written (no
// throwing inside the parallel loops).
bool f16_finite(uint16_t h) { return (h & 0x7C00) != 0x7C00; }
void check_f16_fit(const GpuBlockPack& p, const std::vector<uint8_t>& out, const std::string& name) {
  if (p.row_scale) return;
  const auto* scales = reinterpret_cast<const uint16_t*>(out.data() + p.scales_offset());
  const auto* mins = reinterpret_cast<const uint16_t*>(out.data() + p.mins_offset());
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t g = 0; g < p.cols / p.group; ++g) {
      const int64_t i = p.scale_index(r, g);
      SERVAL_CHECK(f16_finite(scales[i]) && (!p.mins || f16_finite(mins[i])), "gpu block pack: \"", name, "\" row ",
                   r, " group ", g, ": its scale or min does not fit an f16");
    }
}

// One row of GGUF blocks of `type` (blocks of p.group or 256 columns).
void pack_gguf_row(GpuPackWriter& w, DType type, const uint8_t* row, int64_t r) {
  const GpuBlockPack& p = w.pack();
  const int64_t bb = dtype_block_bytes(type);
  switch (type) {
    case DType::Q4_0:
    case DType::Q8_0:
    case DType::Q4_1:
      for (int64_t g = 0; g < p.cols / 32; ++g) {
        const uint8_t* b = row + g * bb;
        w.scale(r, g, u16_at(b));
        if (type == DType::Q4_1) w.min(r, g, u16_at(b + 2));
        const uint8_t* qs = b + (type == DType::Q4_1 ? 4 : 2);
        for (int e = 0; e < 32; ++e) {
          const int q = type == DType::Q8_0 ? int(int8_t(qs[e])) : e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
          w.quant(r, 32 * g + e, q);
        }
      }
      return;
    case DType::Q4_K:
    case DType::Q5_K:
      // Sub-block s (32 columns): d * sc and -dmin * m_sub, exact in f32, rounded to f16.
      for (int64_t k = 0; k < p.cols / k_quants::kSuper; ++k) {
        const uint8_t* b = row + k * bb;
        const float d = f16_to_f32(u16_at(b)), dmin = f16_to_f32(u16_at(b + 2));
        const uint8_t* scales = b + 4;
        const uint8_t* qh = type == DType::Q5_K ? b + 16 : nullptr;
        const uint8_t* qs = b + (type == DType::Q5_K ? 48 : 16);
        for (int s = 0; s < 8; ++s) {
          int sc, m;
          k_quants::scale_min_k4(scales, s, sc, m);
          const int64_t g = 8 * k + s;
          w.scale(r, g, f32_to_f16(d * float(sc)));
          w.min(r, g, f32_to_f16(-(dmin * float(m))));
          for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
            if (qh != nullptr) q |= ((qh[l] >> s) & 1) << 4;
            w.quant(r, 32 * g + l, q);
          }
        }
      }
      return;
    default: return;  // pack_gguf checked the type
  }
}

std::vector<uint8_t> pack_gguf(const GpuBlockPack& p, DType type, const void* blocks, const std::string& name) {
  const GpuBlockPack want = GpuBlockPack::of(type, p.rows, p.cols);
  SERVAL_CHECK(want.same_form(p), "gpu block pack: ", dtype_name(type), " blocks for another layout");
  GpuPackWriter w(p);
  const auto* src = static_cast<const uint8_t*>(blocks);
  const int64_t row_bytes = dtype_bytes(type, p.cols);
#pragma omp parallel for schedule(static) if (p.rows * p.cols > (1 << 20))
  for (int64_t r = 0; r < p.rows; ++r) pack_gguf_row(w, type, src + r * row_bytes, r);
  std::vector<uint8_t> out = w.take();
  if (type == DType::Q4_K || type == DType::Q5_K) check_f16_fit(p, out, name);  // the others' are the file's f16
  return out;
}

}  // namespace

std::vector<uint8_t> pack_gguf_blocks(const GpuBlockPack& p, DType type, const void* blocks) {
  return pack_gguf(p, type, blocks, std::string(dtype_name(type)));
}

std::vector<uint8_t> pack_linear(const GpuBlockPack& p, const Linear& lin) {
  using K = LinearFormat::Kind;
  SERVAL_CHECK(lin.shard.is_whole() && p.rows == lin.out && p.cols == lin.in &&
                   GpuBlockPack::of(lin.format, lin.out, lin.in).same_form(p),
               "gpu block pack: \"", lin.name, "\" (", lin.format.describe(), ", [", lin.out, ", ", lin.in,
               "]) for another layout");
  lin.validate();
  if (lin.format.kind == K::GgufBlock) return pack_gguf(p, lin.format.dtype, lin.weight.data, lin.name);
  GpuPackWriter w(p);
  const auto* q = static_cast<const uint8_t*>(lin.weight.data);
  const auto* scale = static_cast<const float*>(lin.scales->data);
  if (lin.format.kind == K::Int8PerChannel) {
#pragma omp parallel for schedule(static) if (p.rows * p.cols > (1 << 20))
    for (int64_t r = 0; r < p.rows; ++r) {
      w.row_scale(r, scale[r]);
      for (int64_t c = 0; c < p.cols; ++c) w.quant(r, c, int(int8_t(q[r * p.cols + c])));
    }
    return w.take();
  }
  // Int4Grouped: w = (q - zero) * s = d * (q - 8) with d = s (symmetric: zero
  // 8), or d * q + m with m = -s * zero.
  const auto* zero = lin.zeros ? static_cast<const float*>(lin.zeros->data) : nullptr;
  const int64_t groups = p.cols / p.group;
#pragma omp parallel for schedule(static) if (p.rows * p.cols > (1 << 20))
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i = r * groups + g;
      w.scale(r, g, f32_to_f16(scale[i]));
      if (zero != nullptr) w.min(r, g, f32_to_f16(-(scale[i] * zero[i])));
    }
    for (int64_t c = 0; c < p.cols; ++c) {
      const uint8_t pair = q[r * (p.cols / 2) + c / 2];
      w.quant(r, c, c % 2 == 0 ? pair & 15 : pair >> 4);
    }
  }
  std::vector<uint8_t> out = w.take();
  check_f16_fit(p, out, lin.name);
  return out;
}

}  // namespace serval
