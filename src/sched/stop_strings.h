#pragma once
// StopStringMatcher: finds OpenAI/vLLM `stop` strings in the detokenized text
// of one sequence as it is generated, delta by delta, even when a stop string
// spans several tokens.
//
// Streaming contract (as vLLM/OpenAI): the text returned by feed() is safe to
// send to the client now. A tail that could be the start of a stop string is
// held back until the next delta decides it; flush() releases it when
// generation ends without a match. The stop string and everything after it are
// never emitted (unless include_stop_str_in_output, which emits the stop string
// itself but still nothing after it; that mode needs no hold-back).
//
// Which match wins when several stop strings occur: the one that *ends*
// first, then the longest of those (earliest start). This is what a
// character-by-character stream would find, so the output does not depend on
// how the text was split into deltas, and the emitted text never contains any
// stop string. (vLLM instead takes the first stop string in list order that
// occurs anywhere in the new window.)
//
// All offsets are in bytes of UTF-8 text. Deltas are whole characters, so the
// emitted text and the truncation point always fall on character boundaries
// (a valid UTF-8 stop string can only match at a character boundary).
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace serval {

struct StopStringMatch {
  size_t stop_index = 0;   // index into the matcher's stop strings
  size_t match_begin = 0;  // byte offset of the stop string in the full text
  // Byte offset in the full text (all deltas concatenated) where the output
  // text ends: match_begin, or the end of the stop string when it is included.
  size_t truncate_at = 0;
};

class StopStringMatcher {
 public:
  // Throws serval::Error if a stop string is empty.
  explicit StopStringMatcher(std::vector<std::string> stop_strings,
                             bool include_stop_str_in_output = false);

  struct Result {
    std::string text;                     // safe to emit now (may be empty)
    std::optional<StopStringMatch> match; // set once, on the delta that completes a stop string
  };

  // Feeds the next text delta. After a match the matcher is stopped and
  // further deltas are ignored (empty result, no match).
  //
  // check_stop = false (vLLM's min_tokens: no stop-string check before that
  // many output tokens): no match may end inside this delta, but one that
  // starts in it and ends in a later checked delta is still found.
  Result feed(std::string_view delta, bool check_stop = true);

  // Generation ended (any reason but a stop string): returns the held-back
  // text. Returns "" after a match or a previous flush.
  std::string flush();

  bool stopped() const { return match_.has_value(); }
  const std::optional<StopStringMatch>& match() const { return match_; }
  // The matched stop string; requires stopped().
  const std::string& matched_string() const;
  const std::vector<std::string>& stop_strings() const { return stops_; }

  // Everything emitted so far (the sequence's output text).
  const std::string& output_text() const { return output_; }
  // Bytes received but not yet emitted.
  size_t held_back_bytes() const { return held_; }

 private:
  // Longest suffix of window_ that is a proper prefix of some stop string.
  size_t longest_partial_suffix() const;

  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_stop_len_ = 0;
  // The last bytes of the text seen (at most max_stop_len_ - 1 after each
  // feed): a new match can start only inside it or in the next delta.
  std::string window_;
  size_t window_offset_ = 0;  // offset of window_[0] in the full text
  size_t held_ = 0;           // trailing bytes of window_ not yet emitted
  bool flushed_ = false;
  std::optional<StopStringMatch> match_;
  std::string output_;
};

}  // namespace serval
