// The CPU backend's quantized KV pools (--kv-cache-dtype fp8|int8): kv_write
// stores each head's values as kv_quantize's codes under that head's scale
// (K's and V's apart), and paged_attention over the codes equals, bit for
// bit, paged_attention over an f32 pool holding their values (code * scale):
// the reference the CUDA kernels are compared with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_quant.h"
#include "core/error.h"
#include "runtime/backend.h"

namespace serval {
namespace {

constexpr int32_t kHeads = 3, kDim = 16, kBlock = 4, kGroup = 2;

std::vector<float> random_values(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Per-head scales, K's then V's, a decade apart so a wrong index shows.
std::vector<float> head_scales(DType t) {
  std::vector<float> s;
  for (int which = 0; which < 2; ++which)
    for (int h = 0; h < kHeads; ++h) s.push_back(kv_scale_for_amax(t, std::pow(10.0f, float(h - 1)) * (which + 1)));
  return s;
}

struct Pools {
  KvGeometry geom;
  KvLayer kv;
};

Pools make_pools(Backend& be, DType t, int64_t blocks) {
  Pools p;
  p.geom = KvGeometry{blocks, kBlock, kHeads, kDim, t, 0};
  p.kv = be.alloc_kv_layer(p.geom);
  if (kv_dtype_quantized(t)) {
    const std::vector<float> s = head_scales(t);
    EXPECT_EQ(p.kv.scales.bytes(), int64_t(s.size() * 4));
    std::memcpy(p.kv.scales.data(), s.data(), s.size() * 4);
  }
  return p;
}

// Rows of K or V whose head h has values around 10^(h-1).
std::vector<float> kv_rows(int64_t n, uint32_t seed) {
  std::vector<float> v = random_values(size_t(n * kHeads * kDim), seed, 1.0f);
  for (int64_t i = 0; i < int64_t(v.size()); ++i) v[size_t(i)] *= 0.4f * std::pow(10.0f, float((i / kDim) % kHeads - 1));
  return v;
}

class CpuKvQuant : public ::testing::TestWithParam<DType> {};

TEST_P(CpuKvQuant, WriteStoresEachHeadsCodesUnderItsScale) {
  const DType t = GetParam();
  auto be = create_backend("cpu", 1);
  be->set_kv_dtype(t);
  Pools p = make_pools(*be, t, 4);
  const int64_t n = 5;
  std::vector<float> k = kv_rows(n, 1), v = kv_rows(n, 2);
  v[7] = 1e6f;  // saturates
  const std::vector<int64_t> slots = {3, 0, 9, 15, 6};
  be->kv_write(Tensor{k.data(), DType::F32, n, kHeads * kDim}, Tensor{v.data(), DType::F32, n, kHeads * kDim},
               slots.data(), p.kv, p.geom);
  const std::vector<float> s = head_scales(t);
  const uint8_t* K = static_cast<const uint8_t*>(p.kv.k.data());
  const uint8_t* V = static_cast<const uint8_t*>(p.kv.v.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < kHeads * kDim; ++i) {
      const int64_t h = i / kDim, at = slots[size_t(r)] * kHeads * kDim + i;
      ASSERT_EQ(K[at], kv_quantize(t, k[size_t(r * kHeads * kDim + i)], 1.0f / s[size_t(h)])) << r << " " << i;
      ASSERT_EQ(V[at], kv_quantize(t, v[size_t(r * kHeads * kDim + i)], 1.0f / s[size_t(kHeads + h)])) << r << " " << i;
    }
  EXPECT_EQ(kv_dequantize(t, V[3 * kHeads * kDim + 7], s[kHeads]), kv_code_max(t) * s[kHeads]);  // row 0 is slot 3
  // A block copy moves the codes as they are (copy-on-write, the prefix cache).
  be->copy_kv_block(p.kv, p.geom, 0, 2);
  EXPECT_EQ(std::memcmp(K, K + 2 * kBlock * kHeads * kDim, kBlock * kHeads * kDim), 0);
  EXPECT_EQ(std::memcmp(V, V + 2 * kBlock * kHeads * kDim, kBlock * kHeads * kDim), 0);
}

TEST_P(CpuKvQuant, AttentionOverCodesEqualsAttentionOverTheirValues) {
  const DType t = GetParam();
  auto be = create_backend("cpu", 1);
  // Two sequences: a decode at context 11 and a 3-token prefill chunk at 7,
  // through shuffled blocks.
  const std::vector<int32_t> table = {5, 2, 7, -1, 0, 3, -1, -1}, qstart = {0, 1, 4}, ctx = {11, 7},
                             pos = {10, 4, 5, 6};
  const int64_t blocks = 8, tokens = 4;
  std::vector<int64_t> slots;
  std::vector<int32_t> lens = {11, 7};
  for (int s = 0; s < 2; ++s)
    for (int32_t j = 0; j < lens[size_t(s)]; ++j) slots.push_back(int64_t(table[size_t(s * 4 + j / kBlock)]) * kBlock + j % kBlock);
  const int64_t n = int64_t(slots.size());
  const std::vector<float> k = kv_rows(n, 3), v = kv_rows(n, 4);
  const Tensor kt{const_cast<float*>(k.data()), DType::F32, n, kHeads * kDim};
  const Tensor vt{const_cast<float*>(v.data()), DType::F32, n, kHeads * kDim};

  be->set_kv_dtype(t);
  Pools q = make_pools(*be, t, blocks);
  be->kv_write(kt, vt, slots.data(), q.kv, q.geom);
  // The reference: an f32 pool of the codes' values.
  Pools f = make_pools(*be, DType::F32, blocks);
  const std::vector<float> s = head_scales(t);
  const int64_t pool_elems = blocks * kBlock * kHeads * kDim;
  for (int64_t i = 0; i < pool_elems; ++i) {
    const int64_t h = (i / kDim) % kHeads;
    static_cast<float*>(f.kv.k.data())[i] = kv_dequantize(t, static_cast<uint8_t*>(q.kv.k.data())[i], s[size_t(h)]);
    static_cast<float*>(f.kv.v.data())[i] =
        kv_dequantize(t, static_cast<uint8_t*>(q.kv.v.data())[i], s[size_t(kHeads + h)]);
  }
  BatchView b;
  b.positions = pos.data();
  b.query_start = qstart.data();
  b.context_len = ctx.data();
  b.block_table = table.data();
  b.num_tokens = int32_t(tokens);
  b.num_seqs = 2;
  b.max_blocks_per_seq = 4;
  b.max_query_len = 3;
  b.max_context_len = 11;
  std::vector<float> query = random_values(size_t(tokens * kHeads * kGroup * kDim), 9, 1.0f);
  const Tensor qt{query.data(), DType::F32, tokens, kHeads * kGroup * kDim};
  std::vector<float> got(query.size()), want(query.size()), exact(query.size());
  be->paged_attention(qt, q.kv, q.geom, b, kHeads * kGroup, 0.25f, Tensor{got.data(), DType::F32, tokens, qt.cols});
  be->paged_attention(qt, f.kv, f.geom, b, kHeads * kGroup, 0.25f, Tensor{want.data(), DType::F32, tokens, qt.cols});
  EXPECT_EQ(got, want);
  // And close to attention over the unquantized K/V.
  Pools e = make_pools(*be, DType::F32, blocks);
  be->kv_write(kt, vt, slots.data(), e.kv, e.geom);
  be->paged_attention(qt, e.kv, e.geom, b, kHeads * kGroup, 0.25f, Tensor{exact.data(), DType::F32, tokens, qt.cols});
  double err = 0, norm = 0;
  for (size_t i = 0; i < exact.size(); ++i) err += std::pow(got[i] - exact[i], 2), norm += std::pow(exact[i], 2);
  EXPECT_LT(std::sqrt(err / norm), t == DType::FP8_E4M3 ? 0.05 : 0.02);
  EXPECT_GT(std::sqrt(err / norm), 0.0);  // the codes did round
}

INSTANTIATE_TEST_SUITE_P(Fp8AndInt8, CpuKvQuant, ::testing::Values(DType::FP8_E4M3, DType::I8),
                         [](const auto& info) { return std::string(info.param == DType::I8 ? "Int8" : "Fp8"); });

TEST(CpuKvQuant, OtherPoolTypesAreRefused) {
  auto be = create_backend("cpu", 1);
  EXPECT_THROW(be->set_kv_dtype(DType::BF16), Error);
  EXPECT_THROW(be->set_kv_dtype(DType::Q4_0), Error);
}

}  // namespace
}  // namespace serval
