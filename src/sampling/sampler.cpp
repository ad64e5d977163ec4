#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "sampling/row_math.h"

namespace serval {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Filters avoid sorting the vocabulary by first bucketing tokens by how far
// their logit is below the max: buckets of 1/16 logit over [max - 32, max],
// plus one tail bucket for everything lower (including -inf). Whole buckets are
// kept or dropped; only the bucket where a filter's cut falls is sorted.
constexpr int kBuckets = 512;
constexpr float kPerLogit = kBuckets / 32.0f;

inline int bucket_of(float max, float x) {
  const float d = (max - x) * kPerLogit;  // >= 0; inf for -inf logits
  return d < float(kBuckets) ? int(d) : kBuckets;
}

// Largest logit and the lowest id holding it. Throws on NaN, +inf, or a row
// that is all -inf (no token could be chosen).
RowMax checked_max(std::span<const float> x) {
  SERVAL_CHECK(!x.empty(), "cannot sample from an empty row of logits");
  const RowMax m = row_max(x);
  SERVAL_CHECK(!m.has_nan, "logits contain NaN (the model output is broken)");
  SERVAL_CHECK(m.value != kInf, "logits contain +inf (the model output is broken)");
  SERVAL_CHECK(m.index >= 0 && m.value != -kInf, "all ", x.size(),
               " logits are -inf: no token can be sampled");
  return m;
}

}  // namespace

SampleResult Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids, Rng& rng,
                             std::span<const int32_t> banned, std::span<const uint32_t> allowed) {
  const double u = params.greedy() ? 0.0 : rng.uniform();
  return sample(logits, params, prompt_ids, output_ids, u, banned, allowed);
}

SampleResult Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids, double u,
                             std::span<const int32_t> banned, std::span<const uint32_t> allowed) {
  SampleResult result;
  std::span<const float> x = logits;
  if (params.has_penalties() || !params.greedy() || !banned.empty() || !params.logit_bias.empty() ||
      !allowed.empty()) {
    work_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : params.logit_bias) {
      SERVAL_CHECK(size_t(id) < work_.size(), "logit_bias: token id ", id, " is outside the vocabulary of ",
                   work_.size());
      work_[size_t(id)] += bias;
    }
    if (!allowed.empty()) {
      SERVAL_CHECK(allowed.size() * 32 >= work_.size(), "the allowed-token mask has ", allowed.size(),
                   " words, too few for a vocabulary of ", work_.size());
      for (size_t id = 0; id < work_.size(); ++id)
        if (!((allowed[id / 32] >> (id % 32)) & 1u)) work_[id] = -kInf;
    }
    for (int32_t id : banned)
      if (id >= 0 && size_t(id) < work_.size()) work_[size_t(id)] = -kInf;
    penalties_.apply(work_, params, prompt_ids, output_ids);
    x = work_;
  }
  if (params.greedy()) {
    result.token = checked_max(x).index;
  } else {
    const float t = params.temperature;
    for (float& v : work_) v /= t;
    result.token = sample_filtered(work_, params, u);
  }
  if (params.logprobs >= 0) result.logprobs = compute_logprobs(logits, result.token, params.logprobs);
  return result;
}

SampleResult Sampler::score(std::span<const float> logits, int32_t token, int32_t top_n) {
  (void)checked_max(logits);
  SERVAL_CHECK(token >= 0 && size_t(token) < logits.size(), "cannot score token ", token, ": outside the vocabulary of ",
               logits.size());
  SERVAL_CHECK(top_n >= 0, "scoring a token needs logprobs (top_n >= 0), got ", top_n);
  SampleResult result;
  result.token = token;
  result.logprobs = compute_logprobs(logits, token, top_n);
  return result;
}

int32_t Sampler::sample_filtered(std::span<const float> x, const SamplingParams& params,
                                 double u) {
  const int64_t vocab = int64_t(x.size());
  const float max = checked_max(x).value;
  // `all`: every token is still a candidate and candidates_ is not materialized
  // (the common case: no filtering, vectorized passes over the vocabulary).
  bool all = true;

  // top-k: keep tokens whose logit is at least the k-th largest (ties at the
  // boundary are all kept, as in vLLM).
  if (params.top_k > 0 && params.top_k < vocab) {
    const float threshold = kth_largest(x, max, params.top_k);
    candidates_.clear();
    for (int32_t id = 0; id < vocab; ++id)
      if (x[id] >= threshold) candidates_.push_back(id);
    all = false;
  }

  if (params.top_p < 1.0f) {
    if (all) {
      candidates_.resize(size_t(vocab));
      std::iota(candidates_.begin(), candidates_.end(), 0);
      all = false;
    }
    apply_top_p(x, max, params.nucleus_mass());
  }

  // min-p: keep tokens with p >= min_p * p_max, i.e. logit >= max + log(min_p)
  // (the ratio does not change when earlier filters renormalize).
  if (params.min_p > 0.0f) {
    const float threshold = max + std::log(params.min_p);
    if (all) {
      candidates_.clear();
      for (int32_t id = 0; id < vocab; ++id)
        if (x[id] >= threshold) candidates_.push_back(id);
      all = false;
    } else {
      std::erase_if(candidates_, [&](int32_t id) { return x[id] < threshold; });
    }
  }

  if (all) {
    weights_.resize(size_t(vocab));
    exp_shifted(x, max, weights_.data());
    return int32_t(draw_index(weights_, u));
  }
  weights_.resize(candidates_.size());
  for (size_t j = 0; j < candidates_.size(); ++j)
    weights_[j] = exp_nonpositive(x[candidates_[j]] - max);
  return candidates_[draw_index(weights_, u)];
}

// The k-th largest value of x: count tokens per bucket, find the bucket that
// holds the k-th, and nth_element only its values. O(vocab), no sort.
float Sampler::kth_largest(std::span<const float> x, float max, int32_t k) {
  const size_t n = x.size();
  bucket_of_.resize(n);
  for (size_t i = 0; i < n; ++i) bucket_of_[i] = uint16_t(bucket_of(max, x[i]));
  int32_t count[kBuckets + 1] = {};
  for (uint16_t b : bucket_of_) ++count[b];
  int32_t above = 0;  // tokens in buckets before `boundary`
  int boundary = 0;
  while (above + count[boundary] < k) above += count[boundary++];
  values_.clear();
  for (size_t i = 0; i < n; ++i)
    if (bucket_of_[i] == boundary) values_.push_back(x[i]);
  const auto kth = values_.begin() + (k - above - 1);
  std::nth_element(values_.begin(), kth, values_.end(), std::greater<float>());
  return *kth;
}

// top-p (vLLM semantics): in descending order of probability (lower id first on
// ties), keep a token while the mass of the tokens before it is below top_p;
// the most likely token always stays. Instead of sorting the vocabulary, the
// candidates are bucketed (see kBuckets); whole buckets are kept until the
// one where the mass crosses top_p, and only that bucket is sorted.
void Sampler::apply_top_p(std::span<const float> x, float max, float top_p) {
  const size_t n = candidates_.size();
  bucket_of_.resize(n);
  double bucket_mass[kBuckets + 1] = {};
  double total = 0.0;
  for (size_t j = 0; j < n; ++j) {
    const float logit = x[candidates_[j]];
    const int b = bucket_of(max, logit);
    bucket_of_[j] = uint16_t(b);
    const double w = exp_nonpositive(logit - max);
    bucket_mass[b] += w;
    total += w;
  }
  const double target = double(top_p) * total;
  double cum = 0.0;
  int boundary = kBuckets;
  for (int b = 0; b < kBuckets; ++b) {
    if (cum + bucket_mass[b] >= target) {
      boundary = b;
      break;
    }
    cum += bucket_mass[b];
  }
  // Candidates above the boundary bucket stay (in their current order); those
  // in it are sorted and kept while the running mass is below target.
  size_t kept = 0;
  boundary_.clear();
  for (size_t j = 0; j < n; ++j) {
    if (bucket_of_[j] < boundary) candidates_[kept++] = candidates_[j];
    else if (bucket_of_[j] == boundary) boundary_.push_back(candidates_[j]);
  }
  std::sort(boundary_.begin(), boundary_.end(),
            [&x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (int32_t id : boundary_) {
    if (cum >= target) break;
    candidates_[kept++] = id;
    cum += exp_nonpositive(x[id] - max);
  }
  candidates_.resize(kept);
}

}  // namespace serval
