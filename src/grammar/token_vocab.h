#pragma once
// The vocabulary as the grammar sees it: each token's bytes, which tokens are
// special (never produced by a grammar; EOS only where the text may end), and
// a byte trie over the normal tokens so that a token mask walks shared
// prefixes once and skips every token under a rejected prefix.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serval {
class Tokenizer;
}

namespace serval::grammar {

// A byte trie in preorder: node i's subtree is nodes [i, subtree_end); the
// tokens whose bytes end at node i are ids[tok_begin, tok_end). nodes[0] is
// the root (the empty prefix).
struct TokenTrie {
  struct Node {
    uint8_t byte = 0;
    uint32_t depth = 0;
    uint32_t subtree_end = 0;
    uint32_t tok_begin = 0, tok_end = 0;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> ids;
  uint32_t max_depth = 0;

  // From (bytes, id) pairs; empty byte strings are left out.
  static TokenTrie build(std::vector<std::pair<std::string_view, int32_t>> entries);
};

class TokenVocabulary {
 public:
  // token_bytes by id; `special` ids (and tokens with no bytes) are never
  // allowed by a grammar; eos_ids are allowed where the text may end.
  TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<int32_t>& special,
                  std::vector<int32_t> eos_ids);
  // Every token of a loaded tokenizer, by Tokenizer::token_bytes; its
  // control tokens are special; EOS ids are eos_ids (or eos_id).
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tok);

  int32_t size() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool is_special(int32_t id) const { return special_[size_t(id)]; }
  bool is_eos(int32_t id) const;
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const TokenTrie& trie() const { return trie_; }
  // Words of a token bitmask: (size + 31) / 32.
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  std::vector<int32_t> eos_ids_;
  TokenTrie trie_;
};

}  // namespace serval::grammar
