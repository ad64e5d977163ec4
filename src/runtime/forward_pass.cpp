#include "runtime/forward_pass.h"

#include <cmath>

namespace serval {

namespace {

class ForwardPass {
 public:
  ForwardPass(Backend& be, const DeviceModel& model, const Workspace& ws, const KvPool& kv, const BatchView& bv)
      : be_(be), m_(model), cfg_(model.def().config()), ws_(ws), kv_(kv), bv_(bv), T_(bv.num_tokens) {}

  void run();

 private:
  Tensor act(const DeviceBuffer& buf, int64_t rows, int64_t cols) const {
    return Tensor{buf.data(), be_.act_dtype(), rows, cols};
  }
  // A bias or a per-head norm comes between the projection and rope, so the
  // layer cannot take the fused q/k/v path (Backend::qkv_attention).
  static bool unfused_qkv(const DeviceLayer& L) { return L.def.attention.qkv_bias || L.def.attention.qk_norm; }
  // xn_ holds the attention's input norm; attn gets its output, before the o product.
  void attention(size_t l);
  // The o product into the residual, then the MLP's input norm into xn_.
  void attention_out(size_t l);
  // The MLP from xn_ into the residual, then the next layer's input norm (or
  // the final norm where every row needs logits) into xn_.
  void mlp(size_t l);
  void lm_head();

  Backend& be_;
  const DeviceModel& m_;
  const ModelConfig& cfg_;
  const Workspace& ws_;
  const KvPool& kv_;
  const BatchView& bv_;
  const int64_t T_;
  // The normalized rows in ws_.xn that the next matmuls read; the backend
  // may have left their norm to those matmuls (NormedRows::deferred).
  NormedRows xn_{Tensor{}};
};

void ForwardPass::run() {
  const Tensor x{ws_.x.data(), DType::F32, T_, cfg_.hidden_size};
  const Tensor xn = act(ws_.xn, T_, cfg_.hidden_size);
  const auto& layers = m_.layers();
  be_.embedding(m_.embedding(), bv_.token_ids, bv_.feed, x);
  // Only the fused path may use the step's angles.
  if (!layers.empty() && !unfused_qkv(layers[0])) be_.prepare_rope_angles(bv_.positions, T_, m_.rope());
  be_.rmsnorm(x, m_.attn_norm(0), cfg_.rms_eps, xn);
  xn_ = xn;
  for (size_t l = 0; l < layers.size(); ++l) {
    attention(l);
    attention_out(l);
    mlp(l);
  }
  lm_head();
}

void ForwardPass::attention(size_t l) {
  const DeviceLayer& L = m_.layers()[l];
  const AttentionDef& a = L.def.attention;
  const int64_t qd = a.num_heads * a.head_dim, kvd = a.num_kv_heads * a.head_dim;
  const Tensor q = act(ws_.q, T_, qd), k = act(ws_.k, T_, kvd), v = act(ws_.v, T_, kvd);
  const Tensor out = act(ws_.attn, T_, qd);
  const float scale = float(1.0 / std::sqrt(double(a.head_dim)));
  const KvLayer& kv = kv_.layers[l];
  const KvGeometry& geom = kv_.geoms[l];
  if (!unfused_qkv(L)) {
    be_.qkv_attention(xn_, *L.wq, *L.wk, *L.wv, q, k, v, m_.rope(), kv, geom, bv_, int32_t(a.num_heads), scale, out);
    return;
  }
  const Tensor xn = be_.finish_norm(xn_);
  if (a.qkv_bias) {
    be_.matmul(xn, *L.wq, L.bq.get(), q);
    be_.matmul(xn, *L.wk, L.bk.get(), k);
    be_.matmul(xn, *L.wv, L.bv.get(), v);
  } else {
    be_.matmul_multi(xn, {L.wq.get(), L.wk.get(), L.wv.get()}, {q, k, v});
  }
  if (a.qk_norm) {
    be_.rmsnorm(q.reshaped(a.head_dim), *L.q_norm, cfg_.rms_eps, q.reshaped(a.head_dim));
    be_.rmsnorm(k.reshaped(a.head_dim), *L.k_norm, cfg_.rms_eps, k.reshaped(a.head_dim));
  }
  be_.rope_kv_write(q, k, v, bv_.positions, m_.rope(), bv_.slot_mapping, kv, geom);
  be_.paged_attention(q, kv, geom, bv_, int32_t(a.num_heads), scale, out);
}

void ForwardPass::attention_out(size_t l) {
  const DeviceLayer& L = m_.layers()[l];
  const AttentionDef& a = L.def.attention;
  const Tensor x{ws_.x.data(), DType::F32, T_, cfg_.hidden_size};
  const Tensor attn = act(ws_.attn, T_, a.num_heads * a.head_dim);
  xn_ = be_.matmul_add_rmsnorm(attn, *L.wo, act(ws_.proj, T_, cfg_.hidden_size), x, m_.ffn_norm(l), cfg_.rms_eps,
                               act(ws_.xn, T_, cfg_.hidden_size));
}

void ForwardPass::mlp(size_t l) {
  const DeviceLayer& L = m_.layers()[l];
  const int64_t I = L.def.mlp.intermediate, H = cfg_.hidden_size;
  const Tensor x{ws_.x.data(), DType::F32, T_, H};
  const Tensor xn = act(ws_.xn, T_, H), proj = act(ws_.proj, T_, H);
  const Tensor gate = act(ws_.gate, T_, I), up = act(ws_.up, T_, I);
  be_.gated_mlp_up(xn_, *L.gate, *L.up, gate, up, gate);  // silu(gate) * up lands in gate
  if (l + 1 < m_.layers().size()) {
    xn_ = be_.matmul_add_rmsnorm(gate, *L.down, proj, x, m_.attn_norm(l + 1), cfg_.rms_eps, xn);
  } else if (bv_.num_logits_rows > 0 && bv_.logits_rows_all) {
    // Every row needs logits (a decode step): the final norm follows the
    // last projection as the other norms do, with no gather between.
    xn_ = be_.matmul_add_rmsnorm(gate, *L.down, proj, x, m_.final_norm(), cfg_.rms_eps, xn);
  } else {
    be_.matmul(gate, *L.down, nullptr, proj);
    be_.add(x, proj);
  }
}

// Only the rows that need logits go through the final norm and the LM head.
void ForwardPass::lm_head() {
  const int64_t R = bv_.num_logits_rows, H = cfg_.hidden_size;
  if (R == 0) return;
  Tensor rows_n = act(ws_.xn, R, H);
  const Tensor out{ws_.logits.data(), DType::F32, R, cfg_.vocab_size};
  if (bv_.logits_rows_all) {
    rows_n = be_.finish_norm(xn_);
  } else {
    const Tensor x{ws_.x.data(), DType::F32, T_, H};
    const Tensor rows{ws_.rows.data(), DType::F32, R, H};
    be_.gather_rows(x, bv_.logits_rows, rows);
    be_.rmsnorm(rows, m_.final_norm(), cfg_.rms_eps, rows_n);
  }
  be_.matmul(rows_n, m_.lm_head(), nullptr, out);
}

}  // namespace

void enqueue_forward(Backend& be, const DeviceModel& model, const Workspace& ws, const KvPool& kv,
                     const BatchView& bv) {
  ForwardPass(be, model, ws, kv, bv).run();
}

}  // namespace serval
