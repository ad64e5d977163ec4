#pragma once
// The harness of the paged-attention tests (cuda_attention_test.cpp,
// cuda_attention_window_test.cpp): cases of sequences (context, new tokens)
// laid out through shuffled block tables with random K/V, run on a backend
// and on the CPU backend and compared head by head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif

namespace serval::testing::attn {

// Which decode kernel serves the launches: the split-KV kernel only (off), the
// stream kernel wherever it can run (always), or the backend's choice (auto).
enum class Stream { kAuto, kOff, kAlways };
inline void use_stream(Backend& be, Stream mode) {
#ifdef SERVAL_WITH_CUDA
  cuda::use_attention_stream(be, mode == Stream::kOff      ? cuda::AttentionStream::kOff
                                 : mode == Stream::kAlways ? cuda::AttentionStream::kAlways
                                                           : cuda::AttentionStream::kAuto);
#else
  (void)be, (void)mode;
#endif
}

struct SeqSpec {
  int32_t context;       // tokens in the cache after the step
  int32_t query;         // new tokens this step (the last `query` positions)
  int32_t capacity = 0;  // tokens of K/V stored and in the block table (>= context; 0: context)
};

struct AttnCase {
  std::string name;
  int32_t kv_heads, group, head_dim, block_size;
  std::vector<SeqSpec> seqs;
  int32_t context_bound = 0;  // > 0: the GPU gets this max_context_len (an upper bound, as under graphs)
  // > 0: a sliding window (KvGeometry::window); the table entries of blocks
  // before every query's window are -1 (released), as the KV manager leaves them.
  int32_t window = 0;
};

// One backend's copy of a case: pools filled through kv_write with random K/V
// (unless `fill` is off), laid out through a shuffled block table that is the
// same on every backend for a seed; queries; the batch arrays of a step.
struct AttnWorld {
  int32_t num_seqs = 0, num_tokens = 0, num_heads = 0, head_dim = 0;
  KvGeometry geom;
  KvLayer kv;
  DevTensor q, out;
  DeviceBuffer table, query_start, context_len, positions;
  BatchView view;
};

inline int32_t capacity_of(const SeqSpec& s) { return std::max(s.context, s.capacity); }

// Sets to -1 the entries of a table row whose blocks lie wholly before the
// first key that the sequence's first query reads (its position + 1 - window):
// no kernel may read them.
inline void release_behind_window(int32_t* row, const SeqSpec& s, int32_t block_size, int32_t window) {
  const int32_t first_key = std::max(0, s.context - s.query + 1 - window);
  for (int32_t b = 0; (b + 1) * block_size <= first_key; ++b) row[b] = -1;
}

inline AttnWorld make_world(Backend& be, const AttnCase& c, uint32_t seed, bool fill = true) {
  AttnWorld w;
  w.num_seqs = int32_t(c.seqs.size());
  w.num_heads = c.kv_heads * c.group;
  w.head_dim = c.head_dim;
  const int64_t kv_row = int64_t(c.kv_heads) * c.head_dim;
  int32_t stride = c.context_bound > 0 ? (c.context_bound + c.block_size - 1) / c.block_size : 0;
  int64_t total_blocks = 0;
  for (const SeqSpec& s : c.seqs) {
    const int32_t nb = (capacity_of(s) + c.block_size - 1) / c.block_size;
    stride = std::max(stride, nb);
    total_blocks += nb;
    w.num_tokens += s.query;
  }
  w.geom = KvGeometry{total_blocks + 3, c.block_size, c.kv_heads, c.head_dim};
  w.geom.window = c.window;
  std::vector<int32_t> order(size_t(w.geom.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<int32_t> table(size_t(w.num_seqs) * size_t(stride), -1), qstart = {0};
  std::vector<int64_t> all_slots;  // every stored token, to fill the pools
  size_t next = 0;
  for (int32_t s = 0; s < w.num_seqs; ++s) {
    const int32_t cap = capacity_of(c.seqs[size_t(s)]);
    int32_t* row = table.data() + size_t(s) * size_t(stride);
    for (int32_t b = 0; b * c.block_size < cap; ++b) row[b] = order[next++];
    if (fill)
      for (int32_t j = 0; j < cap; ++j) all_slots.push_back(int64_t(row[j / c.block_size]) * c.block_size + j % c.block_size);
    qstart.push_back(qstart.back() + c.seqs[size_t(s)].query);
  }
  if (c.window > 0)
    for (int32_t s = 0; s < w.num_seqs; ++s) release_behind_window(table.data() + size_t(s) * size_t(stride),
                                                                  c.seqs[size_t(s)], c.block_size, c.window);
  w.kv = be.alloc_kv_layer(w.geom);
  if (fill) {
    const int64_t n = int64_t(all_slots.size());
    DevTensor k = upload(be, random_bf16(size_t(n * kv_row), seed + 1), n, kv_row);
    DevTensor v = upload(be, random_bf16(size_t(n * kv_row), seed + 2), n, kv_row);
    DeviceBuffer slots = upload_ints(be, all_slots);
    be.kv_write(k.t, v.t, static_cast<int64_t*>(slots.data()), w.kv, w.geom);
    be.synchronize();
  }
  const int64_t q_cols = int64_t(w.num_heads) * c.head_dim;
  w.q = upload(be, random_bf16(size_t(w.num_tokens * q_cols), seed + 3, 2.0f), w.num_tokens, q_cols);
  w.out = zeros(be, w.num_tokens, q_cols);
  w.table = upload_ints(be, table);
  w.query_start = upload_ints(be, qstart);
  w.context_len = upload_ints(be, std::vector<int32_t>(size_t(w.num_seqs), 0));
  w.positions = upload_ints(be, std::vector<int32_t>(size_t(w.num_tokens), 0));
  w.view.token_ids = nullptr;
  w.view.positions = static_cast<int32_t*>(w.positions.data());
  w.view.query_start = static_cast<int32_t*>(w.query_start.data());
  w.view.context_len = static_cast<int32_t*>(w.context_len.data());
  w.view.block_table = static_cast<int32_t*>(w.table.data());
  w.view.num_tokens = w.num_tokens;
  w.view.num_seqs = w.num_seqs;
  w.view.max_blocks_per_seq = stride;
  return w;
}

// Writes the contexts (and so the positions) of a step into the world's
// arrays, in place: the query counts must be the world's.
inline void set_step(Backend& be, AttnWorld& w, const std::vector<SeqSpec>& seqs, int32_t bound) {
  std::vector<int32_t> ctx, pos;
  int32_t max_q = 0, max_ctx = 0;
  for (const SeqSpec& s : seqs) {
    for (int32_t j = s.context - s.query; j < s.context; ++j) pos.push_back(j);
    ctx.push_back(s.context);
    max_q = std::max(max_q, s.query);
    max_ctx = std::max(max_ctx, s.context);
  }
  ASSERT_EQ(int32_t(pos.size()), w.num_tokens);
  be.copy_to_device(w.positions.data(), pos.data(), int64_t(pos.size()) * 4);
  be.copy_to_device(w.context_len.data(), ctx.data(), int64_t(ctx.size()) * 4);
  w.view.max_query_len = max_q;
  w.view.max_context_len = bound > 0 ? bound : max_ctx;
  w.view.mean_context_len = int32_t(std::accumulate(ctx.begin(), ctx.end(), int64_t(0)) / int64_t(ctx.size()));
}

inline void enqueue_attention(Backend& be, AttnWorld& w) {
  be.paged_attention(w.q.t, w.kv, w.geom, w.view, w.num_heads, 1.0f / std::sqrt(float(w.head_dim)), w.out.t);
}

// Fills a tensor, in place, with a value attention cannot produce (|out| <=
// max |v| = 1), so rows a kernel forgot to write show.
inline void poison(Backend& be, const Tensor& t) {
  const size_t n = size_t(t.numel());
  if (t.dtype == DType::F32) {
    const std::vector<float> v(n, 100.0f);
    be.copy_to_device(t.data, v.data(), int64_t(n) * 4);
  } else {
    const std::vector<uint16_t> v(n, f32_to_bf16(100.0f));
    be.copy_to_device(t.data, v.data(), int64_t(n) * 2);
  }
}

inline std::vector<float> run_on(Backend& be, const AttnCase& c, uint32_t seed, int32_t bound) {
  AttnWorld w = make_world(be, c, seed);
  set_step(be, w, c.seqs, bound);
  poison(be, w.out.t);
  enqueue_attention(be, w);
  return download(be, w.out.t);
}

// Every case on `gpu` and on the CPU: the worst head's relative error under `tol`.
inline void expect_matches_cpu(Backend& gpu, const std::vector<AttnCase>& cases, uint32_t seed, double tol = 1e-2) {
  auto cpu = create_backend("cpu", 0);
  for (const AttnCase& c : cases) {
    const std::vector<float> want = run_on(*cpu, c, seed, 0), got = run_on(gpu, c, seed, c.context_bound);
    const double err = worst_head_error(got, want, c.head_dim);
    int32_t max_ctx = 0, tokens = 0;
    for (const SeqSpec& s : c.seqs) max_ctx = std::max(max_ctx, s.context), tokens += s.query;
    std::printf("[attn] %-36s %4zu seqs %5d tokens, max ctx %6d, bound %6d, window %4d: worst head rel err %.2e\n",
                c.name.c_str(), c.seqs.size(), tokens, max_ctx, c.context_bound, c.window, err);
    EXPECT_LT(err, tol) << c.name;
    seed += 10;
  }
}

inline std::vector<SeqSpec> decodes(const std::vector<int32_t>& contexts) {
  std::vector<SeqSpec> out;
  for (int32_t c : contexts) out.push_back({c, 1});
  return out;
}

inline std::vector<SeqSpec> random_decodes(int n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> ctx(lo, hi);
  std::vector<SeqSpec> out;
  for (int i = 0; i < n; ++i) out.push_back({ctx(rng), 1});
  return out;
}

inline std::vector<SeqSpec> concat(std::vector<SeqSpec> a, const std::vector<SeqSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A graph captured once (with the bound as max_context_len) and replayed while
// the contexts grow and shrink: the launch depends on nothing that changes.
// With a window, every query reads its last `window` keys.
inline void expect_graph_replay_follows_contexts(Backend& gpu, Stream mode, int32_t window = 0) {
  use_stream(gpu, mode);
  auto cpu = create_backend("cpu", 0);
  const int32_t kBound = 131072, kCap = 2600, S = 24;
  AttnCase c{"graph", 2, 4, 128, 16, {}, kBound, window};
  for (int32_t s = 0; s < S; ++s) c.seqs.push_back({1, 1, kCap});
  AttnWorld g = make_world(gpu, c, 700);
  const std::vector<std::vector<SeqSpec>> steps = {
      random_decodes(S, 1, 300, 20), random_decodes(S, 1, kCap, 21), decodes(std::vector<int32_t>(size_t(S), 1)),
      random_decodes(S, 2000, kCap, 22)};
  set_step(gpu, g, steps[0], kBound);
  enqueue_attention(gpu, g);  // eager: sizes the partials the graph will use
  gpu.synchronize();
  gpu.begin_capture();
  enqueue_attention(gpu, g);
  std::unique_ptr<DeviceGraph> graph = gpu.end_capture();
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<SeqSpec> seqs = steps[i];
    for (SeqSpec& s : seqs) s.capacity = kCap;
    set_step(gpu, g, seqs, kBound);
    poison(gpu, g.out.t);
    graph->replay();
    const std::vector<float> got = download(gpu, g.out.t);
    AttnCase ref = c;
    ref.seqs = seqs;
    const std::vector<float> want = run_on(*cpu, ref, 700, 0);
    const double err = worst_head_error(got, want, c.head_dim);
    std::printf("[attn] graph replay (%s) step %zu (%d seqs, contexts up to %d, bound %d, window %d): "
                "worst head rel err %.2e\n",
                mode == Stream::kAlways ? "stream kernel" : "auto", i, S,
                std::max_element(seqs.begin(), seqs.end(),
                                 [](const SeqSpec& a, const SeqSpec& b) { return a.context < b.context; })
                    ->context,
                kBound, window, err);
    EXPECT_LT(err, 1e-2) << "step " << i;
  }
}

}  // namespace serval::testing::attn
