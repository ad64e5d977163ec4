#include "grammar/utf8_ranges.h"

#include <string>

#include "tokenizer/utf8.h"

namespace serval::grammar {

namespace {

// The largest code point encoded in n bytes.
constexpr uint32_t kMaxOfLength[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};

void split(uint32_t lo, uint32_t hi, std::vector<ByteSequence>& out) {
  // Never across an encoding length or the surrogate gap.
  for (int n = 1; n < 4; ++n) {
    if (lo <= kMaxOfLength[n] && hi > kMaxOfLength[n]) {
      split(lo, kMaxOfLength[n], out);
      split(kMaxOfLength[n] + 1, hi, out);
      return;
    }
  }
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) split(lo, 0xD7FF, out);
    if (hi > 0xDFFF) split(0xE000, hi, out);
    return;
  }
  if (hi < 0x80) {
    out.push_back({{uint8_t(lo), uint8_t(hi)}});
    return;
  }
  // Split until lo and hi differ only in the bytes where lo has all-0 and hi
  // all-1 continuation bits: then each byte position spans a plain range.
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split(lo, lo | m, out);
        split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split(lo, (hi & ~m) - 1, out);
        split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  utf8::append(a, lo);
  utf8::append(b, hi);
  ByteSequence seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out.push_back(std::move(seq));
}

}  // namespace

std::vector<ByteSequence> utf8_sequences(const std::vector<CodepointRange>& ranges) {
  std::vector<ByteSequence> out;
  for (const auto& r : normalize_ranges(ranges)) split(r.lo, r.hi, out);
  return out;
}

}  // namespace serval::grammar
