// ModelRunner's defaults (a forward on the host's sampler, chained starts
// resolved on the host) and its factory.
#include "runtime/model_runner.h"

#include "core/error.h"
#include "runtime/backend_model_runner.h"

namespace serval {

void ModelRunner::start_sample(const Batch& batch, std::span<const SampleSpec> specs) {
  forwarded_.reset();
  SERVAL_CHECK(started_.size() < kMaxStartedSteps, "start_sample: ", kMaxStartedSteps,
               " steps are already started and unfinished");
  std::vector<SampleResult> out;
  const std::vector<int32_t>& latest = started_.latest_tokens();
  const FedOutputs fed(specs, latest);
  if (batch.token_source.empty()) {
    forward_sample(batch, fed.specs(), out);
  } else {
    Batch resolved = batch;
    resolved.token_source.clear();
    for (size_t t = 0; t < batch.token_source.size(); ++t) {
      const int32_t source = batch.token_source[t];
      SERVAL_CHECK(source < int32_t(latest.size()), "batch: token_source[", t, "] = ", source,
                   " names no spec of the sample before, which had ", latest.size());
      if (source >= 0) resolved.token_ids[t] = latest[size_t(source)];
    }
    forward_sample(resolved, fed.specs(), out);
  }
  started_.push(std::move(out));
}

void ModelRunner::start_forward(const Batch& batch) {
  SERVAL_CHECK(started_.size() < kMaxStartedSteps, "start_forward: ", kMaxStartedSteps,
               " steps are already started and unfinished");
  // Computed at start_sampling: the tokens it feeds from stay the latest
  // start's until then (no start comes between).
  forwarded_ = batch;
}

void ModelRunner::start_sampling(std::span<const SampleSpec> specs) {
  SERVAL_CHECK(forwarded_.has_value(), "start_sampling without a step forwarded (start_forward)");
  const Batch batch = std::move(*forwarded_);
  forwarded_.reset();
  start_sample(batch, specs);
}

void ModelRunner::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>&) {
  fail("this model runner cannot copy KV blocks");
}

void ModelRunner::forward_sample(const Batch& batch, std::span<const SampleSpec> specs,
                                 std::vector<SampleResult>& out) {
  std::vector<float> logits;
  forward(batch, logits);
  const int64_t V = config().vocab_size;
  out.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const SampleSpec& s = specs[i];
    SERVAL_CHECK(s.params != nullptr && s.row >= 0 && int64_t(s.row) * V < int64_t(logits.size()),
                 "forward_sample: spec row ", s.row, " is outside the step's logits");
    const std::span<const float> row(logits.data() + int64_t(s.row) * V, size_t(V));
    out[i] = s.forced_token >= 0
                 ? host_sampler_.score(row, s.forced_token, s.params->logprobs)
                 : host_sampler_.sample(row, *s.params, s.prompt_ids, s.output_ids, s.uniform, s.banned, s.allowed);
  }
}

std::unique_ptr<ModelRunner> ModelRunner::create(const ModelConfig& config, const WeightStore& weights,
                                                 const RunnerOptions& opts) {
  return make_backend_model_runner(config, weights, opts);
}

}  // namespace serval
