#include "tokenizer/byte_unicode.h"

#include "tokenizer/utf8.h"

namespace serval {

namespace {

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<uint32_t, 256> code_point{};
  ByteMap() {
    // Printable bytes keep their own code point; the others (controls, space,
    // 0x7F-0xA0, 0xAD) are numbered from 256 upwards in byte order.
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      code_point[b] = printable ? static_cast<uint32_t>(b) : extra++;
      utf8::append(to_unicode[b], code_point[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

int byte_from_unicode(uint32_t cp) {
  if (cp <= 255) {
    bool printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174);
    return printable ? static_cast<int>(cp) : -1;
  }
  const auto& m = byte_map();
  if (cp < 256 + 68) {
    for (int b = 0; b < 256; ++b)
      if (m.code_point[b] == cp) return b;
  }
  return -1;
}

std::string bytes_to_unicode_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_unicode(b);
  return out;
}

std::string unicode_string_to_bytes(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp = utf8::next(s, i);
    int b = byte_from_unicode(cp);
    if (b >= 0)
      out += static_cast<char>(b);
    else
      out.append(s.substr(start, i - start));
  }
  return out;
}

}  // namespace serval
