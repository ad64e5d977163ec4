#include "sched/stop_strings.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings,
                                     bool include_stop_str_in_output)
    : stops_(std::move(stop_strings)), include_stop_(include_stop_str_in_output) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    SERVAL_CHECK(!stops_[i].empty(), "stop string ", i, " is empty");
    max_stop_len_ = std::max(max_stop_len_, stops_[i].size());
  }
}

const std::string& StopStringMatcher::matched_string() const {
  SERVAL_CHECK(match_.has_value(), "no stop string has matched");
  return stops_[match_->stop_index];
}

size_t StopStringMatcher::longest_partial_suffix() const {
  const std::string_view window = window_;
  size_t best = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(stop.size() - 1, window.size()); k > best; --k) {
      if (window.ends_with(std::string_view(stop).substr(0, k))) {
        best = k;
        break;
      }
    }
  }
  return best;
}

StopStringMatcher::Result StopStringMatcher::feed(std::string_view delta, bool check_stop) {
  Result result;
  if (stopped() || flushed_ || delta.empty()) return result;
  if (stops_.empty()) {
    result.text = std::string(delta);
    output_ += delta;
    window_offset_ += delta.size();
    return result;
  }

  const size_t old_size = window_.size();
  const size_t emit_from = old_size - held_;  // window_[emit_from:] is not yet emitted
  window_ += delta;

  // Earliest-ending match that ends inside the new delta (matches ending
  // earlier were looked for on previous deltas). std::string::find gives the
  // earliest start of each stop string, hence its earliest end.
  size_t best = stops_.size(), best_begin = 0, best_end = 0;
  for (size_t i = 0; check_stop && i < stops_.size(); ++i) {
    const std::string& stop = stops_[i];
    const size_t from = old_size + 1 > stop.size() ? old_size + 1 - stop.size() : 0;
    const size_t begin = window_.find(stop, from);
    if (begin == std::string::npos) continue;
    const size_t end = begin + stop.size();
    if (best == stops_.size() || end < best_end || (end == best_end && begin < best_begin)) {
      best = i;
      best_begin = begin;
      best_end = end;
    }
  }

  if (best != stops_.size()) {
    // Without include_stop_str_in_output the match cannot start before
    // emit_from: the held-back tail is the longest possible stop-string start.
    const size_t cut = std::max(emit_from, include_stop_ ? best_end : best_begin);
    result.text = window_.substr(emit_from, cut - emit_from);
    output_ += result.text;
    match_ = StopStringMatch{best, window_offset_ + best_begin, window_offset_ + cut};
    result.match = match_;
    window_.clear();
    held_ = 0;
    return result;
  }

  const size_t held = include_stop_ ? 0 : std::min(longest_partial_suffix(), window_.size() - emit_from);
  result.text = window_.substr(emit_from, window_.size() - held - emit_from);
  output_ += result.text;
  held_ = held;
  // Keep only what a future match could start in (held_ <= max_stop_len_ - 1).
  const size_t keep = max_stop_len_ - 1;
  if (window_.size() > keep) {
    const size_t drop = window_.size() - keep;
    window_.erase(0, drop);
    window_offset_ += drop;
  }
  return result;
}

std::string StopStringMatcher::flush() {
  if (stopped() || flushed_) return {};
  flushed_ = true;
  std::string text = window_.substr(window_.size() - held_);
  output_ += text;
  held_ = 0;
  return text;
}

}  // namespace serval
