#include "engine/request_output.h"

namespace serval {

void RequestChannel::push(RequestEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finals_left_ <= 0) return;  // nothing follows the last final event
    if (event.finished()) --finals_left_;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<RequestEvent> RequestChannel::pop(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] { return !events_.empty() || done_; };
  if (timeout) {
    if (!cv_.wait_for(lock, *timeout, ready)) return std::nullopt;
  } else {
    cv_.wait(lock, ready);
  }
  if (events_.empty()) return std::nullopt;
  RequestEvent event = std::move(events_.front());
  events_.pop_front();
  if (events_.empty() && finals_left_ == 0) done_ = true;
  return event;
}

}  // namespace serval
