#pragma once
// Activation-aware scaling before round-to-nearest quantization (the idea of
// AWQ, Lin et al. 2023; our own code): a linear whose input channel c carries
// large activations loses most to rounding there, so its column c is scaled
// up by s[c] before quantizing and the op feeding it divides channel c by
// s[c], which leaves the float model's function unchanged:
//   q/k/v   read attn_norm's output: the norm weight / s;
//   gate/up read ffn_norm's output:  the norm weight / s;
//   down    reads silu(gate) * up, linear in up: up's rows / s;
//   o       reads the attention's output, linear in v per head: v's rows
//           (and bias) / s, with s shared by the query heads of a KV head.
// s = mean|x|^alpha (normalized so that sqrt(max s * min s) = 1), alpha from
// a grid on [0, 1) minimizing the output error of the group's quantized
// linears on sampled calibration inputs; alpha 0 is round to nearest, so the
// choice is never worse on those rows.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/linear.h"
#include "model/model_config.h"

namespace serval {

// One matmul input's statistics over the calibration tokens.
struct ChannelStats {
  int64_t cols = 0;
  int64_t tokens = 0;            // rows seen
  std::vector<double> abs_sum;   // sum of |x| per channel
  std::vector<float> rows;       // every `stride`-th row seen, [sampled(), cols]
  int64_t stride = 1;

  void add(const float* x, int64_t n, int64_t cols);
  int64_t sampled() const { return cols > 0 ? int64_t(rows.size()) / cols : 0; }
  std::vector<float> mean_abs() const;
};

// A float tensor by GGUF name: shape outermost first ({out, in} for a matrix).
struct FloatTensor {
  std::vector<int64_t> shape;
  std::vector<float> v;
  int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.back(); }
};
using FloatWeights = std::map<std::string, FloatTensor>;

struct AwqOptions {
  int grid = 20;                      // alphas 0, 1/grid, ..., (grid-1)/grid
  std::optional<float> fixed_alpha;   // set: no search, every group takes it
  // int4: after scaling, each group of each row is clamped to +-r max|w|,
  // r in 1, 0.95, ..., 0.55 minimizing that group's share of the output
  // error (AWQ's clipping search), so its step shrinks where the extremes
  // cost less than the rounding of the rest.
  bool clip = true;
};

// One group's choice: `group` like "blk.3 q/k/v"; errors are the mean squared
// output error of its quantized linears on the sampled rows (err_clip after
// the clipping, where it ran; else err_awq).
struct AwqChoice {
  std::string group;
  float alpha = 0;
  double err_rtn = 0, err_awq = 0, err_clip = 0;
  double mean_clip = 1;  // mean ratio r over the int4 groups
};

// The names whose matmul inputs awq_scale_model reads: each layer's attn_q,
// attn_output, ffn_gate and ffn_down weight.
std::vector<std::string> awq_input_names(const ModelConfig& cfg);

// Mean squared output error, on x's sampled rows, of the linears `ws` with
// their columns scaled by s, quantized to `want` (or the format it falls back
// to: rtn_format_for) and scaled back: y = x W^T against x diag(1/s) Q(W diag(s))^T.
double awq_output_error(const LinearFormat& want, const std::vector<std::pair<std::string, const FloatTensor*>>& ws,
                        const std::vector<float>& s, const ChannelStats& x);

// Clamps each group of each row of the int4 matrix `w` (scaled, its input
// x / s) to +-r max|w| of the group, r from the grid minimizing the group's
// output error on x's sampled rows. Returns the mean r.
double awq_clip(FloatTensor& w, const LinearFormat& f, const std::vector<float>& s, const ChannelStats& x);

// The scales for alpha and the input's per-channel mean |x|; `tie_heads`
// (o's input: num_heads, num_kv_heads, head_dim) averages the means of the
// query heads that read one KV head, so that s folds into v.
std::vector<float> awq_scales(const std::vector<float>& mean_abs, float alpha, const int64_t* tie_heads = nullptr);

// Scales every layer of the Llama-family model `cfg` in `w` (which holds each
// layer's norms and matrices in f32, and attn_v.bias where the model has
// one), reading `stats` by awq_input_names. Returns one choice per group,
// layer by layer. Throws serval::Error naming a missing tensor or statistic.
std::vector<AwqChoice> awq_scale_model(FloatWeights& w, const ModelConfig& cfg,
                                       const std::map<std::string, ChannelStats>& stats, const LinearFormat& want,
                                       const AwqOptions& o = {});

}  // namespace serval
