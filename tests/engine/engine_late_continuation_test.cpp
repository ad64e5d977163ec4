// Late continuations (EngineOptions::late_continuations): with async
// scheduling, a step's continuation is started shortly before the step is
// expected to end, so that a request arriving while the step runs starts in
// the very next step, and the device still never waits for the host. The
// runner here is a simulated device: it runs the toy model at once, but
// hands out each step's tokens only `step_time` after the step before ended
// (or after it was queued, if the device was idle then).
//
// These measure the engine against the wall clock: on a loaded machine the
// loop wakes late and the timer's estimate of the host's cost grows, so a
// CI machine with other builds beside can fail them (seen: 9 of 45 steps
// started late where 11 were asked). They are disabled in the suite and run
// by scripts/timing-checks.sh on a quiet machine; the timer's decisions are
// tested without a clock in continuation_timer_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace serval {
namespace {

using Clock = std::chrono::steady_clock;
using testing::FakeModelRunner;

constexpr int64_t kVocab = 97;
constexpr auto kStepTime = std::chrono::milliseconds(20);
constexpr auto kShortStepTime = std::chrono::milliseconds(4);

const Tokenizer& tokenizer() { return *testing::stories_model().tok; }

class SimulatedDevice : public FakeModelRunner {
 public:
  struct Step {
    Clock::time_point queued, start, done;
    int32_t num_tokens = 0;
  };

  // Steps take `long_time`, from `short_from` on kShortStepTime.
  explicit SimulatedDevice(size_t short_from = SIZE_MAX, Clock::duration long_time = kStepTime)
      : FakeModelRunner(kVocab, 4, 256), short_from(short_from), long_time(long_time) {}
  const size_t short_from;
  const Clock::duration long_time;

  void start_sample(const Batch& batch, std::span<const SampleSpec> specs) override {
    FakeModelRunner::start_sample(batch, specs);
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point now = Clock::now();
    const Clock::time_point start = steps_.empty() ? now : std::max(now, steps_.back().done);
    const Clock::duration time = steps_.size() < short_from ? long_time : kShortStepTime;
    steps_.push_back(Step{now, start, start + time, batch.num_tokens()});
    unfinished_.push_back(steps_.size() - 1);
  }
  bool sample_ready() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return unfinished_.empty() || Clock::now() >= steps_[unfinished_.front()].done;
  }
  void finish_sample(std::vector<SampleResult>& out) override {
    Clock::time_point done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done = steps_[unfinished_.front()].done;
      unfinished_.pop_front();
    }
    std::this_thread::sleep_until(done);
    FakeModelRunner::finish_sample(out);
  }
  std::vector<Step> steps() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return steps_;
  }
  // Waits until `n` steps have been queued.
  void wait_for_steps(size_t n) const {
    while (steps().size() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Step> steps_;
  std::deque<size_t> unfinished_;
};

EngineOptions options(bool late) {
  EngineOptions o;
  o.async_scheduling = EngineOptions::AsyncScheduling::kOn;
  o.late_continuations = late;
  return o;
}

EngineRequest request(int prompt_len, int max_tokens, int salt) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(int32_t((3 + 13 * i + 5 * salt) % kVocab));
  return testing::greedy_request(std::move(prompt), max_tokens, /*ignore_eos=*/false);
}

// For each of 5 requests submitted a fifth of the way into a decode step: how
// many steps after that one its prompt was computed (1: the very next).
std::vector<int> steps_to_first_chunk(bool late) {
  SimulatedDevice device;
  Engine engine(device, tokenizer(), options(late));
  RequestHandle decoding = engine.submit(request(6, 60, 0));
  device.wait_for_steps(6);  // the timer has seen a few decode steps
  std::vector<Clock::time_point> submitted;
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 5; ++i) {
    // The start of the step queued next: then a fifth of a step in.
    const size_t n = device.steps().size();
    device.wait_for_steps(n + 1);
    const Clock::time_point start = device.steps()[n].start;
    std::this_thread::sleep_until(start + kStepTime / 5);
    submitted.push_back(Clock::now());
    handles.push_back(engine.submit(request(5, 2, i + 1)));
    testing::collect(handles.back());  // done: two steps later
    device.wait_for_steps(device.steps().size() + 2);
  }
  testing::collect(decoding);
  const std::vector<SimulatedDevice::Step> steps = device.steps();
  std::vector<int> after;
  for (const Clock::time_point t : submitted) {
    size_t running = 0;
    while (running + 1 < steps.size() && steps[running + 1].start <= t) ++running;
    size_t first = running + 1;
    while (first < steps.size() && steps[first].num_tokens < 5) ++first;  // its prompt: 5 tokens
    after.push_back(int(first - running));
  }
  return after;
}

TEST(EngineLateContinuation, DISABLED_ARequestArrivingDuringAStepStartsInTheNext) {
  const std::vector<int> late = steps_to_first_chunk(true);
  const std::vector<int> early = steps_to_first_chunk(false);
  // A loaded machine may wake the loop late once in a while.
  EXPECT_GE(std::count(late.begin(), late.end(), 1), 4) << ::testing::PrintToString(late);
  // Started when the step is queued, the next step was planned before the arrival.
  EXPECT_GE(std::count(early.begin(), early.end(), 2), 4) << ::testing::PrintToString(early);
}

TEST(EngineLateContinuation, DISABLED_TheDeviceStaysBusy) {
  SimulatedDevice device;
  Engine engine(device, tokenizer(), options(true));
  RequestHandle h = engine.submit(request(6, 50, 0));
  testing::collect(h);
  const std::vector<SimulatedDevice::Step> steps = device.steps();
  ASSERT_GE(steps.size(), 45u);
  int idle = 0, late = 0;
  for (size_t k = 5; k < steps.size(); ++k) {
    if (steps[k].queued > steps[k - 1].done) ++idle;  // the device waited for the host
    // Queued in the second half of the step before: started late, not at once.
    if (steps[k].queued > steps[k - 1].done - kStepTime / 2) ++late;
  }
  const int n = int(steps.size()) - 5;
  // A loaded machine may wake the loop late now and then, and its slower host
  // makes the timer plan earlier (its cost estimate grows): at a load of 8 on
  // 2 cores, 18 of 45 steps were still planned in the second half. Planned at
  // once (no late continuations), none would be.
  EXPECT_LE(idle, n / 4) << idle << " of " << n << " steps found the device idle";
  EXPECT_GE(late, n / 4) << late << " of " << n << " steps were started late";
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

// Steps that suddenly get 25 times shorter: the timer still expects a long
// one when it plans the step after the first short one, but the loop, polling
// the step while it waits, starts the next as soon as it sees the step ended.
TEST(EngineLateContinuation, DISABLED_ATooLongEstimateLeavesTheDeviceIdleBriefly) {
  constexpr size_t kShortFrom = 15;
  constexpr auto kLongStep = std::chrono::milliseconds(100);
  SimulatedDevice device(kShortFrom, kLongStep);
  Engine engine(device, tokenizer(), options(true));
  RequestHandle h = engine.submit(request(6, 40, 0));
  testing::collect(h);
  const std::vector<SimulatedDevice::Step> steps = device.steps();
  ASSERT_GE(steps.size(), 35u);
  // Only the steps planned on the stale estimate: elsewhere a loaded machine's
  // late wake-up is no fault of the timer.
  Clock::duration longest{0};
  for (size_t k = kShortFrom; k < kShortFrom + 3; ++k)
    longest = std::max(longest, steps[k].queued - steps[k - 1].done);
  // Without the poll: ~95 ms (100 ms expected, 4 ms taken, less the margin);
  // with it a fraction of a millisecond, so half a long step is a wide margin.
  EXPECT_LT(longest, kLongStep / 2)
      << "the device waited " << std::chrono::duration<double, std::milli>(longest).count() << " ms";
  EXPECT_EQ(engine.kv_usage().used_blocks, 0);
}

}  // namespace
}  // namespace serval
