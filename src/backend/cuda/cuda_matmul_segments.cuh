#pragma once
// The operands of the GEMV's decode matmuls (cuda_gemv.cu,
// cuda_gemv_wide.cu): x [tokens, in] and up to three weights w[i] [rows[i],
// in], each writing y[i] [tokens, rows[i]] (bf16, or one f32 output alone);
// or the gated form, gate (w[0]) and up (w[1]) into the one output
// y[0] = silu(x @ gate^T) * (x @ up^T). A kernel cuts the rows into tiles of
// its own size, numbered segment after segment.
#include "backend/cuda/cuda_tensor.h"

namespace serval::cuda {

struct MatmulSegments {
  const bf16* x;
  const bf16* w[3];
  void* y[3];
  int rows[3];      // outputs (W rows) of each weight; gated: of the product
  int tile_end[3];  // running tile counts, segment after segment
  int segments;
  int tiles;
  int tokens;
  int in;
  bool interleaved;  // gated: gate and up are an interleaved pair (cuda_gate_up_layout.cuh)
};

// ys[i] = x @ ws[i]^T in tiles of `tile_rows` rows; `who` names the kernel in errors.
inline MatmulSegments matmul_segments(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n, int tile_rows,
                                      const char* who) {
  SERVAL_CHECK(n >= 1 && n <= 3, who, ": ", n, " weights in one launch (1..3)");
  SERVAL_CHECK(ys[0].dtype != DType::F32 || n == 1, who, ": an f32 output only alone");
  MatmulSegments p{};
  p.x = bf(x);
  p.tokens = int(x.rows);
  p.in = int(x.cols);
  p.segments = n;
  for (int i = 0; i < n; ++i) {
    SERVAL_CHECK(reinterpret_cast<uintptr_t>(ws[i]) % 16 == 0, who, ": weight not 16-byte aligned");
    p.w[i] = ws[i];
    p.y[i] = ys[i].data;
    p.rows[i] = int(ys[i].cols);
    p.tiles += ceil_div(ys[i].cols, tile_rows);
    p.tile_end[i] = p.tiles;
  }
  return p;
}

// out = silu(x @ gate^T) * (x @ up^T) in tiles of `tile_rows` output rows;
// gate and up are [out.cols, x.cols], or an interleaved pair.
inline MatmulSegments gated_segments(const Tensor& x, const bf16* gate, const bf16* up, const Tensor& out,
                                     int tile_rows, const char* who, bool interleaved = false) {
  SERVAL_CHECK(reinterpret_cast<uintptr_t>(gate) % 16 == 0 && reinterpret_cast<uintptr_t>(up) % 16 == 0, who,
               ": weights not 16-byte aligned");
  MatmulSegments p{};
  p.x = bf(x);
  p.tokens = int(x.rows);
  p.in = int(x.cols);
  p.segments = 1;
  p.w[0] = gate;
  p.w[1] = up;
  p.interleaved = interleaved;
  p.y[0] = out.data;
  p.rows[0] = int(out.cols);
  p.tiles = p.tile_end[0] = ceil_div(out.cols, tile_rows);
  return p;
}

// The segment of tile `tile` (of `tile_rows` rows) and the tile's first row in it.
__device__ __forceinline__ void locate_tile(const MatmulSegments& p, int tile, int tile_rows, int& seg,
                                            int& first_row) {
  seg = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (seg + 1 < p.segments && tile >= p.tile_end[seg]) ++seg;
  first_row = (tile - (seg > 0 ? p.tile_end[seg - 1] : 0)) * tile_rows;
}

}  // namespace serval::cuda
