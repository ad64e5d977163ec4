// The request-field table: names listed once, refused fields refused with
// the field named unless their value asks for nothing, no-op fields type
// checked, unknown fields accepted (and logged once per name).
#include "server/request_fields.h"

#include <gtest/gtest.h>

#include <set>

#include "server/api_error.h"

namespace serval::server {
namespace {

using nlohmann::json;

std::string refused_param(const json& body, Endpoint e) {
  try {
    check_request_fields(body, e);
  } catch (const ApiError& err) {
    EXPECT_EQ(err.status(), 400);
    return err.param();
  }
  return "";
}

TEST(RequestFields, EachNameOnce) {
  std::set<std::string> names;
  for (const FieldRule& r : request_field_rules()) {
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_NE(r.endpoints, 0) << r.name;
    if (r.status == FieldStatus::kRefused) {
      EXPECT_NE(r.why, nullptr) << r.name;
    }
  }
}

TEST(RequestFields, RefusedUnlessTheValueAsksForNothing) {
  EXPECT_EQ(refused_param({{"use_beam_search", true}}, Endpoint::kCompletions), "use_beam_search");
  EXPECT_EQ(refused_param({{"use_beam_search", false}}, Endpoint::kCompletions), "");
  EXPECT_EQ(refused_param({{"use_beam_search", nullptr}}, Endpoint::kChat), "");
  EXPECT_EQ(refused_param({{"length_penalty", 1.0}}, Endpoint::kChat), "");
  EXPECT_EQ(refused_param({{"length_penalty", 1}}, Endpoint::kChat), "");
  EXPECT_EQ(refused_param({{"length_penalty", 0.5}}, Endpoint::kChat), "length_penalty");
  EXPECT_EQ(refused_param({{"modalities", {"text"}}}, Endpoint::kChat), "");
  EXPECT_EQ(refused_param({{"modalities", {"text", "audio"}}}, Endpoint::kChat), "modalities");
  EXPECT_EQ(refused_param({{"cache_salt", "s"}}, Endpoint::kCompletions), "cache_salt");
  try {
    check_request_fields({{"audio", {{"voice", "alloy"}}}}, Endpoint::kChat);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("'audio' is not supported: "), std::string::npos) << e.what();
  }
}

TEST(RequestFields, NoopsAreTypeCheckedAndUnknownsAccepted) {
  EXPECT_EQ(refused_param({{"user", "u"}, {"metadata", {{"a", "b"}}}, {"store", true}}, Endpoint::kChat), "");
  EXPECT_EQ(refused_param({{"user", 3}}, Endpoint::kCompletions), "user");
  EXPECT_EQ(refused_param({{"store", "yes"}}, Endpoint::kChat), "store");
  // A chat-only field on completions is unknown there: accepted (and logged).
  EXPECT_EQ(refused_param({{"audio", {{"voice", "alloy"}}}}, Endpoint::kCompletions), "");
  EXPECT_EQ(refused_param({{"no_such_field_for_the_test", 1}}, Endpoint::kCompletions), "");
}

TEST(RequestFields, UnknownNamesLoggedOnce) {
  EXPECT_TRUE(log_unknown_field("request_fields_test_once", "POST /v1/completions"));
  EXPECT_FALSE(log_unknown_field("request_fields_test_once", "POST /v1/chat/completions"));
}

}  // namespace
}  // namespace serval::server
