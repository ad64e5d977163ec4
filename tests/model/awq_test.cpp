// Activation-aware scaling (model/awq.h): folding 1/s into the norms, up's
// rows and v's rows leaves a tiny float model's logits as they were (plain
// double loops of tests/runtime/tiny_model.h, GQA and v biases included);
// with inputs whose few channels are large, the scaled and quantized q/k/v
// err less on those inputs than round to nearest, computed here from
// quantize_matrix_rtn and dequantize_linear alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "../runtime/tiny_model.h"
#include "model/awq.h"
#include "model/rtn_quantize.h"

namespace serval {
namespace {

using Kind = LinearFormat::Kind;
using testing::TinySpec;

const LinearFormat kInt4G16{Kind::Int4Grouped, DType::I8, 16, false};

FloatWeights layer_floats(const ModelConfig& cfg, const WeightStore& ws) {
  FloatWeights w;
  for (const auto& [name, view] : ws.all()) {
    if (!name.starts_with("blk.")) continue;
    FloatTensor& f = w[name];
    f.shape = view.shape;
    f.v.resize(size_t(view.numel()));
    to_f32(view.dtype, view.data, f.v.data(), view.numel());
  }
  return w;
}

// `ws` with the tensors of `w` in their place (f32).
WeightStore replaced(const WeightStore& ws, const FloatWeights& w) {
  WeightStore out;
  for (const auto& [name, view] : ws.all()) {
    const auto it = w.find(name);
    if (it == w.end()) {
      out.add(view);
      continue;
    }
    std::vector<uint8_t> bytes(it->second.v.size() * 4);
    std::memcpy(bytes.data(), it->second.v.data(), bytes.size());
    out.add_owned(name, DType::F32, it->second.shape, std::move(bytes));
  }
  return out;
}

// Rows of `cols` values around 1 whose channels 3, 7 and 11 are `outlier` times larger.
ChannelStats outlier_inputs(int64_t rows, int64_t cols, float outlier, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[size_t(r * cols + c)] = n(rng) * ((c == 3 || c == 7 || c == 11) ? outlier : 1.0f);
  ChannelStats s;
  s.add(x.data(), rows, cols);
  return s;
}

std::map<std::string, ChannelStats> stats_for(const ModelConfig& cfg, float outlier) {
  std::map<std::string, ChannelStats> stats;
  uint32_t seed = 1;
  for (const std::string& name : awq_input_names(cfg)) {
    const int64_t cols = name.ends_with("attn_output.weight") ? cfg.q_dim()
                         : name.ends_with("ffn_down.weight")  ? cfg.intermediate_size
                                                              : cfg.hidden_size;
    stats[name] = outlier_inputs(64, cols, outlier, seed++);
  }
  return stats;
}

TEST(Awq, FoldingLeavesTheFloatModelsLogitsUnchanged) {
  for (const bool bias : {false, true}) {
    TinySpec spec;
    spec.arch = bias ? "qwen2" : "llama";
    spec.bias = bias;
    spec.hidden = 32, spec.inter = 48, spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 8;
    const ModelConfig cfg = testing::tiny_config(spec);
    const WeightStore ws = testing::tiny_weights(cfg, spec);
    FloatWeights w = layer_floats(cfg, ws);
    const FloatWeights before = w;
    AwqOptions o;
    o.fixed_alpha = 0.5f;  // every group scaled, whatever the search would choose
    o.clip = false;        // clipping changes the function; the scaling must not
    const std::vector<AwqChoice> choices = awq_scale_model(w, cfg, stats_for(cfg, 8.0f), kInt4G16, o);
    ASSERT_EQ(choices.size(), size_t(4 * cfg.num_layers));
    for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_norm.weight", "blk.1.ffn_up.weight",
                             "blk.1.attn_v.weight", "blk.2.attn_output.weight", "blk.2.ffn_down.weight"})
      EXPECT_NE(w.at(name).v, before.at(name).v) << name << " was not scaled";
    if (bias) EXPECT_NE(w.at("blk.0.attn_v.bias").v, before.at("blk.0.attn_v.bias").v);

    const std::vector<int32_t> tokens = {1, 17, 5, 42, 8, 33, 2, 60, 11};
    const auto want = testing::reference_logits(cfg, ws, tokens);
    const auto got = testing::reference_logits(cfg, replaced(ws, w), tokens);
    for (size_t t = 0; t < tokens.size(); ++t) {
      std::vector<float> g(got[t].begin(), got[t].end());
      EXPECT_LT(testing::rel_error(g, want[t]), 2e-6) << "position " << t << (bias ? " (qwen2, biases)" : "");
    }
  }
}

// x W^T against x' Q^T, mean over all outputs.
double output_mse(const std::vector<float>& x, const std::vector<float>& xq, int64_t rows, const FloatTensor& w,
                  const std::vector<float>& q) {
  const int64_t in = w.cols(), out = w.rows();
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double want = 0, got = 0;
      for (int64_t c = 0; c < in; ++c) {
        want += double(x[size_t(r * in + c)]) * w.v[size_t(o * in + c)];
        got += double(xq[size_t(r * in + c)]) * q[size_t(o * in + c)];
      }
      sum += (got - want) * (got - want);
    }
  return sum / double(rows * out);
}

std::vector<float> rtn(const FloatTensor& w) {
  return dequantize_linear(quantize_matrix_rtn(kInt4G16, "w", w.v.data(), w.rows(), w.cols()).linear);
}

TEST(Awq, CalibratedInt4ErrsLessThanRoundToNearestOnTheCalibrationInputs) {
  TinySpec spec;
  spec.hidden = 64, spec.inter = 96, spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 16;
  const ModelConfig cfg = testing::tiny_config(spec);
  const WeightStore ws = testing::tiny_weights(cfg, spec);
  FloatWeights w = layer_floats(cfg, ws);
  const FloatWeights before = w;
  const std::map<std::string, ChannelStats> stats = stats_for(cfg, 20.0f);
  const std::vector<AwqChoice> choices = awq_scale_model(w, cfg, stats, kInt4G16);
  const ChannelStats& x = stats.at("blk.0.attn_q.weight");
  const int64_t rows = x.sampled(), in = x.cols;
  // The folded norm scales the q/k/v input by gamma' / gamma.
  const std::vector<float>& g0 = before.at("blk.0.attn_norm.weight").v;
  const std::vector<float>& g1 = w.at("blk.0.attn_norm.weight").v;
  std::vector<float> xs = x.rows;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < in; ++c) xs[size_t(r * in + c)] *= g1[size_t(c)] / g0[size_t(c)];
  double err_rtn = 0, err_cal = 0;
  // (v is left out: o's scaling also divides its rows.)
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}) {
    const FloatTensor& orig = before.at(name);
    err_rtn += output_mse(x.rows, x.rows, rows, orig, rtn(orig));
    err_cal += output_mse(x.rows, xs, rows, orig, rtn(w.at(name)));
  }
  ASSERT_EQ(choices[0].group, "blk.0 q/k/v");
  EXPECT_GT(choices[0].alpha, 0.0f);
  EXPECT_LT(err_cal, 0.8 * err_rtn) << "calibrated " << err_cal << " against round to nearest " << err_rtn;
  for (const AwqChoice& c : choices) EXPECT_LE(c.err_awq, c.err_rtn) << c.group;
}

}  // namespace
}  // namespace serval
