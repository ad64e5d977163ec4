#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "grammar/grammar_lowering.h"

namespace serval::grammar {

class Lowering {
 public:
  using Elem = CompiledGrammar::Elem;
  using ElemKind = CompiledGrammar::ElemKind;

  explicit Lowering(FlatGrammar flat) : f_(std::move(flat)) {}

  std::shared_ptr<CompiledGrammar> run() {
    auto g = std::make_shared<CompiledGrammar>();
    g_ = g.get();
    compute_nullable();
    check_productive();
    check_left_recursion();
    layout();
    expand_all();
    compute_min_lengths();
    return g;
  }

 private:
  bool elem_nullable(const Elem& e) const { return e.kind == ElemKind::Ref && nullable_[e.arg]; }

  void compute_nullable() {
    nullable_.assign(f_.rules.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < f_.rules.size(); ++r) {
        if (nullable_[r]) continue;
        for (const auto& a : f_.rules[r].alts) {
          if (std::all_of(a.begin(), a.end(), [&](const Elem& e) { return elem_nullable(e); })) {
            nullable_[r] = changed = true;
            break;
          }
        }
      }
    }
  }

  std::vector<bool> reachable_from_root() const {
    std::vector<bool> seen(f_.rules.size(), false);
    std::vector<uint32_t> todo{f_.root};
    seen[f_.root] = true;
    while (!todo.empty()) {
      uint32_t r = todo.back();
      todo.pop_back();
      for (const auto& a : f_.rules[r].alts)
        for (const auto& e : a)
          if (e.kind == ElemKind::Ref && !seen[e.arg]) seen[e.arg] = true, todo.push_back(e.arg);
    }
    return seen;
  }

  // A rule that can never finish (no alternatives, or recursion without a
  // base case) would leave the matcher in states that accept bytes but can
  // never end: refuse it.
  void check_productive() {
    std::vector<bool> prod(f_.rules.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < f_.rules.size(); ++r) {
        if (prod[r]) continue;
        for (const auto& a : f_.rules[r].alts) {
          if (std::all_of(a.begin(), a.end(), [&](const Elem& e) { return e.kind != ElemKind::Ref || prod[e.arg]; })) {
            prod[r] = changed = true;
            break;
          }
        }
      }
    }
    auto reach = reachable_from_root();
    for (size_t r = 0; r < f_.rules.size(); ++r)
      SERVAL_CHECK(!reach[r] || prod[r], "grammar: rule '", f_.rules[r].name,
                   "' can never finish matching (it matches nothing, or recurses without a way out)");
  }

  // Calls made before any input is consumed: rule -> (callee, pushes a return
  // frame). A cycle through a pushing call grows the stack without end.
  void check_left_recursion() {
    size_t n = f_.rules.size();
    std::vector<std::vector<std::pair<uint32_t, bool>>> calls(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& a : f_.rules[r].alts) {
        for (size_t i = 0; i < a.size(); ++i) {
          if (a[i].kind == ElemKind::Ref) calls[r].push_back({a[i].arg, i + 1 < a.size()});
          if (!elem_nullable(a[i])) break;
        }
      }
    }
    for (size_t r = 0; r < n; ++r) {
      for (const auto& [callee, pushes] : calls[r]) {
        if (!pushes) continue;
        // Does callee reach r? Breadth-first, remembering the way for the message.
        std::vector<int64_t> from(n, -1);
        std::vector<uint32_t> queue{callee};
        from[callee] = callee;
        for (size_t q = 0; q < queue.size() && from[r] < 0; ++q)
          for (const auto& [next, _] : calls[queue[q]])
            if (from[next] < 0) from[next] = queue[q], queue.push_back(next);
        if (from[r] < 0) continue;
        std::vector<uint32_t> path{uint32_t(r)};
        for (uint32_t x = uint32_t(r); x != callee;) path.push_back(x = uint32_t(from[x]));
        std::string cycle = f_.rules[r].name;
        for (auto it = path.rbegin(); it != path.rend(); ++it) cycle += " -> " + f_.rules[*it].name;
        fail("grammar: left recursion: rule '", f_.rules[r].name,
             "' can call itself before matching any input (", cycle, "); rewrite it with repetition");
      }
    }
  }

  void layout() {
    g_->sets_ = f_.sets;
    g_->alt_starts_.resize(f_.rules.size());
    for (size_t r = 0; r < f_.rules.size(); ++r) {
      g_->rule_names_.push_back(f_.rules[r].name);
      for (const auto& a : f_.rules[r].alts) {
        g_->alt_starts_[r].push_back(uint32_t(g_->elems_.size()));
        g_->elems_.insert(g_->elems_.end(), a.begin(), a.end());
        g_->elems_.push_back({ElemKind::End, uint32_t(r)});
      }
    }
    // The start symbol: a rule of its own that calls root (in tail position).
    uint32_t start_rule = uint32_t(f_.rules.size());
    g_->rule_names_.push_back("$start");
    g_->start_ = uint32_t(g_->elems_.size());
    g_->elems_.push_back({ElemKind::Ref, f_.root});
    g_->elems_.push_back({ElemKind::End, start_rule});
    g_->alt_starts_.push_back({g_->start_});
  }

  // Depth-first over calls from `pos`, with the frames pushed so far;
  // (position, frames) pairs already seen are skipped, which ends tail-call
  // cycles (left recursion with pushes was refused above).
  void expand(uint32_t pos, std::vector<uint32_t>& chain, bool& pops, size_t depth = 0) {
    // Chains of calls that can match nothing ((x?){0,n} with a large n) nest
    // this deep; refuse them rather than overflow the stack.
    SERVAL_CHECK(depth < 10000, "grammar: over 10000 nested rules can match empty text at one point (",
                 rule_names_of(pos), "); lower the repetition counts");
    if (!seen_.insert({pos, chain}).second) return;
    const Elem& e = g_->elems_[pos];
    if (e.kind == ElemKind::Bytes) {
      uint32_t begin = uint32_t(g_->chains_.size());
      g_->chains_.insert(g_->chains_.end(), chain.begin(), chain.end());
      g_->entries_.push_back({pos, begin, uint32_t(g_->chains_.size())});
    } else if (e.kind == ElemKind::End) {
      if (chain.empty()) {
        pops = true;
      } else {
        uint32_t ret = chain.back();
        chain.pop_back();
        expand(ret, chain, pops, depth + 1);
        chain.push_back(ret);
      }
    } else {
      uint32_t ret = pos + 1;
      bool tail = g_->elems_[ret].kind == ElemKind::End;
      if (!tail) chain.push_back(ret);
      for (uint32_t a : g_->alt_starts_[e.arg]) expand(a, chain, pops, depth + 1);
      if (!tail) chain.pop_back();
    }
  }

  std::string rule_names_of(uint32_t pos) const {
    while (g_->elems_[pos].kind != ElemKind::End) ++pos;
    return "in rule '" + g_->rule_names_[g_->elems_[pos].arg] + "'";
  }

  void expand_all() {
    size_t n = g_->elems_.size();
    g_->exp_begin_.resize(n + 1);
    g_->pops_.assign(n, 0);
    for (size_t pos = 0; pos < n; ++pos) {
      g_->exp_begin_[pos] = uint32_t(g_->entries_.size());
      std::vector<uint32_t> chain;
      bool pops = false;
      seen_.clear();
      expand(uint32_t(pos), chain, pops);
      g_->pops_[pos] = pops;
    }
    g_->exp_begin_[n] = uint32_t(g_->entries_.size());
  }

  // Shortest text of each rule, then of each position's rest, by iterating
  // to a fixed point (productive grammars converge; a cap keeps it cheap).
  void compute_min_lengths() {
    const uint64_t inf = UINT32_MAX;
    size_t n = g_->elems_.size();
    std::vector<uint64_t> rule_min(g_->rule_names_.size(), inf);
    std::vector<uint64_t> to_end(n, inf);
    for (int iter = 0; iter < 1000; ++iter) {
      bool changed = false;
      for (size_t pos = n; pos-- > 0;) {
        const Elem& e = g_->elems_[pos];
        uint64_t v = e.kind == ElemKind::End ? 0
                     : std::min(inf, (e.kind == ElemKind::Bytes ? 1 : rule_min[e.arg]) + to_end[pos + 1]);
        if (v != to_end[pos]) to_end[pos] = v, changed = true;
      }
      for (size_t r = 0; r < g_->alt_starts_.size(); ++r)
        for (uint32_t a : g_->alt_starts_[r])
          if (to_end[a] < rule_min[r]) rule_min[r] = to_end[a], changed = true;
      if (!changed) break;
    }
    g_->min_to_end_.assign(to_end.begin(), to_end.end());
  }

  FlatGrammar f_;
  CompiledGrammar* g_ = nullptr;
  std::vector<bool> nullable_;
  std::set<std::pair<uint32_t, std::vector<uint32_t>>> seen_;
};

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(const Grammar& g) {
  return Lowering(lower_grammar(g)).run();
}

std::string CompiledGrammar::describe(uint32_t pos) const {
  uint32_t rule = 0, begin = pos;
  while (begin > 0 && elems_[begin - 1].kind != ElemKind::End) --begin;
  uint32_t end = pos;
  while (elems_[end].kind != ElemKind::End) ++end;
  rule = elems_[end].arg;
  std::string out = rule_names_[rule] + " ::=";
  for (uint32_t p = begin; p <= end; ++p) {
    if (p == pos) out += " \xE2\x80\xA2";  // the bullet marks the position
    if (p == end) break;
    const Elem& e = elems_[p];
    if (e.kind == ElemKind::Ref) {
      out += " " + rule_names_[e.arg];
    } else {
      std::string set;
      const ByteSet& s = sets_[e.arg];
      for (int b = 0; b < 256; ++b)
        if (s.has(uint8_t(b))) set += (b >= 0x21 && b < 0x7F) ? std::string(1, char(b)) : str_cat("\\x", std::hex, b);
      out += " [" + set + "]";
    }
  }
  return out;
}

}  // namespace serval::grammar
