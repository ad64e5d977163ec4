// Sliding-window paged attention (KvGeometry::window) on the CUDA backend
// against the CPU backend, through the harness of cuda_attention_test.cpp:
// windows 1 to 4096 over decode batches with contexts shorter and longer than
// the window (block sizes 4, 8 and 16), long contexts whose window the split
// decode kernel divides, upper-bound context lengths (CUDA graphs), prefill
// chunks longer than the window and chunks starting mid-sequence (tensor-core
// kernel, head_dim 64 / 128, and the CUDA-core one for the others), GQA
// groups 1 to 20, a captured graph replayed while the contexts change, the
// stream kernel asked for (the split kernel must serve windows), f32 mode and
// batch-invariant mode. Table entries of blocks wholly before every query's
// window are -1, as the KV manager leaves released blocks: a kernel that
// read one would fault or fail. A window wider than every context gives
// exactly the bits of no window. Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "cuda_attention_harness.h"

namespace serval::testing {
namespace {

using namespace attn;

const std::vector<int32_t> kWindowContexts = {1,  2,  4,  5,   6,   15,  16,  17,   36,
                                              37, 38, 99, 100, 101, 129, 300, 1000, 4097};

std::string tag(const std::string& base, int32_t window, int32_t group, int32_t d, int32_t bs) {
  return base + "_w" + std::to_string(window) + "_gqa" + std::to_string(group) + "_d" + std::to_string(d) + "_bs" +
         std::to_string(bs);
}

std::vector<AttnCase> decode_cases() {
  std::vector<AttnCase> cases;
  for (int32_t window : {1, 5, 16, 37, 100})
    for (int32_t bs : {16, 8, 4})
      for (const auto& [group, d] : {std::pair{1, 64}, std::pair{4, 128}}) {
        const int32_t kv = 8 / group;
        cases.push_back({tag("decode", window, group, d, bs), kv, group, d, bs, decodes(kWindowContexts), 0, window});
      }
  return cases;
}

TEST(CudaAttentionWindow, DecodeBatches) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, decode_cases(), 1100);
}

// Windows whose keys the split kernel divides among its splits (up to a
// 32k context), beside short contexts, and under an upper-bound
// max_context_len (the split count follows min(bound, window + 16)).
std::vector<AttnCase> long_cases() {
  const int32_t kBound = 131072;
  return {
      {"b1_32k_w4096_gqa8_d128", 4, 8, 128, 16, {{32768, 1}}, 0, 4096},
      {"b1_32k_w100_gqa4_d128", 8, 4, 128, 16, {{32768, 1}}, 0, 100},
      {"b1_32k_w1000_gqa1_d64_bs8", 4, 1, 64, 8, {{32768, 1}}, 0, 1000},
      {"b1_4097_w4096_gqa4_d128", 8, 4, 128, 16, {{4097, 1}}, 0, 4096},
      {"spread_w1000_gqa4_d128", 2, 4, 128, 16,
       decodes({1, 2, 15, 16, 17, 999, 1000, 1001, 1016, 1017, 2047, 4097, 8191, 16384, 20000}), 0, 1000},
      {"b4_w777_gqa1_d64_bs4", 4, 1, 64, 4, random_decodes(4, 1, 4096, 2), 0, 777},
      {"bound_b1_ctx100_w37", 8, 4, 128, 16, {{100, 1}}, kBound, 37},
      {"bound_b1_ctx32768_w4096", 2, 4, 128, 16, {{32768, 1}}, kBound, 4096},
      {"bound_b64_mixed_w1000_gqa8_d64", 1, 8, 64, 16, random_decodes(64, 1, 5000, 12), kBound, 1000},
      {"bound_b64_short_w16_gqa1_d128_bs8", 8, 1, 128, 8, random_decodes(64, 1, 300, 11), kBound, 16},
      {"b64_2k_w512_gqa4_d128", 2, 4, 128, 16, random_decodes(64, 1900, 2100, 6), 0, 512},
  };
}

TEST(CudaAttentionWindow, LongContextsSplitOverTheWindow) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, long_cases(), 1200);
}

// Prefill chunks: a prompt longer than the window, chunks that start
// mid-sequence behind a cached prefix, long chunks whose query tiles skip
// whole key tiles, decodes in the same batch; block sizes 16 / 8 (the
// tensor-core kernel's table fetched ahead) and 4 (looked up per key), GQA 6
// (query tiles of 21 tokens).
std::vector<AttnCase> prefill_cases() {
  std::vector<AttnCase> cases;
  const std::vector<SeqSpec> mixed = {{1, 1}, {300, 300}, {1000, 37}, {77, 1}, {200, 129}, {2500, 1}, {40, 40}};
  for (int32_t window : {1, 5, 16, 37, 100, 1000})
    for (int32_t bs : {16, 4}) {
      cases.push_back({tag("mixed", window, 4, 128, bs), 2, 4, 128, bs, mixed, 0, window});
      cases.push_back({tag("mixed", window, 6, 64, bs), 2, 6, 64, bs, mixed, 0, window});
    }
  cases.push_back({"prompt_300_w37_gqa4_d128", 2, 4, 128, 16, {{300, 300}}, 0, 37});
  cases.push_back({"chunk_mid_1129_129_w100_gqa1_d64", 4, 1, 64, 16, {{1129, 129}, {64, 64}}, 0, 100});
  cases.push_back({"chunk_mid_1129_129_w5_gqa1_d64_bs8", 4, 1, 64, 8, {{1129, 129}}, 0, 5});
  cases.push_back({"long_chunk_4096_w1000_gqa6_d64_bs4", 2, 6, 64, 4, {{4096, 4096}}, 0, 1000});
  cases.push_back({"long_chunk_8192_2048_w700_gqa8_d128", 1, 8, 128, 16, {{8192, 2048}, {513, 17}}, 0, 700});
  cases.push_back({"chunk_mid_w1_gqa4_d128_bs8", 2, 4, 128, 8, {{513, 17}, {9, 1}, {40, 40}}, 0, 1});
  return cases;
}

TEST(CudaAttentionWindow, PrefillChunks) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, prefill_cases(), 1300);
}

// The head dims without a tensor-core prefill kernel (the CUDA-core one
// takes their chunks), every decode head_dim, and groups beyond the 16 heads
// of one decode block.
std::vector<AttnCase> dim_cases() {
  const std::vector<SeqSpec> seqs = concat(decodes({1, 2, 17, 40, 500, 1500}), {{130, 1}, {60, 3}, {5, 5}, {300, 90}});
  std::vector<AttnCase> cases;
  for (int32_t window : {1, 16, 37}) {
    const std::string w = "_w" + std::to_string(window);
    cases.push_back({"gqa2_d8" + w, 4, 2, 8, 16, seqs, 0, window});
    cases.push_back({"gqa1_d16_bs4" + w, 3, 1, 16, 4, seqs, 0, window});
    cases.push_back({"gqa4_d32_bs8" + w, 2, 4, 32, 8, seqs, 0, window});
    cases.push_back({"gqa2_d80" + w, 2, 2, 80, 16, seqs, 0, window});
    cases.push_back({"gqa8_d96_bs32" + w, 1, 8, 96, 32, seqs, 0, window});
    cases.push_back({"gqa12_d256" + w, 1, 12, 256, 16, seqs, 0, window});
    cases.push_back({"gqa16_d128" + w, 2, 16, 128, 16, seqs, 0, window});
    cases.push_back({"gqa20_d64_two_head_blocks" + w, 1, 20, 64, 16, decodes({1, 2, 17, 40, 500, 1500}), 0, window});
  }
  return cases;
}

TEST(CudaAttentionWindow, HeadDimsAndGroups) {
  SERVAL_CUDA_OR_SKIP(gpu);
  expect_matches_cpu(*gpu, dim_cases(), 1400);
}

// A window at least as wide as every context reads what no window reads, in
// the same tiles: the windowed kernels give exactly the bits of the others.
// (Decode contexts of at most 128 keys, which the first split holds whole:
// the split count, planned from the window, may differ.)
TEST(CudaAttentionWindow, WiderThanEveryContextIsBitwiseNoWindow) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const std::vector<SeqSpec> seqs = concat(decodes({1, 17, 100, 128}), {{300, 300}, {1129, 129}, {5, 5}});
  for (const auto& [group, d] : {std::pair{4, 128}, std::pair{1, 64}, std::pair{2, 80}}) {
    AttnCase plain{"plain", 2, group, d, 16, seqs};
    AttnCase wide = plain;
    wide.window = 1129;
    EXPECT_EQ(run_on(*gpu, wide, 1500, 0), run_on(*gpu, plain, 1500, 0)) << "d" << d;
    EXPECT_EQ(run_on(*gpu, wide, 1501, 131072), run_on(*gpu, plain, 1501, 131072)) << "d" << d << " bound";
  }
}

// The stream kernel has no window: asked for everywhere, the backend still
// serves windowed layers with the split kernel, correctly.
TEST(CudaAttentionWindow, StreamKernelNeverServesAWindow) {
  SERVAL_CUDA_OR_SKIP(gpu);
  use_stream(*gpu, Stream::kAlways);
#ifdef SERVAL_WITH_CUDA
  const int64_t before = cuda::stream_attention_calls(*gpu);
#endif
  expect_matches_cpu(*gpu, long_cases(), 1600);
  expect_matches_cpu(*gpu, decode_cases(), 1700);
#ifdef SERVAL_WITH_CUDA
  EXPECT_EQ(cuda::stream_attention_calls(*gpu), before);
#endif
  use_stream(*gpu, Stream::kAuto);
}

// One capture, replayed while the contexts grow past the window and shrink.
TEST(CudaAttentionWindow, GraphReplayFollowsChangingContexts) {
  SERVAL_CUDA_OR_SKIP(gpu);
  for (int32_t window : {1, 37, 300, 2000}) expect_graph_replay_follows_contexts(*gpu, Stream::kAuto, window);
}

// f32 mode: one CUDA-core kernel serves every row, prefill and decode.
TEST(CudaAttentionWindow, Float32) {
  std::unique_ptr<Backend> gpu;
  try {
    gpu = create_backend("cuda", 0, "float32");
  } catch (const Error&) {
    GTEST_SKIP() << "no CUDA backend in this build or no CUDA device here";
  }
  std::vector<AttnCase> cases = decode_cases();
  for (const auto& more : {prefill_cases(), dim_cases()}) cases.insert(cases.end(), more.begin(), more.end());
  cases.push_back(long_cases()[0]);
  cases.push_back(long_cases()[2]);
  expect_matches_cpu(*gpu, cases, 1800, 1e-5);
}

// Batch-invariant mode: the prefill kernels serve the decode rows too.
TEST(CudaAttentionWindow, BatchInvariant) {
  SERVAL_CUDA_OR_SKIP(gpu);
  gpu->set_batch_invariant(true);
  std::vector<AttnCase> cases = decode_cases();
  for (const auto& more : {prefill_cases(), dim_cases(), long_cases()})
    cases.insert(cases.end(), more.begin(), more.end());
  expect_matches_cpu(*gpu, cases, 1900);
}

}  // namespace
}  // namespace serval::testing
