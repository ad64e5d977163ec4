// Default implementations of the Backend interface's optional parts.
#include "runtime/backend.h"

#include "core/error.h"

namespace serval {

DeviceBuffer DeviceBuffer::slice(int64_t offset, int64_t bytes) const {
  SERVAL_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_, "device buffer: slice [", offset, ", ",
               offset + bytes, ") of a buffer of ", bytes_, " bytes");
  return DeviceBuffer(std::shared_ptr<void>(mem_, static_cast<char*>(mem_.get()) + offset), bytes);
}

std::vector<std::unique_ptr<DeviceWeight>> Backend::upload_weight_group(const std::vector<TensorView>& views) {
  std::vector<std::unique_ptr<DeviceWeight>> out;
  for (const TensorView& v : views) out.push_back(upload_weight(v));
  return out;
}

std::unique_ptr<DeviceWeight> Backend::upload_kept_linear(const Linear& w) {
  fail("the ", name(), " backend does not keep \"", w.name, "\" in its own format (", w.format.describe(), ")");
}

void Backend::fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>&) {
  fail("the ", name(), " backend does not fold norm weights (\"", norm.name(), "\") into matrices");
}

void StartedSamples::push(std::vector<SampleResult> results) {
  SERVAL_CHECK(size() < kMax, "start_sample: ", kMax, " starts are already unfinished");
  latest_tokens_.resize(results.size());
  for (size_t i = 0; i < results.size(); ++i) latest_tokens_[i] = results[i].token;
  queue_.push_back(std::move(results));
}

std::vector<SampleResult> StartedSamples::pop() {
  SERVAL_CHECK(!queue_.empty(), "finish_sample without a started sample");
  std::vector<SampleResult> out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

FedOutputs::FedOutputs(std::span<const SampleSpec> specs, std::span<const int32_t> latest) : specs_(specs) {
  size_t fed = 0;
  for (const SampleSpec& s : specs) {
    SERVAL_CHECK(s.fed_source < int64_t(latest.size()), "sample spec: fed_source ", s.fed_source,
                 " names no spec of the sample before, which had ", latest.size());
    fed += s.fed_source >= 0;
  }
  if (fed == 0) return;
  resolved_.assign(specs.begin(), specs.end());
  outputs_.reserve(fed);  // the spans below point into these
  for (SampleSpec& s : resolved_) {
    if (s.fed_source < 0) continue;
    // Only the penalties read the output: other rows need no copy of it.
    if (s.params != nullptr && s.params->has_penalties()) {
      std::vector<int32_t>& out = outputs_.emplace_back(s.output_ids.begin(), s.output_ids.end());
      out.push_back(latest[size_t(s.fed_source)]);
      s.output_ids = out;
    }
    s.fed_source = -1;
  }
  specs_ = resolved_;
}

void Backend::start_sample(const Tensor& logits, std::span<const SampleSpec> specs) {
  SERVAL_CHECK(started_samples() < kMaxStartedSamples, "start_sample: ", kMaxStartedSamples,
               " starts are already unfinished");
  std::vector<SampleResult> out;
  const FedOutputs fed(specs, started_.latest_tokens());
  sample(logits, fed.specs(), out);
  started_.push(std::move(out));
}

Tensor Backend::finish_norm(NormedRows& x) { return normalized(x, "finish_norm"); }

const Tensor& Backend::normalized(const NormedRows& x, const char* op) {
  SERVAL_CHECK(!x.deferred, op, ": the rows' norm was left deferred, which this backend does not do");
  return x.rows;
}

void Backend::set_kv_dtype(DType t) {
  SERVAL_CHECK(t == kv_dtype(), "the ", name(), " backend has no kernels for a KV cache of ", dtype_name(t),
               " (--kv-cache-dtype); use --kv-cache-dtype auto (", dtype_name(kv_dtype()), "), or --device cpu");
}

void Backend::set_matmul_observer(MatmulObserver* observer) {
  SERVAL_CHECK(observer == nullptr, "the ", name(), " backend cannot show matmul inputs (calibration runs on the CPU)");
}

void Backend::begin_capture() { fail("the ", name(), " backend cannot record graphs"); }

std::unique_ptr<DeviceGraph> Backend::end_capture() { fail("the ", name(), " backend cannot record graphs"); }

}  // namespace serval
