// Speculative decoding through the Engine on stories260K (CPU): a mixed
// workload (shared prefixes hitting the prefix cache, chunked prefill, a KV
// pool small enough to preempt, n > 1 seeded samples, penalties, min_tokens,
// stop strings, per-request opt-out) gives every sample exactly the tokens,
// text and finish reason it gets without speculation, for k = 1..8; drafts
// are made and accepted (serval:spec_decode_* counters); no block leaks.
#include <gtest/gtest.h>

#include <map>

#include "engine_test_util.h"

namespace serval {
namespace {

using testing::metric_value;

const std::string kLabels = "{model_name=\"serval\"}";

struct Sample {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const Sample&) const = default;
};
using Outputs = std::vector<std::map<int32_t, Sample>>;  // per request, per sample index

std::vector<EngineRequest> workload() {
  const std::vector<int32_t> text = testing::story_tokens(400);
  std::vector<EngineRequest> out;
  auto add = [&](size_t from, size_t len, int max_tokens) -> EngineRequest& {
    EngineRequest r = testing::greedy_request(std::vector<int32_t>(text.begin() + from, text.begin() + from + len),
                                              max_tokens);
    out.push_back(std::move(r));
    return out.back();
  };
  // Shared 48-token prefixes (the prefix cache), a long prompt (chunked).
  add(0, 60, 60);
  add(0, 70, 50).stop.ignore_eos = true;
  add(0, 150, 40);
  // n = 3 seeded samples with top-p; a seeded request with penalties.
  EngineRequest& s = add(20, 30, 50);
  s.n = 3;
  s.params.temperature = 0.9f;
  s.params.top_p = 0.9f;
  s.params.seed = 11;
  EngineRequest& p = add(5, 40, 60);
  p.params.temperature = 0.7f;
  p.params.seed = 5;
  p.params.repetition_penalty = 1.2f;
  p.params.frequency_penalty = 0.3f;
  // min_tokens, a stop string, an opt-out.
  EngineRequest& m = add(100, 20, 40);
  m.stop.min_tokens = 30;
  EngineRequest& st = add(40, 25, 80);
  st.stop_strings = {" park", "Lily."};
  add(0, 64, 30).speculative = false;
  return out;
}

struct SpecRun {
  Outputs outputs;
  double drafts = 0, draft_tokens = 0, accepted = 0, preemptions = 0;
};

SpecRun run(int32_t k) {
  // 20 blocks of 16 tokens: too few for every request at once (preemptions).
  auto runner = testing::stories_runner(320);
  EngineOptions opts;
  opts.check_invariants = true;
  opts.scheduler.max_num_batched_tokens = 48;  // prompts in chunks
  if (k > 0) {
    opts.speculative.method = "ngram";
    opts.speculative.num_tokens = k;
    opts.speculative.ngram_min = 2;
  }
  Engine engine(*runner, *testing::stories_model().tok, opts);
  std::vector<EngineRequest> reqs = workload();
  std::vector<RequestHandle> handles = engine.submit_all(reqs);
  SpecRun r;
  for (size_t i = 0; i < handles.size(); ++i) {
    std::map<int32_t, Sample> samples;
    for (int finals = 0; finals < reqs[i].n;) {
      std::optional<RequestEvent> ev = handles[i].next(std::chrono::milliseconds(60000));
      if (!ev) {
        ADD_FAILURE() << "request " << i << ": no event within 60 s";
        break;
      }
      Sample& s = samples[ev->index];
      s.tokens.insert(s.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
      s.text += ev->text;
      if (ev->finished()) {
        s.finish = ev->finish;
        ++finals;
      }
    }
    r.outputs.push_back(std::move(samples));
  }
  EXPECT_EQ(engine.kv_usage().used_blocks, 0) << "k " << k;
  const std::string m = engine.metrics_registry().expose();
  r.drafts = metric_value(m, "serval:spec_decode_num_drafts_total" + kLabels);
  r.draft_tokens = metric_value(m, "serval:spec_decode_num_draft_tokens_total" + kLabels);
  r.accepted = metric_value(m, "serval:spec_decode_num_accepted_tokens_total" + kLabels);
  r.preemptions = metric_value(m, "serval:num_preemptions_total" + kLabels);
  return r;
}

TEST(EngineSpeculative, NgramOutputEqualsNonSpeculativeForEveryK) {
  const SpecRun base = run(0);
  EXPECT_EQ(base.drafts, 0);
  EXPECT_GT(base.preemptions, 0) << "the pool is meant to force preemptions";
  for (int32_t k = 1; k <= 8; ++k) {
    const SpecRun spec = run(k);
    ASSERT_EQ(spec.outputs.size(), base.outputs.size());
    for (size_t i = 0; i < base.outputs.size(); ++i) {
      ASSERT_EQ(spec.outputs[i].size(), base.outputs[i].size()) << "k " << k << " request " << i;
      for (const auto& [index, s] : base.outputs[i]) {
        const Sample& got = spec.outputs[i].at(index);
        EXPECT_EQ(got.tokens, s.tokens) << "k " << k << " request " << i << " sample " << index;
        EXPECT_EQ(got.text, s.text) << "k " << k << " request " << i << " sample " << index;
        EXPECT_EQ(got.finish, s.finish) << "k " << k << " request " << i << " sample " << index;
      }
    }
    EXPECT_GT(spec.drafts, 0) << "k " << k;
    EXPECT_GT(spec.accepted, 0) << "k " << k;
    EXPECT_LE(spec.draft_tokens, spec.drafts * k);
    EXPECT_LE(spec.accepted, spec.draft_tokens);
  }
}

}  // namespace
}  // namespace serval
