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

void Backend::fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>&) {
  fail("the ", name(), " backend does not fold norm weights (\"", norm.name(), "\") into matrices");
}

void Backend::start_sample(const Tensor& logits, std::span<const SampleSpec> specs) {
  SERVAL_CHECK(started_samples() < kMaxStartedSamples, "start_sample: ", kMaxStartedSamples,
               " samples are already started and unfinished");
  std::vector<SampleResult> out;
  sample(logits, specs, out);
  started_tokens_.resize(out.size());
  for (size_t i = 0; i < out.size(); ++i) started_tokens_[i] = out[i].token;
  started_.push_back(std::move(out));
}

void Backend::finish_sample(std::vector<SampleResult>& out) {
  SERVAL_CHECK(!started_.empty(), "finish_sample without a started sample");
  out = std::move(started_.front());
  started_.pop_front();
}

void Backend::begin_capture() { fail("the ", name(), " backend cannot record graphs"); }

std::unique_ptr<DeviceGraph> Backend::end_capture() { fail("the ", name(), " backend cannot record graphs"); }

}  // namespace serval
