// The n-gram (prompt lookup) proposer and the verification rule.
#include <gtest/gtest.h>

#include "core/error.h"
#include "spec/ngram_proposer.h"
#include "spec/verify.h"

namespace serval {
namespace {

std::vector<int32_t> propose(NgramProposer& p, const std::vector<int32_t>& tokens, int32_t k) {
  std::vector<int32_t> draft = {99};  // replaced
  p.propose(tokens, k, draft);
  return draft;
}

TEST(NgramProposer, ProposesWhatFollowedTheMostRecentEarlierMatch) {
  NgramProposer p(1, 3);
  // Suffix [1 2 3] occurs at 0 (followed by 4 5 6) and at 6 (followed by 7 8).
  EXPECT_EQ(propose(p, {1, 2, 3, 4, 5, 6, 1, 2, 3, 7, 8, 0, 1, 2, 3}, 2), (std::vector<int32_t>{7, 8}));
  // The draft stops at the end of the tokens.
  EXPECT_EQ(propose(p, {1, 2, 3, 4, 5, 6, 1, 2, 3, 7, 8, 0, 1, 2, 3}, 5), (std::vector<int32_t>{7, 8, 0, 1, 2}));
}

TEST(NgramProposer, PrefersTheLongestSuffixThatOccurs) {
  NgramProposer p(1, 3);
  // [5 6] occurs once (followed by 9); the 1-gram [6] last occurred at 3 (followed by 4).
  EXPECT_EQ(propose(p, {5, 6, 9, 6, 4, 5, 6}, 1), (std::vector<int32_t>{9}));
  NgramProposer one(1, 1);
  EXPECT_EQ(propose(one, {5, 6, 9, 6, 4, 5, 6}, 1), (std::vector<int32_t>{4}));
}

TEST(NgramProposer, NothingWithoutAMatchOfAtLeastNgramMin) {
  NgramProposer p(2, 4);
  EXPECT_TRUE(propose(p, {1, 2, 3, 4, 5, 3}, 3).empty());  // only the 1-gram [3] recurs
  EXPECT_TRUE(propose(p, {7}, 3).empty());
  EXPECT_TRUE(propose(p, {1, 2, 1, 2}, 0).empty());
  // A repeated token overlapping itself: [7 7] follows [7 7] at 1.
  EXPECT_EQ(propose(p, {7, 7, 7, 7}, 3), (std::vector<int32_t>{7}));
}

TEST(NgramProposer, RefusesBadSettings) {
  EXPECT_THROW(NgramProposer(0, 3), Error);
  EXPECT_THROW(NgramProposer(3, 2), Error);
}

TEST(SpeculativeConfig, BadValuesNameTheFlag) {
  auto message = [](SpeculativeConfig c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SpeculativeConfig c;
  c.method = "ngram";
  EXPECT_EQ(message(c), "");
  c.num_tokens = 0;
  EXPECT_NE(message(c).find("--num-speculative-tokens"), std::string::npos);
  c.num_tokens = 100;
  EXPECT_NE(message(c).find("--num-speculative-tokens"), std::string::npos);
  c.num_tokens = 3;
  c.ngram_min = 5;
  c.ngram_max = 2;
  EXPECT_NE(message(c).find("--ngram-max"), std::string::npos);
  c = SpeculativeConfig{};
  c.method = "eagle";
  EXPECT_NE(message(c).find("--speculative"), std::string::npos);
  EXPECT_EQ(make_proposer(SpeculativeConfig{}), nullptr);
}

TEST(Verify, AcceptsWhileTheDraftEqualsTheSampledTokens) {
  EXPECT_EQ(accepted_length(std::vector<int32_t>{4, 5, 6}, std::vector<int32_t>{4, 5, 6, 7}), 4);  // all + bonus
  EXPECT_EQ(accepted_length(std::vector<int32_t>{4, 5, 6}, std::vector<int32_t>{4, 9, 6, 7}), 2);
  EXPECT_EQ(accepted_length(std::vector<int32_t>{4, 5, 6}, std::vector<int32_t>{1, 5, 6, 7}), 1);
  EXPECT_THROW(accepted_length(std::vector<int32_t>{4}, std::vector<int32_t>{4}), Error);
}

}  // namespace
}  // namespace serval
