#pragma once
// Errors: Serval reports bad input (files, parameters, requests) by throwing
// serval::Error with a message that names the problem. Callers at the edges
// (CLI, server) turn it into a message or an HTTP error; nothing crashes.
#include <sstream>
#include <stdexcept>
#include <string>

namespace serval {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// str_cat("a", 1, 'b') == "a1b"; used to build error messages.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace serval

#define SERVAL_CHECK(cond, ...)                 \
  do {                                          \
    if (!(cond)) ::serval::fail(__VA_ARGS__);   \
  } while (0)
