// Error mapping: engine refusals to 429/503, validation errors to 400 with
// the parameter, OpenAI's error shape; the access-log line format.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "server/access_log.h"
#include "server/api_error.h"
#include "server/sse_stream.h"

namespace serval::server {
namespace {

TEST(ApiError, EngineRefusalsMapToStatuses) {
  EXPECT_EQ(to_api_error(QueueFullError("full")).status(), 429);
  EXPECT_EQ(to_api_error(EngineStoppedError("stopped")).status(), 503);
  const ApiError bad = to_api_error(Error("top_p must be in [0, 1], got 1.5"));
  EXPECT_EQ(bad.status(), 400);
  EXPECT_EQ(bad.param(), "top_p");
  EXPECT_EQ(to_api_error(Error("prompt token id 900 is outside the vocabulary")).param(), "prompt");
  EXPECT_EQ(to_api_error(std::runtime_error("boom")).status(), 500);
}

TEST(ApiError, OpenAiShapeAndRetryAfter) {
  httplib::Response res;
  write_error(res, ApiError(429, "queue full", "", "queue_full"));
  EXPECT_EQ(res.status, 429);
  EXPECT_EQ(res.get_header_value("Retry-After"), "1");
  const auto body = nlohmann::json::parse(res.body);
  EXPECT_EQ(body["error"]["message"], "queue full");
  EXPECT_EQ(body["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_EQ(body["error"]["code"], "queue_full");
  httplib::Response res400;
  write_error(res400, ApiError(400, "bad n", "n"));
  EXPECT_FALSE(res400.has_header("Retry-After"));
  EXPECT_EQ(nlohmann::json::parse(res400.body)["error"]["param"], "n");
}

TEST(AccessLog, LineHasIdStatusTokensAndTimes) {
  AccessRecord r;
  r.start = AccessRecord::Clock::now();
  r.id = "cmpl-1";
  r.method = "POST";
  r.path = "/v1/\xff";
  r.status = 200;
  r.prompt_tokens = 5;
  r.completion_tokens = 16;
  r.first_token = r.start + std::chrono::milliseconds(3);
  const std::string line = format_access_line(r, r.start + std::chrono::milliseconds(40));
  EXPECT_EQ(line, "access id=cmpl-1 POST /v1/%FF status=200 prompt_tokens=5 completion_tokens=16 ttft_ms=3.0 "
                  "total_ms=40.0");
}

TEST(Sse, DataFrames) {
  EXPECT_EQ(sse_data({{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_data({{"t", "\xff"}}), "data: {\"t\":\"\xEF\xBF\xBD\"}\n\n");  // invalid UTF-8 replaced
  EXPECT_STREQ(kSseDone, "data: [DONE]\n\n");
}

}  // namespace
}  // namespace serval::server
