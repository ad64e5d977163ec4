// Decoding shared by every tokenizer: whole sequences and streaming.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace serval {

namespace {

// The bytes `id` contributes at this point of a text, or nothing when skipped.
// `at_start` tracks whether no token has been emitted yet (SentencePiece drops
// the space of the first "▁").
std::string piece_bytes(const Tokenizer& tok, int32_t id, bool skip_special, bool& at_start) {
  SERVAL_CHECK(id >= 0, "token id ", id, " is negative");
  // Models pad their vocabulary past the tokenizer's (Qwen: 151936 rows for 151669
  // tokens); those rows have no text, and decode to nothing as in transformers.
  if (id >= tok.vocab_size()) return {};
  if (skip_special && tok.is_special(id)) return {};
  std::string b = tok.token_bytes(id);
  if (at_start && tok.strips_leading_space() && !b.empty() && b[0] == ' ') b.erase(0, 1);
  at_start = false;
  return b;
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  bool at_start = true;
  for (int32_t id : ids) bytes += piece_bytes(*this, id, skip_special, at_start);
  return utf8::sanitize(bytes);
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special, bool first_in_text)
    : tok_(tok), skip_special_(skip_special), first_(first_in_text) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  pending_ += piece_bytes(tok_, id, skip_special_, first_);
  std::string out;
  utf8::consume_valid(pending_, out, /*final=*/false);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  utf8::consume_valid(pending_, out, /*final=*/true);
  return out;
}

}  // namespace serval
