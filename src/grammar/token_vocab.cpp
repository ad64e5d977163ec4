#include "grammar/token_vocab.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace serval::grammar {

TokenTrie TokenTrie::build(std::vector<std::pair<std::string_view, int32_t>> entries) {
  std::erase_if(entries, [](const auto& e) { return e.first.empty(); });
  std::sort(entries.begin(), entries.end());
  TokenTrie t;
  t.nodes.push_back({});
  std::vector<uint32_t> path{0};  // node of each depth on the current path
  std::string_view prev;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      t.nodes[path.back()].subtree_end = uint32_t(t.nodes.size());
      path.pop_back();
    }
  };
  for (const auto& [bytes, id] : entries) {
    size_t common = 0;
    while (common < prev.size() && common < bytes.size() && prev[common] == bytes[common]) ++common;
    close_to(common);
    for (size_t d = common; d < bytes.size(); ++d) {
      TokenTrie::Node n;
      n.byte = uint8_t(bytes[d]);
      n.depth = uint32_t(d + 1);
      n.tok_begin = n.tok_end = uint32_t(t.ids.size());
      path.push_back(uint32_t(t.nodes.size()));
      t.nodes.push_back(n);
    }
    // Sorted: all tokens ending at this node come one after another.
    TokenTrie::Node& end = t.nodes[path.back()];
    if (end.tok_begin == end.tok_end) end.tok_begin = uint32_t(t.ids.size());
    t.ids.push_back(id);
    end.tok_end = uint32_t(t.ids.size());
    t.max_depth = std::max(t.max_depth, uint32_t(bytes.size()));
    prev = bytes;
  }
  close_to(0);
  t.nodes[0].subtree_end = uint32_t(t.nodes.size());
  return t;
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<int32_t>& special,
                                 std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), special_(bytes_.size(), false), eos_ids_(std::move(eos_ids)) {
  for (int32_t id : special) {
    SERVAL_CHECK(id >= 0 && size_t(id) < bytes_.size(), "special token id ", id, " is outside the vocabulary");
    special_[size_t(id)] = true;
  }
  for (int32_t id : eos_ids_) {
    SERVAL_CHECK(id >= 0 && size_t(id) < bytes_.size(), "EOS token id ", id, " is outside the vocabulary");
    special_[size_t(id)] = true;
  }
  std::vector<std::pair<std::string_view, int32_t>> entries;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!special_[i]) entries.emplace_back(bytes_[i], int32_t(i));
  trie_ = TokenTrie::build(std::move(entries));
}

bool TokenVocabulary::is_eos(int32_t id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tok) {
  std::vector<std::string> bytes;
  std::vector<int32_t> special;
  int32_t n = tok.vocab_size();
  bytes.reserve(size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id)) {
      special.push_back(id);
      bytes.emplace_back();
    } else {
      bytes.push_back(tok.token_bytes(id));
    }
  }
  std::vector<int32_t> eos = tok.eos_ids;
  if (eos.empty() && tok.eos_id >= 0) eos.push_back(tok.eos_id);
  return std::make_shared<const TokenVocabulary>(std::move(bytes), special, std::move(eos));
}

}  // namespace serval::grammar
