#include "tokenizer/utf8.h"

namespace serval::utf8 {

size_t char_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = char_len(c);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

namespace {

const char kReplacement[] = "\xEF\xBF\xBD";

// Number of bytes of a well-formed sequence starting with `lead` (0 if `lead`
// cannot start one), and the allowed range of the second byte.
size_t expected_len(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

void consume_valid(std::string& buf, std::string& out, bool final) {
  size_t i = 0;
  const size_t n = buf.size();
  while (i < n) {
    unsigned char lo, hi;
    unsigned char lead = static_cast<unsigned char>(buf[i]);
    size_t len = expected_len(lead, lo, hi);
    if (len == 1) {
      out += static_cast<char>(lead);
      ++i;
      continue;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Walk the continuation bytes that are present.
    size_t k = 1;
    bool bad = false;
    while (k < len && i + k < n) {
      unsigned char c = static_cast<unsigned char>(buf[i + k]);
      bool ok = (k == 1) ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) {
        bad = true;
        break;
      }
      ++k;
    }
    if (bad) {  // maximal invalid subpart: the bytes accepted so far
      out += kReplacement;
      i += k;
      continue;
    }
    if (k < len) {  // ran out of bytes: incomplete character
      if (!final) break;
      out += kReplacement;
      i = n;
      break;
    }
    out.append(buf, i, len);
    i += len;
  }
  buf.erase(0, i);
}

std::string sanitize(std::string_view s) {
  std::string buf(s), out;
  out.reserve(s.size());
  consume_valid(buf, out, true);
  return out;
}

}  // namespace serval::utf8
