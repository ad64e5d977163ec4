#pragma once
// One access-log line per HTTP request, to stderr:
//   access id=cmpl-… POST /v1/completions status=200 prompt_tokens=5
//   completion_tokens=16 ttft_ms=3.1 total_ms=40.2
// The connection loop starts a record per request; handlers fill in what they
// know (id, tokens, first-token time) through current_access_record(), which
// is the calling thread's (a request is served by one thread end to end).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace serval::server {

struct AccessRecord {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  std::string id;        // response id; "-" when none
  std::string method, path;
  int status = 0;        // 499: the client went away first
  int64_t prompt_tokens = -1, completion_tokens = -1;  // -1: not applicable
  std::optional<Clock::time_point> first_token;

  void mark_first_token() {
    if (!first_token) first_token = Clock::now();
  }
};

AccessRecord& current_access_record();
// Resets the calling thread's record for a new request starting now.
void start_access_record();
// The line for `r` (no newline).
std::string format_access_line(const AccessRecord& r, AccessRecord::Clock::time_point end);
// Writes the calling thread's record to stderr (one write, so lines from
// several threads do not interleave), if a request was seen.
void write_access_log();

}  // namespace serval::server
