#include "grammar/json_builtins.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace serval::grammar {

namespace {

ExprPtr chars(uint32_t lo, uint32_t hi) { return cls({{lo, hi}}); }
ExprPtr hex() { return cls({{'0', '9'}, {'A', 'F'}, {'a', 'f'}}); }
ExprPtr digit() { return chars('0', '9'); }
ExprPtr digits(uint32_t n) { return repeat(digit(), n, n); }

// How a character is written inside a JSON string.
std::string json_escape_char(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: break;
  }
  std::string out;
  if (cp < 0x20) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
    out = buf;
  } else {
    utf8::append(out, cp);
  }
  return out;
}

bool needs_escape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

// Two-digit months and days.
ExprPtr days_upto(int last) {
  std::vector<ExprPtr> alts{seq({lit("0"), chars('1', '9')}), seq({lit("1"), digit()})};
  if (last >= 29) alts.push_back(seq({lit("2"), digit()}));
  else alts.push_back(seq({lit("2"), chars('0', '8')}));
  if (last == 30) alts.push_back(lit("30"));
  if (last == 31) alts.push_back(seq({lit("3"), chars('0', '1')}));
  return alt(std::move(alts));
}

ExprPtr date_expr() {
  // Years 0001-9999; February 29 only in leap years.
  ExprPtr year = alt({seq({chars('1', '9'), digits(3)}), seq({lit("0"), chars('1', '9'), digits(2)}),
                      seq({lit("00"), chars('1', '9'), digit()}), seq({lit("000"), chars('1', '9')})});
  auto month_list = [](std::initializer_list<const char*> ms) {
    std::vector<ExprPtr> a;
    for (const char* m : ms) a.push_back(lit(m));
    return alt(std::move(a));
  };
  ExprPtr month_day = alt({seq({month_list({"01", "03", "05", "07", "08", "10", "12"}), lit("-"), days_upto(31)}),
                           seq({month_list({"04", "06", "09", "11"}), lit("-"), days_upto(30)}),
                           seq({lit("02-"), days_upto(28)})});
  // Two digits that are a nonzero multiple of 4.
  ExprPtr mult4 = alt({seq({cls({{'0', '0'}, {'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}), cls({{'4', '4'}, {'8', '8'}})}),
                       seq({cls({{'1', '1'}, {'3', '3'}, {'5', '5'}, {'7', '7'}, {'9', '9'}}), cls({{'2', '2'}, {'6', '6'}})}),
                       seq({cls({{'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}), lit("0")})});
  ExprPtr leap_year = alt({seq({digits(2), mult4}), seq({mult4, lit("00")})});
  return alt({seq({year, lit("-"), month_day}), seq({leap_year, lit("-02-29")})});
}

ExprPtr time_expr() {
  ExprPtr hour = alt({seq({chars('0', '1'), digit()}), seq({lit("2"), chars('0', '3')})});
  ExprPtr minute = seq({chars('0', '5'), digit()});
  ExprPtr frac = opt(seq({lit("."), repeat(digit(), 1, 9)}));
  ExprPtr offset = alt({lit("Z"), seq({cls({{'+', '+'}, {'-', '-'}}), hour, lit(":"), minute})});
  return seq({hour, lit(":"), minute, lit(":"), minute, frac, offset});
}

ExprPtr uuid_expr() {
  return seq({repeat(hex(), 8, 8), lit("-"), repeat(hex(), 4, 4), lit("-"), repeat(hex(), 4, 4), lit("-"),
              repeat(hex(), 4, 4), lit("-"), repeat(hex(), 12, 12)});
}

ExprPtr email_expr() {
  ExprPtr local = repeat(cls({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'.', '.'}, {'_', '_'}, {'%', '%'}, {'+', '+'}, {'-', '-'}}), 1, 64);
  ExprPtr label = repeat(cls({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'-', '-'}}), 1, 63);
  ExprPtr tld = repeat(cls({{'a', 'z'}, {'A', 'Z'}}), 2, 12);
  return seq({local, lit("@"), label, repeat(seq({lit("."), label}), 0, 4), lit("."), tld});
}

ExprPtr ipv4_expr() {
  // No leading zeros: Python's ipaddress refuses them.
  ExprPtr octet = alt({seq({lit("25"), chars('0', '5')}), seq({lit("2"), chars('0', '4'), digit()}),
                       seq({lit("1"), digits(2)}), seq({chars('1', '9'), digit()}), digit()});
  return seq({octet, lit("."), octet, lit("."), octet, lit("."), octet});
}

}  // namespace

void add_json_builtins(Grammar& g, const JsonGrammarOptions& opts) {
  if (g.find(kJsonValue)) return;
  std::vector<CodepointRange> ws_chars = {{' ', ' '}};
  if (opts.allow_newlines) ws_chars = {{'\t', '\n'}, {' ', ' '}};
  g.set(kWs, repeat(cls(ws_chars), 0, opts.max_whitespace));
  ExprPtr ws = rule_ref(kWs);
  // \u escapes leave out surrogates, so that every json-char is one code
  // point (a decoded string's length is its count of json-chars).
  ExprPtr hex4 = alt({seq({cls({{'0', '9'}, {'A', 'C'}, {'E', 'F'}, {'a', 'c'}, {'e', 'f'}}), repeat(hex(), 3, 3)}),
                      seq({cls({{'D', 'D'}, {'d', 'd'}}), chars('0', '7'), repeat(hex(), 2, 2)})});
  g.set(kJsonChar, alt({cls({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true),
                        seq({lit("\\"), alt({cls({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'},
                                                  {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                             seq({lit("u"), hex4})})})}));
  g.set(kJsonString, seq({lit("\""), star(rule_ref(kJsonChar)), lit("\"")}));
  ExprPtr int_part = alt({lit("0"), seq({chars('1', '9'), star(digit())})});
  g.set(kJsonInteger, seq({opt(lit("-")), int_part}));
  g.set(kJsonNumber, seq({opt(lit("-")), int_part, opt(seq({lit("."), plus(digit())})),
                          opt(seq({cls({{'E', 'E'}, {'e', 'e'}}), opt(cls({{'+', '+'}, {'-', '-'}})), repeat(digit(), 1, 2)}))}));
  ExprPtr member = seq({rule_ref(kJsonString), ws, lit(":"), ws, rule_ref(kJsonValue)});
  g.set(kJsonObject, seq({lit("{"), ws, opt(seq({member, star(seq({ws, lit(","), ws, member})), ws})), lit("}")}));
  g.set(kJsonArray, seq({lit("["), ws,
                         opt(seq({rule_ref(kJsonValue), star(seq({ws, lit(","), ws, rule_ref(kJsonValue)})), ws})),
                         lit("]")}));
  g.set(kJsonValue, alt({rule_ref(kJsonObject), rule_ref(kJsonArray), rule_ref(kJsonString), rule_ref(kJsonNumber),
                         lit("true"), lit("false"), lit("null")}));
}

bool is_json_builtin(std::string_view rule) {
  for (const char* b : {kWs, kJsonValue, kJsonString, kJsonChar, kJsonNumber, kJsonInteger, kJsonObject, kJsonArray})
    if (rule == b) return true;
  return false;
}

ExprPtr json_escape_expr(const ExprPtr& e) {
  switch (e->kind) {
    case Expr::Kind::Empty:
    case Expr::Kind::RuleRef: return e;
    case Expr::Kind::Literal: {
      std::string out;
      for (size_t i = 0; i < e->text.size();) out += json_escape_char(utf8::next(e->text, i));
      return lit(out);
    }
    case Expr::Kind::Class: {
      std::vector<CodepointRange> ranges = e->negated ? complement_ranges(e->ranges) : e->ranges;
      std::vector<CodepointRange> raw = complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
      std::vector<CodepointRange> plain;
      std::vector<ExprPtr> alts;
      for (const auto& r : ranges) {
        for (const auto& ok : raw) {
          uint32_t lo = std::max(r.lo, ok.lo), hi = std::min(r.hi, ok.hi);
          if (lo <= hi) plain.push_back({lo, hi});
        }
        for (uint32_t cp = r.lo; cp <= std::min<uint32_t>(r.hi, 0x5C); ++cp)
          if (needs_escape(cp)) alts.push_back(lit(json_escape_char(cp)));
      }
      if (!plain.empty()) alts.insert(alts.begin(), cls(std::move(plain)));
      SERVAL_CHECK(!alts.empty(), "character class matches nothing");
      return alt(std::move(alts));
    }
    case Expr::Kind::Seq:
    case Expr::Kind::Alt: {
      std::vector<ExprPtr> items;
      for (const auto& it : e->items) items.push_back(json_escape_expr(it));
      return e->kind == Expr::Kind::Seq ? seq(std::move(items)) : alt(std::move(items));
    }
    case Expr::Kind::Repeat: return repeat(json_escape_expr(e->items[0]), e->min, e->max);
  }
  return e;
}

ExprPtr json_string_literal(std::string_view utf8) {
  std::string out = "\"";
  for (size_t i = 0; i < utf8.size();) out += json_escape_char(utf8::next(utf8, i));
  return lit(out + "\"");
}

ExprPtr json_string_rest_not_in(const std::vector<std::string>& names, Grammar& g, const std::string& rule_prefix) {
  // A trie of the names by code point; rule k stands for "the characters so
  // far spell the prefix of trie node k".
  struct Node {
    std::map<uint32_t, size_t> children;
    bool is_name = false;
  };
  std::vector<Node> trie(1);
  for (const auto& name : names) {
    size_t n = 0;
    for (size_t i = 0; i < name.size();) {
      uint32_t cp = utf8::next(name, i);
      auto it = trie[n].children.find(cp);
      if (it == trie[n].children.end()) {
        trie.push_back({});
        it = trie[n].children.emplace(cp, trie.size() - 1).first;
      }
      n = it->second;
    }
    trie[n].is_name = true;
  }
  ExprPtr free_rest = seq({star(rule_ref(kJsonChar)), lit("\"")});
  std::vector<CodepointRange> plain = complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  for (size_t k = 0; k < trie.size(); ++k) {
    std::vector<ExprPtr> alts;
    if (!trie[k].is_name) alts.push_back(lit("\""));
    std::vector<CodepointRange> taken;
    for (const auto& [cp, child] : trie[k].children) {
      alts.push_back(seq({lit(json_escape_char(cp)), rule_ref(rule_prefix + std::to_string(child))}));
      taken.push_back({cp, cp});
    }
    // Leaving the trie: an unescaped character no name continues with.
    std::vector<CodepointRange> leave;
    auto not_taken = complement_ranges(taken);
    for (const auto& a : plain)
      for (const auto& b : not_taken) {
        uint32_t lo = std::max(a.lo, b.lo), hi = std::min(a.hi, b.hi);
        if (lo <= hi) leave.push_back({lo, hi});
      }
    if (!leave.empty()) alts.push_back(seq({cls(std::move(leave)), free_rest}));
    g.set(rule_prefix + std::to_string(k), alt(std::move(alts)));
  }
  return rule_ref(rule_prefix + "0");
}

ExprPtr json_format(std::string_view format) {
  if (format == "date") return date_expr();
  if (format == "time") return time_expr();
  if (format == "date-time") return seq({date_expr(), lit("T"), time_expr()});
  if (format == "uuid") return uuid_expr();
  if (format == "email") return email_expr();
  if (format == "ipv4") return ipv4_expr();
  return nullptr;
}

Grammar json_object_grammar(const JsonGrammarOptions& opts) {
  Grammar g;
  g.set("root", rule_ref(kJsonObject));
  add_json_builtins(g, opts);
  return g;
}

Grammar choice_grammar(const std::vector<std::string>& choices) {
  SERVAL_CHECK(!choices.empty(), "choice needs at least one string");
  std::vector<ExprPtr> alts;
  for (const auto& c : choices) alts.push_back(lit(c));
  Grammar g;
  g.set("root", alt(std::move(alts)));
  return g;
}

}  // namespace serval::grammar
