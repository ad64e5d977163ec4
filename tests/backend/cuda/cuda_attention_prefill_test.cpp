// The prefill path of CudaBackend::paged_attention (tensor-core kernel for
// head_dim 64 and 128, CUDA-core fallback otherwise) against the CPU backend
// on random K/V laid out through shuffled block tables: GQA groups 1 to 16,
// query lengths 2 to 8192 (on and off the 64/128-row tiles), chunks behind a
// cached prefix (up to 32k context), many sequences per batch, decode rows in
// the same batch (the decode kernel fills those; every row is compared), and
// block sizes 4 to 256 plus a non-power-of-two one. The output starts as a
// sentinel so an unwritten row fails. A second test times the kernel at real
// model shapes and prints TFLOP/s. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "cuda_test_util.h"

namespace serval::testing {
namespace {

struct SeqSpec {
  int32_t context;  // tokens in the cache after the step
  int32_t query;    // new tokens this step (the last `query` positions)
};

struct PrefillCase {
  std::string name;
  int32_t kv_heads, group, head_dim, block_size;
  std::vector<SeqSpec> seqs;
};

constexpr float kSentinel = 4096.0f;  // exact in bf16, far outside any attention output

// One backend's copy of a case: pools filled through kv_write in shuffled
// block order, batch arrays and q in its memory, out preset to the sentinel.
struct PagedBatch {
  KvGeometry geom;
  KvLayer kv;
  DevTensor q, out;
  DeviceBuffer table, query_start, context_len, positions;
  BatchView view;
  int32_t num_heads = 0;
  float scale = 0;

  void run(Backend& be) const { be.paged_attention(q.t, kv, geom, view, num_heads, scale, out.t); }
};

PagedBatch build(Backend& be, const PrefillCase& c, uint32_t seed) {
  PagedBatch b;
  const int32_t S = int32_t(c.seqs.size()), D = c.head_dim;
  b.num_heads = c.kv_heads * c.group;
  b.scale = 1.0f / std::sqrt(float(D));
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
  b.geom = KvGeometry{total_blocks + 5, c.block_size, c.kv_heads, D};
  std::vector<int32_t> order(size_t(b.geom.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<int32_t> table(size_t(S) * max_blocks, -1), qstart = {0}, ctx, positions;
  std::vector<int64_t> all_slots;  // every context token, to fill the pools
  size_t next = 0;
  for (int32_t s = 0; s < S; ++s) {
    const SeqSpec& sp = c.seqs[size_t(s)];
    int32_t* row = table.data() + size_t(s) * max_blocks;
    for (int32_t blk = 0; blk * c.block_size < sp.context; ++blk) row[blk] = order[next++];
    for (int32_t j = 0; j < sp.context; ++j)
      all_slots.push_back(int64_t(row[j / c.block_size]) * c.block_size + j % c.block_size);
    for (int32_t j = sp.context - sp.query; j < sp.context; ++j) positions.push_back(j);
    qstart.push_back(qstart.back() + sp.query);
    ctx.push_back(sp.context);
  }
  b.kv = be.alloc_kv_layer(b.geom);
  const int64_t n_ctx = int64_t(all_slots.size());
  {
    DevTensor k = upload(be, random_bf16(size_t(n_ctx * kv_row), seed + 1), n_ctx, kv_row);
    DevTensor v = upload(be, random_bf16(size_t(n_ctx * kv_row), seed + 2), n_ctx, kv_row);
    DeviceBuffer slots = upload_ints(be, all_slots);
    be.kv_write(k.t, v.t, static_cast<int64_t*>(slots.data()), b.kv, b.geom);
    be.synchronize();  // k, v and slots go out of scope
  }
  const int64_t width = int64_t(b.num_heads) * D;
  b.q = upload(be, random_bf16(size_t(T) * width, seed + 3, 2.0f), T, width);
  b.out = upload(be, std::vector<float>(size_t(T) * width, kSentinel), T, width);
  b.table = upload_ints(be, table);
  b.query_start = upload_ints(be, qstart);
  b.context_len = upload_ints(be, ctx);
  b.positions = upload_ints(be, positions);
  b.view.positions = static_cast<int32_t*>(b.positions.data());
  b.view.query_start = static_cast<int32_t*>(b.query_start.data());
  b.view.context_len = static_cast<int32_t*>(b.context_len.data());
  b.view.block_table = static_cast<int32_t*>(b.table.data());
  b.view.num_tokens = T;
  b.view.num_seqs = S;
  b.view.max_blocks_per_seq = max_blocks;
  b.view.max_query_len = max_q;
  b.view.max_context_len = max_ctx;
  return b;
}

std::vector<float> run_case(Backend& be, const PrefillCase& c, uint32_t seed) {
  const PagedBatch b = build(be, c, seed);
  b.run(be);
  return download(be, b.out.t);
}

// Attended (query, key) pairs of a case: the work the FLOP count is based on.
double attended_pairs(const PrefillCase& c) {
  double pairs = 0;
  for (const SeqSpec& s : c.seqs)
    for (int64_t i = 0; i < s.query; ++i) pairs += double(s.context - s.query + i + 1);
  return pairs;
}

// max |got - want| / max |want| over all values; non-finite or sentinel values count as failures.
struct Compare {
  double rel = 0;
  int64_t bad = 0;
};
Compare compare(const std::vector<float>& got, const std::vector<float>& want) {
  Compare r;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || got[i] == kSentinel) {
      ++r.bad;
      continue;
    }
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  r.rel = scale > 0 ? diff / scale : diff;
  return r;
}

// The query lengths on and around the 64- and 128-row tiles, two decode rows.
std::vector<SeqSpec> length_sweep(bool prefix, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> cached(1, 1500);
  std::vector<SeqSpec> out;
  for (int q : {2, 15, 16, 17, 63, 64, 65, 127, 129, 1000}) out.push_back({(prefix ? cached(rng) : 0) + q, q});
  out.insert(out.begin() + 3, SeqSpec{cached(rng), 1});
  out.push_back({1, 1});
  return out;
}

std::vector<PrefillCase> cases() {
  std::vector<PrefillCase> out;
  const int block_sizes[] = {8, 16, 32};
  int n = 0;
  for (int group : {1, 4, 8})
    for (int d : {64, 128})
      for (bool prefix : {false, true}) {
        const int bs = block_sizes[n % 3];
        const int kvh = group == 1 ? 4 : 2;
        out.push_back({"sweep_gqa" + std::to_string(group) + "_d" + std::to_string(d) + "_bs" + std::to_string(bs) +
                           (prefix ? "_prefix" : ""),
                       kvh, group, d, bs, length_sweep(prefix, 1000 + n)});
        ++n;
      }
  std::vector<SeqSpec> batch8;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> cached(0, 1000);
  for (int i = 0; i < 8; ++i) batch8.push_back({cached(rng) + 1000, 1000});
  for (int i = 0; i < 4; ++i) batch8.push_back({cached(rng) + 1, 1});
  out.push_back({"batch8x1000_prefix_gqa4_d128_bs16", 1, 4, 128, 16, batch8});
  out.push_back({"prompt4096_gqa4_d128_bs16", 2, 4, 128, 16, {{4096, 4096}}});
  out.push_back({"prompt4096_gqa1_d64_bs32", 2, 1, 64, 32, {{4096, 4096}}});
  out.push_back({"prefix3000_new1000_gqa8_d128_bs16", 1, 8, 128, 16, {{4000, 1000}, {2500, 1}, {3000, 1}}});
  out.push_back({"prefix3000_new1000_gqa1_d64_bs8", 2, 1, 64, 8, {{4000, 1000}, {77, 1}}});
  out.push_back({"prompt8192_gqa2_d128_bs256", 1, 2, 128, 256, {{8192, 8192}}});
  out.push_back({"ctx32k_chunk300_gqa8_d128_bs16", 1, 8, 128, 16, {{32768, 300}, {32000, 1}}});
  out.push_back({"llama2_7b_shape_prompt512", 32, 1, 128, 16, {{512, 512}}});
  out.push_back({"uneven_gqa6_d128_bs16", 2, 6, 128, 16, {{150, 150}, {700, 1}, {95, 33}}});
  out.push_back({"gqa16_d64_bs16", 1, 16, 64, 16, {{200, 200}, {70, 9}}});
  out.push_back({"odd_block12_gqa4_d128", 2, 4, 128, 12, {{500, 200}, {64, 64}, {300, 1}}});
  out.push_back({"block4_gqa1_d64", 2, 1, 64, 4, {{200, 130}, {33, 1}}});
  out.push_back({"fallback_d96_gqa2_bs16", 2, 2, 96, 16, {{300, 300}, {500, 77}, {40, 1}}});
  return out;
}

TEST(CudaAttentionPrefill, MatchesCpuOnShuffledBlockTables) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  uint32_t seed = 500;
  double worst = 0;
  for (const PrefillCase& c : cases()) {
    const std::vector<float> want = run_case(*cpu, c, seed), got = run_case(*gpu, c, seed);
    ASSERT_EQ(got.size(), want.size());
    const Compare r = compare(got, want);
    int64_t rows = 0;
    for (const SeqSpec& s : c.seqs) rows += s.query;
    std::printf("[prefill attention] %-36s rows %6lld  max rel err %.2e  unwritten/non-finite %lld\n", c.name.c_str(),
                static_cast<long long>(rows), r.rel, static_cast<long long>(r.bad));
    EXPECT_EQ(r.bad, 0) << c.name;
    EXPECT_LT(r.rel, 1e-2) << c.name;
    worst = std::max(worst, r.rel);
    seed += 10;
  }
  std::printf("[prefill attention] worst max rel err over all cases %.2e\n", worst);
}

// Kernel time at model shapes (batch metadata already on the device, as in a
// real step); FLOPs = 4 * attended pairs * head_dim * query heads.
TEST(CudaAttentionPrefill, SpeedAtModelShapes) {
  SERVAL_CUDA_OR_SKIP(gpu);
  std::vector<SeqSpec> batch8;
  for (int i = 0; i < 8; ++i) batch8.push_back({1000, 1000});
  const std::vector<PrefillCase> shapes = {
      {"llama3.1-8b prompt 4096 (32/8 heads)", 8, 4, 128, 16, {{4096, 4096}}},
      {"llama3.1-8b chunk 1000 after 3000", 8, 4, 128, 16, {{4000, 1000}}},
      {"llama3.1-8b 8 prompts x 1000", 8, 4, 128, 16, batch8},
      {"llama3.1-8b prompt 16384", 8, 4, 128, 16, {{16384, 16384}}},
      {"llama-2-7b prompt 512 (32/32 heads)", 32, 1, 128, 16, {{512, 512}}},
      {"llama-2-7b prompt 4096", 32, 1, 128, 16, {{4096, 4096}}},
      {"d64 prompt 4096 (32/8 heads)", 8, 4, 64, 16, {{4096, 4096}}},
  };
  for (const PrefillCase& c : shapes) {
    const PagedBatch b = build(*gpu, c, 77);
    for (int i = 0; i < 3; ++i) b.run(*gpu);
    gpu->synchronize();
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) b.run(*gpu);
    gpu->synchronize();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const double flops = 4.0 * attended_pairs(c) * c.head_dim * c.kv_heads * c.group;
    std::printf("[prefill attention speed] %-38s %8.1f us  %6.1f TFLOP/s\n", c.name.c_str(), sec * 1e6,
                flops / sec * 1e-12);
    const std::vector<float> got = download(*gpu, b.out.t);
    int64_t bad = 0;
    for (float x : got) bad += !std::isfinite(x) || x == kSentinel;
    EXPECT_EQ(bad, 0) << c.name;
  }
}

}  // namespace
}  // namespace serval::testing
