#include "server/request_group.h"

#include <algorithm>

namespace serval::server {

void RequestGroup::submit(EngineRequest request) {
  const int32_t n = std::max(1, request.n);
  RequestHandle handle = engine_.submit(std::move(request));
  members_.push_back({std::move(handle), n});
  ++unfinished_;
}

std::optional<GroupEvent> RequestGroup::take(size_t i, std::chrono::milliseconds wait) {
  Member& m = members_[i];
  if (m.finals_left == 0) return std::nullopt;
  std::optional<RequestEvent> ev = m.handle.next(wait);
  if (!ev) return std::nullopt;
  if (ev->finished() && --m.finals_left == 0) --unfinished_;
  return GroupEvent{i, std::move(*ev)};
}

std::optional<GroupEvent> RequestGroup::next(std::chrono::milliseconds wait) {
  if (done()) return std::nullopt;
  if (members_.size() == 1) return take(0, wait);
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    for (size_t k = 0; k < members_.size(); ++k) {
      const size_t i = (cursor_ + k) % members_.size();
      if (auto ev = take(i, std::chrono::milliseconds(0))) {
        cursor_ = i + 1;
        return ev;
      }
    }
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
    // Nothing ready: wait a little on one unfinished member, then look at all again.
    for (size_t k = 0; k < members_.size(); ++k) {
      const size_t i = (cursor_ + k) % members_.size();
      if (members_[i].finals_left == 0) continue;
      const auto slice = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(2), std::chrono::duration_cast<std::chrono::milliseconds>(left));
      if (auto ev = take(i, slice)) {
        cursor_ = i + 1;
        return ev;
      }
      break;
    }
  }
}

void RequestGroup::abort_all() {
  for (Member& m : members_)
    if (m.finals_left > 0) {
      engine_.abort(m.handle.id());
      m.finals_left = 0;
    }
  unfinished_ = 0;
}

}  // namespace serval::server
