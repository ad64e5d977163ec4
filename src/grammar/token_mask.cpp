#include "grammar/token_mask.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "core/error.h"

namespace serval::grammar {

// What a walk from a cache key's frames found (see token_mask.h).
struct TokenMasker::Entry {
  std::vector<int32_t> accepted;        // ids, when few
  std::vector<uint32_t> accepted_bits;  // a whole mask, when many
  TokenTrie remainders;                 // context-dependent tokens by their remainders
};

namespace {

// Key marker: the frames reach the root (nothing below them).
constexpr uint32_t kRootMarker = UINT32_MAX;

inline void set_bit(std::span<uint32_t> mask, int32_t id) { mask[size_t(id) / 32] |= uint32_t(1) << (id % 32); }

// Whether the frame under a top position belongs in its key: when the top's
// rule can end right after it, or within a few more bytes of its own (the
// rest of a UTF-8 character, the end of a short literal), tokens would leave
// the frame after almost every prefix.
bool top_is_open(const CompiledGrammar& g, uint32_t top) {
  if (g.pops(top + 1)) return true;
  for (uint32_t p = top + 1, n = 0; n <= 3; ++p, ++n) {
    const auto& e = g.elem(p);
    if (e.kind == CompiledGrammar::ElemKind::End) return true;
    if (e.kind != CompiledGrammar::ElemKind::Bytes) return false;
  }
  return false;
}

// The key of stack `s`: its top position, then return positions while the
// frames above can end soon (see top_is_open) or without consuming input;
// then the stack below them.
void make_key(const CompiledGrammar& g, const StackPool& pool, uint32_t s, std::vector<uint32_t>& key,
              uint32_t& below) {
  key.clear();
  const StackNode* n = &pool.node(s);
  key.push_back(n->pos);
  bool open = top_is_open(g, n->pos);
  uint32_t next = n->parent;
  while (open && next != kRootNode) {
    n = &pool.node(next);
    key.push_back(n->pos);
    open = g.pops(n->pos);
    next = n->parent;
  }
  below = next;
  if (below == kRootNode) key.push_back(kRootMarker);
}

// Walks the vocabulary trie from the key's frames over a sentinel.
void compute_entry(const CompiledGrammar& g, const TokenVocabulary& vocab, const std::vector<uint32_t>& key,
                   TokenMasker::Entry& out) {
  StackPool pool;
  Stepper stepper(g);
  bool to_root = key.back() == kRootMarker;
  size_t frames = key.size() - (to_root ? 1 : 0);
  uint32_t node = to_root ? kRootNode : kBottomNode;
  for (size_t i = frames; i-- > 0;) node = pool.intern(key[i], node);

  // Most trie nodes lead to a state seen before (inside a string every
  // character leads back to the same stacks), so states are numbered and
  // transitions (state, byte) remembered: a walk of the whole vocabulary
  // then costs a table lookup per node.
  struct Trans {
    uint32_t next;  // state id; 0 = no stacks
    bool bottom, root;
  };
  std::vector<std::vector<uint32_t>> state_stacks{{}, {node}};
  std::unordered_map<uint64_t, Trans> trans;
  std::unordered_map<std::string, uint32_t> state_ids;
  auto state_id = [&](const std::vector<uint32_t>& stacks) -> uint32_t {
    if (stacks.empty()) return 0;
    std::string k(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(uint32_t));
    auto [it, fresh] = state_ids.emplace(std::move(k), uint32_t(state_stacks.size()));
    if (fresh) state_stacks.push_back(stacks);
    return it->second;
  };
  state_id(state_stacks[1]);

  const TokenTrie& trie = vocab.trie();
  std::vector<uint32_t> states(trie.max_depth + 1);
  states[0] = 1;
  std::vector<uint32_t> bottoms;  // depths on the current path where the frames were left
  std::vector<std::pair<std::string_view, int32_t>> rem;
  StepResult res;
  auto add_remainders = [&](const TokenTrie::Node& tn) {
    for (uint32_t k = tn.tok_begin; k < tn.tok_end; ++k) {
      int32_t id = trie.ids[k];
      std::string_view bytes = vocab.bytes(id);
      for (uint32_t d : bottoms) rem.emplace_back(bytes.substr(d), id);
    }
  };
  for (uint32_t i = 1; i < trie.nodes.size();) {
    const TokenTrie::Node& tn = trie.nodes[i];
    uint32_t d = tn.depth;
    while (!bottoms.empty() && bottoms.back() >= d) bottoms.pop_back();
    uint64_t tk = uint64_t(states[d - 1]) << 8 | tn.byte;
    auto it = trans.find(tk);
    if (it == trans.end()) {
      stepper.step(pool, state_stacks[states[d - 1]], tn.byte, res);
      it = trans.emplace(tk, Trans{state_id(res.stacks), res.reached_bottom, res.reached_root}).first;
    }
    const Trans t = it->second;
    if (t.next != 0 || t.bottom || t.root) {
      for (uint32_t k = tn.tok_begin; k < tn.tok_end; ++k) out.accepted.push_back(trie.ids[k]);
    } else {
      add_remainders(tn);
    }
    if (t.bottom) bottoms.push_back(d);
    if (t.next == 0) {
      // Nothing continues inside the frames: the subtree is rejected, except
      // for the tokens that left them on the way (context-dependent).
      if (!bottoms.empty())
        for (uint32_t j = i + 1; j < tn.subtree_end; ++j) add_remainders(trie.nodes[j]);
      i = tn.subtree_end;
      continue;
    }
    states[d] = t.next;
    ++i;
  }
  if (out.accepted.size() * 32 > size_t(vocab.size())) {
    out.accepted_bits.assign(vocab.mask_words(), 0);
    for (int32_t id : out.accepted) set_bit(out.accepted_bits, id);
    out.accepted.clear();
    out.accepted.shrink_to_fit();
  }
  out.remainders = TokenTrie::build(std::move(rem));
}

// Sets the tokens of the remainders that the stacks `start` accept.
void walk_remainders(const CompiledGrammar& g, StackPool& pool, Stepper& stepper, const TokenTrie& trie,
                     const std::vector<uint32_t>& start, std::span<uint32_t> mask) {
  std::vector<std::vector<uint32_t>> states(trie.max_depth + 1);
  states[0] = start;
  StepResult res;
  for (uint32_t i = 1; i < trie.nodes.size();) {
    const TokenTrie::Node& tn = trie.nodes[i];
    stepper.step(pool, states[tn.depth - 1], tn.byte, res);
    if (!res.stacks.empty() || res.reached_root)
      for (uint32_t k = tn.tok_begin; k < tn.tok_end; ++k) set_bit(mask, trie.ids[k]);
    if (res.stacks.empty()) {
      i = tn.subtree_end;
      continue;
    }
    states[tn.depth] = res.stacks;
    ++i;
  }
}

}  // namespace

size_t TokenMasker::KeyHash::operator()(const std::vector<uint32_t>& k) const {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t x : k) h = (h ^ x) * 1099511628211ull;
  return size_t(h);
}

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  SERVAL_CHECK(grammar_ && vocab_, "TokenMasker needs a grammar and a vocabulary");
}

TokenMasker::~TokenMasker() = default;

size_t TokenMasker::cache_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

const TokenMasker::Entry& TokenMasker::entry(const std::vector<uint32_t>& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto e = std::make_unique<Entry>();
  compute_entry(*grammar_, *vocab_, key, *e);
  return *cache_.emplace(key, std::move(e)).first->second;  // entries never move or go away
}

void TokenMasker::fill_mask(GrammarMatcher& m, std::span<uint32_t> mask) const {
  SERVAL_CHECK(mask.size() == vocab_->mask_words(), "token mask has ", mask.size(), " words, the vocabulary needs ",
               vocab_->mask_words());
  SERVAL_CHECK(m.grammar_ptr() == grammar_, "the matcher's grammar is not the masker's");
  std::fill(mask.begin(), mask.end(), 0u);
  // The scratch stacks made here go away on every way out (an over-ambiguous
  // grammar throws from the stepper).
  struct Scratch {
    StackPool& pool;
    size_t mark;
    ~Scratch() { pool.truncate(mark); }
  } scratch{m.pool(), m.pool().size()};
  StackPool& pool = scratch.pool;
  Stepper stepper(*grammar_);
  std::vector<uint32_t> key;
  std::vector<std::pair<const Entry*, uint32_t>> walked;
  StepResult start;
  for (uint32_t s : m.stacks()) {
    uint32_t below = 0;
    make_key(*grammar_, pool, s, key, below);
    const Entry& e = entry(key);
    if (!e.accepted_bits.empty()) {
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= e.accepted_bits[w];
    } else {
      for (int32_t id : e.accepted) set_bit(mask, id);
    }
    if (below == kRootNode || e.remainders.nodes.size() <= 1) continue;
    std::pair<const Entry*, uint32_t> job{&e, below};
    if (std::find(walked.begin(), walked.end(), job) != walked.end()) continue;
    walked.push_back(job);
    stepper.resume(pool, below, start);
    if (!start.stacks.empty()) walk_remainders(*grammar_, pool, stepper, e.remainders, start.stacks, mask);
  }
  if (m.can_end())
    for (int32_t id : vocab_->eos_ids()) set_bit(mask, id);
}

std::vector<uint32_t> TokenMasker::mask(GrammarMatcher& m) const {
  std::vector<uint32_t> out(vocab_->mask_words());
  fill_mask(m, out);
  return out;
}

bool TokenMasker::accept_token(GrammarMatcher& m, int32_t id) const {
  SERVAL_CHECK(id >= 0 && id < vocab_->size(), "token id ", id, " is outside the vocabulary");
  if (vocab_->is_eos(id)) return m.can_end();
  if (vocab_->is_special(id) || vocab_->bytes(id).empty()) return false;
  return m.accept_bytes(vocab_->bytes(id));
}

void fill_mask_reference(GrammarMatcher& m, const TokenVocabulary& vocab, std::span<uint32_t> mask) {
  std::fill(mask.begin(), mask.end(), 0u);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    bool ok = vocab.is_eos(id) ? m.can_end()
                               : !vocab.is_special(id) && !vocab.bytes(id).empty() && m.can_accept_bytes(vocab.bytes(id));
    if (ok) set_bit(mask, id);
  }
}

}  // namespace serval::grammar
