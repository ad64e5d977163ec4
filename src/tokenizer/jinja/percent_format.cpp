// Python's printf-style formatting, `"%s=%d" % (a, b)`, used by jinja2's
// format filter and by the % operator on a string.
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/jinja/evaluator.h"

namespace serval::jinja {

namespace {

std::string pad(std::string s, int width, bool left_align, char fill = ' ') {
  // Width counts characters (code points), as Python does.
  size_t chars = utf8_chars(s).size();
  if (width <= 0 || chars >= static_cast<size_t>(width)) return s;
  std::string padding(static_cast<size_t>(width) - chars, fill);
  return left_align ? s + padding : padding + s;
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  Array items;
  bool mapping = args.is_object();
  if (args.is_tuple()) items = args.as_array();
  else if (!mapping) items.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    Value v;
    bool have = false;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      const Value* found = args.as_object().find(fmt.substr(i + 1, close - i - 1));
      if (!found) fail("KeyError: '", fmt.substr(i + 1, close - i - 1), "'");
      v = *found;
      have = true;
      i = close + 1;
    }
    bool left = false, zero = false, plus = false, space = false;
    for (; i < fmt.size() && std::string("-0+ #").find(fmt[i]) != std::string::npos; ++i) {
      left |= fmt[i] == '-';
      zero |= fmt[i] == '0';
      plus |= fmt[i] == '+';
      space |= fmt[i] == ' ';
    }
    int width = 0, precision = -1;
    for (; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i) {
      width = width * 10 + (fmt[i] - '0');
      if (width > (1 << 20)) fail("format width too large");
    }
    if (i < fmt.size() && fmt[i] == '.') {
      precision = 0;
      for (++i; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i) {
        precision = precision * 10 + (fmt[i] - '0');
        if (precision > 400) fail("format precision too large");
      }
    }
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have && mapping) {
      v = args;  // Python: '%s' % {'a': 1} prints the dict
    } else if (!have) {
      if (next >= items.size()) fail("not enough arguments for format string");
      v = items[next++];
    }
    std::string text;
    switch (conv) {
      case 's': text = v.str(); if (precision >= 0) text = text.substr(0, static_cast<size_t>(precision)); break;
      case 'r': case 'a': text = v.repr(); break;
      case 'd': case 'i': case 'u': {
        if (!v.is_number()) fail("%", conv, " format: a real number is required, not ", v.type_name());
        int64_t n = v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int();
        text = std::to_string(n);
        if (n >= 0 && (plus || space)) text = (plus ? "+" : " ") + text;
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        if (!v.is_number()) fail("must be real number, not ", v.type_name());
        char spec[16];
        std::snprintf(spec, sizeof spec, "%%%s%s.%d%c", plus ? "+" : "", space ? " " : "", precision < 0 ? 6 : precision, conv);
        int n = std::snprintf(nullptr, 0, spec, v.as_double());
        std::string buf(static_cast<size_t>(n) + 1, '\0');
        std::snprintf(buf.data(), buf.size(), spec, v.as_double());
        text = buf.substr(0, static_cast<size_t>(n));
        break;
      }
      case 'x': case 'X': case 'o': {
        if (!v.is_int() && !v.is_bool()) fail("%", conv, " format: an integer is required, not ", v.type_name());
        char buf[64];
        std::snprintf(buf, sizeof buf, conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : "%llo",
                      static_cast<long long>(std::llabs(v.as_int())));
        text = v.as_int() < 0 ? "-" : "";  // then appended: GCC 12 warns (-Wrestrict) on "-" + temporary
        text += buf;
        break;
      }
      case 'c': text = v.is_string() ? v.as_string() : std::string(1, static_cast<char>(v.as_int())); break;
      default: fail("unsupported format character '", conv, "'");
    }
    bool numeric = std::string("diufFeEgGxXo").find(conv) != std::string::npos;
    if (zero && numeric && !left && width > 0 && static_cast<int>(text.size()) < width) {
      size_t sign = (!text.empty() && (text[0] == '-' || text[0] == '+' || text[0] == ' ')) ? 1 : 0;
      text.insert(sign, static_cast<size_t>(width) - text.size(), '0');
    }
    out += pad(text, width, left);
  }
  if (!mapping && next < items.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace serval::jinja
