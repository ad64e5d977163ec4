#pragma once
// GPT-2's reversible map between bytes and printable Unicode characters, used by
// byte-level BPE vocabularies ("Ġ" is the space byte, "Ċ" the newline byte).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace serval {

// UTF-8 of the character standing for byte `b`.
const std::string& byte_to_unicode(uint8_t b);
// The byte a code point stands for, or -1 if it stands for none.
int byte_from_unicode(uint32_t cp);
// Maps every byte of `bytes` to its character.
std::string bytes_to_unicode_string(std::string_view bytes);
// Maps a byte-level string back to bytes; characters outside the map are kept as UTF-8.
std::string unicode_string_to_bytes(std::string_view s);

}  // namespace serval
