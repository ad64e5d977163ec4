#include "grammar/closing_mask.h"

#include <algorithm>

#include "core/error.h"

namespace serval::grammar {

std::string shortest_completion(GrammarMatcher& m) {
  std::string out;
  // Each byte should bring the end one byte nearer; the bound only guards
  // against an estimate that does not (then the nearest byte is taken).
  const size_t limit = 2 * m.min_bytes_to_end() + 8;
  while (!m.can_end() && out.size() < limit) {
    const size_t left = m.min_bytes_to_end();
    int best = -1;
    size_t best_left = SIZE_MAX;
    for (int b = 0; b < 256; ++b) {
      const char c = char(b);
      if (!m.accept_bytes(std::string_view(&c, 1))) continue;
      const size_t after = m.min_bytes_to_end();
      m.rollback(1);
      if (after < best_left) {
        best = b;
        best_left = after;
        if (after + 1 == left) break;
      }
    }
    if (best < 0) break;  // nothing can follow (cannot happen in a compiled grammar)
    const char c = char(best);
    m.accept_bytes(std::string_view(&c, 1));
    out += c;
  }
  m.rollback(out.size());
  return out;
}

void fill_closing_mask(GrammarMatcher& m, const TokenVocabulary& vocab, std::span<uint32_t> mask) {
  SERVAL_CHECK(mask.size() >= vocab.mask_words(), "closing mask: ", mask.size(), " words for ", vocab.mask_words());
  std::fill(mask.begin(), mask.end(), 0u);
  auto allow = [&](int32_t id) { mask[size_t(id) / 32] |= 1u << (id % 32); };
  if (m.can_end())
    for (int32_t id : vocab.eos_ids()) allow(id);
  const std::string s = shortest_completion(m);
  // Down the trie along s: every node on the path ends tokens that are prefixes of s.
  const TokenTrie& t = vocab.trie();
  if (t.nodes.empty()) return;
  uint32_t node = 0;
  for (size_t d = 0; d < s.size(); ++d) {
    uint32_t child = node + 1, found = UINT32_MAX;
    while (child < t.nodes[node].subtree_end) {
      if (t.nodes[child].byte == uint8_t(s[d])) {
        found = child;
        break;
      }
      child = t.nodes[child].subtree_end;
    }
    if (found == UINT32_MAX) break;
    node = found;
    for (uint32_t k = t.nodes[node].tok_begin; k < t.nodes[node].tok_end; ++k) allow(t.ids[k]);
  }
}

namespace {
// How near the end (in bytes beyond the shortest completion) candidates are
// tried: a token that opens more than this at once may still be cut short.
constexpr int64_t kMargin = 64;
// Where more tokens than this are allowed, the closing mask is used instead.
constexpr int64_t kMaxTried = 4096;
}  // namespace

namespace {
bool any_bit(std::span<const uint32_t> mask) {
  for (uint32_t w : mask)
    if (w != 0) return true;
  return false;
}
}  // namespace

void fill_budget_mask(const TokenMasker& masker, GrammarMatcher& m, int64_t tokens_left, std::span<uint32_t> mask) {
  const TokenVocabulary& vocab = masker.vocab();
  // A vocabulary without the tokens the way to the end needs: the plain
  // mask (the text may then be cut short, never made invalid).
  auto closing_or_plain = [&] {
    fill_closing_mask(m, vocab, mask);
    if (!any_bit(mask)) masker.fill_mask(m, mask);
  };
  const int64_t need = int64_t(m.min_bytes_to_end());
  if (tokens_left > need + 1 + kMargin) {
    masker.fill_mask(m, mask);
    return;
  }
  if (tokens_left <= need + 1) {
    closing_or_plain();
    return;
  }
  masker.fill_mask(m, mask);
  int64_t allowed = 0;
  for (size_t w = 0; w < vocab.mask_words(); ++w) allowed += __builtin_popcount(mask[w]);
  if (allowed > kMaxTried) {
    closing_or_plain();
    return;
  }
  for (size_t w = 0; w < vocab.mask_words(); ++w) {
    for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const int32_t id = int32_t(w * 32) + __builtin_ctz(bits);
      if (vocab.is_eos(id)) continue;  // ends the text now
      if (!masker.accept_token(m, id)) continue;
      const int64_t after = int64_t(m.min_bytes_to_end());
      m.rollback(1);
      if (after + 2 > tokens_left) mask[w] &= ~(1u << (id % 32));
    }
  }
  if (!any_bit(mask)) closing_or_plain();
}

}  // namespace serval::grammar
