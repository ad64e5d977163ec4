// The one fit check (sched/request_fit): which limit a request misses, with
// the numbers in the reason; the room a prompt leaves; check_request_fits
// throwing the reason after its caller's prefix.
#include "sched/request_fit.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "core/error.h"

namespace serval {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(RequestFit, NamesTheLimitItMisses) {
  const KvFitLimits limits{/*max_model_len=*/256, /*block_size=*/16, /*num_blocks=*/8, /*window=*/0, 64};
  EXPECT_TRUE(request_fit(limits, 5, 100).fits());
  EXPECT_TRUE(request_fit(limits, 128, 0).fits());

  const RequestFit fills = request_fit(limits, 300, 1);
  EXPECT_EQ(fills.misfit, Misfit::kPromptFillsContext);
  EXPECT_TRUE(has(fills.reason, "300") && has(fills.reason, "256")) << fills.reason;
  EXPECT_EQ(request_fit(limits, 256, 1).misfit, Misfit::kPromptFillsContext);
  EXPECT_TRUE(request_fit(KvFitLimits{256, 16, 64, 0, 64}, 256, 0).fits()) << "no output asked: the prompt fits";

  const RequestFit past = request_fit(limits, 5, 300);
  EXPECT_EQ(past.misfit, Misfit::kPastContext);
  EXPECT_TRUE(has(past.reason, "5 prompt tokens + max_tokens 300 = 305") && has(past.reason, "256")) << past.reason;

  // 8 blocks of 16 hold 128 tokens (all but the last computed: 129).
  EXPECT_TRUE(request_fit(limits, 100, 29).fits());
  const RequestFit pool = request_fit(limits, 100, 30);
  EXPECT_EQ(pool.misfit, Misfit::kPastKvCache);
  EXPECT_TRUE(has(pool.reason, "need 9 KV blocks of 16 tokens but the whole cache has 8")) << pool.reason;
}

TEST(RequestFit, RoomAndThrowingCheck) {
  const KvFitLimits bounded{100, 16, 1000, 0, 64}, unbounded{0, 16, 1000, 0, 64};
  EXPECT_EQ(context_room(bounded, 30), 70);
  EXPECT_EQ(context_room(bounded, 130), -30);
  EXPECT_EQ(context_room(unbounded, 30), std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(request_fit(unbounded, 5000, 5000).fits());
  try {
    check_request_fits(bounded, 30, 80, "request 7: ");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("request 7: 30 prompt tokens + max_tokens 80 = 110", 0), 0u) << e.what();
  }
  EXPECT_NO_THROW(check_request_fits(bounded, 30, 70, ""));
}

}  // namespace
}  // namespace serval
