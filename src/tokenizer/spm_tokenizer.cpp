#include "tokenizer/spm_tokenizer.h"

#include <cstdio>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"
#include "tokenizer/work_count.h"

namespace serval {

namespace {

const std::string kSpace = "\xE2\x96\x81";  // "▁"

bool mergeable_type(TokenType t) { return t == TokenType::Normal || t == TokenType::UserDefined; }

// "<0x41>" -> 0x41, or -1.
int parse_byte_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  unsigned v = 0;
  for (int k = 3; k < 5; ++k) {
    char c = p[k];
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return static_cast<int>(v);
}

}  // namespace

SpmTokenizer::SpmTokenizer(SpmVocab v)
    : pieces_(std::move(v.pieces)),
      scores_(std::move(v.scores)),
      types_(std::move(v.types)),
      add_dummy_prefix_(v.add_dummy_prefix),
      prefix_every_fragment_(v.prefix_every_fragment),
      prefix_unless_leading_space_(v.prefix_unless_leading_space),
      unk_id_(v.unk_id) {
  const size_t n = pieces_.size();
  if (scores_.empty()) scores_.assign(n, 0.0f);
  if (types_.empty()) types_.assign(n, TokenType::Normal);
  SERVAL_CHECK(scores_.size() == n && types_.size() == n, "SentencePiece vocabulary has ", n, " pieces but ",
               scores_.size(), " scores and ", types_.size(), " token types");
  added_special_.assign(n, false);
  for (int b = 0; b < 256; ++b) byte_ids_[b] = -1;
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    int32_t id = static_cast<int32_t>(i);
    ids_.emplace(pieces_[i], id);
    if (mergeable_type(types_[i])) mergeable_.emplace(pieces_[i], id);
    int byte = parse_byte_piece(pieces_[i]);
    if (byte >= 0 && (types_[i] == TokenType::Byte || types_[i] == TokenType::Normal) && byte_ids_[byte] < 0)
      byte_ids_[byte] = id;
  }
  for (const auto& t : v.added) {
    SERVAL_CHECK(t.id >= 0 && t.id < vocab_size(), "added token \"", t.content, "\" has id ", t.id,
                 " outside the vocabulary (size ", vocab_size(), ")");
    added_special_[t.id] = t.special;
    splitter_.add(t.content, t.id, t.lstrip, t.rstrip);
  }
}

bool SpmTokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return types_[id] == TokenType::Control || types_[id] == TokenType::Unknown || added_special_[id];
}

std::optional<int32_t> SpmTokenizer::token_id(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

int32_t SpmTokenizer::mergeable_id(std::string_view piece) const {
  auto it = mergeable_.find(std::string(piece));
  return it == mergeable_.end() ? -1 : it->second;
}

std::string SpmTokenizer::token_bytes(int32_t id) const {
  SERVAL_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is out of range (vocabulary size ", vocab_size(),
               ")");
  const std::string& p = pieces_[id];
  if (types_[id] == TokenType::Byte) {
    int b = parse_byte_piece(p);
    if (b >= 0) return std::string(1, static_cast<char>(b));
  }
  if (types_[id] == TokenType::Control) return p;
  std::string out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += p[i++];
    }
  }
  return out;
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_special) const {
  return encode_text(text, add_special, /*continuation=*/false);
}

std::vector<int32_t> SpmTokenizer::encode_continuation(std::string_view text) const {
  return encode_text(text, /*add_special=*/false, /*continuation=*/true);
}

std::vector<int32_t> SpmTokenizer::encode_text(std::string_view text, bool add_special, bool continuation) const {
  std::vector<int32_t> ids;
  if (add_special && add_bos && bos_id >= 0) ids.push_back(bos_id);
  std::string clean = utf8::sanitize(text);
  for (const auto& frag : splitter_.split(clean)) {
    if (frag.id >= 0) {
      ids.push_back(frag.id);
      continue;
    }
    bool at_start = frag.text.data() == clean.data();
    bool prefix = add_dummy_prefix_ && !(continuation && at_start) && (prefix_every_fragment_ || at_start) &&
                  !(prefix_unless_leading_space_ && (frag.text[0] == ' ' || frag.text.substr(0, 3) == kSpace));
    encode_fragment(frag.text, prefix, ids);
  }
  if (add_special && add_eos && eos_id >= 0) ids.push_back(eos_id);
  return ids;
}

// Merges by score with a heap of candidate pairs (highest score first, leftmost
// on ties, as SentencePiece does): O(n log n) in the text length.
void SpmTokenizer::encode_fragment(std::string_view text, bool prefix, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string s;
  s.reserve(text.size() + 8);
  if (prefix) s += kSpace;
  for (char c : text) {
    if (c == ' ')
      s += kSpace;
    else
      s += c;
  }

  struct Sym {
    int32_t start, len, prev, next;
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < s.size();) {
    size_t len = std::min(utf8::char_len(static_cast<unsigned char>(s[i])), s.size() - i);
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<int32_t>(i), static_cast<int32_t>(len), n - 1, n + 1});
    i += len;
  }
  syms.back().next = -1;

  struct Cand {
    float score;
    int32_t left, right, len;  // len: merged length, to detect stale entries
    bool operator<(const Cand& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  std::priority_queue<Cand> heap;
  int64_t pairs = 0, pops = 0;  // for work_count.h
  auto push = [&](int32_t l) {
    if (l < 0) return;
    int32_t r = syms[l].next;
    if (r < 0) return;
    ++pairs;
    int32_t len = syms[l].len + syms[r].len;
    int32_t id = mergeable_id(std::string_view(s).substr(syms[l].start, len));
    if (id >= 0) heap.push({scores_[id], l, r, len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);

  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    ++pops;
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;  // stale
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.len = 0;
    push(l.prev);
    push(c.left);
  }
  if (TokenizerWork* work = tokenizer_work()) {
    work->merge_pairs += pairs;
    work->merge_pops += pops;
  }

  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    std::string_view piece = std::string_view(s).substr(syms[i].start, syms[i].len);
    int32_t id = mergeable_id(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Byte fallback; without byte pieces the whole character is unknown.
    if (byte_ids_[static_cast<unsigned char>(piece[0])] < 0) {
      out.push_back(unk_id_);
      continue;
    }
    for (unsigned char b : piece) out.push_back(byte_ids_[b] >= 0 ? byte_ids_[b] : unk_id_);
  }
}

}  // namespace serval
