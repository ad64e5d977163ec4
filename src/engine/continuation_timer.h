#pragma once
// When to start a step's continuation (async scheduling). Started the moment
// the step is queued, a continuation is planned before the requests that
// arrive while the step runs: they wait a whole extra step for their first
// token. Started shortly before the step ends, it takes them, and the device
// still finds it queued. The timer learns how long the device takes for
// steps of each size (the host's wait for their tokens ends when the device
// does) and how long the host takes to plan and start a continuation, and
// places the start that long, plus a margin for the device's variation,
// before the step's expected end. A step that had ended before the host
// asked for its tokens may have left the device idle: its margin grows.
// Too long an estimate leaves the device idle, too short one only gives
// back part of the gain, so the expected time is the shortest of the last
// few steps of that size (a cold first step, or a longer context before,
// does not hold the next start back), and the engine also polls whether
// the step has ended while it waits.
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>

namespace serval {

class ContinuationTimer {
 public:
  using Clock = std::chrono::steady_clock;

  // When to start the continuation of a step of `num_tokens` tokens that the
  // device began at `device_start`; nullopt: at once (fewer than two steps
  // of its size timed yet).
  std::optional<Clock::time_point> start_time(Clock::time_point device_start, int64_t num_tokens) const;

  // A step of `num_tokens` tokens, begun by the device at `device_start`,
  // gave its tokens at `done`. `waited`: the host was waiting for them, so
  // `done` is when the device finished; otherwise the step ended earlier, at
  // an unknown time. `delayed`: its continuation was started late, at
  // start_time(); a step that ended before the host waited may then have
  // ended before the continuation was queued.
  void step_done(Clock::time_point device_start, int64_t num_tokens, Clock::time_point done, bool waited,
                 bool delayed);

  // Planning and starting a continuation took the host `d`.
  void host_cost(Clock::duration d);

  // The margin kept before a step of `num_tokens` tokens is expected to end.
  Clock::duration margin(int64_t num_tokens) const;
  // The expected device time of such a step, if one has been timed.
  std::optional<Clock::duration> expected(int64_t num_tokens) const;
  int64_t misses() const { return misses_; }

 private:
  // Steps of 2^(k-1) .. 2^k - 1 tokens share bucket k: a decode step's time
  // hardly changes with its rows, a prompt chunk's grows with its tokens.
  static constexpr int kRecent = 4;
  struct Bucket {
    std::array<double, kRecent> recent{};  // device times of the last steps, a ring
    int64_t count = 0;                     // steps timed
    double error_s = 0;                    // |device time - expected|, moving average
    std::optional<double> expected_s() const;
  };
  static size_t bucket_of(int64_t num_tokens);

  std::array<Bucket, 64> buckets_{};
  double host_s_ = 0;  // planning and starting a continuation, moving average
  int64_t misses_ = 0;
};

}  // namespace serval
