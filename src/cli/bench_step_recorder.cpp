#include "cli/bench_step_recorder.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace serval::cli {

using Clock = std::chrono::steady_clock;

void StepTotals::add(const StepRecord& r, const Limits& limits) {
  ++steps;
  seconds += r.seconds;
  seqs += r.num_seqs;
  bytes_s += limits.seconds_for_bytes(r.bytes);
  limit_s += std::max(limits.seconds_for_bytes(r.bytes), limits.seconds_for_flops(r.flops));
  op_limit_s += r.op_limit_s;
  start_s += r.start_s;
  wait_s += r.wait_s;
  if (r.gap_s >= 0) {
    gap_s += r.gap_s;
    ++gaps;
    pipelined += r.gap_s == 0;
    after_end += r.after_end;
  }
}

void StepRecorder::forward(const Batch& batch, std::vector<float>& logits) {
  StepRecord r = describe(batch);
  const auto t0 = Clock::now();
  inner_.forward(batch, logits);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  record(r);
}

void StepRecorder::forward_sample(const Batch& batch, std::span<const SampleSpec> specs,
                                  std::vector<SampleResult>& out) {
  start_sample(batch, specs);
  finish_sample(out);
}

void StepRecorder::start_sample(const Batch& batch, std::span<const SampleSpec> specs) {
  Started s{describe(batch), Clock::now()};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_.empty()) {
      s.record.gap_s = 0;  // queued behind a step in flight: the device does not wait...
      s.record.after_end = inner_.sample_ready();  // ...unless that step had ended
    } else if (finished_at_) {
      s.record.gap_s = std::chrono::duration<double>(s.at - *finished_at_).count();
    }
  }
  inner_.start_sample(batch, specs);
  s.record.start_s = std::chrono::duration<double>(Clock::now() - s.at).count();
  started_.push_back(s);
}

void StepRecorder::finish_sample(std::vector<SampleResult>& out) {
  const auto wait_from = Clock::now();
  inner_.finish_sample(out);
  const auto done = Clock::now();
  SERVAL_CHECK(!started_.empty(), "step recorder: finish_sample without a start");
  Started s = started_.front();
  started_.pop_front();
  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point from = finished_at_ ? std::max(s.at, *finished_at_) : s.at;
  s.record.seconds = std::chrono::duration<double>(done - from).count();
  s.record.wait_s = std::chrono::duration<double>(done - wait_from).count();
  finished_at_ = done;
  steps_.push_back(s.record);
}

StepRecord StepRecorder::describe(const Batch& b) const {
  StepRecord r;
  r.num_seqs = b.num_seqs();
  r.num_tokens = b.num_tokens();
  r.decode = r.num_tokens == r.num_seqs;
  const double matmul_flops = cost_.matmul_flops(r.num_tokens, int64_t(b.logits_rows.size()));
  double kv_bytes = 0, attention_flops = 0;
  for (int32_t s = 0; s < r.num_seqs; ++s) {
    const int32_t n_new = b.query_start[size_t(s) + 1] - b.query_start[size_t(s)];
    kv_bytes += cost_.kv_read_bytes(b.context_len[size_t(s)]);
    attention_flops += cost_.attention_flops(n_new, b.context_len[size_t(s)]);
  }
  r.bytes = cost_.weight_bytes() + kv_bytes;
  r.flops = matmul_flops + attention_flops;
  r.op_limit_s = cost_.op_limit_s(limits_, matmul_flops, kv_bytes, attention_flops);
  return r;
}

void StepRecorder::record(StepRecord r) {
  std::lock_guard<std::mutex> lock(mutex_);
  steps_.push_back(r);
}

std::vector<StepRecord> StepRecorder::steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_;
}

void StepRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  steps_.clear();
  finished_at_.reset();
}

}  // namespace serval::cli
