#include "sched/sequence.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace serval {
namespace {

TEST(StopCriteria, EosStopTokensAndLength) {
  StopCriteria s;
  s.max_tokens = 3;
  s.eos_token_ids = {2};
  s.stop_token_ids = {7};
  EXPECT_EQ(s.check(5, 1, 10, 0), FinishReason::kNone);
  EXPECT_EQ(s.check(2, 1, 10, 0), FinishReason::kStop);
  EXPECT_EQ(s.check(7, 1, 10, 0), FinishReason::kStop);
  EXPECT_EQ(s.check(5, 3, 10, 0), FinishReason::kLength);
  EXPECT_EQ(s.check(2, 3, 10, 0), FinishReason::kStop);  // EOS wins over length
  EXPECT_EQ(s.check(5, 1, 10, 10), FinishReason::kLength);  // context full
  s.ignore_eos = true;
  EXPECT_EQ(s.check(2, 1, 10, 0), FinishReason::kNone);
  EXPECT_EQ(s.check(7, 1, 10, 0), FinishReason::kStop);
  EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::kNone), nullptr);
}

TEST(Sequence, TracksTokensComputedAndFinish) {
  SamplingParams p;
  p.seed = 42;
  StopCriteria stop;
  stop.max_tokens = 2;
  Sequence seq(3, {5, 6, 7}, p, stop, BlockTable(16));
  EXPECT_EQ(seq.seed(), 42u);
  EXPECT_EQ(seq.num_tokens(), 3);
  EXPECT_FALSE(seq.prompt_computed());
  seq.advance_computed(3);
  EXPECT_TRUE(seq.prompt_computed());
  EXPECT_EQ(seq.num_uncomputed_tokens(), 0);
  EXPECT_THROW(seq.advance_computed(1), Error);
  EXPECT_EQ(seq.append_output(9, std::nullopt, 0), FinishReason::kNone);
  EXPECT_EQ(seq.token_at(3), 9);
  EXPECT_EQ(seq.token_at(0), 5);
  EXPECT_THROW(seq.token_at(4), Error);
  EXPECT_EQ(seq.num_uncomputed_tokens(), 1);
  EXPECT_EQ(seq.append_output(1, std::nullopt, 0), FinishReason::kLength);
  EXPECT_TRUE(seq.finished());
  EXPECT_THROW(seq.append_output(1, std::nullopt, 0), Error);
  EXPECT_THROW(Sequence(0, {}, p, stop, BlockTable(16)), Error);
}

}  // namespace
}  // namespace serval
