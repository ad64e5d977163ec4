#include "engine/engine_warmup.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "runtime/step_graphs.h"

namespace serval {

WarmupPlan plan_warmup(const EngineRequest& defaults, const WarmupShape& s,
                       const std::function<std::vector<int32_t>(int64_t)>& prompt) {
  WarmupPlan plan;
  if (s.requests <= 0) return plan;
  auto wanting = [&](int64_t len, int64_t tokens) {  // a prompt of len tokens
    EngineRequest r = defaults;
    r.prompt_ids = prompt(len);
    r.stop.max_tokens = int32_t(tokens);
    return r;
  };
  {
    const int64_t len = std::clamp<int64_t>(s.budget, 1, std::max<int64_t>(s.room - 1, 1));
    const int64_t n = std::min<int64_t>((s.budget + len - 1) / len, s.max_seqs);
    plan.phases.emplace_back();
    for (int64_t i = 0; i < n; ++i) plan.phases.back().push_back(wanting(len, 1));
  }
  // Ladder sizes, largest first: L[0] = W > L[1] > ... > 1. Decode step k
  // (k >= 1; the prefill gives each request its first token) runs the
  // requests that want more than k tokens, L[k - 1] of them when
  // L[j] - L[j + 1] want j + 2.
  std::vector<int32_t> sizes = StepGraphs::ladder(s.requests);
  std::reverse(sizes.begin(), sizes.end());
  for (int32_t start : StepGraphs::class_starts(int32_t(std::min<int64_t>(s.longest, INT32_MAX)))) {
    const int64_t bs = std::max<int32_t>(s.block_size, 1);
    const int64_t len = start == 1 ? std::min<int64_t>(s.room / 2, 32) / bs * bs + 1 : start;
    if (start > 1 && len + int64_t(sizes.size()) + 1 > s.room) continue;
    EngineRequest r = wanting(len, 1);
    plan.prompt_lens.push_back(len);
    plan.phases.push_back({r});
    plan.phases.emplace_back();
    for (size_t j = 0; j < sizes.size(); ++j) {
      const int32_t next = j + 1 < sizes.size() ? sizes[j + 1] : 0;
      r.stop.max_tokens = int32_t(std::clamp<int64_t>(int64_t(j) + 2, 1, s.room - len));
      for (int32_t i = next; i < sizes[j]; ++i) {
        r.params.seed = uint64_t(i);
        plan.phases.back().push_back(r);
      }
    }
  }
  return plan;
}

void run_warmup(Engine& engine, const WarmupPlan& plan) {
  for (const auto& phase : plan.phases) engine.check(phase.back());
  for (const auto& phase : plan.phases) {
    std::vector<RequestHandle> handles = engine.submit_all(phase);
    for (RequestHandle& h : handles) {
      while (true) {
        std::optional<RequestEvent> ev = h.next(std::chrono::seconds(600));
        SERVAL_CHECK(ev.has_value(), "warm-up: a request made no progress in 600 s");
        SERVAL_CHECK(ev->finish != FinishReason::kError, "warm-up: a request failed: ", ev->error);
        if (ev->finished()) break;
      }
    }
  }
}

}  // namespace serval
