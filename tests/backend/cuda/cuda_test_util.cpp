#include "cuda_test_util.h"

#include <algorithm>
#include <cmath>

#include "runtime/rope.h"

namespace serval::testing {

std::unique_ptr<Backend> try_cuda_backend() {
  try {
    return create_backend("cuda", 0);
  } catch (const Error&) {
    return nullptr;
  }
}

std::vector<float> random_bf16(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(dist(rng)));
  return v;
}

DevTensor upload(Backend& be, const std::vector<float>& values, int64_t rows, int64_t cols) {
  DevTensor d = zeros(be, rows, cols);
  if (be.act_dtype() == DType::F32) {
    be.copy_to_device(d.t.data, values.data(), int64_t(values.size()) * 4);
  } else {
    std::vector<uint16_t> h(values.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(values[i]);
    be.copy_to_device(d.t.data, h.data(), int64_t(h.size()) * 2);
  }
  return d;
}

DevTensor zeros(Backend& be, int64_t rows, int64_t cols) {
  DevTensor d;
  d.buf = be.alloc(dtype_bytes(be.act_dtype(), rows * cols) + 64);
  d.t = Tensor{d.buf.data(), be.act_dtype(), rows, cols};
  return d;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  be.tensor_to_host(t, out.data());
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::unique_ptr<DeviceWeight> upload_matrix(Backend& be, const std::string& name, int64_t rows, int64_t cols,
                                            const std::vector<float>& values) {
  return be.upload_weight(TensorView{name, DType::F32, {rows, cols}, values.data(), int64_t(values.size() * 4)});
}

// y [T, out] = x [T, in] @ w [out, in]^T in double; four partial sums per dot
// product so the loop is not one long dependency chain.
std::vector<double> reference_matmul(const std::vector<float>& x, int64_t T, const std::vector<float>& w, int64_t out,
                              int64_t in) {
  std::vector<double> y(size_t(T * out));
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < out; ++j) {
      const float* xr = x.data() + t * in;
      const float* wr = w.data() + j * in;
      double s[4] = {0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 4 <= in; k += 4)
        for (int u = 0; u < 4; ++u) s[u] += double(xr[k + u]) * double(wr[k + u]);
      for (; k < in; ++k) s[0] += double(xr[k]) * double(wr[k]);
      y[size_t(t * out + j)] = (s[0] + s[1]) + (s[2] + s[3]);
    }
  return y;
}

// max |got - want| / max |want| over the first `n` values of `want`.
std::vector<float> int8_x(const std::vector<float>& x, int64_t T, int64_t in) {
  std::vector<float> out(size_t(T * in));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < in; g += 32) {
      const float* v = x.data() + t * in + g;
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      for (int i = 0; i < 32; ++i) out[size_t(t * in + g + i)] = std::nearbyint(v[i] * inv) * dx;
    }
  return out;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& want, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double worst_head_error(const std::vector<float>& got, const std::vector<float>& want, int32_t head_dim) {
  double worst = got.size() == want.size() ? 0.0 : 1e30;
  for (size_t h0 = 0; h0 + size_t(head_dim) <= std::min(got.size(), want.size()); h0 += size_t(head_dim)) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = h0; i < h0 + size_t(head_dim); ++i) {
      diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
      scale = std::max(scale, std::abs(double(want[i])));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

std::vector<RopeCase> rope_cases() {
  return {RopeCase{RopeStyle::Neox, 128, 128, RopeScaling::Type::None},
          RopeCase{RopeStyle::Interleaved, 128, 128, RopeScaling::Type::Llama3},
          RopeCase{RopeStyle::Neox, 64, 32, RopeScaling::Type::Linear},
          RopeCase{RopeStyle::Interleaved, 8, 8, RopeScaling::Type::None}};
}

std::vector<float> rope_case_inv_freq(const RopeCase& c) {
  ModelConfig cfg;
  cfg.head_dim = c.head_dim;
  cfg.rope_dim = c.rope_dim;
  cfg.rope_theta = 500000;
  cfg.rope_scaling.type = c.scaling;
  cfg.rope_scaling.factor = 8;
  cfg.rope_scaling.low_freq_factor = 1;
  cfg.rope_scaling.high_freq_factor = 4;
  cfg.rope_scaling.original_max_position = 8192;
  return rope_inv_freq(cfg, {});
}

}  // namespace serval::testing
