// paged_attention of the CUDA backend (prefill and split-KV decode kernels)
// against the CPU backend on random K/V laid out through shuffled block
// tables: GQA groups 1 to 32 (4, 6, 8 and beyond the 16 heads one decode
// block serves), head_dim 8 to 256, block sizes 8/16/32, contexts 1 to 32768,
// batches of 1 to 256, prefill chunks with a cached prefix mixed with decodes,
// an upper-bound max_context_len (as under CUDA graphs), and a captured graph
// replayed while the contexts change. A last test times the decode kernels
// at Llama shapes and prints their K/V bandwidth. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "cuda_attention_harness.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif

namespace serval::testing {
namespace {

using namespace attn;

const std::vector<int32_t> kEdgeContexts = {1, 2, 15, 16, 17, 31, 33, 100, 127, 129, 257, 1000, 4097};

std::vector<AttnCase> sweep_cases() {
  std::vector<AttnCase> cases;
  for (int32_t group : {1, 4, 6, 8})
    for (int32_t d : {64, 128})
      for (int32_t bs : {8, 16, 32}) {
        const std::vector<SeqSpec> seqs = concat(decodes(kEdgeContexts), {{300, 50}, {40, 40}, {18, 2}});
        cases.push_back({"sweep_gqa" + std::to_string(group) + "_d" + std::to_string(d) + "_bs" + std::to_string(bs),
                         2, group, d, bs, seqs});
      }
  return cases;
}

TEST(CudaAttention, GqaHeadDimAndBlockSizeSweep) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, sweep_cases(), 100);
}

std::vector<AttnCase> dim_cases() {
  const std::vector<SeqSpec> seqs = concat(decodes({1, 2, 17, 500, 1500}), {{130, 1}, {60, 3}, {5, 5}});
  const std::vector<AttnCase> cases = {
      {"stories_shape_gqa2_d8", 4, 2, 8, 16, seqs},
      {"gqa1_d16", 3, 1, 16, 16, seqs},
      {"gqa4_d32_bs8", 2, 4, 32, 8, seqs},
      {"gqa2_d80", 2, 2, 80, 16, seqs},
      {"gqa8_d96_bs32", 1, 8, 96, 32, seqs},
      {"gqa2_d256", 2, 2, 256, 16, seqs},
      {"gqa12_d256", 1, 12, 256, 16, seqs},
      {"gqa12_d128", 2, 12, 128, 16, seqs},
      {"gqa16_d128", 2, 16, 128, 16, seqs},
      {"gqa9_d64_bs32", 1, 9, 64, 32, seqs},
      // Beyond one decode block's 16 heads (decodes only: prefill groups are the prefill kernel's limit).
      {"gqa20_d64_two_head_blocks", 1, 20, 64, 16, decodes({1, 2, 17, 500, 1500, 130})},
      {"mqa32_d128_two_head_blocks", 1, 32, 128, 16, decodes({1, 2, 17, 500, 1500, 130})},
  };
  return cases;
}

TEST(CudaAttention, SmallAndLargeHeadDimsAndGroups) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, dim_cases(), 200);
}

std::vector<AttnCase> long_cases() {
  return {
      {"b1_32k_gqa8_d128", 4, 8, 128, 16, {{32768, 1}}},
      {"b1_32k_gqa1_d64_bs32", 4, 1, 64, 32, {{32768, 1}}},
      {"b1_4097_gqa4_d128", 8, 4, 128, 16, {{4097, 1}}},
      {"spread_gqa4_d128", 2, 4, 128, 16,
       decodes({1, 2, 15, 16, 17, 127, 128, 129, 1000, 2047, 4097, 8191, 12000, 16384, 20000})},
      {"b4_gqa1_d64_long", 4, 1, 64, 16, random_decodes(4, 1, 4096, 2)},
      {"b3_gqa8_d128_bs32", 2, 8, 128, 32, random_decodes(3, 1, 3000, 3)},
  };
}

TEST(CudaAttention, LongContexts) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, long_cases(), 300);
}

std::vector<AttnCase> large_batch_cases() {
  return {
      {"b256_short_gqa1_d128", 8, 1, 128, 16, random_decodes(256, 1, 300, 4)},
      {"b256_short_gqa4_d128_bs32", 2, 4, 128, 32, random_decodes(256, 1, 300, 5)},
      {"b64_2k_gqa4_d128", 2, 4, 128, 16, random_decodes(64, 1900, 2100, 6)},
      {"b64_gqa4_d128_to2000", 2, 4, 128, 16, random_decodes(64, 1, 2000, 1)},
      {"b128_gqa8_d64_bs8", 1, 8, 64, 8, random_decodes(128, 1, 700, 7)},
  };
}

TEST(CudaAttention, LargeBatches) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, large_batch_cases(), 400);
}

std::vector<AttnCase> mixed_cases() {
  return {
      {"mixed_gqa4_d128", 2, 4, 128, 16, {{1, 1}, {300, 300}, {1000, 37}, {77, 1}, {200, 129}, {2500, 1}}},
      {"prefill_prefix_gqa1_d64", 4, 1, 64, 16, {{1129, 129}, {64, 64}}},
      {"mixed_gqa8_d128_small_blocks", 1, 8, 128, 8, {{513, 17}, {9, 1}, {40, 40}}},
      {"uneven_gqa6_d64", 2, 6, 64, 16, {{150, 150}, {700, 1}, {95, 33}}},
      {"mixed_b38_gqa8_d128_bs32", 2, 8, 128, 32,
       concat(random_decodes(32, 1, 3000, 8), {{700, 200}, {64, 64}, {5, 5}, {2000, 17}, {129, 2}, {4097, 3}})},
      {"mixed_b20_gqa1_d128", 4, 1, 128, 16, concat({{33, 33}, {1, 1}}, random_decodes(18, 1, 1000, 9))},
  };
}

TEST(CudaAttention, MixedPrefillAndDecode) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, mixed_cases(), 500);
}

// Under CUDA graphs max_context_len is the model's maximum while the real
// contexts are short: the split count follows the bound, most splits are
// empty, and the merge must ignore them. The table stride is the bound's too.
std::vector<AttnCase> bound_cases() {
  const int32_t kBound = 131072;
  return {
      {"bound_b1_ctx100_gqa4_d128", 8, 4, 128, 16, {{100, 1}}, kBound},
      {"bound_b1_ctx1_gqa4_d128", 8, 4, 128, 16, {{1, 1}}, kBound},
      {"bound_b1_ctx4097_gqa8_d128", 4, 8, 128, 16, {{4097, 1}}, kBound},
      {"bound_b1_ctx32768_gqa4_d128", 2, 4, 128, 16, {{32768, 1}}, kBound},
      {"bound_b64_short_gqa4_d128", 2, 4, 128, 16, random_decodes(64, 1, 300, 10), kBound},
      {"bound_b64_short_gqa1_d128", 8, 1, 128, 16, random_decodes(64, 1, 300, 11), kBound},
      {"bound_b64_mixed_lengths_gqa8_d64", 1, 8, 64, 16, random_decodes(64, 1, 5000, 12), kBound},
      {"bound_mixed_prefill_gqa4_d128", 2, 4, 128, 16, {{300, 30}, {1, 1}, {999, 1}}, kBound},
  };
}

TEST(CudaAttention, UpperBoundContextLength) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, bound_cases(), 600);
}

// The first split launch sizes the partials and merge counters for every
// split launch of its heads: decode steps of any batch size under any bound
// after it grow no scratch (graph_epoch stays), which would drop every
// recorded graph. Each still matches the CPU.
TEST(CudaAttention, SplitScratchIsSizedOnceForEveryBatchAndBound) {
  SERVAL_CUDA_OR_SKIP(gpu);
  use_stream(*gpu, Stream::kOff);
  for (const auto& [kv_heads, group] : {std::pair{8, 4}, std::pair{32, 1}, std::pair{1, 8}}) {
    const std::string shape = "kv" + std::to_string(kv_heads) + "_g" + std::to_string(group);
    expect_matches_cpu(*gpu, {{shape + "_first", kv_heads, group, 128, 16, random_decodes(1, 100, 200, 70), 1024}}, 960);
    const int64_t epoch = gpu->graph_epoch();
    for (int32_t bound : {128, 1024, 8192, 131072})
      for (int seqs : {1, 2, 3, 5, 9, 17, 31, 39, 64}) {
        const std::string name = shape + "_b" + std::to_string(seqs) + "_bound" + std::to_string(bound);
        expect_matches_cpu(*gpu, {{name, kv_heads, group, 128, 16, random_decodes(seqs, 1, 128, uint32_t(seqs)), bound}},
                           961);
        EXPECT_EQ(gpu->graph_epoch(), epoch) << name;
      }
  }
  use_stream(*gpu, Stream::kAuto);
}

// Contexts the first split holds whole (up to 8 tiles of 16 keys) under a
// bound that plans many splits: that split writes the output itself and the
// merge skips the sequence; the result must be bitwise what one split gives
// (the same tiles in the same warps), next to longer contexts that merge.
TEST(CudaAttention, ContextsOneSplitHoldsEqualOneSplitBitwise) {
  SERVAL_CUDA_OR_SKIP(gpu);
  use_stream(*gpu, Stream::kOff);  // the split kernel's own property
  for (int32_t group : {1, 4}) {
    const AttnCase c{"whole_split_gqa" + std::to_string(group), 8 / group, group, 128, 16,
                     decodes({1, 2, 15, 16, 17, 100, 127, 128})};
    const std::vector<float> one = run_on(*gpu, c, 650, 0), planned = run_on(*gpu, c, 650, 131072);
    EXPECT_EQ(planned, one) << c.name;
    // With a long context in the batch, the others still merge or not, per sequence.
    AttnCase mixed = c;
    mixed.seqs.push_back({5000, 1});
    const std::vector<float> m1 = run_on(*gpu, mixed, 651, 0), m2 = run_on(*gpu, mixed, 651, 131072);
    const int64_t short_vals = int64_t(c.seqs.size()) * 8 * 128;  // the short sequences' rows come first
    EXPECT_TRUE(std::equal(m1.begin(), m1.begin() + short_vals, m2.begin())) << mixed.name;
    EXPECT_LT(worst_head_error(m2, m1, 128), 1e-2) << mixed.name << ": the merged sequence";
  }
}

TEST(CudaAttention, GraphReplayFollowsChangingContexts) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_graph_replay_follows_contexts(*gpu, Stream::kAuto);
}

// The stream kernel wherever it can run, even where the backend would pick
// the split kernel: short items cut into pieces of one tile, items spread over
// hundreds of warps (32k contexts), prefill rows it must skip, groups of two
// head tiles, every head_dim; then replayed from a graph, which reuses the
// per-warp flags the merging warps clear.
TEST(CudaAttention, StreamKernelOnEveryCase) {
  SERVAL_CUDA_OR_SKIP(gpu);
  use_stream(*gpu, Stream::kAlways);
  uint32_t seed = 900;
  for (const auto& cases : {sweep_cases(), dim_cases(), long_cases(), large_batch_cases(), mixed_cases(), bound_cases()})
    expect_matches_cpu(*gpu, cases, seed += 1000);
  expect_graph_replay_follows_contexts(*gpu, Stream::kAlways);
}

// The backend's own choice: the stream kernel for a batch of long contexts
// whose items fill the GPU, the split kernel for short contexts or few items.
TEST(CudaAttention, AutoStreamsLongContextsOnly) {
  SERVAL_CUDA_OR_SKIP(gpu);
#ifdef SERVAL_WITH_CUDA
  struct Pick {
    AttnCase c;
    bool stream;
  };
  const std::vector<Pick> picks = {
      {{"auto_b64_long_gqa4_d128", 8, 4, 128, 16, random_decodes(64, 2048, 4096, 40)}, true},
      {{"auto_b64_long_gqa1_d128_bound", 32, 1, 128, 16, random_decodes(64, 1500, 3000, 41), 131072}, true},
      {{"auto_b64_short_gqa1_d128", 32, 1, 128, 16, random_decodes(64, 128, 256, 42)}, false},
      {{"auto_b4_long_gqa4_d128", 8, 4, 128, 16, random_decodes(4, 4000, 5000, 43)}, false},
  };
  for (const Pick& pick : picks) {
    const int64_t before = cuda::stream_attention_calls(*gpu);
    expect_matches_cpu(*gpu, {pick.c}, 950);
    EXPECT_EQ(cuda::stream_attention_calls(*gpu) - before, pick.stream ? 1 : 0) << pick.c.name;
  }
#endif
}

// Decode attention alone, as a captured graph of 10 launches replayed: time
// per launch and K/V bytes read per second, by the split kernel and by the
// stream kernel. Pools are zeros (alloc), which
// costs the kernels the same as real data. Prints; asserts nothing about speed.
TEST(CudaAttentionBench, DecodeBandwidth) {
  SERVAL_CUDA_OR_SKIP(gpu);
  struct Shape {
    std::string name;
    int32_t kv_heads, group, batch, ctx_lo, ctx_hi, bound;
  };
  const std::vector<Shape> shapes = {
      {"llama2-7b b1 ctx 128-256", 32, 1, 1, 200, 200, 0},
      {"llama2-7b b16 ctx 128-256", 32, 1, 16, 128, 256, 0},
      {"llama2-7b b64 ctx 128", 32, 1, 64, 128, 128, 0},
      {"llama2-7b b64 ctx 192", 32, 1, 64, 192, 192, 0},
      {"llama2-7b b64 ctx 256", 32, 1, 64, 256, 256, 0},
      {"llama2-7b b64 ctx 128-256", 32, 1, 64, 128, 256, 0},
      {"llama2-7b b256 ctx 128-256", 32, 1, 256, 128, 256, 0},
      {"llama2-7b b64 ctx 128-256 bound 4096", 32, 1, 64, 128, 256, 4096},
      {"llama3-8b b1 ctx 100 bound 131072", 8, 4, 1, 100, 100, 131072},
      {"llama3-8b b1 ctx 4k", 8, 4, 1, 4096, 4096, 0},
      {"llama3-8b b1 ctx 4k bound 131072", 8, 4, 1, 4096, 4096, 131072},
      {"llama3-8b b1 ctx 16k", 8, 4, 1, 16384, 16384, 0},
      {"llama3-8b b1 ctx 32k", 8, 4, 1, 32768, 32768, 0},
      {"llama3-8b b1 ctx 32k bound 131072", 8, 4, 1, 32768, 32768, 131072},
      {"llama3-8b b64 ctx 4k", 8, 4, 64, 4096, 4096, 0},
      {"llama3-8b b64 ctx 16k", 8, 4, 64, 16384, 16384, 0},
      {"llama3-8b b64 ctx 32k", 8, 4, 64, 32768, 32768, 0},
      {"llama3-8b b64 ctx 1k-4k bound 131072", 8, 4, 64, 1024, 4096, 131072},
  };
  constexpr int kLaunches = 10, kD = 128;
  for (const Stream mode : {Stream::kOff, Stream::kAlways})
    for (const Shape& sh : shapes) {
      use_stream(*gpu, mode);
      AttnCase c{sh.name, sh.kv_heads, sh.group, kD, 16, random_decodes(sh.batch, sh.ctx_lo, sh.ctx_hi, 30), sh.bound};
      AttnWorld w = make_world(*gpu, c, 800, /*fill=*/false);
      set_step(*gpu, w, c.seqs, sh.bound);
      int64_t keys = 0;
      for (const SeqSpec& s : c.seqs) keys += s.context;
      const double bytes = double(keys) * sh.kv_heads * kD * 2 * 2;  // bf16 K and V
      enqueue_attention(*gpu, w);
      gpu->synchronize();
      gpu->begin_capture();
      for (int i = 0; i < kLaunches; ++i) enqueue_attention(*gpu, w);
      std::unique_ptr<DeviceGraph> graph = gpu->end_capture();
      graph->replay();
      gpu->synchronize();
      using clock = std::chrono::steady_clock;
      auto t0 = clock::now();
      graph->replay();
      gpu->synchronize();
      const double once = std::chrono::duration<double>(clock::now() - t0).count();
      const int reps = std::clamp(int(0.05 / std::max(once, 1e-7)), 2, 200);
      t0 = clock::now();
      for (int r = 0; r < reps; ++r) graph->replay();
      gpu->synchronize();
      const double per_launch = std::chrono::duration<double>(clock::now() - t0).count() / (reps * kLaunches);
      std::printf("[attn-bw] %-6s %-40s %8.1f us/launch  %6.2f TB/s of K+V (%.1f MB)\n",
                  mode == Stream::kOff ? "split" : "stream", sh.name.c_str(), per_launch * 1e6,
                  bytes / per_launch / 1e12, bytes / 1e6);
    }
}

}  // namespace
}  // namespace serval::testing
