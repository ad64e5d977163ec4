#pragma once
// What a request's caller receives from the engine loop: RequestEvents through
// a thread-safe channel (the loop pushes, the caller's thread pops), read via
// a RequestHandle.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "sampling/logprobs.h"
#include "sched/stop_criteria.h"

namespace serval {

using EngineClock = std::chrono::steady_clock;

struct RequestTimings {
  EngineClock::time_point arrival;                   // submit()
  std::optional<EngineClock::time_point> first_token;
  std::optional<EngineClock::time_point> finish;     // set on the final event
};

// New output of one sample of a request since its previous event. A request
// with n samples gets events tagged index 0..n-1; each sample ends with one
// event whose finish != kNone, and after the last sample's final event
// nothing follows.
struct RequestEvent {
  int64_t request_id = -1;
  int32_t index = 0;               // which of the request's n samples
  std::vector<int32_t> token_ids;  // newly generated tokens
  std::string text;                // newly safe text (UTF-8 whole characters, no stop string)
  std::vector<Logprobs> logprobs;  // one per token when the request asked for logprobs
  // Asked for (prompt_logprobs): with each sample's first tokens, one per
  // prompt token, the first empty (nothing comes before it).
  std::vector<std::optional<Logprobs>> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;               // the message when finish == kError
  // vLLM's stop_reason, on a final event with finish kStop: the stop string
  // that matched, or the stop token (of stop_token_ids: an EOS gives neither).
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  RequestTimings timings;
  // Set on every event once the request has been scheduled: its prompt
  // length and how many prompt tokens its first admission took from the
  // prefix cache (OpenAI usage.prompt_tokens_details.cached_tokens).
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;

  // This sample is done (its last event).
  bool finished() const { return finish != FinishReason::kNone; }
};

// A queue of events between the engine loop and one reader, for a request
// of `num_samples` samples: it ends after that many final events.
class RequestChannel {
 public:
  explicit RequestChannel(int32_t num_samples = 1) : finals_left_(num_samples) {}
  void push(RequestEvent event);
  // The next event, waiting up to `timeout` (forever when unset); nullopt on
  // timeout or once every sample's final event has been taken.
  std::optional<RequestEvent> pop(std::optional<std::chrono::milliseconds> timeout);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  int32_t finals_left_;        // final events not yet pushed
  bool done_ = false;           // every final event has been taken
};

class RequestHandle {
 public:
  RequestHandle(int64_t id, std::shared_ptr<RequestChannel> channel)
      : id_(id), channel_(std::move(channel)) {}
  int64_t id() const { return id_; }
  // Blocks for the next event (see RequestChannel::pop). Thread-safe.
  std::optional<RequestEvent> next(std::optional<std::chrono::milliseconds> timeout = {}) {
    return channel_->pop(timeout);
  }

 private:
  int64_t id_;
  std::shared_ptr<RequestChannel> channel_;
};

}  // namespace serval
