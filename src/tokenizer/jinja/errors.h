#pragma once
// The two ways rendering fails: the template itself calls raise_exception()
// (the message is the template's, passed through untouched), or something
// goes wrong while rendering (the message names the line and column).
#include <string>

#include "core/error.h"

namespace serval::jinja {

class TemplateRaisedError : public Error {
 public:
  using Error::Error;
};

class TemplateRuntimeError : public Error {
 public:
  using Error::Error;
};

}  // namespace serval::jinja
