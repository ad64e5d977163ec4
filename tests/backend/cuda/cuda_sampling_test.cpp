// The GPU sampler (CudaBackend::sample) against the CPU Sampler
// (sampling/sampler.h) on the same f32 logits, and against a naive
// sort-based reference of the same semantics for exact distributions.
// Skips without a GPU.
//
// The sampled and logprobs checks run twice: with the sampler's shared-memory
// candidate lists (what rows with few candidates take) and without (the radix
// passes to the end, what rows with many candidates take).
//
// Draw checks use stratified uniforms u_i = (i + 0.5) / N: for any fixed walk
// order over the kept tokens, token t is then drawn N * p_t times up to +-1,
// so the GPU's histogram (walked in its own order) and the CPU's both lie
// within ~2/N of the exact distribution.
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
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kSmallVocab = 64;
constexpr int64_t kMidVocab = 32000;
constexpr int64_t kLargeVocab = 128256;
constexpr int kMaxRows = 256;
constexpr int kDraws = 20000;      // stratified draws per distribution (small vocabulary)
constexpr int kLargeDraws = 2048;  // stratified draws per distribution (large vocabulary)
constexpr int kTimedCalls = 20;

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

const char* mode_name(bool lists) { return lists ? "lists" : "radix"; }

struct DeviceLogits {
  DeviceBuffer buf;
  Tensor t;
};

DeviceLogits to_device(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols) {
  DeviceLogits d;
  d.buf = be.alloc(rows * cols * 4 + 64);
  be.copy_to_device(d.buf.data(), v.data(), rows * cols * 4);
  d.t = Tensor{d.buf.data(), DType::F32, rows, cols};
  return d;
}

std::vector<float> random_logits(int64_t rows, int64_t cols, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(size_t(rows * cols));
  for (float& x : v) x = dist(rng);
  return v;
}

int32_t argmax_of(const float* row, int64_t cols) {
  return int32_t(std::max_element(row, row + cols) - row);  // first of the largest
}

// Copies each row's max to two more random positions: exact ties at the top.
void plant_max_ties(std::vector<float>& v, int64_t rows, int64_t cols, uint32_t seed) {
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
};

std::vector<SampleResult> gpu_sample(Backend& gpu, const Tensor& logits, const std::vector<Request>& reqs) {
  std::vector<SampleSpec> specs(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& q = reqs[i];
    specs[i] = SampleSpec{q.row, &q.params, q.prompt, q.output, q.banned, q.uniform};
  }
  std::vector<SampleResult> out;
  gpu.sample(logits, specs, out);
  EXPECT_EQ(out.size(), reqs.size());
  return out;
}

std::span<const float> row_of(const std::vector<float>& logits, int64_t cols, int32_t row) {
  return std::span<const float>(logits.data() + int64_t(row) * cols, size_t(cols));
}

SampleResult cpu_sample(Sampler& s, const std::vector<float>& logits, int64_t cols, const Request& q) {
  return s.sample(row_of(logits, cols, q.row), q.params, q.prompt, q.output, q.uniform, q.banned);
}

// The sampler's semantics written naively (a full sort): the exact probability
// of each token (0 outside the kept set).
std::vector<double> reference_probs(std::span<const float> logits, const Request& q) {
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
    const double target = double(p.top_p) * total;
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
std::vector<Request> stratified(const Request& base, int n) {
  std::vector<Request> reqs(size_t(n), base);
  for (int i = 0; i < n; ++i) reqs[size_t(i)].uniform = (i + 0.5) / n;
  return reqs;
}

// max |frequency difference| over tokens.
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Stratified draws of `base` on the CPU once, and on the GPU with the
// candidate lists on and off; every histogram within ~2/n of the reference.
void expect_distribution(Backend& gpu, const DeviceLogits& dev, const std::vector<float>& host, int64_t vocab,
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

SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// ---------------------------------------------------------------- greedy

TEST(CudaSampling, GreedyMatchesCpuExactly) {
  SERVAL_CUDA_OR_SKIP(gpu);
  Sampler sampler;
  const char* variants[] = {"plain", "bans", "repetition", "frequency", "presence", "all penalties"};
  for (int64_t vocab : {kMidVocab, kLargeVocab}) {
    for (int rows : {1, 7, kMaxRows}) {
      for (int variant = 0; variant < 6; ++variant) {
        std::vector<float> host = random_logits(rows, vocab, uint32_t(vocab + rows * 7 + variant));
        plant_max_ties(host, rows, vocab, uint32_t(rows + variant));
        std::mt19937 rng(uint32_t(variant * 1000 + rows));
        std::vector<Request> reqs(static_cast<size_t>(rows));
        for (int r = 0; r < rows; ++r) {
          Request& q = reqs[size_t(r)];
          q.row = r;
          q.params = greedy_params();
          float* row = host.data() + int64_t(r) * vocab;
          const int32_t top = argmax_of(row, vocab);
          auto some_ids = [&](int n, std::vector<int32_t>& into) {
            for (int i = 0; i < n; ++i) into.push_back(int32_t(rng() % uint32_t(vocab)));
          };
          const bool odd = r % 2 == 1;  // even rows stay plain: both kernels run in one call
          if (variant == 1 && odd) {
            q.banned = {top, int32_t(vocab + 5), -1};  // out-of-vocabulary bans are ignored
            some_ids(3, q.banned);
          }
          if (variant == 2 && odd) {
            q.params.repetition_penalty = 2.0f;
            some_ids(50, q.prompt);
            q.prompt.push_back(top);
            // A prompt token at exactly twice a positive max ties with it after
            // the penalty.
            const int32_t twin = int32_t(rng() % uint32_t(vocab));
            if (row[top] > 0 && twin != top) {
              row[twin] = 2.0f * row[top];
              q.prompt.push_back(twin);
            }
          }
          if (variant == 3 && odd) {
            q.params.frequency_penalty = (r % 4 == 1) ? 0.5f : -0.75f;  // exact products: no FMA dependence
            some_ids(40, q.output);
            q.output.push_back(top);
            q.output.push_back(top);
          }
          if (variant == 4 && odd) {
            q.params.presence_penalty = 1.5f;
            some_ids(20, q.output);
          }
          if ((variant == 3 || variant == 4) && odd) {
            // Every token at the max is in the output; a prompt-only runner-up
            // just below it must not be penalized, so it wins when they are.
            const float m = row[top];
            for (int64_t id = 0; id < vocab; ++id)
              if (row[id] == m) q.output.push_back(int32_t(id));
            int32_t runner = int32_t(rng() % uint32_t(vocab));
            while (row[runner] == m) runner = int32_t((runner + 1) % vocab);
            row[runner] = m - 0.01f;
            q.prompt.push_back(runner);
          }
          if (variant == 5 && odd) {
            q.params.repetition_penalty = 1.25f;
            q.params.frequency_penalty = 0.25f;
            q.params.presence_penalty = -0.5f;
            some_ids(30, q.prompt);
            some_ids(30, q.output);
            q.output.push_back(top);
            q.banned = {int32_t(rng() % uint32_t(vocab))};
          }
        }
        const DeviceLogits dev = to_device(*gpu, host, rows, vocab);
        const std::vector<SampleResult> g = gpu_sample(*gpu, dev.t, reqs);
        int mismatches = 0, first_bad = -1;
        for (int r = 0; r < rows; ++r) {
          const int32_t want = cpu_sample(sampler, host, vocab, reqs[size_t(r)]).token;
          if (g[size_t(r)].token != want) {
            if (first_bad < 0) first_bad = r;
            ++mismatches;
          }
        }
        std::printf("[cuda sampling] greedy vocab %lld rows %d %-13s: %d mismatches\n", (long long)vocab, rows,
                    variants[variant], mismatches);
        EXPECT_EQ(mismatches, 0) << "vocab " << vocab << " rows " << rows << " " << variants[variant]
                                 << ", first at row " << first_bad;
      }
    }
  }
}

// A start whose penalized specs name a token of the start before
// (SampleSpec::fed_source, queued before that start is finished) counts it as
// the CPU counts an output token: every token equals the CPU sampler's with
// the fed token appended to the output. The fed tokens are read before this
// start's kernels overwrite them: plain greedy specs of the same start write
// the slots the fed ones read, and the second start has more specs than the
// token array holds (it grows). Each penalized row's fed token and a
// runner-up lead the rest, so that counting the fed token or not picks the
// other one.
TEST(CudaSampling, FedTokensCountInTheNextStartsPenalties) {
  SERVAL_CUDA_OR_SKIP(gpu);
  Sampler sampler;
  const int64_t vocab = 1000;
  for (const int rows : {6, 1500}) {
    const int first_rows = std::min(rows, 1024);
    std::vector<float> first = random_logits(first_rows, vocab, uint32_t(rows));
    std::vector<int32_t> fed_of(static_cast<size_t>(first_rows));  // start 1's greedy tokens
    for (int r = 0; r < first_rows; ++r) fed_of[size_t(r)] = argmax_of(first.data() + int64_t(r) * vocab, vocab);
    std::vector<float> second = random_logits(rows, vocab, uint32_t(rows + 1));
    std::mt19937 rng{uint32_t(rows)};
    // Spec k of start 2: even k plain greedy (writing token slot k), odd k
    // penalized and fed from start 1's spec (k + 1) % first_rows, which an
    // even spec of start 2 overwrites.
    std::vector<Request> reqs(static_cast<size_t>(rows));
    std::vector<int32_t> sources(static_cast<size_t>(rows), -1);
    for (int k = 0; k < rows; ++k) {
      Request& q = reqs[size_t(k)];
      q.row = rows - 1 - k;
      q.params = greedy_params();
      if (k % 2 == 0) continue;
      const int32_t src = int32_t((k + 1) % first_rows);
      const int32_t f = fed_of[size_t(src)];
      sources[size_t(k)] = src;
      float* row = second.data() + int64_t(q.row) * vocab;
      const float m = *std::max_element(row, row + vocab);
      row[f] = m + 1.0f;
      const int32_t runner = int32_t((f + 1 + int32_t(rng() % uint32_t(vocab - 1))) % vocab);
      row[runner] = m + 0.75f;
      switch (k % 10) {
        case 1:  // f new to the output: frequency and presence count it once
          q.params.frequency_penalty = 0.25f;
          q.params.presence_penalty = 0.5f;
          break;
        case 3:  // f in the output twice already: a third count
          q.params.frequency_penalty = 0.125f;
          q.output = {f, f};
          row[runner] = m + 0.7f;
          break;
        case 5:  // f in the prompt only: now in the output too
          q.params.presence_penalty = 0.5f;
          q.prompt = {f, runner};
          break;
        case 7:  // f seen now: repetition
          q.params.repetition_penalty = 2.0f;
          break;
        default:  // a negative frequency penalty lifts f above the runner-up
          q.params.frequency_penalty = -0.5f;
          row[runner] = m + 1.25f;
          break;
      }
    }
    const DeviceLogits dev1 = to_device(*gpu, first, first_rows, vocab);
    const DeviceLogits dev2 = to_device(*gpu, second, rows, vocab);
    std::vector<SampleSpec> specs1(static_cast<size_t>(first_rows));
    const SamplingParams greedy = greedy_params();
    for (int r = 0; r < first_rows; ++r) specs1[size_t(r)] = SampleSpec{r, &greedy, {}, {}, {}, 0.0};
    std::vector<SampleSpec> specs2(static_cast<size_t>(rows));
    for (int k = 0; k < rows; ++k) {
      const Request& q = reqs[size_t(k)];
      specs2[size_t(k)] = SampleSpec{q.row, &q.params, q.prompt, q.output, q.banned, q.uniform};
      specs2[size_t(k)].fed_source = sources[size_t(k)];
    }
    gpu->start_sample(dev1.t, specs1);
    gpu->start_sample(dev2.t, specs2);
    std::vector<SampleResult> out1, out2;
    gpu->finish_sample(out1);
    gpu->finish_sample(out2);
    ASSERT_EQ(out1.size(), size_t(first_rows));
    for (int r = 0; r < first_rows; ++r) ASSERT_EQ(out1[size_t(r)].token, fed_of[size_t(r)]) << "row " << r;
    ASSERT_EQ(out2.size(), size_t(rows));
    int mismatches = 0, fed_changed = 0;
    for (int k = 0; k < rows; ++k) {
      Request q = reqs[size_t(k)];
      if (sources[size_t(k)] >= 0) {
        const int32_t uncounted = cpu_sample(sampler, second, vocab, q).token;
        q.output.push_back(fed_of[size_t(sources[size_t(k)])]);
        fed_changed += cpu_sample(sampler, second, vocab, q).token != uncounted;
      }
      const int32_t want = cpu_sample(sampler, second, vocab, q).token;
      if (out2[size_t(k)].token != want && mismatches++ == 0)
        ADD_FAILURE() << rows << " rows: spec " << k << " drew " << out2[size_t(k)].token << ", the CPU " << want;
    }
    std::printf("[cuda sampling] fed tokens, %d specs after %d: %d mismatches; counting the fed token changes %d of %d\n",
                rows, first_rows, mismatches, fed_changed, rows / 2);
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(fed_changed, rows / 2) << "a case where the fed token does not matter";
  }
  // A fed source the start before did not have is refused before anything runs.
  const DeviceLogits dev = to_device(*gpu, random_logits(1, vocab, 3u), 1, vocab);
  SamplingParams penalized = greedy_params();
  penalized.repetition_penalty = 1.2f;
  SampleSpec spec{0, &penalized, {}, {}, {}, 0.0};
  spec.fed_source = 1;
  std::vector<SampleResult> out;
  gpu->start_sample(dev.t, {&spec, 1});  // the start before (above) had 1500 specs: fine
  spec.fed_source = 2;
  EXPECT_THROW(gpu->start_sample(dev.t, {&spec, 1}), Error);
  gpu->finish_sample(out);
  EXPECT_THROW(gpu->sample(dev.t, {&spec, 1}, out), Error) << "sample() takes no fed tokens";
}

// ---------------------------------------------------------------- sampled

// A 64-token row with ties at the max and at the top-k boundary, and a second row whose
// top-p boundary cuts a tie group of four in the middle.
std::vector<float> small_rows(float* topp_cut) {
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
// swapped (tasks of the same size, other bytes), then those again.
TEST(CudaSampling, RepeatedTasksSampleTheNewLogits) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int64_t rows = 3;
  std::vector<Request> reqs(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    reqs[size_t(r)].row = r;
    reqs[size_t(r)].params = greedy_params();
  }
  for (int call = 0; call < 6; ++call) {
    if (call == 2 || call == 4) std::swap(reqs[0].row, reqs[2].row);
    const std::vector<float> host = random_logits(rows, kMidVocab, uint32_t(100 + call));
    DeviceLogits d = to_device(*gpu, host, rows, kMidVocab);
    const std::vector<SampleResult> out = gpu_sample(*gpu, d.t, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(out[i].token, argmax_of(host.data() + int64_t(reqs[i].row) * kMidVocab, kMidVocab))
          << "call " << call << ", spec " << i;
  }
}

TEST(CudaSampling, SampledDistributionsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  float topp_cut = 0.0f;
  const std::vector<float> host = small_rows(&topp_cut);
  const DeviceLogits dev = to_device(*gpu, host, 2, kSmallVocab);
  struct Case {
    std::string name;
    int32_t row;
    float temperature, top_p;
    int32_t top_k;
    float min_p;
    bool penalties;
  };
  const std::vector<Case> cases = {
      {"temperature 1", 0, 1.0f, 1.0f, 0, 0.0f, false},
      {"temperature 0.6", 0, 0.6f, 1.0f, 0, 0.0f, false},
      {"top_k 5 (ties at the boundary)", 0, 1.0f, 1.0f, 5, 0.0f, false},
      {"top_k 1", 0, 1.0f, 1.0f, 1, 0.0f, false},
      {"top_k 11 (tie pair at 11)", 0, 1.5f, 1.0f, 11, 0.0f, false},
      {"top_p 0.7", 0, 1.0f, 0.7f, 0, 0.0f, false},
      {"top_p 0.3 temperature 0.8", 0, 0.8f, 0.3f, 0, 0.0f, false},
      {"min_p 0.05", 0, 1.0f, 1.0f, 0, 0.05f, false},
      {"min_p 1 (the max and its tie)", 0, 1.0f, 1.0f, 0, 1.0f, false},
      {"top_k 8 min_p 1 (the max and its tie)", 0, 1.0f, 1.0f, 8, 1.0f, false},
      {"min_p 0.3 temperature 2", 0, 2.0f, 1.0f, 0, 0.3f, false},
      {"top_k 12 top_p 0.8 min_p 0.02 t 1.3", 0, 1.3f, 0.8f, 12, 0.02f, false},
      {"top_k 5 (ties) top_p 0.95", 0, 1.0f, 0.95f, 5, 0.0f, false},
      {"top_p cutting a tie group", 1, 1.0f, topp_cut, 0, 0.0f, false},
      {"top_p tie cut + top_k 8", 1, 1.0f, topp_cut, 8, 0.0f, false},
      {"penalties + bans, top_p 0.9 t 0.9", 0, 0.9f, 0.9f, 0, 0.0f, true},
      {"penalties + bans, top_k 6 min_p 0.1", 0, 1.0f, 1.0f, 6, 0.1f, true},
  };
  for (const Case& c : cases) {
    Request base;
    base.row = c.row;
    base.params.temperature = c.temperature;
    base.params.top_p = c.top_p;
    base.params.top_k = c.top_k;
    base.params.min_p = c.min_p;
    if (c.penalties) {
      base.params.repetition_penalty = 1.3f;
      base.params.frequency_penalty = 0.5f;
      base.params.presence_penalty = 0.25f;
      base.prompt = {1, 2, 3, 9, 20, 2};
      base.output = {20, 20, 7, 51, 63};
      base.banned = {argmax_of(host.data(), kSmallVocab), 100};
    }
    expect_distribution(*gpu, dev, host, kSmallVocab, base, kDraws, c.name);
  }
}

// A 128k row: a dozen likely tokens (two tied) over a long tail that holds
// much of the mass; one token banned.
TEST(CudaSampling, LargeVocabularyDistributionsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  std::vector<float> host = random_logits(1, kLargeVocab, 5u, 1.5f);
  std::mt19937 rng(6);
  for (int i = 0; i < 12; ++i) host[rng() % uint32_t(kLargeVocab)] = 8.0f + float(i) * 0.2f;
  host[777] = host[90001] = 10.0f;
  const DeviceLogits dev = to_device(*gpu, host, 1, kLargeVocab);
  struct Case {
    std::string name;
    float temperature, top_p;
    int32_t top_k;
    float min_p;
  };
  const std::vector<Case> cases = {
      {"temperature 1 (all kept)", 1.0f, 1.0f, 0, 0.0f},
      {"top_k 50", 1.0f, 1.0f, 50, 0.0f},
      {"top_p 0.9", 1.0f, 0.9f, 0, 0.0f},
      {"top_p 0.5 temperature 0.7", 0.7f, 0.5f, 0, 0.0f},
      {"top_k 3000 top_p 0.95 min_p 1e-3 t 1.5", 1.5f, 0.95f, 3000, 1e-3f},
      {"min_p 0.2", 1.0f, 1.0f, 0, 0.2f},
  };
  for (const Case& c : cases) {
    Request base;
    base.params.temperature = c.temperature;
    base.params.top_p = c.top_p;
    base.params.top_k = c.top_k;
    base.params.min_p = c.min_p;
    base.banned = {90001};
    expect_distribution(*gpu, dev, host, kLargeVocab, base, kLargeDraws, c.name);
  }
}

// ---------------------------------------------------------------- logprobs

TEST(CudaSampling, LogprobsMatchCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  Sampler sampler;
  for (bool lists : {true, false}) {
    const ListMode mode(lists);
    for (int64_t vocab : {int64_t(10), kMidVocab, kLargeVocab}) {
      const int rows = 64;
      std::vector<float> host = random_logits(rows, vocab, uint32_t(vocab), 2.5f);
      std::mt19937 rng(uint32_t(vocab + 1));
      // Row 0: 25 tokens share the max (top 20 cuts the tie); row 1: 4 tokens
      // tie at the 19th largest; row 2: many tokens at -inf.
      {
        float* r0 = host.data();
        const float m = r0[argmax_of(r0, vocab)] + 1.0f;
        for (int i = 0; i < 25; ++i) r0[rng() % uint32_t(vocab)] = m;
        if (vocab > 40) {
          float* r1 = host.data() + vocab;
          std::vector<float> s(r1, r1 + vocab);
          std::sort(s.begin(), s.end(), std::greater<float>());
          for (int i = 0; i < 4; ++i) r1[rng() % uint32_t(vocab)] = s[18];
          float* r2 = host.data() + 2 * vocab;
          for (int64_t i = 0; i < vocab; i += 2) r2[i] = -kInf;
        }
      }
      std::vector<Request> reqs(static_cast<size_t>(rows));
      const int ns[] = {0, 1, 5, 20};
      for (int r = 0; r < rows; ++r) {
        Request& q = reqs[size_t(r)];
        q.row = r;
        q.params.logprobs = r < 2 ? 20 : ns[r % 4];  // rows 0 and 1: the top 20 cuts a tie
        if (r % 3 == 0) {
          q.params.temperature = 0.0f;
        } else {
          q.params.temperature = 0.9f;
          q.params.top_k = 40;
          q.uniform = (r + 0.37) / rows;
        }
        if (r % 5 == 1) {  // penalties and bans change the draw, not the (raw) logprobs
          q.params.repetition_penalty = 1.5f;
          q.prompt = {int32_t(rng() % uint32_t(vocab)), int32_t(rng() % uint32_t(vocab))};
          q.banned = {argmax_of(host.data() + int64_t(r) * vocab, vocab)};
        }
      }
      const DeviceLogits dev = to_device(*gpu, host, rows, vocab);
      const std::vector<SampleResult> g = gpu_sample(*gpu, dev.t, reqs);
      double max_err = 0.0;
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        const Request& q = reqs[size_t(r)];
        const SampleResult& got = g[size_t(r)];
        if (q.params.greedy()) {
          EXPECT_EQ(got.token, cpu_sample(sampler, host, vocab, q).token) << "row " << r;
        }
        ASSERT_TRUE(got.logprobs.has_value()) << "row " << r;
        ASSERT_GE(got.token, 0);
        ASSERT_LT(got.token, vocab);
        const Logprobs want = compute_logprobs(row_of(host, vocab, q.row), got.token, q.params.logprobs);
        const Logprobs& lp = *got.logprobs;
        // Equal values (also -inf for tokens the model excludes) or within
        // 1e-4.
        auto close = [&max_err](float a, float b) {
          if (a == b) return true;
          max_err = std::max(max_err, double(std::abs(a - b)));
          return std::abs(a - b) <= 1e-4f;
        };
        bool ok =
            close(lp.chosen, want.chosen) && lp.chosen_rank == want.chosen_rank && lp.top.size() == want.top.size();
        for (size_t i = 0; ok && i < want.top.size(); ++i)
          ok = lp.top[i].token == want.top[i].token && close(lp.top[i].logprob, want.top[i].logprob);
        if (!ok) {
          ++bad;
          ADD_FAILURE() << "vocab " << vocab << " row " << r << ": chosen " << lp.chosen << " vs " << want.chosen
                        << ", rank " << lp.chosen_rank << " vs " << want.chosen_rank << ", top " << lp.top.size()
                        << " vs " << want.top.size()
                        << (lp.top.empty() || want.top.empty() ? std::string()
                                                               : ", first top " + std::to_string(lp.top[0].token) +
                                                                     " vs " + std::to_string(want.top[0].token));
        }
      }
      std::printf(
          "[cuda sampling] logprobs vocab %lld rows %d [%s]: %d "
          "mismatching rows, max |logprob diff| %.2e\n",
          (long long)vocab, rows, mode_name(lists), bad, max_err);
    }
  }
}

// ---------------------------------------------------------------- errors and
// shapes

void expect_throw_containing(Backend& gpu, const DeviceLogits& dev, const std::vector<Request>& reqs,
                             const std::string& needle, const std::string& what) {
  try {
    gpu_sample(gpu, dev.t, reqs);
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

TEST(CudaSampling, BrokenRowsThrowLikeTheCpu) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int64_t vocab = 1000;
  std::vector<float> host = random_logits(4, vocab, 21u);
  host[1 * vocab + 517] = std::numeric_limits<float>::quiet_NaN();
  host[2 * vocab + 3] = kInf;
  for (int64_t i = 0; i < vocab; ++i) host[size_t(3 * vocab + i)] = -kInf;
  const DeviceLogits dev = to_device(*gpu, host, 4, vocab);
  int checked = 0;
  for (bool greedy : {true, false}) {
    for (bool logprobs : {false, true}) {
      Request q;
      q.params.temperature = greedy ? 0.0f : 0.8f;
      q.params.top_p = greedy ? 1.0f : 0.9f;
      q.params.logprobs = logprobs ? 3 : -1;
      std::vector<Request> reqs(2, q);
      reqs[0].row = 0;  // a good row before the bad one
      const std::string mode = std::string(greedy ? "greedy" : "sampled") + (logprobs ? " + logprobs" : "");
      reqs[1].row = 1;
      expect_throw_containing(*gpu, dev, reqs, "NaN", mode + " NaN");
      reqs[1].row = 2;
      expect_throw_containing(*gpu, dev, reqs, "+inf", mode + " +inf");
      reqs[1].row = 3;
      expect_throw_containing(*gpu, dev, reqs, "all 1000 logits are -inf", mode + " all -inf");
      reqs[1].row = 0;
      for (int32_t id = 0; id < vocab; ++id) reqs[1].banned.push_back(id);
      expect_throw_containing(*gpu, dev, reqs, "are -inf", mode + " all banned");
      reqs[1].banned.clear();
      reqs[1].row = 1;
      reqs[1].banned = {517};  // the NaN banned away: fine, as on the CPU
      EXPECT_NO_THROW(gpu_sample(*gpu, dev.t, reqs)) << mode << " banned NaN";
      reqs[1].banned.clear();
      reqs[1].row = 0;
      reqs[1].params.repetition_penalty = 1.2f;
      reqs[1].prompt = {5, int32_t(vocab)};
      expect_throw_containing(*gpu, dev, reqs, "token id 1000 in the prompt is outside the vocabulary [0, 1000)",
                              mode + " bad prompt id");
      reqs[1].prompt = {5};
      reqs[1].output = {-3};
      expect_throw_containing(*gpu, dev, reqs, "token id -3 in the output is outside the vocabulary",
                              mode + " bad output id");
      reqs[1].params.repetition_penalty = 1.0f;  // no penalties: ids are not looked at
      EXPECT_NO_THROW(gpu_sample(*gpu, dev.t, reqs)) << mode << " ids without penalties";
      checked += 7;
    }
  }
  std::printf(
      "[cuda sampling] errors: %d broken-row cases checked (NaN, +inf, "
      "all -inf, all banned, bad ids)\n",
      checked);
}

TEST(CudaSampling, EmptyAndOddShapes) {
  SERVAL_CUDA_OR_SKIP(gpu);
  {
    const DeviceLogits dev = to_device(*gpu, std::vector<float>(4, 1.0f), 1, 4);
    std::vector<SampleResult> out(3);
    gpu->sample(Tensor{dev.t.data, DType::F32, 0, 4}, {}, out);
    EXPECT_TRUE(out.empty());
  }
  Sampler sampler;
  int checked = 0;
  for (bool lists : {true, false}) {
    const ListMode mode(lists);
    for (int64_t vocab : {int64_t(1), int64_t(3), int64_t(5), int64_t(4099), int64_t(50257)}) {
      const int rows = 5;  // odd vocabularies leave rows 1.. unaligned
      std::vector<float> host = random_logits(rows, vocab, uint32_t(vocab * 3));
      plant_max_ties(host, rows, vocab, 9u);
      const DeviceLogits dev = to_device(*gpu, host, rows, vocab);
      std::vector<Request> reqs;
      for (int r = 0; r < rows; ++r) {
        Request q;
        q.row = r;
        q.params = greedy_params();
        reqs.push_back(q);
        q.params.temperature = 1.0f;
        q.params.top_k = 3;
        q.params.top_p = 0.9f;
        q.params.logprobs = 2;
        for (double u : {0.01, 0.5, 0.99}) {
          q.uniform = u;
          reqs.push_back(q);
        }
      }
      const std::vector<SampleResult> g = gpu_sample(*gpu, dev.t, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        const Request& q = reqs[i];
        if (q.params.greedy()) {
          EXPECT_EQ(g[i].token, cpu_sample(sampler, host, vocab, q).token) << "vocab " << vocab << " row " << q.row;
        } else {
          const std::vector<double> ref = reference_probs(row_of(host, vocab, q.row), q);
          ASSERT_GE(g[i].token, 0);
          ASSERT_LT(g[i].token, vocab);
          EXPECT_GT(ref[size_t(g[i].token)], 0.0) << "vocab " << vocab << " row " << q.row << " u " << q.uniform;
          ASSERT_TRUE(g[i].logprobs.has_value());
          const Logprobs want = compute_logprobs(row_of(host, vocab, q.row), g[i].token, 2);
          EXPECT_EQ(g[i].logprobs->top.size(), want.top.size());
          EXPECT_EQ(g[i].logprobs->chosen_rank, want.chosen_rank);
        }
        ++checked;
      }
    }
  }
  std::printf(
      "[cuda sampling] empty call ok; %d rows of vocabularies 1, 3, 5, "
      "4099, 50257 checked\n",
      checked);
}

// ---------------------------------------------------------------- speed

double time_call_us(Backend& gpu, const DeviceLogits& dev, const std::vector<Request>& reqs) {
  gpu_sample(gpu, dev.t, reqs);  // warm: buffers allocated
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kTimedCalls; ++i) gpu_sample(gpu, dev.t, reqs);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / kTimedCalls;
}

TEST(CudaSampling, SpeedOfFullBatches) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int rows = kMaxRows;
  const std::vector<float> host = random_logits(rows, kLargeVocab, 77u);
  const DeviceLogits dev = to_device(*gpu, host, rows, kLargeVocab);
  std::vector<Request> reqs(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    reqs[size_t(r)].row = r;
    reqs[size_t(r)].params = greedy_params();
    reqs[size_t(r)].uniform = (r + 0.5) / rows;
  }
  const double greedy = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) q.params.temperature = 0.8f;
  const double plain = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) q.params.top_p = 0.9f;
  const double topp = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) q.params.top_k = 50;
  const double topk_topp = time_call_us(*gpu, dev, reqs);
  for (Request& q : reqs) {
    q.params.logprobs = 5;
    q.params.repetition_penalty = 1.1f;
    for (int i = 0; i < 200; ++i) q.prompt.push_back(int32_t((i * 7919) % kLargeVocab));
  }
  const double full = time_call_us(*gpu, dev, reqs);
  const double bytes = double(rows) * double(kLargeVocab) * 4.0;
  std::printf(
      "[cuda sampling] speed %d x %lld: greedy %.1f us (%.0f GB/s of "
      "logits), temperature %.1f us, "
      "top_p %.1f us, top_k+top_p %.1f us, +penalties+logprobs5 %.1f "
      "us (per call, incl. copies)\n",
      rows, (long long)kLargeVocab, greedy, bytes / greedy * 1e-3, plain, topp, topk_topp, full);
  // No bound on the times: a loaded machine stretches them. The calls' results
  // are checked by gpu_sample; the times are for the reader.
}

}  // namespace
}  // namespace serval::testing
