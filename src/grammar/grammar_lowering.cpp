#include "grammar/grammar_lowering.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "grammar/utf8_ranges.h"

namespace serval::grammar {

namespace {

using Elem = CompiledGrammar::Elem;
using ElemKind = CompiledGrammar::ElemKind;

// Past this many elements a grammar is refused rather than compiled (a
// `{0,100000}` of a big group would otherwise take all memory).
constexpr size_t kMaxElements = 4'000'000;

class Lowerer {
 public:
  explicit Lowerer(const Grammar& g) : g_(g) {}

  FlatGrammar run() {
    for (const auto& [name, body] : g_.rules) {
      SERVAL_CHECK(!rule_index_.count(name), "grammar: rule '", name, "' is defined twice");
      rule_index_[name] = uint32_t(out_.rules.size());
      out_.rules.push_back({name, {}});
    }
    auto root = rule_index_.find(g_.root);
    SERVAL_CHECK(root != rule_index_.end(), "grammar: the root rule '", g_.root, "' is not defined");
    out_.root = root->second;
    for (size_t i = 0; i < g_.rules.size(); ++i) {
      const Expr& body = *g_.rules[i].second;
      std::vector<std::vector<Elem>> alts;
      if (body.kind == Expr::Kind::Alt) {
        alts = lower_alternatives(body);
      } else {
        alts.push_back(lower_seq(body));
      }
      out_.rules[i].alts = std::move(alts);
    }
    return std::move(out_);
  }

 private:
  std::vector<Elem> lower_seq(const Expr& e) {
    std::vector<Elem> out;
    append(e, out);
    return out;
  }

  void count(size_t n) {
    elements_ += n;
    SERVAL_CHECK(elements_ <= kMaxElements, "grammar is too large to compile (over ", kMaxElements,
                 " elements; lower the repetition counts)");
  }

  uint32_t set_index(const ByteSet& s) {
    std::string key(reinterpret_cast<const char*>(s.w), sizeof s.w);
    auto it = set_index_.find(key);
    if (it != set_index_.end()) return it->second;
    uint32_t id = uint32_t(out_.sets.size());
    out_.sets.push_back(s);
    set_index_[key] = id;
    return id;
  }

  Elem bytes(uint8_t lo, uint8_t hi) {
    ByteSet s;
    for (unsigned b = lo; b <= hi; ++b) s.add(uint8_t(b));
    return {ElemKind::Bytes, set_index(s)};
  }

  uint32_t new_rule(const std::string& name, std::vector<std::vector<Elem>> alts) {
    uint32_t id = uint32_t(out_.rules.size());
    out_.rules.push_back({name, std::move(alts)});
    return id;
  }

  // A generated rule, shared by every use with the same key.
  template <typename Build>
  Elem shared_rule(const std::string& key, const std::string& name, Build build) {
    auto it = generated_.find(key);
    if (it != generated_.end()) return {ElemKind::Ref, it->second};
    uint32_t id = new_rule(name, {});
    generated_[key] = id;
    auto alts = build();  // may create further rules
    for (const auto& a : alts) count(a.size() + 1);
    out_.rules[id].alts = std::move(alts);
    return {ElemKind::Ref, id};
  }

  static std::string elem_key(const Elem& e) { return str_cat(int(e.kind), ':', e.arg); }

  void append(const Expr& e, std::vector<Elem>& out) {
    switch (e.kind) {
      case Expr::Kind::Empty: return;
      case Expr::Kind::Literal:
        count(e.text.size());
        for (unsigned char c : e.text) out.push_back(bytes(c, c));
        return;
      case Expr::Kind::Class: out.push_back(lower_class(e)); return;
      case Expr::Kind::RuleRef: {
        auto it = rule_index_.find(e.text);
        SERVAL_CHECK(it != rule_index_.end(), "grammar: undefined rule '", e.text, "'");
        out.push_back({ElemKind::Ref, it->second});
        return;
      }
      case Expr::Kind::Seq:
        for (const auto& it : e.items) append(*it, out);
        return;
      case Expr::Kind::Alt: {
        std::string key = "alt:" + to_gbnf(e);
        out.push_back(shared_rule(key, str_cat("(group ", generated_.size(), ")"), [&] {
          return lower_alternatives(e);
        }));
        return;
      }
      case Expr::Kind::Repeat: lower_repeat(e, out); return;
    }
  }

  std::vector<std::vector<Elem>> lower_alternatives(const Expr& e) {
    bool literals = e.items.size() >= 8 && std::all_of(e.items.begin(), e.items.end(), [](const ExprPtr& a) {
      return a->kind == Expr::Kind::Literal || a->kind == Expr::Kind::Empty;
    });
    if (literals) return literal_trie(e);
    std::vector<std::vector<Elem>> alts;
    for (const auto& a : e.items) alts.push_back(lower_seq(*a));
    return alts;
  }

  // Many literal alternatives (an enum, a choice) as a byte trie: one rule
  // per node, so the matcher follows one stack per distinct prefix instead of
  // one per alternative. Returns the root node's alternatives.
  std::vector<std::vector<Elem>> literal_trie(const Expr& e) {
    std::vector<std::string> words;
    for (const auto& a : e.items) words.push_back(a->text);
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    // Node alternatives of the words [lo, hi) that share their first `depth` bytes.
    std::function<std::vector<std::vector<Elem>>(size_t, size_t, size_t)> node = [&](size_t lo, size_t hi, size_t depth) {
      std::vector<std::vector<Elem>> alts;
      size_t i = lo;
      if (words[i].size() == depth) {
        alts.push_back({});  // a word ends here
        ++i;
      }
      while (i < hi) {
        unsigned char b = words[i][depth];
        size_t j = i;
        while (j < hi && static_cast<unsigned char>(words[j][depth]) == b) ++j;
        std::vector<Elem> a{bytes(b, b)};
        if (!(j == i + 1 && words[i].size() == depth + 1)) {
          auto child = node(i, j, depth + 1);
          a.push_back({ElemKind::Ref, new_rule(str_cat("(literal trie ", out_.rules.size(), ")"), std::move(child))});
        }
        count(a.size() + 1);
        alts.push_back(std::move(a));
        i = j;
      }
      return alts;
    };
    return node(0, words.size(), 0);
  }

  Elem lower_class(const Expr& e) {
    std::vector<CodepointRange> ranges = e.negated ? complement_ranges(e.ranges) : e.ranges;
    std::vector<ByteSequence> seqs = utf8_sequences(ranges);
    ByteSet ascii;
    bool multi = false;
    for (const auto& s : seqs) {
      if (s.size() == 1) {
        for (unsigned b = s[0].lo; b <= s[0].hi; ++b) ascii.add(uint8_t(b));
      } else {
        multi = true;
      }
    }
    if (!multi && !seqs.empty()) return {ElemKind::Bytes, set_index(ascii)};
    std::string text = to_gbnf(e);
    return shared_rule("class:" + text, text, [&] {
      std::vector<std::vector<Elem>> alts;
      if (ascii != ByteSet{}) alts.push_back({{ElemKind::Bytes, set_index(ascii)}});
      for (const auto& s : seqs) {
        if (s.size() == 1) continue;
        std::vector<Elem> a;
        for (const auto& r : s) a.push_back(bytes(r.lo, r.hi));
        alts.push_back(std::move(a));
      }
      return alts;  // empty for a class that matches nothing: compile() refuses it
    });
  }

  // The item of a repetition as one element: itself, or a rule around it.
  Elem unit(const Expr& item) {
    std::vector<Elem> elems = lower_seq(item);
    if (elems.size() == 1) return elems[0];
    std::string key = "unit:";
    for (const auto& el : elems) key += elem_key(el) + ",";
    return shared_rule(key, str_cat("(", to_gbnf(item), ")"), [&] { return std::vector<std::vector<Elem>>{elems}; });
  }

  void lower_repeat(const Expr& e, std::vector<Elem>& out) {
    Elem u = unit(*e.items[0]);
    count(e.min);
    for (uint32_t i = 0; i < e.min; ++i) out.push_back(u);
    std::string name = str_cat("(", to_gbnf(*e.items[0]), ")");
    if (e.max == kUnbounded) {
      // r ::= u r | "" : the self call is in tail position (no stack growth).
      std::string key = "star:" + elem_key(u);
      out.push_back(shared_rule(key, name + "*", [&] {
        uint32_t self = generated_[key];
        return std::vector<std::vector<Elem>>{{u, {ElemKind::Ref, self}}, {}};
      }));
      return;
    }
    uint32_t k = e.max - e.min;
    if (k == 0) return;
    out.push_back(upto(u, k, name));
  }

  // r_k ::= u r_{k-1} | "" ; r_1 ::= u | "" : at most k more of u.
  Elem upto(Elem u, uint32_t k, const std::string& name) {
    std::string base = "upto:" + elem_key(u) + ":";
    // Built bottom-up, so no recursion depth grows with k.
    Elem prev{};
    for (uint32_t i = 1; i <= k; ++i) {
      std::string key = base + std::to_string(i);
      Elem cur = shared_rule(key, str_cat(name, "{0,", i, "}"), [&] {
        std::vector<Elem> first{u};
        if (i > 1) first.push_back(prev);
        return std::vector<std::vector<Elem>>{first, {}};
      });
      prev = cur;
    }
    return prev;
  }

  const Grammar& g_;
  FlatGrammar out_;
  std::unordered_map<std::string, uint32_t> rule_index_;
  std::unordered_map<std::string, uint32_t> generated_;
  std::unordered_map<std::string, uint32_t> set_index_;
  size_t elements_ = 0;
};

}  // namespace

FlatGrammar lower_grammar(const Grammar& g) { return Lowerer(g).run(); }

}  // namespace serval::grammar
