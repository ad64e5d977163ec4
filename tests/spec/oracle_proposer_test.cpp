// The benchmark oracle proposer: the recorded continuation, each token right
// with the given probability.
#include <gtest/gtest.h>

#include "core/error.h"
#include "spec/oracle_proposer.h"

namespace serval {
namespace {

const std::vector<int32_t> kSeq = {1, 2, 3, 4, 5, 6, 7, 8};

TEST(OracleProposer, AcceptanceOneDraftsTheContinuation) {
  OracleProposer p({{9, 9, 9}, kSeq}, 1.0, 16);
  std::vector<int32_t> draft;
  p.propose(std::vector<int32_t>{1, 2, 3}, 3, draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{4, 5, 6}));
  p.propose(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}, 3, draft);  // only one token left
  EXPECT_EQ(draft, (std::vector<int32_t>{8}));
  p.propose(std::vector<int32_t>{1, 2, 4}, 3, draft);  // unknown
  EXPECT_TRUE(draft.empty());
}

TEST(OracleProposer, AcceptanceZeroDraftsOnlyWrongTokens) {
  OracleProposer p({kSeq}, 0.0, 16);
  std::vector<int32_t> draft;
  p.propose(std::vector<int32_t>{1, 2}, 4, draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{4, 5, 6, 7}));  // each the right one + 1
}

TEST(OracleProposer, AcceptanceIsThePerTokenRate) {
  std::vector<int32_t> long_seq(2001);
  for (size_t i = 0; i < long_seq.size(); ++i) long_seq[i] = int32_t(i % 7);
  OracleProposer p({long_seq}, 0.75, 16, 42);
  int right = 0, total = 0;
  std::vector<int32_t> draft;
  for (size_t len = 1; len + 8 < long_seq.size(); len += 8) {
    p.propose(std::span(long_seq).first(len), 8, draft);
    for (size_t j = 0; j < draft.size(); ++j, ++total) right += draft[j] == long_seq[len + j];
  }
  EXPECT_NEAR(double(right) / total, 0.75, 0.03);  // 2,000 draws: 3 sigma is 0.029
}

TEST(OracleProposer, RefusesBadAcceptance) {
  EXPECT_THROW(OracleProposer({kSeq}, 1.5, 16), Error);
  SpeculativeConfig c;
  c.method = "oracle";
  EXPECT_THROW(make_proposer(c), Error);  // needs the continuations: serval bench makes it
}

}  // namespace
}  // namespace serval
