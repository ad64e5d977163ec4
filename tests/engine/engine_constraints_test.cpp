// Structured output through the Engine on stories260K (EngineRequest::grammar):
// every sample's text follows its grammar (a choice, a regex, a JSON schema)
// whatever the model would rather say, greedy and sampled, with n > 1, a KV
// pool small enough to preempt, and async scheduling on (a continuation's
// constrained rows are sampled after the step before is committed: the same
// text as without async scheduling); unconstrained requests beside them are
// unchanged.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "engine_test_util.h"
#include "grammar/compiled_grammar.h"
#include "grammar/json_builtins.h"
#include "grammar/json_schema_grammar.h"
#include "grammar/regex_to_grammar.h"
#include "grammar/token_mask.h"
#include "grammar/token_vocab.h"

namespace serval {
namespace {

using testing::collect;
using testing::Collected;

std::shared_ptr<const grammar::TokenMasker> masker(grammar::Grammar g) {
  static const std::shared_ptr<const grammar::TokenVocabulary> vocab =
      grammar::TokenVocabulary::from_tokenizer(*testing::stories_model().tok);
  return std::make_shared<grammar::TokenMasker>(grammar::CompiledGrammar::compile(std::move(g)), vocab);
}

EngineRequest constrained(std::shared_ptr<const grammar::TokenMasker> m, float temperature, int max_tokens,
                          int32_t n = 1, uint64_t seed = 1) {
  EngineRequest r = testing::greedy_request(testing::story_tokens(12), max_tokens);
  r.params.temperature = temperature;
  r.params.seed = seed;
  r.n = n;
  r.stop.eos_token_ids = {testing::stories_model().tok->eos_id};
  r.grammar = std::move(m);
  return r;
}

// Every sample's text, by index.
std::vector<std::string> texts(RequestHandle& h, int32_t n, std::vector<FinishReason>* finishes = nullptr) {
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int finals = 0; finals < n;) {
    std::optional<RequestEvent> ev = h.next(std::chrono::milliseconds(60000));
    if (!ev) throw Error("no event within 60 s");
    out.at(size_t(ev->index)) += ev->text;
    if (ev->finished()) {
      EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
      if (finishes) finishes->push_back(ev->finish);
      ++finals;
    }
  }
  return out;
}

TEST(EngineConstraints, EveryTextFollowsItsGrammar) {
  auto runner = testing::stories_runner(/*kv_cache_tokens=*/256);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async scheduling" : "sync");
    EngineOptions o;
    o.async_scheduling = async ? EngineOptions::AsyncScheduling::kOn : EngineOptions::AsyncScheduling::kOff;
    o.scheduler.max_num_batched_tokens = 32;
    o.check_invariants = true;
    Engine engine(*runner, *testing::stories_model().tok, o);
    const auto choice = masker(grammar::choice_grammar({"yes", "no", "maybe not"}));
    const auto digits = masker(grammar::regex_to_grammar("[0-9]{3}-[a-z]{2,5}"));
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(
        R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["name", "age"],
            "additionalProperties": false})");
    const auto json = masker(grammar::json_schema_to_grammar(schema));
    std::vector<RequestHandle> hs;
    hs.push_back(engine.submit(constrained(choice, 0.0f, 10)));
    hs.push_back(engine.submit(constrained(choice, 1.0f, 10, 3, 7)));
    hs.push_back(engine.submit(constrained(digits, 1.0f, 24, 2, 3)));
    hs.push_back(engine.submit(constrained(json, 0.8f, 60, 2, 5)));
    hs.push_back(engine.submit(constrained(json, 0.0f, 60)));
    hs.push_back(engine.submit(testing::greedy_request(testing::story_tokens(12), 20)));
    const std::vector<int32_t> ns = {1, 3, 2, 2, 1};
    for (size_t i = 0; i < 5; ++i) {
      std::vector<FinishReason> finishes;
      for (const std::string& t : texts(hs[i], ns[i], &finishes)) {
        if (i < 2) EXPECT_TRUE(t == "yes" || t == "no" || t == "maybe not") << t;
        if (i == 2) EXPECT_TRUE(std::regex_match(t, std::regex("[0-9]{3}-[a-z]{2,5}"))) << t;
        if (i >= 3) {
          const auto j = nlohmann::json::parse(t, nullptr, false);
          ASSERT_FALSE(j.is_discarded()) << t;
          ASSERT_TRUE(j.is_object() && j.size() == 2 && j["name"].is_string() && j["age"].is_number_integer()) << t;
          EXPECT_LE(j["name"].get<std::string>().size(), 8u) << t;
          EXPECT_GE(j["age"].get<int>(), 1);
          EXPECT_LE(j["age"].get<int>(), 99);
        }
      }
      for (FinishReason f : finishes) EXPECT_EQ(f, FinishReason::kStop) << "request " << i;
    }
    // The unconstrained request beside them is the plain greedy story.
    RequestHandle alone_h = engine.submit(testing::greedy_request(testing::story_tokens(12), 20));
    EXPECT_EQ(collect(hs[5]).tokens, collect(alone_h).tokens);
    EXPECT_EQ(engine.kv_usage().used_blocks, 0);
  }
}

// Counts the steps forwarded before their specs were made (deferred sampling).
class DeferCountingRunner : public testing::WrappedRunner {
 public:
  using WrappedRunner::WrappedRunner;
  void start_forward(const Batch& batch) override {
    ++deferred;
    WrappedRunner::start_forward(batch);
  }
  int64_t deferred = 0;  // read after the engine is gone
};

TEST(EngineConstraints, AsyncSchedulingDefersTheMasksAndChangesNoText) {
  auto inner = testing::stories_runner(/*kv_cache_tokens=*/4096);
  const auto digits = masker(grammar::regex_to_grammar("[0-9]{3}-[a-z]{2,5}( [a-z]{1,6}){0,6}"));
  const auto json = masker(grammar::json_schema_to_grammar(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 4}},
          "required": ["name", "tags"], "additionalProperties": false})")));
  std::vector<std::vector<std::string>> by_mode;
  int64_t deferred_async = 0, deferred_sync = 0;
  for (bool async : {false, true}) {
    DeferCountingRunner runner(*inner);
    {
      EngineOptions o;
      o.async_scheduling = async ? EngineOptions::AsyncScheduling::kOn : EngineOptions::AsyncScheduling::kOff;
      o.check_invariants = true;
      o.scheduler.max_num_batched_tokens = 16;  // prompts in chunks, some scored, beside constrained decodes
      Engine engine(runner, *testing::stories_model().tok, o);
      std::vector<RequestHandle> hs;
      hs.push_back(engine.submit(constrained(digits, 1.0f, 30, 2, 11)));
      hs.push_back(engine.submit(constrained(json, 0.9f, 50, 3, 12)));
      hs.push_back(engine.submit(constrained(json, 0.0f, 50)));
      EngineRequest plain = testing::greedy_request(testing::story_tokens(9), 30);
      plain.params.temperature = 1.0f;
      plain.params.seed = 4;
      hs.push_back(engine.submit(plain));
      EngineRequest scored = constrained(digits, 0.0f, 12);
      scored.prompt_ids = testing::story_tokens(40);
      scored.params.prompt_logprobs = 2;
      hs.push_back(engine.submit(scored));
      const std::vector<int32_t> ns = {2, 3, 1, 1, 1};
      std::vector<std::string> all;
      for (size_t i = 0; i < hs.size(); ++i)
        for (const std::string& t : texts(hs[i], ns[i])) all.push_back(t);
      by_mode.push_back(all);
    }
    (async ? deferred_async : deferred_sync) = runner.deferred;
  }
  EXPECT_EQ(deferred_sync, 0);
  EXPECT_GT(deferred_async, 10);  // the constrained decode steps were continued
  ASSERT_EQ(by_mode.size(), 2u);
  EXPECT_EQ(by_mode[0], by_mode[1]);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(std::regex_match(by_mode[1][i], std::regex("[0-9]{3}-[a-z]{2,5}( [a-z]{1,6}){0,6}"))) << by_mode[1][i];
  for (size_t i = 2; i < 6; ++i) EXPECT_FALSE(nlohmann::json::parse(by_mode[1][i], nullptr, false).is_discarded());
}

}  // namespace
}  // namespace serval
