#pragma once
// ApiError: a request that fails with an HTTP status, reported in OpenAI's
// shape {"error": {"message", "type", "param", "code"}}. Handlers throw it;
// to_api_error() maps everything else (engine refusals, serval::Error from
// validation, unexpected exceptions) onto the right status.
#include <exception>
#include <stdexcept>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace serval::server {

class ApiError : public std::runtime_error {
 public:
  // `param`: the request parameter at fault ("" when none). `code`: OpenAI's
  // machine-readable code ("" gives null).
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // OpenAI's error type for the status: invalid_request_error (4xx),
  // rate_limit_error (429), service_unavailable (503), server_error (5xx).
  std::string type() const;
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_, code_;
};

// Maps an exception to the error a client gets: ApiError as is,
// QueueFullError 429, EngineStoppedError 503, serval::Error 400 (its param is
// the first word of the message when that names a known request parameter),
// anything else 500.
ApiError to_api_error(const std::exception& e);

// Writes the error to `res`: status, JSON body, Retry-After on 429 and 503.
void write_error(httplib::Response& res, const ApiError& error);

}  // namespace serval::server
