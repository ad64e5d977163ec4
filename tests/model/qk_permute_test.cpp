// The q/k row permutation between rotate_half and adjacent-pair RoPE
// (model/qk_permute.h): llama.cpp's order, and what it is for.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/qk_permute.h"

namespace serval {
namespace {

TEST(QkPermute, MatchesLlamaCpp) {
  // llama.cpp: w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(w.shape)
  // For 2 heads of 6 rows: head 0 rows 0..5 -> 0 3 1 4 2 5, head 1 -> 6 9 7 10 8 11.
  std::vector<int32_t> src(12), dst(12);
  for (int i = 0; i < 12; ++i) src[size_t(i)] = i;
  permute_qk_rows(src.data(), dst.data(), 2, 6, 4);
  EXPECT_EQ(dst, (std::vector<int32_t>{0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11}));
}

TEST(QkPermute, PartialRotaryKeepsTheRowsPastRopeDim) {
  // 2 heads of 8 rows, rope over the first 4: rows (0, 2), (1, 3) pair up.
  std::vector<int32_t> src(16), dst(16);
  for (int i = 0; i < 16; ++i) src[size_t(i)] = i;
  permute_qk_rows(src.data(), dst.data(), 2, 8, 4, /*rope_dim=*/4);
  EXPECT_EQ(dst, (std::vector<int32_t>{0, 2, 1, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15}));
}

// RoPE over the first rope_dim of one head: Neox pairs (i, i + r/2),
// interleaved pairs (2i, 2i + 1).
std::vector<float> rope(const std::vector<float>& x, int64_t pos, int64_t rope_dim, bool neox) {
  std::vector<float> y = x;
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    const double ang = double(pos) * std::pow(10000.0, -2.0 * double(i) / double(rope_dim));
    const int64_t a = neox ? i : 2 * i, b = neox ? i + rope_dim / 2 : 2 * i + 1;
    y[size_t(a)] = float(x[size_t(a)] * std::cos(ang) - x[size_t(b)] * std::sin(ang));
    y[size_t(b)] = float(x[size_t(a)] * std::sin(ang) + x[size_t(b)] * std::cos(ang));
  }
  return y;
}

TEST(QkPermute, PermutedRowsUnderInterleavedRopeEqualHfRowsUnderNeoxRope) {
  // The point of the permutation: q = W x rotated with HF's rotate_half equals
  // (P W) x rotated with adjacent pairs, up to the same row permutation P;
  // with partial rotary too.
  const int64_t hd = 8, cols = 5;
  for (int64_t rope_dim : {int64_t(8), int64_t(4)}) {
    std::vector<float> W(static_cast<size_t>(hd * cols)), x(static_cast<size_t>(cols));
    for (size_t i = 0; i < W.size(); ++i) W[i] = std::sin(float(i) * 0.7f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(float(i) * 1.3f);
    std::vector<float> PW(W.size());
    permute_qk_rows(W.data(), PW.data(), 1, hd, cols * 4, rope_dim);
    auto matvec = [&](const std::vector<float>& M) {
      std::vector<float> y(size_t(hd), 0.0f);
      for (int64_t r = 0; r < hd; ++r)
        for (int64_t k = 0; k < cols; ++k) y[size_t(r)] += M[size_t(r * cols + k)] * x[size_t(k)];
      return y;
    };
    const std::vector<float> hf = rope(matvec(W), 3, rope_dim, /*neox=*/true);
    const std::vector<float> gg = rope(matvec(PW), 3, rope_dim, /*neox=*/false);
    std::vector<float> hf_permuted(hf.size());
    permute_qk_rows(hf.data(), hf_permuted.data(), 1, hd, 4, rope_dim);
    for (size_t i = 0; i < gg.size(); ++i) EXPECT_NEAR(gg[i], hf_permuted[i], 1e-5) << "rope_dim " << rope_dim << ", " << i;
  }
}

}  // namespace
}  // namespace serval
