#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace serval::grammar {

namespace {

std::shared_ptr<Expr> make(Expr::Kind kind) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  return e;
}

// Escapes a code point for a GBNF literal or class; `special` lists the
// characters that must be escaped in that context.
void append_escaped(std::string& out, uint32_t cp, std::string_view special) {
  switch (cp) {
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\\': out += "\\\\"; return;
    default: break;
  }
  if (cp < 0x80 && special.find(char(cp)) != std::string_view::npos) {
    out += '\\';
    out += char(cp);
    return;
  }
  char buf[16];
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(cp));
    out += buf;
  } else if (cp >= 0xD800 && cp <= 0xDFFF) {
    std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(cp));
    out += buf;
  } else if (cp > kMaxCodepoint) {
    fail("code point ", cp, " is out of range");
  } else {
    utf8::append(out, cp);
  }
}

// Literals hold UTF-8 text (every front end produces valid UTF-8; \xNN in
// GBNF is a code point, as in llama.cpp).
void print_literal(std::string& out, std::string_view bytes) {
  out += '"';
  size_t i = 0;
  while (i < bytes.size()) {
    unsigned char c = bytes[i];
    size_t n = utf8::char_len(c);
    bool valid = c < 0x80 || (c >= 0xC2 && c <= 0xF4 && n > 1 && i + n <= bytes.size());
    for (size_t k = 1; valid && k < n; ++k) valid = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    SERVAL_CHECK(valid, "literal is not valid UTF-8 at byte ", i);
    size_t j = i;
    append_escaped(out, utf8::next(bytes, j), "\"");
    i = j;
  }
  out += '"';
}

int precedence(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Alt: return 0;
    case Expr::Kind::Seq: return 1;
    case Expr::Kind::Repeat: return 2;
    default: return 3;
  }
}

void print(std::string& out, const Expr& e, int min_prec) {
  bool parens = precedence(e) < min_prec;
  if (parens) out += '(';
  switch (e.kind) {
    case Expr::Kind::Empty: out += "\"\""; break;
    case Expr::Kind::Literal: print_literal(out, e.text); break;
    case Expr::Kind::RuleRef: out += e.text; break;
    case Expr::Kind::Class:
      out += e.negated ? "[^" : "[";
      for (const auto& r : e.ranges) {
        append_escaped(out, r.lo, "]^-[");
        if (r.hi != r.lo) {
          out += '-';
          append_escaped(out, r.hi, "]^-[");
        }
      }
      out += ']';
      break;
    case Expr::Kind::Seq:
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i) out += ' ';
        print(out, *e.items[i], 2);
      }
      break;
    case Expr::Kind::Alt:
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i) out += " | ";
        print(out, *e.items[i], 1);
      }
      break;
    case Expr::Kind::Repeat: {
      print(out, *e.items[0], 3);
      if (e.min == 0 && e.max == 1) out += '?';
      else if (e.min == 0 && e.max == kUnbounded) out += '*';
      else if (e.min == 1 && e.max == kUnbounded) out += '+';
      else if (e.max == kUnbounded) out += str_cat('{', e.min, ",}");
      else if (e.min == e.max) out += str_cat('{', e.min, '}');
      else out += str_cat('{', e.min, ',', e.max, '}');
      break;
    }
  }
  if (parens) out += ')';
}

}  // namespace

std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> out;
  for (const auto& r : ranges) {
    SERVAL_CHECK(r.lo <= r.hi, "character range is out of order (", r.lo, " > ", r.hi, ")");
    SERVAL_CHECK(r.hi <= kMaxCodepoint, "code point ", r.hi, " is past U+10FFFF");
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CodepointRange> complement_ranges(const std::vector<CodepointRange>& ranges) {
  std::vector<CodepointRange> out;
  uint32_t next = 0;
  auto add = [&](uint32_t lo, uint32_t hi) {
    // Surrogates are not characters: UTF-8 cannot carry them.
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) out.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    } else {
      out.push_back({lo, hi});
    }
  };
  for (const auto& r : normalize_ranges(ranges)) {
    if (r.lo > next) add(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) add(next, kMaxCodepoint);
  return out;
}

ExprPtr empty() { return make(Expr::Kind::Empty); }

ExprPtr lit(std::string_view utf8) {
  if (utf8.empty()) return empty();
  auto e = make(Expr::Kind::Literal);
  e->text = std::string(utf8);
  return e;
}

ExprPtr cls(std::vector<CodepointRange> ranges, bool negated) {
  auto e = make(Expr::Kind::Class);
  e->ranges = normalize_ranges(std::move(ranges));
  e->negated = negated;
  return e;
}

ExprPtr rule_ref(std::string_view rule) {
  auto e = make(Expr::Kind::RuleRef);
  e->text = std::string(rule);
  return e;
}

ExprPtr seq(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& it : items) {
    if (it->kind == Expr::Kind::Empty) continue;
    if (it->kind == Expr::Kind::Seq) {
      flat.insert(flat.end(), it->items.begin(), it->items.end());
    } else if (it->kind == Expr::Kind::Literal && !flat.empty() && flat.back()->kind == Expr::Kind::Literal) {
      flat.back() = lit(flat.back()->text + it->text);  // "a" "b" is "ab"
    } else {
      flat.push_back(it);
    }
  }
  if (flat.empty()) return empty();
  if (flat.size() == 1) return flat[0];
  auto e = make(Expr::Kind::Seq);
  e->items = std::move(flat);
  return e;
}

ExprPtr alt(std::vector<ExprPtr> items) {
  SERVAL_CHECK(!items.empty(), "an alternation needs at least one alternative");
  std::vector<ExprPtr> flat;
  for (auto& it : items) {
    if (it->kind == Expr::Kind::Alt) flat.insert(flat.end(), it->items.begin(), it->items.end());
    else flat.push_back(it);
  }
  if (flat.size() == 1) return flat[0];
  auto e = make(Expr::Kind::Alt);
  e->items = std::move(flat);
  return e;
}

ExprPtr repeat(ExprPtr item, uint32_t min, uint32_t max) {
  SERVAL_CHECK(min <= max, "repetition {", min, ",", max, "} has min > max");
  if (max == 0 || item->kind == Expr::Kind::Empty) return empty();
  if (min == 1 && max == 1) return item;
  auto e = make(Expr::Kind::Repeat);
  e->items = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}

void Grammar::set(const std::string& name, ExprPtr body) {
  for (auto& [n, b] : rules) {
    if (n == name) {
      b = std::move(body);
      return;
    }
  }
  rules.emplace_back(name, std::move(body));
}

const Expr* Grammar::find(std::string_view name) const {
  for (const auto& [n, b] : rules)
    if (n == name) return b.get();
  return nullptr;
}

std::string to_gbnf(const Expr& e) {
  std::string out;
  print(out, e, 0);
  return out;
}

std::string to_gbnf(const Grammar& g) {
  std::string out;
  for (const auto& [name, body] : g.rules) out += name + " ::= " + to_gbnf(*body) + "\n";
  return out;
}

bool equal(const Expr& a, const Expr& b) {
  if (a.kind != b.kind || a.text != b.text || a.ranges != b.ranges || a.negated != b.negated ||
      a.min != b.min || a.max != b.max || a.items.size() != b.items.size())
    return false;
  for (size_t i = 0; i < a.items.size(); ++i)
    if (a.items[i] != b.items[i] && !equal(*a.items[i], *b.items[i])) return false;
  return true;
}

}  // namespace serval::grammar
