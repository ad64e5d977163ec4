#pragma once
// The regex pre-tokenizer of byte-level BPE, through PCRE2 in UTF + UCP mode
// (so \p{L}, \p{N} and \s follow Unicode). Compiled once; matching is
// thread-safe (each call uses its own match data).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace serval {

// The patterns of the tokenizers Serval knows (as written in their tokenizer.json).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;
// SmolLM's (and StarCoder's): HF Sequence[Digits(individual_digits), ByteLevel(use_regex)],
// llama.cpp's pre "smollm": every digit alone, the GPT-2 regex on each stretch between
// digits. As one regex: \p{N} first, no " ?\p{N}+", and a whitespace run also ends
// before a digit (the end of its stretch).
extern const char* const kSmolLMPattern;

class PretokenizerRegex {
 public:
  explicit PretokenizerRegex(const std::string& pattern);
  ~PretokenizerRegex();
  PretokenizerRegex(const PretokenizerRegex&) = delete;
  PretokenizerRegex& operator=(const PretokenizerRegex&) = delete;

  // Splits `text` (valid UTF-8) into the matches and the gaps between them
  // (HF Split with behavior "Isolated"), in order.
  std::vector<std::string_view> split(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serval
