// CudaBackend::qkv_attention with rope and the KV write done by the split
// decode kernel (AttnRopeFold) against the same op with them in their own
// kernel (use_rope_in_attention off, the default): the attention output and both pools
// bitwise equal. Decode steps of 17..64 sequences whose contexts run from 1
// to 3,000 tokens through shuffled block tables, with the new token's slot
// holding stale K/V before the step; MHA, GQA 4 and GQA 32 (two head blocks
// per KV head write the same slot), head_dim 64/128/256, interleaved, NeoX and
// partial rope, stacked and separate projections, one split and several; then
// two steps in a row, the second replayed from a captured graph. The folded
// launches are counted, so a silent fallback fails. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_stats.h"
#endif
#include "runtime/rope.h"

namespace serval::testing {
namespace {

struct Case {
  std::string name;
  RopeStyle style;
  int32_t head_dim, rope_dim, q_heads, kv_heads;
  int64_t hidden;
  std::vector<int32_t> contexts;  // one decode per sequence: the context after the step
  bool stacked = true;            // q/k/v uploaded as one group (one stacked GEMM) or apart
};

std::vector<int32_t> random_contexts(int n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(d(rng));
  return out;
}

// Everything one step needs on one backend, made the same for a seed: the
// weights, x, pools filled with random K/V for every stored position (the
// new tokens' slots included), shuffled block tables and the batch arrays.
struct World {
  int32_t seqs = 0, capacity = 0, stride = 0;
  KvGeometry geom;
  KvLayer kv;
  std::vector<std::unique_ptr<DeviceWeight>> w;
  DeviceBuffer freq;
  RopeParams rope;
  DevTensor x, q, k, v, out;
  std::vector<int32_t> table;
  DeviceBuffer table_d, query_start, context_len, positions, slots;
  BatchView view;
};

World make_world(Backend& be, const Case& c, uint32_t seed) {
  World w;
  w.seqs = int32_t(c.contexts.size());
  w.capacity = *std::max_element(c.contexts.begin(), c.contexts.end()) + 40;  // room for later steps
  const int32_t bs = 16;
  w.stride = (w.capacity + bs - 1) / bs;
  w.geom = KvGeometry{int64_t(w.seqs) * w.stride + 5, bs, c.kv_heads, c.head_dim};
  const int64_t qw = int64_t(c.q_heads) * c.head_dim, kw = int64_t(c.kv_heads) * c.head_dim;

  const auto wq = random_bf16(size_t(qw * c.hidden), seed + 1, 0.05f);
  const auto wk = random_bf16(size_t(kw * c.hidden), seed + 2, 0.05f);
  const auto wv = random_bf16(size_t(kw * c.hidden), seed + 3, 0.05f);
  const std::vector<TensorView> views = {TensorView{"wq", DType::F32, {qw, c.hidden}, wq.data(), int64_t(wq.size() * 4)},
                                         TensorView{"wk", DType::F32, {kw, c.hidden}, wk.data(), int64_t(wk.size() * 4)},
                                         TensorView{"wv", DType::F32, {kw, c.hidden}, wv.data(), int64_t(wv.size() * 4)}};
  if (c.stacked) {
    w.w = be.upload_weight_group(views);
  } else {
    for (const TensorView& view : views) w.w.push_back(be.upload_weight(view));
  }

  ModelConfig cfg;
  cfg.head_dim = c.head_dim;
  cfg.rope_dim = c.rope_dim;
  cfg.rope_theta = 10000;
  const std::vector<float> inv = rope_inv_freq(cfg, {});
  w.freq = be.alloc(int64_t(inv.size() * 4));
  be.copy_to_device(w.freq.data(), inv.data(), int64_t(inv.size() * 4));
  w.rope = RopeParams{c.style, c.head_dim, c.rope_dim, static_cast<const float*>(w.freq.data())};

  std::vector<int32_t> order(size_t(w.geom.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  w.table.assign(size_t(w.seqs) * size_t(w.stride), -1);
  std::copy(order.begin(), order.begin() + int64_t(w.table.size()), w.table.begin());
  std::vector<int64_t> all_slots;
  for (int32_t s = 0; s < w.seqs; ++s)
    for (int32_t j = 0; j < w.capacity; ++j)
      all_slots.push_back(int64_t(w.table[size_t(s) * size_t(w.stride) + size_t(j / bs)]) * bs + j % bs);
  w.kv = be.alloc_kv_layer(w.geom);
  const int64_t n = int64_t(all_slots.size());
  DevTensor k0 = upload(be, random_bf16(size_t(n * kw), seed + 4), n, kw);
  DevTensor v0 = upload(be, random_bf16(size_t(n * kw), seed + 5), n, kw);
  DeviceBuffer slots0 = upload_ints(be, all_slots);
  be.kv_write(k0.t, v0.t, static_cast<int64_t*>(slots0.data()), w.kv, w.geom);
  be.synchronize();

  w.x = upload(be, random_bf16(size_t(w.seqs * c.hidden), seed + 6), w.seqs, c.hidden);
  w.q = zeros(be, w.seqs, qw);
  w.k = zeros(be, w.seqs, kw);
  w.v = zeros(be, w.seqs, kw);
  w.out = zeros(be, w.seqs, qw);
  std::vector<int32_t> qstart(size_t(w.seqs) + 1);
  std::iota(qstart.begin(), qstart.end(), 0);
  w.table_d = upload_ints(be, w.table);
  w.query_start = upload_ints(be, qstart);
  w.context_len = upload_ints(be, std::vector<int32_t>(size_t(w.seqs), 0));
  w.positions = upload_ints(be, std::vector<int32_t>(size_t(w.seqs), 0));
  w.slots = upload_ints(be, std::vector<int64_t>(size_t(w.seqs), 0));
  w.view.positions = static_cast<int32_t*>(w.positions.data());
  w.view.query_start = static_cast<int32_t*>(w.query_start.data());
  w.view.context_len = static_cast<int32_t*>(w.context_len.data());
  w.view.block_table = static_cast<int32_t*>(w.table_d.data());
  w.view.slot_mapping = static_cast<int64_t*>(w.slots.data());
  w.view.num_tokens = w.view.num_seqs = w.seqs;
  w.view.max_blocks_per_seq = w.stride;
  w.view.max_query_len = 1;
  return w;
}

// The step's contexts (in place: a recorded graph reads the same arrays);
// bound > 0: max_context_len, an upper bound as under graphs.
void set_step(Backend& be, World& w, const std::vector<int32_t>& contexts, int32_t bound = 0) {
  std::vector<int32_t> pos;
  std::vector<int64_t> slots;
  const int32_t bs = w.geom.block_size;
  for (int32_t s = 0; s < w.seqs; ++s) {
    const int32_t j = contexts[size_t(s)] - 1;
    pos.push_back(j);
    slots.push_back(int64_t(w.table[size_t(s) * size_t(w.stride) + size_t(j / bs)]) * bs + j % bs);
  }
  be.copy_to_device(w.positions.data(), pos.data(), int64_t(pos.size()) * 4);
  be.copy_to_device(w.context_len.data(), contexts.data(), int64_t(contexts.size()) * 4);
  be.copy_to_device(w.slots.data(), slots.data(), int64_t(slots.size()) * 8);
  w.view.max_context_len = bound > 0 ? bound : *std::max_element(contexts.begin(), contexts.end());
  w.view.mean_context_len =
      int32_t(std::accumulate(contexts.begin(), contexts.end(), int64_t(0)) / int64_t(contexts.size()));
}

void enqueue(Backend& be, World& w, const Case& c) {
  be.qkv_attention(w.x.t, *w.w[0], *w.w[1], *w.w[2], w.q.t, w.k.t, w.v.t, w.rope, w.kv, w.geom, w.view, c.q_heads,
                   1.0f / std::sqrt(float(c.head_dim)), w.out.t);
}

struct Result {
  std::vector<float> out;
  std::vector<uint16_t> k_pool, v_pool;
};
Result result(Backend& be, World& w) {
  Result r;
  r.out = download(be, w.out.t);
  const int64_t elems = w.geom.num_blocks * w.geom.block_size * w.geom.num_kv_heads * w.geom.head_dim;
  r.k_pool.resize(size_t(elems));
  r.v_pool.resize(size_t(elems));
  be.copy_to_host(r.k_pool.data(), w.kv.k.data(), elems * 2);
  be.copy_to_host(r.v_pool.data(), w.kv.v.data(), elems * 2);
  return r;
}

void fold(Backend& be, bool on) {
#ifdef SERVAL_WITH_CUDA
  cuda::use_rope_in_attention(be, on);
#else
  (void)be, (void)on;
#endif
}
int64_t folded(const Backend& be) {
#ifdef SERVAL_WITH_CUDA
  return cuda::rope_folded_attention_calls(be);
#else
  (void)be;
  return 0;
#endif
}

void expect_equal(const Result& got, const Result& want, const std::string& what) {
  EXPECT_TRUE(got.out == want.out) << what << ": attention output differs (max rel diff "
                                   << max_rel_diff(got.out, want.out) << ")";
  EXPECT_TRUE(got.k_pool == want.k_pool) << what << ": K pool differs";
  EXPECT_TRUE(got.v_pool == want.v_pool) << what << ": V pool differs";
}

std::vector<Case> cases() {
  return {
      {"mha_d128_interleaved_64seqs", RopeStyle::Interleaved, 128, 128, 8, 8, 512, random_contexts(64, 1, 300, 1)},
      {"gqa4_d128_neox_splits", RopeStyle::Neox, 128, 128, 16, 4, 512,
       {1, 2, 15, 16, 17, 31, 33, 127, 128, 129, 1000, 3000, 2999, 257, 64, 65, 100, 5, 2048, 1500}},
      {"gqa32_d128_partial_interleaved", RopeStyle::Interleaved, 128, 64, 32, 1, 512, random_contexts(17, 1, 700, 2)},
      {"gqa4_d64_partial_neox_separate", RopeStyle::Neox, 64, 32, 8, 2, 256, random_contexts(24, 1, 400, 3), false},
      {"gqa4_d256_interleaved", RopeStyle::Interleaved, 256, 256, 8, 2, 256, random_contexts(20, 1, 200, 4)},
  };
}

TEST(CudaQkvAttention, RopeInAttentionEqualsRopeKernelBitwise) {
  SERVAL_CUDA_OR_SKIP(gpu);
#ifdef SERVAL_WITH_CUDA
  cuda::use_attention_stream(*gpu, cuda::AttentionStream::kOff);  // the fold is the split kernel's
  cuda::use_cutlass_rope_epilogue(*gpu, false);  // the other way is the rope kernel's bits
#endif
  uint32_t seed = 100;
  for (const Case& c : cases()) {
    Result r[2];
    int64_t calls[2];
    for (int on = 0; on < 2; ++on) {
      fold(*gpu, on == 1);
      World w = make_world(*gpu, c, seed);
      set_step(*gpu, w, c.contexts);
      const int64_t before = folded(*gpu);
      enqueue(*gpu, w, c);
      r[on] = result(*gpu, w);
      calls[on] = folded(*gpu) - before;
    }
#ifdef SERVAL_WITH_CUDA
    EXPECT_EQ(calls[0], 0) << c.name;
    EXPECT_EQ(calls[1], 1) << c.name << ": the folded kernel did not run";
#endif
    expect_equal(r[1], r[0], c.name);
    // The step wrote the new tokens: the pools are not what the fill left.
    World fresh = make_world(*gpu, c, seed);
    EXPECT_FALSE(result(*gpu, fresh).k_pool == r[0].k_pool) << c.name << ": no new key was written";
    seed += 10;
  }
  fold(*gpu, false);
#ifdef SERVAL_WITH_CUDA
  cuda::use_attention_stream(*gpu, cuda::AttentionStream::kAuto);
#endif
}

// Two steps in a row (the second reads the key the first wrote), the second
// replayed from a graph recorded with the fold, against both eager and unfolded.
TEST(CudaQkvAttention, GraphReplayOfTheFoldFollowsPositions) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const Case c{"graph", RopeStyle::Interleaved, 128, 128, 16, 4, 512, random_contexts(40, 1, 500, 7)};
  std::vector<int32_t> next = c.contexts;
  for (int32_t& n : next) n += 1;
  Result r[2];
  for (int on = 0; on < 2; ++on) {
    fold(*gpu, on == 1);
    World w = make_world(*gpu, c, 300);
    set_step(*gpu, w, c.contexts, w.capacity);
    enqueue(*gpu, w, c);
    gpu->synchronize();
    std::unique_ptr<DeviceGraph> graph;
    if (on) {
      gpu->begin_capture();
      enqueue(*gpu, w, c);
      graph = gpu->end_capture();
    }
    set_step(*gpu, w, next, w.capacity);
    const int64_t before = folded(*gpu);
    if (on)
      graph->replay();
    else
      enqueue(*gpu, w, c);
    r[on] = result(*gpu, w);
    if (!on) {
      EXPECT_EQ(folded(*gpu), before) << "the unfolded op folded";
    }
  }
  expect_equal(r[1], r[0], "graph replay, second step");
  fold(*gpu, false);
}

}  // namespace
}  // namespace serval::testing
