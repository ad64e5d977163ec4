#pragma once
// Scheduler::Entry, shared by the scheduler's source files (scheduler.cpp,
// scheduler_drafts.cpp); not part of its interface.
#include <cstdint>
#include <optional>
#include <vector>

#include "sched/scheduler.h"

namespace serval {

// A request inside the scheduler: its sequence, ordering and all its tokens in
// one array (the prefix cache hashes contiguous token spans).
struct Scheduler::Entry {
  Sequence seq;
  int32_t priority = 0;
  uint64_t arrival = 0;
  std::optional<SchedulerClock::time_point> deadline;
  std::vector<int32_t> tokens;  // prompt + output, mirrors seq
  bool running = false;

  // Order of service: priority first, then arrival.
  bool before(const Entry& o) const {
    return priority != o.priority ? priority < o.priority : arrival < o.arrival;
  }
};

}  // namespace serval
