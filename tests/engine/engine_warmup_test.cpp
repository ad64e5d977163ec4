// plan_warmup + run_warmup on the toy runner: the warm-up runs a step of the
// whole token budget, then, for each class of decode graphs the contexts
// reach, decode steps of every size of the graph ladder at that class's
// contexts (what a GPU records graphs for), and the engine is left empty.
#include "engine/engine_warmup.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine_test_util.h"
#include "fake_model_runner.h"
#include "runtime/step_graphs.h"

namespace serval {
namespace {

TEST(EngineWarmup, EveryLadderSizeDecodesAtEveryClassOfContext) {
  testing::FakeModelRunner runner(97, 4, 2048, 4096);
  EngineOptions o;
  o.scheduler.max_num_seqs = 20;
  o.scheduler.max_num_batched_tokens = 64;
  o.check_invariants = true;
  for (const auto mode : {EngineOptions::AsyncScheduling::kOff, EngineOptions::AsyncScheduling::kOn}) {
    runner.batches.clear();
    o.async_scheduling = mode;
    Engine engine(runner, *testing::stories_model().tok, o);
    WarmupShape shape;
    shape.requests = 20;
    shape.longest = 1024;
    shape.room = 4096;
    shape.budget = 64;
    shape.max_seqs = 20;
    shape.block_size = 4;
    EngineRequest defaults;
    defaults.params.temperature = 0;
    defaults.stop.ignore_eos = true;
    const WarmupPlan plan = plan_warmup(defaults, shape, [](int64_t len) {
      std::vector<int32_t> p(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) p[size_t(i)] = int32_t((5 + 3 * i) % 97);
      return p;
    });
    EXPECT_EQ(plan.prompt_lens, (std::vector<int64_t>{33, 129}));
    run_warmup(engine, plan);

    // (batch size, context bound) of each decode-only step.
    std::set<std::pair<int32_t, int32_t>> decoded;
    int32_t most_tokens = 0;
    for (const Batch& b : runner.batches) {
      most_tokens = std::max(most_tokens, b.num_tokens());
      if (b.num_tokens() != b.num_seqs()) continue;
      const int32_t longest = *std::max_element(b.context_len.begin(), b.context_len.end());
      decoded.emplace(b.num_seqs(), longest <= 128 ? 128 : longest <= 1024 ? 1024 : 8192);
    }
    EXPECT_EQ(most_tokens, 64) << "a step of the whole budget";
    for (int32_t bound : {128, 1024})
      for (int32_t size : StepGraphs::ladder(20))
        EXPECT_TRUE(decoded.count({size, bound})) << "no decode step of " << size << " at contexts up to " << bound;
    EXPECT_EQ(engine.num_unfinished(), 0);
    EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  }
}

TEST(EngineWarmup, NothingToDoWithoutRequests) {
  WarmupShape shape;
  shape.longest = 1024;
  EXPECT_TRUE(plan_warmup(EngineRequest{}, shape, [](int64_t) { return std::vector<int32_t>{1}; }).phases.empty());
}

}  // namespace
}  // namespace serval
