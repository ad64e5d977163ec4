// paged_attention of the CUDA backend (prefill and split-KV decode kernels)
// against the CPU backend on random K/V laid out through shuffled block
// tables: GQA groups 1 to 8 (and an uneven 6), head_dim 8 to 128, contexts up
// to a few thousand tokens, batches up to 64, decode and prefill chunks with
// a cached prefix mixed in one batch. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cuda_test_util.h"

namespace serval::testing {
namespace {

struct SeqSpec {
  int32_t context;  // tokens in the cache after the step
  int32_t query;    // new tokens this step (the last `query` positions)
};

struct AttnCase {
  const char* name;
  int32_t kv_heads, group, head_dim, block_size;
  std::vector<SeqSpec> seqs;
};

// One backend's copy of the case: pools filled through kv_write, batch arrays
// in its memory, output of paged_attention.
std::vector<float> run_case(Backend& be, const AttnCase& c, uint32_t seed) {
  const int32_t S = int32_t(c.seqs.size()), D = c.head_dim, H = c.kv_heads * c.group;
  const int64_t kv_row = int64_t(c.kv_heads) * D;
  int32_t max_blocks = 0, total_blocks = 0, T = 0, max_q = 0, max_ctx = 0;
  for (const SeqSpec& s : c.seqs) {
    const int32_t nb = (s.context + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
    T += s.query;
    max_q = std::max(max_q, s.query);
    max_ctx = std::max(max_ctx, s.context);
  }
  KvGeometry g{total_blocks + 3, c.block_size, c.kv_heads, D};
  std::vector<int32_t> order(size_t(g.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<int32_t> table(size_t(S * max_blocks), -1), qstart = {0}, ctx, positions;
  std::vector<int64_t> all_slots;  // every context token, to fill the pools
  size_t next = 0;
  for (int32_t s = 0; s < S; ++s) {
    const SeqSpec& sp = c.seqs[size_t(s)];
    for (int32_t b = 0; b * c.block_size < sp.context; ++b) table[size_t(s * max_blocks + b)] = order[next++];
    for (int32_t j = 0; j < sp.context; ++j)
      all_slots.push_back(int64_t(table[size_t(s * max_blocks + j / c.block_size)]) * c.block_size +
                          j % c.block_size);
    for (int32_t j = sp.context - sp.query; j < sp.context; ++j) positions.push_back(j);
    qstart.push_back(qstart.back() + sp.query);
    ctx.push_back(sp.context);
  }
  KvLayer kv = be.alloc_kv_layer(g);
  const int64_t n_ctx = int64_t(all_slots.size());
  DevTensor k = upload(be, random_bf16(size_t(n_ctx * kv_row), seed + 1), n_ctx, kv_row);
  DevTensor v = upload(be, random_bf16(size_t(n_ctx * kv_row), seed + 2), n_ctx, kv_row);
  DeviceBuffer slots = upload_ints(be, all_slots);
  be.kv_write(k.t, v.t, static_cast<int64_t*>(slots.data()), kv, g);

  DevTensor q = upload(be, random_bf16(size_t(T) * H * D, seed + 3, 2.0f), T, int64_t(H) * D);
  DevTensor out = zeros(be, T, int64_t(H) * D);
  DeviceBuffer d_table = upload_ints(be, table), d_qs = upload_ints(be, qstart), d_ctx = upload_ints(be, ctx),
               d_pos = upload_ints(be, positions);
  BatchView bv;
  bv.positions = static_cast<int32_t*>(d_pos.data());
  bv.query_start = static_cast<int32_t*>(d_qs.data());
  bv.context_len = static_cast<int32_t*>(d_ctx.data());
  bv.block_table = static_cast<int32_t*>(d_table.data());
  bv.num_tokens = T;
  bv.num_seqs = S;
  bv.max_blocks_per_seq = max_blocks;
  bv.max_query_len = max_q;
  bv.max_context_len = max_ctx;
  be.paged_attention(q.t, kv, g, bv, H, 1.0f / std::sqrt(float(D)), out.t);
  return download(be, out.t);
}

std::vector<SeqSpec> random_decodes(int n, int max_ctx, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> ctx(1, max_ctx);
  std::vector<SeqSpec> out;
  for (int i = 0; i < n; ++i) out.push_back({ctx(rng), 1});
  return out;
}

std::vector<AttnCase> cases() {
  return {
      {"decode_b64_gqa4_d128", 2, 4, 128, 16, random_decodes(64, 2000, 1)},
      {"decode_b4_gqa1_d64_long", 4, 1, 64, 16, random_decodes(4, 4096, 2)},
      {"decode_b1_gqa8_d128_4k", 1, 8, 128, 16, {{4001, 1}}},
      {"decode_b3_gqa8_d128", 2, 8, 128, 32, random_decodes(3, 3000, 3)},
      {"mixed_gqa4_d128", 2, 4, 128, 16, {{1, 1}, {300, 300}, {1000, 37}, {77, 1}, {200, 129}, {2500, 1}}},
      {"prefill_prefix_gqa1_d64", 4, 1, 64, 16, {{1129, 129}, {64, 64}}},
      {"mixed_gqa8_d128_small_blocks", 1, 8, 128, 8, {{513, 17}, {9, 1}, {40, 40}}},
      {"stories_shape_gqa2_d8", 4, 2, 8, 16, {{5, 5}, {130, 1}, {60, 3}}},
      {"uneven_gqa6_d64", 2, 6, 64, 16, {{150, 150}, {700, 1}, {95, 33}}},
  };
}

TEST(CudaAttention, MatchesCpuOnShuffledBlockTables) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  uint32_t seed = 100;
  for (const AttnCase& c : cases()) {
    const std::vector<float> want = run_case(*cpu, c, seed), got = run_case(*gpu, c, seed);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(max_rel_diff(got, want), 1e-2) << c.name;
    seed += 10;
  }
}

}  // namespace
}  // namespace serval::testing
