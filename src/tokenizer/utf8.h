#pragma once
// Small UTF-8 helpers shared by the tokenizers and the detokenizer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace serval::utf8 {

// Length in bytes of the character starting with lead byte `c` (1 for invalid
// lead bytes, so that scanning always advances).
size_t char_len(unsigned char c);

// Appends the UTF-8 encoding of code point `cp`.
void append(std::string& out, uint32_t cp);

// Decodes the code point at `s[i]` (assumes valid UTF-8; invalid bytes decode
// as themselves) and advances i.
uint32_t next(std::string_view s, size_t& i);

// Moves the valid UTF-8 prefix of `buf` to `out`, replacing each maximal
// invalid subsequence by U+FFFD (as Rust's from_utf8_lossy and the WHATWG
// decoder do). When `final` is false an incomplete but so far valid character
// at the end stays in `buf`, waiting for more bytes; when true it becomes
// U+FFFD. Decoding a stream piecewise gives the same text as decoding it whole.
void consume_valid(std::string& buf, std::string& out, bool final);

// The text with every invalid sequence replaced by U+FFFD.
std::string sanitize(std::string_view s);

}  // namespace serval::utf8
