#pragma once
// Code point ranges as UTF-8 byte sequences, so that the matcher works on
// bytes only: [a-zé] becomes [a-z] | [\xC3][\xA9]. Each sequence is a list of
// byte ranges, one per byte of the encoding (the technique of RE2 and Rust's
// utf8-ranges: split a range until every byte position is itself a range).
#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace serval::grammar {

struct ByteRange {
  uint8_t lo = 0, hi = 0;
  bool operator==(const ByteRange&) const = default;
};

using ByteSequence = std::vector<ByteRange>;

// The byte sequences that encode exactly the code points in `ranges`
// (surrogates, which UTF-8 cannot carry, are left out).
std::vector<ByteSequence> utf8_sequences(const std::vector<CodepointRange>& ranges);

}  // namespace serval::grammar
