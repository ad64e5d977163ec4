#pragma once
// Helpers of the GPU sampler tests (cuda_sampling_test.cpp,
// cuda_sampling_distribution_test.cpp): logits on the device, requests, the
// CPU sampler and a naive exact reference to compare with.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "cuda_test_util.h"
#include "sampling/sampler.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_sampling.cuh"
#endif


namespace serval::testing {


inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr int64_t kSmallVocab = 64;
inline constexpr int64_t kMidVocab = 32000;
inline constexpr int64_t kLargeVocab = 128256;
inline constexpr int kMaxRows = 256;
inline constexpr int kDraws = 20000;      // stratified draws per distribution (small vocabulary)
inline constexpr int kLargeDraws = 2048;  // stratified draws per distribution (large vocabulary)
inline constexpr int kTimedCalls = 20;

// Turns the GPU sampler's candidate lists on or off for a scope.
class ListMode {
 public:
  explicit ListMode(bool on) { set(on); }
  ~ListMode() { set(true); }
  ListMode(const ListMode&) = delete;
  ListMode& operator=(const ListMode&) = delete;

 private:
  static void set(bool on) {
#ifdef SERVAL_WITH_CUDA
    cuda::sampling::set_sampling_lists(on);
#else
    (void)on;
#endif
  }
};

inline const char* mode_name(bool lists) { return lists ? "lists" : "radix"; }

struct DeviceLogits {
  DeviceBuffer buf;
  Tensor t;
};

inline DeviceLogits to_device(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols) {
  DeviceLogits d;
  d.buf = be.alloc(rows * cols * 4 + 64);
  be.copy_to_device(d.buf.data(), v.data(), rows * cols * 4);
  d.t = Tensor{d.buf.data(), DType::F32, rows, cols};
  return d;
}

inline std::vector<float> random_logits(int64_t rows, int64_t cols, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(size_t(rows * cols));
  for (float& x : v) x = dist(rng);
  return v;
}

inline int32_t argmax_of(const float* row, int64_t cols) {
  return int32_t(std::max_element(row, row + cols) - row);  // first of the largest
}

// Copies each row's max to two more random positions: exact ties at the top.
inline void plant_max_ties(std::vector<float>& v, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * cols;
    const float m = row[argmax_of(row, cols)];
    for (int i = 0; i < 2; ++i) row[rng() % uint32_t(cols)] = m;
  }
}

// One request; owns what its SampleSpec's spans point to.
struct Request {
  SamplingParams params;
  std::vector<int32_t> prompt, output, banned;
  int32_t row = 0;
  double uniform = 0.0;
  int32_t forced = -1;  // SampleSpec::forced_token
  std::vector<uint32_t> allowed;  // SampleSpec::allowed
};

inline std::vector<SampleResult> gpu_sample(Backend& gpu, const Tensor& logits, const std::vector<Request>& reqs) {
  std::vector<SampleSpec> specs(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& q = reqs[i];
    specs[i] = SampleSpec{q.row, &q.params, q.prompt, q.output, q.banned, q.uniform, -1, q.forced, q.allowed};
  }
  std::vector<SampleResult> out;
  gpu.sample(logits, specs, out);
  EXPECT_EQ(out.size(), reqs.size());
  return out;
}

inline std::span<const float> row_of(const std::vector<float>& logits, int64_t cols, int32_t row) {
  return std::span<const float>(logits.data() + int64_t(row) * cols, size_t(cols));
}

inline SampleResult cpu_sample(Sampler& s, const std::vector<float>& logits, int64_t cols, const Request& q) {
  return s.sample(row_of(logits, cols, q.row), q.params, q.prompt, q.output, q.uniform, q.banned, q.allowed);
}

// The sampler's semantics written naively (a full sort): the exact probability
// of each token (0 outside the kept set).
inline std::vector<double> reference_probs(std::span<const float> logits, const Request& q) {
  const int64_t vocab = int64_t(logits.size());
  const SamplingParams& p = q.params;
  std::vector<float> x(logits.begin(), logits.end());
  for (int32_t id : q.banned)
    if (id >= 0 && id < vocab) x[size_t(id)] = -kInf;
  PenaltyApplier().apply(x, p, q.prompt, q.output);
  for (float& v : x) v /= p.temperature;
  const float max = *std::max_element(x.begin(), x.end());
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  auto weight = [&](int32_t id) { return std::exp(double(x[size_t(id)]) - double(max)); };
  std::vector<bool> keep(size_t(vocab), true);
  if (p.top_k > 0 && p.top_k < vocab) {
    const float kth = x[size_t(order[size_t(p.top_k - 1)])];
    for (int64_t id = 0; id < vocab; ++id) keep[size_t(id)] = x[size_t(id)] >= kth;
  }
  if (p.top_p < 1.0f) {
    double total = 0.0;
    for (int32_t id : order)
      if (keep[size_t(id)]) total += weight(id);
    const double target = double(p.nucleus_mass()) * total;
    double cum = 0.0;
    for (int32_t id : order) {
      if (!keep[size_t(id)]) continue;
      if (cum >= target)
        keep[size_t(id)] = false;
      else
        cum += weight(id);
    }
  }
  if (p.min_p > 0.0f) {
    const float threshold = max + std::log(p.min_p);
    for (int64_t id = 0; id < vocab; ++id) keep[size_t(id)] = keep[size_t(id)] && x[size_t(id)] >= threshold;
  }
  std::vector<double> probs(size_t(vocab), 0.0);
  double sum = 0.0;
  for (int64_t id = 0; id < vocab; ++id)
    if (keep[size_t(id)]) sum += probs[size_t(id)] = weight(int32_t(id));
  for (double& v : probs) v /= sum;
  return probs;
}

// N copies of `base` on its row with stratified uniforms.
inline std::vector<Request> stratified(const Request& base, int n) {
  std::vector<Request> reqs(size_t(n), base);
  for (int i = 0; i < n; ++i) reqs[size_t(i)].uniform = (i + 0.5) / n;
  return reqs;
}

// max |frequency difference| over tokens.
inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Stratified draws of `base` on the CPU once, and on the GPU with the
// candidate lists on and off; every histogram within ~2/n of the reference.
inline void expect_distribution(Backend& gpu, const DeviceLogits& dev, const std::vector<float>& host, int64_t vocab,
                         const Request& base, int n, const std::string& name) {
  const std::vector<Request> reqs = stratified(base, n);
  const std::vector<double> ref = reference_probs(row_of(host, vocab, base.row), base);
  Sampler sampler;
  std::vector<double> cpu(size_t(vocab), 0.0);
  for (const Request& q : reqs) cpu[size_t(cpu_sample(sampler, host, vocab, q).token)] += 1.0 / n;
  const double tol = 2.5 / n;
  const double cpu_vs_ref = max_diff(cpu, ref);
  EXPECT_LE(cpu_vs_ref, tol) << name << " (the reference disagrees with the CPU sampler)";
  for (bool lists : {true, false}) {
    const ListMode mode(lists);
    const std::vector<SampleResult> g = gpu_sample(gpu, dev.t, reqs);
    std::vector<double> hist(size_t(vocab), 0.0);
    int outside = 0;  // draws of tokens with probability 0
    for (const SampleResult& res : g) {
      if (res.token < 0 || res.token >= vocab || ref[size_t(res.token)] == 0.0)
        ++outside;
      else
        hist[size_t(res.token)] += 1.0 / n;
    }
    const double gpu_vs_ref = max_diff(hist, ref), gpu_vs_cpu = max_diff(hist, cpu);
    std::printf(
        "[cuda sampling] vocab %lld %-40s [%s] %d draws: max|gpu-ref| %.2e max|cpu-ref| %.2e "
        "max|gpu-cpu| %.2e outside %d (tol %.1e)\n",
        (long long)vocab, name.c_str(), mode_name(lists), n, gpu_vs_ref, cpu_vs_ref, gpu_vs_cpu, outside, tol);
    EXPECT_EQ(outside, 0) << name << " [" << mode_name(lists) << "]";
    EXPECT_LE(gpu_vs_ref, tol) << name << " [" << mode_name(lists) << "]";
    EXPECT_LE(gpu_vs_cpu, 2 * tol) << name << " [" << mode_name(lists) << "]";
  }
}

inline SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// ---------------------------------------------------------------- greedy


inline std::vector<float> small_rows(float* topp_cut) {
  std::vector<float> v = random_logits(2, kSmallVocab, 11u, 2.0f);
  float* a = v.data();
  std::vector<float> sorted(a, a + kSmallVocab);
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  for (int id : {9, 20, 51}) a[id] = sorted[4];  // the 5th largest, now shared by 3 more tokens
  a[33] = a[34] = sorted[10];
  const int32_t top = argmax_of(a, kSmallVocab);
  a[top == 62 ? 61 : 62] = a[top];  // a tie at the max
  float* b = v.data() + kSmallVocab;
  for (int64_t i = 0; i < kSmallVocab; ++i) b[i] = -1.0f - float(i % 7) * 0.3f;
  b[5] = 2.0f;
  for (int id : {3, 17, 40, 60}) b[id] = 1.0f;
  // top_p so that the target falls halfway through the second tie: two of four
  // kept.
  double total = 0.0;
  for (int64_t i = 0; i < kSmallVocab; ++i) total += std::exp(double(b[i]) - 2.0);
  *topp_cut = float((1.0 + 1.5 * std::exp(-1.0)) / total);
  return v;
}

// A call whose tasks are the same bytes as the call before sends none (the
// device holds them): the same greedy rows over new logits, then the rows

}  // namespace serval::testing
