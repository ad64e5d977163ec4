#include "engine/continuation_timer.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace serval {
namespace {

constexpr double kWeight = 0.2;  // of the newest step in the moving averages
// A timed wait on a condition variable wakes up to ~0.1 ms late.
constexpr double kWakeUpS = 100e-6;

ContinuationTimer::Clock::duration from_seconds(double s) {
  return std::chrono::duration_cast<ContinuationTimer::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

size_t ContinuationTimer::bucket_of(int64_t num_tokens) {
  return size_t(std::bit_width(uint64_t(num_tokens < 1 ? 1 : num_tokens))) % 64;
}

std::optional<double> ContinuationTimer::Bucket::expected_s() const {
  if (count < 2) return std::nullopt;  // one step may be a cold start
  const int64_t n = std::min<int64_t>(count, kRecent);
  return *std::min_element(recent.begin(), recent.begin() + n);
}

std::optional<ContinuationTimer::Clock::duration> ContinuationTimer::expected(int64_t num_tokens) const {
  const std::optional<double> e = buckets_[bucket_of(num_tokens)].expected_s();
  if (!e) return std::nullopt;
  return from_seconds(*e);
}

ContinuationTimer::Clock::duration ContinuationTimer::margin(int64_t num_tokens) const {
  const Bucket& b = buckets_[bucket_of(num_tokens)];
  return from_seconds(2 * host_s_ + 3 * b.error_s + kWakeUpS);
}

std::optional<ContinuationTimer::Clock::time_point> ContinuationTimer::start_time(Clock::time_point device_start,
                                                                                  int64_t num_tokens) const {
  const std::optional<Clock::duration> e = expected(num_tokens);
  if (!e) return std::nullopt;
  return device_start + *e - margin(num_tokens);
}

void ContinuationTimer::step_done(Clock::time_point device_start, int64_t num_tokens, Clock::time_point done,
                                  bool waited, bool delayed) {
  Bucket& b = buckets_[bucket_of(num_tokens)];
  if (!waited) {
    // It ended before the host asked: if the continuation was started late,
    // the device may have gone idle waiting for it (for a poll interval at
    // most: the engine polls the step while it waits). Keep a wider margin.
    if (delayed) {
      ++misses_;
      b.error_s += kWakeUpS;
    }
    return;
  }
  const double d = std::chrono::duration<double>(done - device_start).count();
  if (d <= 0) return;
  if (const std::optional<double> e = b.expected_s())
    b.error_s += kWeight * (std::abs(d - *e) - b.error_s);
  else if (b.count == 0)
    b.error_s = 0.05 * d;
  b.recent[size_t(b.count % kRecent)] = d;
  ++b.count;
}

void ContinuationTimer::host_cost(Clock::duration d) {
  const double s = std::chrono::duration<double>(d).count();
  host_s_ = host_s_ == 0 ? s : host_s_ + kWeight * (s - host_s_);
}

}  // namespace serval
