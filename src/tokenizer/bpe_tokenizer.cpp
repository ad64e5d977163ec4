#include "tokenizer/bpe_tokenizer.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer/unicode_nfc.h"
#include "tokenizer/utf8.h"
#include "tokenizer/work_count.h"

namespace serval {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

constexpr size_t kMaxCachedWord = 64;
constexpr size_t kMaxCacheEntries = 1 << 17;

}  // namespace

BpeTokenizer::BpeTokenizer(BpeVocab v)
    : pieces_(std::move(v.pieces)), regex_(v.pattern), ignore_merges_(v.ignore_merges), nfc_(v.nfc) {
  special_.assign(pieces_.size(), false);
  added_.assign(pieces_.size(), false);
  ids_.reserve(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i)
    if (!pieces_[i].empty()) ids_.emplace(pieces_[i], static_cast<int32_t>(i));
  for (const auto& t : v.added) {
    SERVAL_CHECK(t.id >= 0 && t.id < vocab_size(), "added token \"", t.content, "\" has id ", t.id,
                 " outside the vocabulary (size ", vocab_size(), ")");
    special_[t.id] = t.special;
    added_[t.id] = true;
    splitter_.add(t.content, t.id, t.lstrip, t.rstrip);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(byte_to_unicode(static_cast<uint8_t>(b)));
    byte_ids_[b] = it == ids_.end() ? -1 : it->second;
  }
  merges_.reserve(v.merges.size());
  int32_t rank = 0;
  for (const auto& [a, b] : v.merges) {
    auto ia = ids_.find(a), ib = ids_.find(b), ir = ids_.find(a + b);
    // A merge whose parts or result are not in the vocabulary can never apply.
    if (ia != ids_.end() && ib != ids_.end() && ir != ids_.end())
      merges_.try_emplace(pair_key(ia->second, ib->second), Merge{rank, ir->second});
    ++rank;
  }
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  SERVAL_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is out of range (vocabulary size ", vocab_size(),
               ")");
  if (added_[id]) return pieces_[id];
  return unicode_string_to_bytes(pieces_[id]);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special && add_bos && bos_id >= 0) ids.push_back(bos_id);
  std::string clean = utf8::sanitize(text);  // the regex needs valid UTF-8
  for (const auto& frag : splitter_.split(clean)) {
    if (frag.id >= 0)
      ids.push_back(frag.id);
    else
      encode_plain(frag.text, ids);
  }
  if (add_special && add_eos && eos_id >= 0) ids.push_back(eos_id);
  return ids;
}

void BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc_) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  const std::vector<std::string_view> words = regex_.split(text);
  if (TokenizerWork* work = tokenizer_work()) work->words += static_cast<int64_t>(words.size());
  for (std::string_view word : words) encode_word(word, out);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() <= kMaxCachedWord) {
    std::string key(word);
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids = merge_word(word);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
    return;
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
}

// Merges the pair of lowest rank (leftmost on ties) until none applies, with a
// heap of candidate pairs: O(n log n) in the word length, so long runs of
// letters or spaces stay fast.
std::vector<int32_t> BpeTokenizer::merge_word(std::string_view word) const {
  if (ignore_merges_) {
    auto it = ids_.find(bytes_to_unicode_string(word));
    if (it != ids_.end()) return {it->second};
  }
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  for (unsigned char b : word) {
    int32_t id = byte_ids_[b];
    SERVAL_CHECK(id >= 0, "byte-level vocabulary has no token for byte ", static_cast<int>(b));
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1});
  }
  if (syms.empty()) return {};
  syms.back().next = -1;

  struct Cand {
    int32_t rank, left, right, left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  int64_t pairs = 0, pops = 0;  // for work_count.h
  auto push = [&](int32_t l) {
    if (l < 0) return;
    int32_t r = syms[l].next;
    if (r < 0) return;
    ++pairs;
    auto it = merges_.find(pair_key(syms[l].id, syms[r].id));
    if (it != merges_.end()) heap.push({it->second.rank, l, r, syms[l].id, syms[r].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);

  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    ++pops;
    Sym& l = syms[c.left];
    if (l.id != c.left_id || l.next != c.right || syms[c.right].id != c.right_id) continue;  // stale
    Sym& r = syms[c.right];
    l.id = merges_.at(pair_key(c.left_id, c.right_id)).result;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -1;
    push(l.prev);
    push(c.left);
  }
  if (TokenizerWork* work = tokenizer_work()) {
    work->merge_pairs += pairs;
    work->merge_pops += pops;
  }
  std::vector<int32_t> ids;
  for (int32_t i = 0; i >= 0; i = syms[i].next) ids.push_back(syms[i].id);
  return ids;
}

}  // namespace serval
