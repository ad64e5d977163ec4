#pragma once
// Unicode NFC normalization (the "NFC" normalizer of Qwen's tokenizer.json).
#include <string>
#include <string_view>

namespace serval {

// NFC form of valid UTF-8 text.
std::string nfc_normalize(std::string_view text);

}  // namespace serval
