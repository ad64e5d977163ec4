#pragma once
// Token masks: which tokens of a vocabulary a GrammarMatcher accepts next.
//
// Walking the whole vocabulary trie for every mask costs milliseconds on a
// 128k vocabulary, so results are cached per grammar context (the idea of
// xgrammar's context-independent tokens). For a stack, the key is its top
// position plus the return positions below it up to the first one that cannot
// end without consuming input (inside a JSON string: the string's characters
// and its closing quote). A walk of the trie from those frames alone, over a
// sentinel bottom, sorts each token into
//   - accepted: matched without leaving the frames (whatever lies below),
//   - rejected: fails inside the frames,
//   - context-dependent: leaves the frames after k bytes; the rest of the
//     token (its bytes from k) must then be accepted by the real stack below.
// A mask ORs the accepted set of each stack's key and walks the (few, short,
// shared) remainders of the context-dependent tokens from the real stack.
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_vocab.h"

namespace serval::grammar {

class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocab);
  ~TokenMasker();

  // Writes the mask of tokens `m` accepts next into `mask` (vocab.mask_words()
  // words; token i is bit i % 32 of word i / 32; 1 = allowed). Special tokens
  // are never allowed, except EOS ids when m.can_end(). Thread-safe for
  // different matchers (the cache is shared and locked).
  void fill_mask(GrammarMatcher& m, std::span<uint32_t> mask) const;
  std::vector<uint32_t> mask(GrammarMatcher& m) const;

  // Advances m by a sampled token: EOS is accepted (m unchanged) when m can
  // end; other special tokens never; a normal token as accept_bytes does.
  bool accept_token(GrammarMatcher& m, int32_t id) const;

  const TokenVocabulary& vocab() const { return *vocab_; }
  const std::shared_ptr<const CompiledGrammar>& grammar_ptr() const { return grammar_; }
  size_t cache_size() const;

  struct Entry;

 private:
  const Entry& entry(const std::vector<uint32_t>& key) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  struct KeyHash {
    size_t operator()(const std::vector<uint32_t>& k) const;
  };
  mutable std::mutex mu_;
  mutable std::unordered_map<std::vector<uint32_t>, std::unique_ptr<Entry>, KeyHash> cache_;
};

// The same mask by trying every token on its own: slow, for tests.
void fill_mask_reference(GrammarMatcher& m, const TokenVocabulary& vocab, std::span<uint32_t> mask);

inline bool mask_allows(std::span<const uint32_t> mask, int32_t id) { return (mask[size_t(id) / 32] >> (id % 32)) & 1; }

}  // namespace serval::grammar
