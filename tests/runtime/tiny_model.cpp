#include "tiny_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace serval::testing {

ModelConfig tiny_config(const TinySpec& s) {
  ModelConfig c;
  c.architecture = s.arch;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.rope_dim = s.rope_dim > 0 ? s.rope_dim : s.head_dim;
  c.max_position = 256;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_style = s.style;
  c.rope_scaling = s.scaling;
  c.tie_word_embeddings = s.tied;
  c.attention_bias = s.bias;
  c.qk_norm = s.qk_norm;
  c.validate();
  return c;
}

namespace {

void add_random(WeightStore& ws, std::mt19937& rng, const std::string& name, std::vector<int64_t> shape,
                float center, float spread, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> u(-spread, spread);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = center + u(rng);
  std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(dtype, n)));
  from_f32(dtype, v.data(), bytes.data(), n);
  ws.add_owned(name, dtype, std::move(shape), std::move(bytes));
}

}  // namespace

WeightStore tiny_weights(const ModelConfig& c, const TinySpec& s) {
  WeightStore ws;
  std::mt19937 rng(s.seed);
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  const DType md = s.matrix_dtype;
  auto lin = [&](const std::string& name, int64_t out, int64_t in) {
    add_random(ws, rng, name, {out, in}, 0.0f, 1.7f / std::sqrt(float(in)), md);
  };
  auto norm = [&](const std::string& name, int64_t n) { add_random(ws, rng, name, {n}, 1.0f, 0.3f, DType::F32); };
  add_random(ws, rng, "token_embd.weight", {c.vocab_size, H}, 0.0f, 1.0f, md);
  norm("output_norm.weight", H);
  if (!c.tie_word_embeddings) add_random(ws, rng, "output.weight", {c.vocab_size, H}, 0.0f, 0.5f, md);
  if (s.rope_freqs) add_random(ws, rng, "rope_freqs.weight", {c.rope_dim / 2}, 2.0f, 1.0f, DType::F32);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", H);
    lin(p + "attn_q.weight", Q, H);
    lin(p + "attn_k.weight", KV, H);
    lin(p + "attn_v.weight", KV, H);
    lin(p + "attn_output.weight", H, Q);
    if (c.attention_bias) {
      add_random(ws, rng, p + "attn_q.bias", {Q}, 0.0f, 0.5f, DType::F32);
      add_random(ws, rng, p + "attn_k.bias", {KV}, 0.0f, 0.5f, DType::F32);
      add_random(ws, rng, p + "attn_v.bias", {KV}, 0.0f, 0.5f, DType::F32);
    }
    if (c.qk_norm) {
      norm(p + "attn_q_norm.weight", c.head_dim);
      norm(p + "attn_k_norm.weight", c.head_dim);
    }
    norm(p + "ffn_norm.weight", H);
    lin(p + "ffn_gate.weight", I, H);
    lin(p + "ffn_up.weight", I, H);
    lin(p + "ffn_down.weight", H, I);
  }
  return ws;
}

// ---------------------------------------------------------------- reference

namespace {

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;  // rows

Vec load(const WeightStore& w, const std::string& name) {
  const TensorView& t = w.get(name);
  std::vector<float> f(static_cast<size_t>(t.numel()));
  to_f32(t.dtype, t.data, f.data(), t.numel());
  return Vec(f.begin(), f.end());
}

// y = W x for W stored {out, in}.
Vec linear(const Vec& W, const Vec& x) {
  const size_t in = x.size(), out = W.size() / in;
  Vec y(out, 0.0);
  for (size_t o = 0; o < out; ++o)
    for (size_t i = 0; i < in; ++i) y[o] += W[o * in + i] * x[i];
  return y;
}

Vec rmsnorm(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * r;
  return y;
}

// Inverse frequencies written from the Hugging Face formulas, in double.
Vec inv_freqs(const ModelConfig& c, const WeightStore& w) {
  const int64_t half = c.rope_dim / 2;
  Vec f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[i] = 1.0 / std::pow(double(c.rope_theta), double(2 * i) / double(c.rope_dim));
  const RopeScaling& s = c.rope_scaling;
  if (w.find("rope_freqs.weight")) {
    Vec div = load(w, "rope_freqs.weight");
    for (int64_t i = 0; i < half; ++i) f[i] /= div[i];
    if (s.type == RopeScaling::Type::Linear)
      for (double& v : f) v /= s.factor;
    return f;
  }
  if (s.type == RopeScaling::Type::Linear) {
    for (double& v : f) v /= s.factor;
  } else if (s.type == RopeScaling::Type::Llama3) {
    const double low_wavelen = double(s.original_max_position) / s.low_freq_factor;
    const double high_wavelen = double(s.original_max_position) / s.high_freq_factor;
    for (double& v : f) {
      const double wavelen = 2 * std::numbers::pi / v;
      double scaled = wavelen > low_wavelen ? v / s.factor : v;
      const double smooth =
          (double(s.original_max_position) / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const double smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      v = medium ? smoothed : scaled;
    }
  }
  return f;
}

void rope(double* v, int64_t pos, const ModelConfig& c, const Vec& freq) {
  const int64_t half = c.rope_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double cs = std::cos(double(pos) * freq[i]), sn = std::sin(double(pos) * freq[i]);
    const int64_t a = c.rope_style == RopeStyle::Neox ? i : 2 * i;
    const int64_t b = c.rope_style == RopeStyle::Neox ? i + half : 2 * i + 1;
    const double x0 = v[a], x1 = v[b];
    v[a] = x0 * cs - x1 * sn;
    v[b] = x1 * cs + x0 * sn;
  }
}

}  // namespace

std::vector<std::vector<double>> reference_logits(const ModelConfig& c, const WeightStore& w,
                                                  const std::vector<int32_t>& tokens) {
  const size_t T = tokens.size();
  const int64_t D = c.head_dim, H = c.num_heads, KVH = c.num_kv_heads;
  const double eps = c.rms_eps;
  const Vec emb = load(w, "token_embd.weight");
  const Vec freq = inv_freqs(c, w);
  Mat x(T);
  for (size_t t = 0; t < T; ++t)
    x[t] = Vec(emb.begin() + tokens[t] * c.hidden_size, emb.begin() + (tokens[t] + 1) * c.hidden_size);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const Vec attn_norm = load(w, p + "attn_norm.weight"), ffn_norm = load(w, p + "ffn_norm.weight");
    const Vec wq = load(w, p + "attn_q.weight"), wk = load(w, p + "attn_k.weight"), wv = load(w, p + "attn_v.weight");
    const Vec wo = load(w, p + "attn_output.weight");
    const Vec wg = load(w, p + "ffn_gate.weight"), wu = load(w, p + "ffn_up.weight"), wd = load(w, p + "ffn_down.weight");
    Mat q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      const Vec xn = rmsnorm(x[t], attn_norm, eps);
      q[t] = linear(wq, xn);
      k[t] = linear(wk, xn);
      v[t] = linear(wv, xn);
      if (c.attention_bias) {
        const Vec bq = load(w, p + "attn_q.bias"), bk = load(w, p + "attn_k.bias"), bv = load(w, p + "attn_v.bias");
        for (size_t i = 0; i < q[t].size(); ++i) q[t][i] += bq[i];
        for (size_t i = 0; i < k[t].size(); ++i) k[t][i] += bk[i], v[t][i] += bv[i];
      }
      if (c.qk_norm) {
        const Vec qn = load(w, p + "attn_q_norm.weight"), kn = load(w, p + "attn_k_norm.weight");
        for (int64_t h = 0; h < H; ++h) {
          Vec head(q[t].begin() + h * D, q[t].begin() + (h + 1) * D);
          head = rmsnorm(head, qn, eps);
          std::copy(head.begin(), head.end(), q[t].begin() + h * D);
        }
        for (int64_t h = 0; h < KVH; ++h) {
          Vec head(k[t].begin() + h * D, k[t].begin() + (h + 1) * D);
          head = rmsnorm(head, kn, eps);
          std::copy(head.begin(), head.end(), k[t].begin() + h * D);
        }
      }
      for (int64_t h = 0; h < H; ++h) rope(q[t].data() + h * D, int64_t(t), c, freq);
      for (int64_t h = 0; h < KVH; ++h) rope(k[t].data() + h * D, int64_t(t), c, freq);
    }
    for (size_t t = 0; t < T; ++t) {
      Vec attn(static_cast<size_t>(H * D), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / (H / KVH);
        Vec s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[t][h * D + d] * k[j][kvh * D + d];
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d) attn[h * D + d] += s[j] / sum * v[j][kvh * D + d];
      }
      const Vec o = linear(wo, attn);
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += o[i];
      const Vec xn = rmsnorm(x[t], ffn_norm, eps);
      const Vec g = linear(wg, xn), u = linear(wu, xn);
      Vec hmid(g.size());
      for (size_t i = 0; i < g.size(); ++i) hmid[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const Vec dn = linear(wd, hmid);
      for (size_t i = 0; i < dn.size(); ++i) x[t][i] += dn[i];
    }
  }
  const Vec out_norm = load(w, "output_norm.weight");
  const Vec out_w = c.tie_word_embeddings ? emb : load(w, "output.weight");
  std::vector<std::vector<double>> logits(T);
  for (size_t t = 0; t < T; ++t) logits[t] = linear(out_w, rmsnorm(x[t], out_norm, eps));
  return logits;
}

// ---------------------------------------------------------------- paging

PagedSeqs::PagedSeqs(int32_t block_size, std::vector<int32_t> free_blocks, int32_t max_blocks_per_seq)
    : block_size_(block_size), free_(std::move(free_blocks)), max_blocks_(max_blocks_per_seq) {}

int PagedSeqs::add_sequence() {
  blocks_.emplace_back();
  lens_.push_back(0);
  return int(lens_.size()) - 1;
}

Batch PagedSeqs::step(const std::vector<int>& ids, const std::vector<std::vector<int32_t>>& chunks, bool all_logits) {
  Batch b;
  b.max_blocks_per_seq = max_blocks_;
  b.query_start.push_back(0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int s = ids[i];
    for (int32_t tok : chunks[i]) {
      const int32_t pos = lens_[s]++;
      if (pos / block_size_ >= int32_t(blocks_[s].size())) {
        SERVAL_CHECK(next_free_ < free_.size(), "test pool exhausted");
        blocks_[s].push_back(free_[next_free_++]);
      }
      b.token_ids.push_back(tok);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(int64_t(blocks_[s][pos / block_size_]) * block_size_ + pos % block_size_);
      if (all_logits) b.logits_rows.push_back(b.num_tokens() - 1);
    }
    if (!all_logits) b.logits_rows.push_back(b.num_tokens() - 1);
    b.query_start.push_back(b.num_tokens());
    b.context_len.push_back(lens_[s]);
    for (int32_t j = 0; j < max_blocks_; ++j)
      b.block_table.push_back(j < int32_t(blocks_[s].size()) ? blocks_[s][j] : -1);
  }
  return b;
}

double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  SERVAL_CHECK(a.size() == b.size(), "rel_error: sizes ", a.size(), " vs ", b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_error(a, std::vector<double>(b.begin(), b.end()));
}

}  // namespace serval::testing
