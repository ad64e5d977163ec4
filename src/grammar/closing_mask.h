#pragma once
// Closing masks: when a constrained generation is about to run out of
// tokens, steer it to the nearest end of its grammar so that its text still
// parses. The shortest completion (byte by byte, each byte the one that
// brings the end nearest) is followed: only tokens whose bytes are a prefix
// of it stay allowed (and EOS where the text may end). Any tokenizer that
// covers single bytes or characters then finishes within
// min_bytes_to_end() tokens.
#include <cstdint>
#include <span>
#include <string>

#include "grammar/grammar_matcher.h"
#include "grammar/token_mask.h"
#include "grammar/token_vocab.h"

namespace serval::grammar {

// The bytes of a shortest completion of `m`'s text ("" when it can end).
// Leaves `m` as it was.
std::string shortest_completion(GrammarMatcher& m);

// The closing mask of `m` (vocab.mask_words() words): the tokens whose bytes
// are a prefix of shortest_completion(m), and EOS ids when m.can_end().
void fill_closing_mask(GrammarMatcher& m, const TokenVocabulary& vocab, std::span<uint32_t> mask);

// The mask of `m`'s next token when `tokens_left` tokens (this one
// included) may still be drawn: the grammar's mask, except that near the
// end every allowed token must leave room to finish (its text then needs at
// most tokens_left - 2 more bytes, one token each at worst, and EOS). Each
// candidate is tried where few are allowed; where many are (inside a
// string), the closing mask stands in. Far from the end: the plain mask.
void fill_budget_mask(const TokenMasker& masker, GrammarMatcher& m, int64_t tokens_left, std::span<uint32_t> mask);

}  // namespace serval::grammar
