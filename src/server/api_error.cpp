#include "server/api_error.h"

#include <array>
#include <string_view>

#include "core/error.h"
#include "engine/engine.h"

namespace serval::server {
namespace {

// Parameters whose engine-side validation messages start with their name.
constexpr std::array<std::string_view, 16> kKnownParams = {
    "temperature",    "top_p",      "top_k",      "min_p",          "repetition_penalty", "presence_penalty",
    "frequency_penalty", "logprobs", "max_tokens", "min_tokens",    "stop_token_ids",     "seed",
    "n",              "prompt",     "logit_bias", "prompt_logprobs"};

std::string param_of(const std::string& message) {
  std::string first = message.substr(0, message.find(' '));
  if (!first.empty() && first.back() == ':') first.pop_back();
  for (std::string_view p : kKnownParams)
    if (first == p) return first;
  if (message.find("prompt token") != std::string::npos) return "prompt";
  return "";
}

}  // namespace

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code)
    : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  if (status_ == 429) return "rate_limit_error";
  if (status_ == 503) return "service_unavailable";
  if (status_ >= 500) return "server_error";
  if (status_ == 401) return "authentication_error";
  return "invalid_request_error";
}

nlohmann::json ApiError::body() const {
  nlohmann::json e = {{"message", what()}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) e["param"] = param_;
  if (!code_.empty()) e["code"] = code_;
  return {{"error", e}};
}

ApiError to_api_error(const std::exception& e) {
  if (auto* api = dynamic_cast<const ApiError*>(&e)) return *api;
  if (dynamic_cast<const QueueFullError*>(&e)) return ApiError(429, e.what(), "", "queue_full");
  if (dynamic_cast<const EngineStoppedError*>(&e))
    return ApiError(503, e.what(), "", "engine_stopped");
  if (dynamic_cast<const Error*>(&e)) return ApiError(400, e.what(), param_of(e.what()));
  return ApiError(500, str_cat("internal error: ", e.what()));
}

void write_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status();
  if (error.status() == 429 || error.status() == 503) res.set_header("Retry-After", "1");
  res.set_content(error.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

}  // namespace serval::server
