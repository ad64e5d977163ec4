#include "engine/request_output.h"

namespace serval {

void RequestChannel::push(RequestEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (final_pushed_) return;  // nothing follows a final event
    final_pushed_ = event.finished();
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<RequestEvent> RequestChannel::pop(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] { return !events_.empty() || final_taken_; };
  if (timeout) {
    if (!cv_.wait_for(lock, *timeout, ready)) return std::nullopt;
  } else {
    cv_.wait(lock, ready);
  }
  if (events_.empty()) return std::nullopt;
  RequestEvent event = std::move(events_.front());
  events_.pop_front();
  if (event.finished()) final_taken_ = true;
  return event;
}

}  // namespace serval
