#include "tokenizer/jinja/pystr.h"

#include <unicode/uchar.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <stdexcept>

#include "tokenizer/utf8.h"

namespace serval::jinja {

namespace {

// Python's str.isspace() set.
bool is_py_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

// Byte offsets of each character start, plus s.size() at the end.
std::vector<size_t> char_starts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size();) {
    starts.push_back(i);
    i += std::min(utf8::char_len(static_cast<unsigned char>(s[i])), s.size() - i);
  }
  starts.push_back(s.size());
  return starts;
}

uint32_t code_point(const std::string& s, size_t at) { return utf8::next(s, at); }

}  // namespace

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<size_t> starts = char_starts(s);
  std::vector<uint32_t> set;
  if (chars)
    for (size_t i = 0; i < chars->size();) set.push_back(utf8::next(*chars, i));
  auto strip_it = [&](size_t char_index) {
    uint32_t cp = code_point(s, starts[char_index]);
    if (!chars) return is_py_space(cp);
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  };
  size_t n = starts.size() - 1, b = 0, e = n;
  if (left)
    while (b < e && strip_it(b)) ++b;
  if (right)
    while (e > b && strip_it(e - 1)) --e;
  return s.substr(starts[b], starts[e] - starts[b]);
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw std::invalid_argument("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string::npos) break;
      out.push_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.push_back(s.substr(pos));
    return out;
  }
  std::vector<size_t> starts = char_starts(s);
  size_t n = starts.size() - 1, i = 0;
  while (true) {
    while (i < n && is_py_space(code_point(s, starts[i]))) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(py_strip(s.substr(starts[i]), std::nullopt, false, true));
      break;
    }
    size_t j = i;
    while (j < n && !is_py_space(code_point(s, starts[j]))) ++j;
    out.push_back(s.substr(starts[i], starts[j] - starts[i]));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw std::invalid_argument("empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit && end >= sep->size()) {
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      out.insert(out.begin(), s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.insert(out.begin(), s.substr(0, end));
    return out;
  }
  std::vector<size_t> starts = char_starts(s);
  size_t j = starts.size() - 1;  // one past the current character index
  while (true) {
    while (j > 0 && is_py_space(code_point(s, starts[j - 1]))) --j;
    if (j == 0) break;
    if (static_cast<int64_t>(out.size()) == maxsplit) {
      out.insert(out.begin(), py_strip(s.substr(0, starts[j]), std::nullopt, true, false));
      break;
    }
    size_t i = j;
    while (i > 0 && !is_py_space(code_point(s, starts[i - 1]))) --i;
    out.insert(out.begin(), s.substr(starts[i], starts[j] - starts[i]));
    j = i;
  }
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      out.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` between characters (and at both ends)
    std::vector<size_t> starts = char_starts(s);
    int64_t done = 0;
    for (size_t k = 0; k + 1 < starts.size(); ++k) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += s.substr(starts[k], starts[k + 1] - starts[k]);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos);
    out += with;
    pos = hit + old.size();
    ++done;
  }
  return out + s.substr(pos);
}

std::string py_lower(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

std::string py_upper(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toUpper(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

// Python title(): a cased character after an uncased one is title-cased,
// every other cased character lower-cased.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    auto cp = static_cast<UChar32>(utf8::next(s, i));
    if (u_isupper(cp) || u_istitle(cp)) {
      if (prev_cased) cp = u_tolower(cp);
    } else if (u_islower(cp)) {
      if (!prev_cased) cp = u_totitle(cp);
    }
    utf8::append(out, static_cast<uint32_t>(cp));
    prev_cased = u_isupper(cp) || u_islower(cp) || u_istitle(cp);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  uint32_t first = utf8::next(s, i);
  std::string out;
  utf8::append(out, static_cast<uint32_t>(u_totitle(static_cast<UChar32>(first))));
  return out + py_lower(s.substr(i));
}

int64_t py_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(char_starts(s).size());
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

int64_t py_find(const std::string& s, const std::string& sub, bool reverse) {
  size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string::npos) return -1;
  int64_t index = 0;
  for (size_t i = 0; i < hit;) {
    i += utf8::char_len(static_cast<unsigned char>(s[i]));
    ++index;
  }
  return index;
}

}  // namespace serval::jinja
