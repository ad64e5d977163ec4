#pragma once
// RequestGroup: the engine requests behind one HTTP request (one per prompt,
// each with n samples), read as one stream of events. Whatever is unfinished
// when the group is destroyed (client gone, error) is aborted, so its KV
// blocks are freed in the engine's next step.
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/engine.h"

namespace serval::server {

struct GroupEvent {
  size_t request = 0;  // which submitted request (prompt)
  RequestEvent event;
};

class RequestGroup {
 public:
  explicit RequestGroup(Engine& engine) : engine_(engine) {}
  ~RequestGroup() { abort_all(); }
  RequestGroup(const RequestGroup&) = delete;
  RequestGroup& operator=(const RequestGroup&) = delete;

  // Submits (throws what Engine::submit throws; earlier members stay and
  // are aborted with the group).
  void submit(EngineRequest request);
  // The next event of any member, waiting up to `wait`; nullopt on timeout or
  // when every member is done.
  std::optional<GroupEvent> next(std::chrono::milliseconds wait);
  bool done() const { return unfinished_ == 0; }
  size_t size() const { return members_.size(); }
  void abort_all();

 private:
  struct Member {
    RequestHandle handle;
    int32_t finals_left;
  };
  std::optional<GroupEvent> take(size_t i, std::chrono::milliseconds wait);

  Engine& engine_;
  std::vector<Member> members_;
  size_t unfinished_ = 0;
  size_t cursor_ = 0;  // round-robin start, so no member starves
};

}  // namespace serval::server
