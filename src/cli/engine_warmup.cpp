#include "cli/engine_warmup.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/step_graphs.h"

namespace serval::cli {

WarmupPlan plan_warmup(const EngineRequest& defaults, const WarmupShape& s,
                       const std::function<std::vector<int32_t>(int64_t)>& prompt) {
  WarmupPlan plan;
  if (s.requests <= 0) return plan;
  auto one_token = [&](int64_t len) {  // a prompt of len tokens, wanting 1
    EngineRequest r = defaults;
    r.prompt_ids = prompt(len);
    r.stop.max_tokens = 1;
    return r;
  };
  {
    const int64_t len = std::clamp<int64_t>(s.budget, 1, std::max<int64_t>(s.room - 1, 1));
    const int64_t n = std::min<int64_t>((s.budget + len - 1) / len, s.max_seqs);
    plan.phases.emplace_back();
    for (int64_t i = 0; i < n; ++i) plan.phases.back().push_back(one_token(len));
  }
  for (int32_t start : StepGraphs::class_starts(int32_t(std::min<int64_t>(s.longest, INT32_MAX)))) {
    const int64_t len = start == 1 ? std::clamp<int64_t>(s.room / 2, 1, 32) : start;
    if (start > 1 && len + s.requests > s.room) continue;
    EngineRequest r = one_token(len);
    plan.prompt_lens.push_back(len);
    plan.phases.push_back({r});
    plan.phases.emplace_back();
    for (int32_t i = 0; i < s.requests; ++i) {
      r.params.seed = uint64_t(i);
      r.stop.max_tokens = int32_t(std::clamp<int64_t>(i + 1, 1, s.room - len));
      plan.phases.back().push_back(r);
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

}  // namespace serval::cli
