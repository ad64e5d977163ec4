// One decoder layer strung together op by op through the Backend interface on
// the CPU and CUDA backends, comparing after every op: a failure names the
// first op whose output leaves bf16 tolerance. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "runtime/rope.h"

namespace serval::testing {
namespace {

struct LayerDims {
  int64_t hidden, inter, heads, kv_heads, head_dim;
};

class Side {
 public:
  Side(Backend& be, const LayerDims& d, uint32_t seed) : be_(be), d_(d) {
    const int64_t H = d.hidden, Q = d.heads * d.head_dim, KV = d.kv_heads * d.head_dim;
    auto w = [&](const char* name, int64_t out, int64_t in, uint32_t s) {
      const auto v = random_bf16(size_t(out * in), seed + s, 1.7f / std::sqrt(float(in)));
      return be.upload_weight(TensorView{name, DType::F32, {out, in}, v.data(), int64_t(v.size() * 4)});
    };
    auto n = [&](const char* name, int64_t len, uint32_t s) {
      auto v = random_bf16(size_t(len), seed + s, 0.3f);
      for (float& x : v) x += 1.0f;
      return be.upload_weight(TensorView{name, DType::F32, {len}, v.data(), int64_t(v.size() * 4)});
    };
    norm1 = n("n1", H, 1), norm2 = n("n2", H, 2);
    wq = w("wq", Q, H, 3), wk = w("wk", KV, H, 4), wv = w("wv", KV, H, 5), wo = w("wo", H, Q, 6);
    wg = w("wg", d.inter, H, 7), wu = w("wu", d.inter, H, 8), wd = w("wd", H, d.inter, 9);
    ModelConfig cfg;
    cfg.head_dim = cfg.rope_dim = d.head_dim;
    const auto inv = rope_inv_freq(cfg, {});
    inv_freq = be.alloc(int64_t(inv.size() * 4));
    be.copy_to_device(inv_freq.data(), inv.data(), int64_t(inv.size() * 4));
    geom = KvGeometry{8, 16, int32_t(d.kv_heads), int32_t(d.head_dim)};
    kv = be.alloc_kv_layer(geom);
  }

  // Runs the layer on `x` for positions start..start+T-1 of one sequence and
  // returns every intermediate, in order, with its op name.
  std::vector<std::pair<std::string, std::vector<float>>> run(const std::vector<float>& x_in, int32_t start,
                                                              int32_t T) {
    const int64_t H = d_.hidden, Q = d_.heads * d_.head_dim, KV = d_.kv_heads * d_.head_dim, I = d_.inter;
    std::vector<std::pair<std::string, std::vector<float>>> out;
    DevTensor x = upload(be_, x_in, T, H), xn = zeros(be_, T, H), q = zeros(be_, T, Q), k = zeros(be_, T, KV),
              v = zeros(be_, T, KV), attn = zeros(be_, T, Q), proj = zeros(be_, T, H), g = zeros(be_, T, I),
              u = zeros(be_, T, I);
    std::vector<int32_t> pos, qs = {0, T}, ctx = {start + T}, table = {3, 0, 6, 1};
    std::vector<int64_t> slots;
    for (int32_t i = 0; i < T; ++i) {
      pos.push_back(start + i);
      slots.push_back(int64_t(table[size_t((start + i) / 16)]) * 16 + (start + i) % 16);
    }
    DeviceBuffer d_pos = upload_ints(be_, pos), d_qs = upload_ints(be_, qs), d_ctx = upload_ints(be_, ctx),
                 d_tab = upload_ints(be_, table), d_slots = upload_ints(be_, slots);
    BatchView bv;
    bv.positions = static_cast<int32_t*>(d_pos.data());
    bv.query_start = static_cast<int32_t*>(d_qs.data());
    bv.context_len = static_cast<int32_t*>(d_ctx.data());
    bv.block_table = static_cast<int32_t*>(d_tab.data());
    bv.slot_mapping = static_cast<int64_t*>(d_slots.data());
    bv.num_tokens = T;
    bv.num_seqs = 1;
    bv.max_blocks_per_seq = 4;
    bv.max_query_len = T;
    bv.max_context_len = start + T;
    auto keep = [&](const char* name, const Tensor& t) { out.emplace_back(name, download(be_, t)); };
    be_.rmsnorm(x.t, *norm1, 1e-5f, xn.t);
    keep("rmsnorm", xn.t);
    be_.matmul(xn.t, *wq, nullptr, q.t);
    be_.matmul(xn.t, *wk, nullptr, k.t);
    be_.matmul(xn.t, *wv, nullptr, v.t);
    keep("matmul q", q.t);
    keep("matmul v", v.t);
    RopeParams rp{RopeStyle::Neox, int32_t(d_.head_dim), int32_t(d_.head_dim),
                  static_cast<const float*>(inv_freq.data())};
    be_.rope(q.t, k.t, bv.positions, rp);
    keep("rope q", q.t);
    keep("rope k", k.t);
    be_.kv_write(k.t, v.t, bv.slot_mapping, kv, geom);
    be_.paged_attention(q.t, kv, geom, bv, int32_t(d_.heads), 1.0f / std::sqrt(float(d_.head_dim)), attn.t);
    keep("paged_attention", attn.t);
    be_.matmul(attn.t, *wo, nullptr, proj.t);
    keep("matmul o", proj.t);
    be_.add_rmsnorm(x.t, proj.t, *norm2, 1e-5f, xn.t);
    keep("add_rmsnorm residual", x.t);
    keep("add_rmsnorm out", xn.t);
    be_.matmul(xn.t, *wg, nullptr, g.t);
    be_.matmul(xn.t, *wu, nullptr, u.t);
    keep("matmul up", u.t);
    be_.silu_mul(g.t, u.t, g.t);
    keep("silu_mul", g.t);
    be_.matmul(g.t, *wd, nullptr, proj.t);
    keep("matmul down", proj.t);
    be_.add(x.t, proj.t);
    keep("add", x.t);
    return out;
  }

 private:
  Backend& be_;
  LayerDims d_;
  std::unique_ptr<DeviceWeight> norm1, norm2, wq, wk, wv, wo, wg, wu, wd;
  DeviceBuffer inv_freq;
  KvGeometry geom;
  KvLayer kv;
};

TEST(CudaLayer, EveryOpOfADecoderLayerMatchesCpuInPrefillAndDecode) {
  SERVAL_CUDA_OR_SKIP(gpu);
  auto cpu = create_backend("cpu", 0);
  for (const LayerDims& d : {LayerDims{1024, 2816, 8, 8, 128}, LayerDims{512, 1536, 8, 2, 64},
                             LayerDims{256, 512, 8, 1, 32}}) {
    Side c(*cpu, d, 7), g(*gpu, d, 7);
    struct Step { int32_t start, T; };
    for (const Step& st : {Step{0, 10}, Step{10, 1}, Step{11, 1}}) {
      const auto x = random_bf16(size_t(st.T * d.hidden), uint32_t(100 + st.start));
      const auto want = c.run(x, st.start, st.T), got = g.run(x, st.start, st.T);
      for (size_t i = 0; i < want.size(); ++i) {
        const double err = max_rel_diff(got[i].second, want[i].second);
        EXPECT_LT(err, 2e-2) << "hidden " << d.hidden << " step at " << st.start << " (" << st.T
                             << " tokens): op " << want[i].first;
        if (err >= 2e-2) break;
      }
    }
  }
}

}  // namespace
}  // namespace serval::testing
