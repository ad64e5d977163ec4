#include "model/awq.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/rtn_quantize.h"

namespace serval {

namespace {

const FloatTensor& need(const FloatWeights& w, const std::string& name) {
  const auto it = w.find(name);
  SERVAL_CHECK(it != w.end(), "calibration: missing tensor \"", name, "\"");
  return it->second;
}

FloatTensor& need(FloatWeights& w, const std::string& name) {
  return const_cast<FloatTensor&>(need(static_cast<const FloatWeights&>(w), name));
}

const ChannelStats& need_stats(const std::map<std::string, ChannelStats>& stats, const std::string& name,
                               int64_t cols) {
  const auto it = stats.find(name);
  SERVAL_CHECK(it != stats.end() && it->second.tokens > 0 && it->second.sampled() > 0,
               "calibration: no inputs of \"", name, "\" were seen");
  SERVAL_CHECK(it->second.cols == cols, "calibration: \"", name, "\"'s inputs are ", it->second.cols,
               " wide, its matrix ", cols);
  return it->second;
}

void scale_columns(FloatTensor& m, const std::vector<float>& s) {
  const int64_t in = m.cols();
  for (int64_t r = 0; r < m.rows(); ++r)
    for (int64_t c = 0; c < in; ++c) m.v[size_t(r * in + c)] *= s[size_t(c)];
}

// Row (or element, for a vector) r divided by s[r].
void divide_rows(FloatTensor& m, const std::vector<float>& s) {
  SERVAL_CHECK(int64_t(s.size()) == (m.shape.size() == 2 ? m.rows() : m.cols()), "calibration: ", s.size(),
               " scales for a tensor of ", m.rows(), " rows");
  const int64_t in = m.shape.size() == 2 ? m.cols() : 1;
  for (size_t r = 0; r < s.size(); ++r)
    for (int64_t c = 0; c < in; ++c) m.v[r * size_t(in) + size_t(c)] /= s[r];
}

// One group: the linears reading one input, and where 1/s goes.
struct Group {
  std::string label;
  std::vector<std::string> linears;
  std::string stats_name;
  std::vector<std::string> divide;  // tensors whose rows (or elements) take 1 / s_fold
  bool ties_heads = false;          // o: s shared by the query heads of a KV head; v takes s per KV row
};

std::vector<Group> layer_groups(const ModelConfig& cfg, int64_t l) {
  const std::string p = str_cat("blk.", l, ".");
  std::vector<std::string> v_rows = {p + "attn_v.weight"};
  if (cfg.attention_bias) v_rows.push_back(p + "attn_v.bias");
  return {
      {str_cat("blk.", l, " q/k/v"), {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"},
       p + "attn_q.weight", {p + "attn_norm.weight"}, false},
      {str_cat("blk.", l, " o"), {p + "attn_output.weight"}, p + "attn_output.weight", v_rows, true},
      {str_cat("blk.", l, " gate/up"), {p + "ffn_gate.weight", p + "ffn_up.weight"}, p + "ffn_gate.weight",
       {p + "ffn_norm.weight"}, false},
      {str_cat("blk.", l, " down"), {p + "ffn_down.weight"}, p + "ffn_down.weight", {p + "ffn_up.weight"}, false},
  };
}

}  // namespace

void ChannelStats::add(const float* x, int64_t n, int64_t width) {
  if (cols == 0) {
    cols = width;
    abs_sum.assign(size_t(width), 0.0);
  }
  SERVAL_CHECK(width == cols, "calibration: inputs of ", width, " columns after ", cols);
  for (int64_t r = 0; r < n; ++r, ++tokens) {
    const float* row = x + r * width;
    for (int64_t c = 0; c < width; ++c) abs_sum[size_t(c)] += std::fabs(row[c]);
    if (tokens % stride == 0) rows.insert(rows.end(), row, row + width);
  }
}

std::vector<float> ChannelStats::mean_abs() const {
  std::vector<float> m(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) m[size_t(c)] = float(abs_sum[size_t(c)] / double(std::max<int64_t>(tokens, 1)));
  return m;
}

std::vector<std::string> awq_input_names(const ModelConfig& cfg) {
  std::vector<std::string> names;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const Group& g : layer_groups(cfg, l)) names.push_back(g.stats_name);
  return names;
}

std::vector<float> awq_scales(const std::vector<float>& mean_abs, float alpha, const int64_t* tie_heads) {
  std::vector<float> m = mean_abs;
  if (tie_heads != nullptr) {
    const int64_t heads = tie_heads[0], kv = tie_heads[1], d = tie_heads[2], per = heads / kv;
    SERVAL_CHECK(heads * d == int64_t(m.size()) && kv > 0 && heads % kv == 0, "calibration: ", m.size(),
                 " attention outputs are not ", heads, " heads of ", d);
    for (int64_t k = 0; k < kv; ++k)
      for (int64_t i = 0; i < d; ++i) {
        double sum = 0;
        for (int64_t h = k * per; h < (k + 1) * per; ++h) sum += mean_abs[size_t(h * d + i)];
        for (int64_t h = k * per; h < (k + 1) * per; ++h) m[size_t(h * d + i)] = float(sum / double(per));
      }
  }
  // A channel that never fires would otherwise get a scale of 0: floor it.
  const float top = *std::max_element(m.begin(), m.end());
  float lo = INFINITY, hi = 0;
  std::vector<float> s(m.size());
  for (size_t c = 0; c < m.size(); ++c) {
    s[c] = std::pow(std::max(m[c], top * 1e-5f + 1e-30f), alpha);
    lo = std::min(lo, s[c]), hi = std::max(hi, s[c]);
  }
  const float norm = std::sqrt(lo * hi);
  for (float& v : s) v /= norm;
  return s;
}

namespace {

// Sum of squared output errors on x's sampled rows of `w` against
// Q(scaled) diag(1/s), Q quantizing to `want` (or its fallback); adds the
// outputs counted to `outputs`.
double scaled_error(const LinearFormat& want, const std::string& name, const FloatTensor& w,
                    const FloatTensor& scaled, const std::vector<float>& s, const ChannelStats& x, int64_t& outputs) {
  const int64_t n = x.sampled(), in = x.cols, out = w.rows();
  SERVAL_CHECK(w.cols() == in, "calibration: \"", name, "\" is ", w.cols(), " wide, its inputs ", in);
  std::string why;
  std::vector<float> e =
      dequantize_linear(quantize_matrix_rtn(rtn_format_for(want, in, why), name, scaled.v.data(), out, in).linear);
  for (int64_t r = 0; r < out; ++r)  // back in the input's own units
    for (int64_t c = 0; c < in; ++c) {
      const size_t i = size_t(r * in + c);
      e[i] = e[i] / s[size_t(c)] - w.v[i];
    }
  std::vector<float> y(size_t(n * out));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out), int(in), 1.0f, x.rows.data(), int(in),
              e.data(), int(in), 0.0f, y.data(), int(out));
  double sum = 0;
  for (const float v : y) sum += double(v) * double(v);
  outputs += n * out;
  return sum;
}

}  // namespace

double awq_output_error(const LinearFormat& want, const std::vector<std::pair<std::string, const FloatTensor*>>& ws,
                        const std::vector<float>& s, const ChannelStats& x) {
  double sum = 0;
  int64_t outputs = 0;
  for (const auto& [name, w] : ws) {
    FloatTensor scaled = *w;
    scale_columns(scaled, s);
    sum += scaled_error(want, name, *w, scaled, s, x, outputs);
  }
  return sum / double(std::max<int64_t>(outputs, 1));
}

double awq_clip(FloatTensor& w, const LinearFormat& f, const std::vector<float>& s, const ChannelStats& x) {
  constexpr int kRatios = 10;  // 1, 0.95, ..., 0.55
  const int64_t out = w.rows(), in = w.cols(), g = f.group_size, n = x.sampled();
  SERVAL_CHECK(f.kind == LinearFormat::Kind::Int4Grouped && in % g == 0 && x.cols == in,
               "calibration: clipping is for int4 matrices of whole groups");
  // The input in the scaled matrix's units: x / s.
  std::vector<float> xs = x.rows;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < in; ++c) xs[size_t(r * in + c)] /= s[size_t(c)];
  const LinearFormat one_group{LinearFormat::Kind::Int4Grouped, DType::I8, int32_t(g), f.symmetric};
  std::vector<float> wg(size_t(out * g)), clamped(wg.size()), e(wg.size()), y(size_t(n * out)), amax(static_cast<size_t>(out));
  std::vector<double> best(static_cast<size_t>(out)), err(static_cast<size_t>(out));
  std::vector<float> best_r(static_cast<size_t>(out));
  double r_sum = 0;
  for (int64_t k = 0; k < in / g; ++k) {
    for (int64_t o = 0; o < out; ++o) {
      float m = 0;
      for (int64_t c = 0; c < g; ++c) m = std::max(m, std::fabs(wg[size_t(o * g + c)] = w.v[size_t(o * in + k * g + c)]));
      amax[size_t(o)] = m;
    }
    std::fill(best.begin(), best.end(), INFINITY);
    for (int i = 0; i < kRatios; ++i) {
      const float ratio = 1.0f - 0.05f * float(i);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t c = 0; c < g; ++c) {
          const float lim = ratio * amax[size_t(o)];
          clamped[size_t(o * g + c)] = std::clamp(wg[size_t(o * g + c)], -lim, lim);
        }
      e = dequantize_linear(quantize_matrix_rtn(one_group, "clip", clamped.data(), out, g).linear);
      for (size_t j = 0; j < e.size(); ++j) e[j] -= wg[j];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out), int(g), 1.0f, xs.data() + k * g, int(in),
                  e.data(), int(g), 0.0f, y.data(), int(out));
      std::fill(err.begin(), err.end(), 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t o = 0; o < out; ++o) err[size_t(o)] += double(y[size_t(r * out + o)]) * y[size_t(r * out + o)];
      for (int64_t o = 0; o < out; ++o)
        if (err[size_t(o)] < best[size_t(o)]) best[size_t(o)] = err[size_t(o)], best_r[size_t(o)] = ratio;
    }
    for (int64_t o = 0; o < out; ++o) {
      const float lim = best_r[size_t(o)] * amax[size_t(o)];
      for (int64_t c = 0; c < g; ++c) {
        float& v = w.v[size_t(o * in + k * g + c)];
        v = std::clamp(v, -lim, lim);
      }
      r_sum += best_r[size_t(o)];
    }
  }
  return r_sum / double(std::max<int64_t>(out * (in / g), 1));
}

std::vector<AwqChoice> awq_scale_model(FloatWeights& w, const ModelConfig& cfg,
                                       const std::map<std::string, ChannelStats>& stats, const LinearFormat& want,
                                       const AwqOptions& o) {
  SERVAL_CHECK(o.grid >= 1, "calibration: an alpha grid of ", o.grid, " points");
  const int64_t heads[3] = {cfg.num_heads, cfg.num_kv_heads, cfg.head_dim};
  std::vector<AwqChoice> choices;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    for (const Group& g : layer_groups(cfg, l)) {
      std::vector<std::pair<std::string, const FloatTensor*>> ws;
      for (const std::string& name : g.linears) ws.emplace_back(name, &need(w, name));
      const ChannelStats& x = need_stats(stats, g.stats_name, ws.front().second->cols());
      const std::vector<float> mean = x.mean_abs();
      const int64_t* tie = g.ties_heads ? heads : nullptr;
      AwqChoice c{g.label, 0, 0, 0, 0, 1};
      c.err_rtn = awq_output_error(want, ws, std::vector<float>(size_t(x.cols), 1.0f), x);
      c.err_awq = c.err_rtn;
      if (o.fixed_alpha) {
        c.alpha = *o.fixed_alpha;
        c.err_awq = awq_output_error(want, ws, awq_scales(mean, c.alpha, tie), x);
      } else {
        for (int k = 1; k < o.grid; ++k) {
          const float alpha = float(k) / float(o.grid);
          const double err = awq_output_error(want, ws, awq_scales(mean, alpha, tie), x);
          if (err < c.err_awq) c.err_awq = err, c.alpha = alpha;
        }
      }
      const std::vector<float> s = awq_scales(mean, c.alpha, tie);
      std::string why;
      const LinearFormat f = rtn_format_for(want, x.cols, why);
      const bool clip = o.clip && f.kind == LinearFormat::Kind::Int4Grouped;
      std::vector<FloatTensor> before;  // the group's matrices as they were, for the clipped error
      if (clip)
        for (const auto& [name, m] : ws) before.push_back(*m);
      if (c.alpha != 0)
        for (const std::string& name : g.linears) scale_columns(need(w, name), s);
      c.err_clip = c.err_awq;
      if (clip) {
        double r_sum = 0;
        for (const std::string& name : g.linears) r_sum += awq_clip(need(w, name), f, s, x);
        c.mean_clip = r_sum / double(g.linears.size());
        double sum = 0;
        int64_t outputs = 0;
        for (size_t i = 0; i < ws.size(); ++i)
          sum += scaled_error(want, g.linears[i], before[i], need(w, g.linears[i]), s, x, outputs);
        c.err_clip = sum / double(std::max<int64_t>(outputs, 1));
      }
      choices.push_back(c);
      if (c.alpha == 0) continue;
      // 1/s into the op before: o's columns are query heads, v's rows KV heads (tied, so any head of a group).
      std::vector<float> fold = s;
      if (g.ties_heads) {
        const int64_t per = cfg.num_heads / cfg.num_kv_heads, d = cfg.head_dim;
        fold.resize(size_t(cfg.num_kv_heads * d));
        for (int64_t k = 0; k < cfg.num_kv_heads; ++k)
          for (int64_t i = 0; i < d; ++i) fold[size_t(k * d + i)] = s[size_t(k * per * d + i)];
      }
      for (const std::string& name : g.divide) divide_rows(need(w, name), fold);
    }
  }
  return choices;
}

}  // namespace serval
