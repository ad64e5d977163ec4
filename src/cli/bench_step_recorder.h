#pragma once
// StepRecorder: a ModelRunner that passes every call to the real runner and
// records each step's shape and wall time, so serval bench --mode engine can
// report steps, the mean running batch and each step against its roofline
// without touching the engine.
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "cli/bench_cost.h"
#include "runtime/model_runner.h"

namespace serval::cli {

struct StepRecord {
  int32_t num_seqs = 0, num_tokens = 0;
  bool decode = false;     // every sequence had one new token
  // forward_sample, sampled tokens on the host; a step started while the one
  // before was in flight counts from that one's tokens (the device ran them
  // one after the other).
  double seconds = 0;
  // Where the host spent `seconds`: queueing the step (start_sample), then
  // the caller's own work while the device runs (the engine publishes the
  // step before), then waiting for the tokens (finish_sample).
  double start_s = 0, wait_s = 0;
  // From the tokens of the step before to this step's start (the engine's
  // commit, scheduling and batch building); 0 for a step started before
  // them; < 0: no step before it was recorded.
  double gap_s = -1;
  // Queued behind a step that had already ended on the device (gap_s 0, yet
  // the device idled in between: a continuation started too late).
  bool after_end = false;
  double bytes = 0;        // weights + K/V read
  double flops = 0;
  double op_limit_s = 0;   // StepCost::op_limit_s
};

// Sums over a set of steps.
struct StepTotals {
  int64_t steps = 0;
  // bytes_s: bytes / bandwidth; limit_s: max(bytes, FLOPs); op_limit_s: op by op (StepCost::op_limit_s)
  double seconds = 0, seqs = 0, bytes_s = 0, limit_s = 0, op_limit_s = 0;
  double start_s = 0, wait_s = 0, gap_s = 0;
  int64_t gaps = 0;  // steps with a gap_s
  int64_t pipelined = 0;  // steps queued while the one before was in flight (gap_s 0)
  int64_t after_end = 0;  // of those, queued after the one before had ended on the device
  void add(const StepRecord& r, const Limits& limits);
};

class StepRecorder : public ModelRunner {
 public:
  StepRecorder(ModelRunner& inner, const StepCost& cost, const Limits& limits)
      : inner_(inner), cost_(cost), limits_(limits) {}

  void forward(const Batch& batch, std::vector<float>& logits) override;
  void forward_sample(const Batch& batch, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) override;
  // Timed from the start to the tokens, whatever the caller does in between.
  void start_sample(const Batch& batch, std::span<const SampleSpec> specs) override;
  void finish_sample(std::vector<SampleResult>& out) override;
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override { inner_.copy_blocks(src_dst); }
  const ModelConfig& config() const override { return inner_.config(); }
  int32_t block_size() const override { return inner_.block_size(); }
  int64_t num_blocks() const override { return inner_.num_blocks(); }
  std::string device() const override { return inner_.device(); }
  int64_t weight_bytes() const override { return inner_.weight_bytes(); }
  int64_t matrix_bytes() const override { return inner_.matrix_bytes(); }
  std::string weight_formats() const override { return inner_.weight_formats(); }
  int64_t activation_bytes() const override { return inner_.activation_bytes(); }
  int64_t graph_replays() const override { return inner_.graph_replays(); }
  int64_t graphs_captured() const override { return inner_.graphs_captured(); }
  bool uses_graphs() const override { return inner_.uses_graphs(); }
  bool queues_steps_async() const override { return inner_.queues_steps_async(); }
  bool counts_fed_tokens() const override { return inner_.counts_fed_tokens(); }
  bool sample_ready() const override { return inner_.sample_ready(); }

  // The steps recorded since the last clear() (thread-safe: the engine loop records).
  std::vector<StepRecord> steps() const;
  void clear();

 private:
  // The step's shape and cost; its time comes with the tokens (finish_sample).
  StepRecord describe(const Batch& batch) const;
  void record(StepRecord r);

  ModelRunner& inner_;
  StepCost cost_;
  Limits limits_;
  mutable std::mutex mutex_;
  std::vector<StepRecord> steps_;
  struct Started {
    StepRecord record;
    std::chrono::steady_clock::time_point at;
  };
  std::deque<Started> started_;  // between start_sample and finish_sample, oldest first
  std::optional<std::chrono::steady_clock::time_point> finished_at_;  // the last step's tokens (since clear())
};

}  // namespace serval::cli
