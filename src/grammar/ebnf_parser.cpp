#include "grammar/ebnf_parser.h"

#include <map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace serval::grammar {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Grammar parse() {
    Grammar g;
    std::map<std::string, size_t> defined_at;
    skip_space();
    while (pos_ < s_.size()) {
      size_t start = pos_;
      std::string name = parse_name();
      skip_space();
      if (s_.substr(pos_, 3) != "::=") error(pos_, "expected '::=' after rule name '", name, "'");
      if (defined_at.count(name)) error(start, "rule '", name, "' is defined twice");
      defined_at[name] = start;
      pos_ += 3;
      skip_space();
      ExprPtr body = parse_alternatives(false);
      g.rules.emplace_back(name, body);
      skip_space();
    }
    if (!defined_at.count("root")) error(s_.size(), "the grammar has no 'root' rule");
    for (const auto& [name, at] : refs_)  // in text order: the first bad one is named
      if (!defined_at.count(name)) error(at, "undefined rule '", name, "'");
    return g;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(size_t at, const Args&... args) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("grammar: line ", line, ", column ", col, ": ", args...);
  }

  // Spaces, newlines and # comments.
  void skip_space() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    size_t start = pos_;
    while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
    if (pos_ == start) error(pos_, "expected a rule name, found ", describe(pos_));
    return std::string(s_.substr(start, pos_ - start));
  }

  std::string describe(size_t at) const {
    if (at >= s_.size()) return "the end of the grammar";
    return str_cat("'", s_.substr(at, utf8::char_len(s_[at])), "'");
  }

  // True when a `name ::=` starts at pos_: the end of the current rule.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < s_.size() && is_name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\r' || s_[p] == '\n')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  ExprPtr parse_alternatives(bool nested) {
    std::vector<ExprPtr> alts{parse_sequence(nested)};
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      skip_space();
      alts.push_back(parse_sequence(nested));
    }
    return alt(std::move(alts));
  }

  ExprPtr parse_sequence(bool nested) {
    std::vector<ExprPtr> items;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '|' || (c == ')' && nested)) break;
      if (!nested && at_rule_start()) break;
      items.push_back(parse_postfix(parse_atom()));
      skip_space();
    }
    return seq(std::move(items));
  }

  ExprPtr parse_atom() {
    size_t start = pos_;
    char c = s_[pos_];
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return cls({}, true);  // any character
    }
    if (c == '(') {
      ++pos_;
      skip_space();
      ExprPtr inner = parse_alternatives(true);
      if (pos_ >= s_.size() || s_[pos_] != ')') error(start, "unclosed '('");
      ++pos_;
      return inner;
    }
    if (is_name_char(c)) {
      std::string name = parse_name();
      refs_.emplace_back(name, start);
      return rule_ref(name);
    }
    if (c == ')') error(pos_, "unmatched ')'");
    error(pos_, "unexpected ", describe(pos_));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        e = c == '*' ? star(e) : c == '+' ? plus(e) : opt(e);
      } else if (c == '{') {
        e = parse_braces(e);
      } else {
        break;
      }
    }
    return e;
  }

  ExprPtr parse_braces(ExprPtr e) {
    size_t start = pos_++;
    auto number = [&](uint32_t& out) {
      size_t p = pos_;
      uint64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        v = v * 10 + uint64_t(s_[pos_] - '0');
        if (v > 100000) error(p, "repetition count is too large (at most 100000)");
        ++pos_;
      }
      out = uint32_t(v);
      return pos_ > p;
    };
    auto spaces = [&] { while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_; };
    uint32_t min = 0, max = 0;
    spaces();
    bool has_min = number(min);
    spaces();
    if (pos_ < s_.size() && s_[pos_] == ',') {
      ++pos_;
      spaces();
      if (!number(max)) max = kUnbounded;
      spaces();
    } else {
      if (!has_min) error(start, "expected a number in '{...}'");
      max = min;
    }
    if (pos_ >= s_.size() || s_[pos_] != '}') error(start, "unclosed '{' repetition");
    ++pos_;
    if (min > max) error(start, "repetition {", min, ",", max, "} has min > max");
    return repeat(e, min, max);
  }

  // One character of a literal or class, with escapes; returns the code point.
  uint32_t parse_char() {
    size_t start = pos_;
    if (pos_ >= s_.size()) error(pos_, "unexpected end of the grammar");
    char c = s_[pos_];
    if (c != '\\') {
      uint32_t cp = utf8::next(s_, pos_);
      return cp;
    }
    if (pos_ + 1 >= s_.size()) error(start, "escape at the end of the grammar");
    char e = s_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.': case '\'':
        return uint32_t(e);
      case 'x': return parse_hex(start, 2);
      case 'u': return parse_hex(start, 4);
      case 'U': return parse_hex(start, 8);
      default: error(start, "unknown escape '\\", e, "'");
    }
  }

  uint32_t parse_hex(size_t start, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) error(start, "incomplete hex escape");
      char h = s_[pos_];
      int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
      if (d < 0) error(start, "bad hex digit '", h, "' in escape");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    if (v > kMaxCodepoint) error(start, "code point ", v, " is past U+10FFFF");
    if (v >= 0xD800 && v <= 0xDFFF) error(start, "surrogate code point in escape");
    return v;
  }

  ExprPtr parse_literal() {
    size_t start = pos_++;
    std::string text;
    while (true) {
      if (pos_ >= s_.size()) error(start, "unclosed string literal");
      if (s_[pos_] == '"') break;
      if (s_[pos_] == '\n') error(start, "unclosed string literal (newline inside)");
      utf8::append(text, parse_char());
    }
    ++pos_;
    return lit(text);
  }

  ExprPtr parse_class() {
    size_t start = pos_++;
    bool negated = pos_ < s_.size() && s_[pos_] == '^';
    if (negated) ++pos_;
    std::vector<CodepointRange> ranges;
    while (true) {
      if (pos_ >= s_.size() || s_[pos_] == '\n') error(start, "unclosed character class");
      if (s_[pos_] == ']') break;
      uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error(start, "character range is out of order");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (ranges.empty() && !negated) error(start, "empty character class");
    return cls(std::move(ranges), negated);
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::vector<std::pair<std::string, size_t>> refs_;  // references and where they are, for errors
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return Parser(text).parse(); }

}  // namespace serval::grammar
