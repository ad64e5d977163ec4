#include "grammar/regex_to_grammar.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace serval::grammar {

namespace {

using Ranges = std::vector<CodepointRange>;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
// Negated shorthands stay within ASCII (see the header).
const Ranges kNotDigit = {{0, '0' - 1}, {'9' + 1, 0x7F}};
const Ranges kNotWord = {{0, '0' - 1}, {'9' + 1, 'A' - 1}, {'Z' + 1, '_' - 1}, {'`', '`'}, {'z' + 1, 0x7F}};
const Ranges kNotSpace = {{0, '\t' - 1}, {'\r' + 1, 0x1F}, {'!', 0x7F}};
// `.`: anything but line terminators (\n \r U+2028 U+2029).
const Ranges kDot = {{0, '\n' - 1}, {'\n' + 1, '\r' - 1}, {'\r' + 1, 0x2027}, {0x202A, 0xD7FF}, {0xE000, kMaxCodepoint}};

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : s_(p) {}

  ExprPtr parse() {
    ExprPtr e = parse_alternation(0);
    if (pos_ < s_.size()) error(pos_, "unmatched ')'");
    return e;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(size_t at, const Args&... args) const {
    fail("regex \"", s_, "\": at offset ", at, ": ", args...);
  }

  bool more() const { return pos_ < s_.size(); }
  char peek() const { return s_[pos_]; }

  ExprPtr parse_alternation(int depth) {
    std::vector<ExprPtr> alts{parse_concat(depth)};
    while (more() && peek() == '|') {
      ++pos_;
      alts.push_back(parse_concat(depth));
    }
    return alt(std::move(alts));
  }

  ExprPtr parse_concat(int depth) {
    std::vector<ExprPtr> items;
    while (more() && peek() != '|' && peek() != ')') {
      size_t at = pos_;
      char c = peek();
      if (c == '^') {
        ++pos_;
        if (depth == 0 && items.empty()) continue;  // the text must match from its start anyway
        error(at, "the anchor ^ is only supported at the start of the pattern");
      }
      if (c == '$') {
        ++pos_;
        if (depth == 0 && (!more() || peek() == '|')) continue;
        error(at, "the anchor $ is only supported at the end of the pattern");
      }
      ExprPtr atom = parse_atom(depth);
      items.push_back(parse_quantifier(atom, at));
    }
    return seq(std::move(items));
  }

  // {m}, {m,}, {m,n}, {,n}; anything else after '{' is a literal '{' (as in
  // Python and non-Unicode ECMAScript).
  bool parse_braces(uint32_t& min, uint32_t& max) {
    size_t p = pos_ + 1;
    auto number = [&](uint32_t& out) {
      size_t start = p;
      uint64_t v = 0;
      while (p < s_.size() && s_[p] >= '0' && s_[p] <= '9') {
        v = v * 10 + uint64_t(s_[p] - '0');
        if (v > 100000) error(pos_, "repetition count is too large (at most 100000)");
        ++p;
      }
      out = uint32_t(v);
      return p > start;
    };
    bool has_min = number(min);
    if (p < s_.size() && s_[p] == '}') {
      if (!has_min) return false;
      max = min;
    } else if (p < s_.size() && s_[p] == ',') {
      ++p;
      if (!number(max)) max = kUnbounded;
      if (!has_min) min = 0;
      if (p >= s_.size() || s_[p] != '}' || (!has_min && max == kUnbounded)) return false;
    } else {
      return false;
    }
    pos_ = p + 1;
    return true;
  }

  ExprPtr parse_quantifier(ExprPtr atom, size_t at) {
    if (!more()) return atom;
    uint32_t min = 0, max = 0;
    char c = peek();
    if (c == '*') {
      ++pos_, max = kUnbounded;
    } else if (c == '+') {
      ++pos_, min = 1, max = kUnbounded;
    } else if (c == '?') {
      ++pos_, max = 1;
    } else if (c == '{') {
      if (!parse_braces(min, max)) return atom;
      if (min > max) error(at, "repetition {", min, ",", max, "} has min > max");
    } else {
      return atom;
    }
    if (more() && peek() == '?') ++pos_;  // lazy: the same language
    if (more() && peek() == '+') error(pos_, "possessive quantifiers are not supported");
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' ||
                   (peek() == '{' && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9')))
      error(pos_, "a quantifier cannot follow another quantifier");
    return repeat(atom, min, max);
  }

  ExprPtr parse_atom(int depth) {
    size_t at = pos_;
    char c = peek();
    switch (c) {
      case '(': return parse_group(depth);
      case '[': return parse_class();
      case '.': ++pos_; return cls(kDot);
      case '\\': return parse_escape(false, nullptr);
      case '*': case '+': case '?': error(at, "nothing to repeat before '", c, "'");
      case '{': {
        uint32_t a, b;
        size_t save = pos_;
        if (parse_braces(a, b)) error(save, "nothing to repeat before '{'");
        break;
      }
      default: break;
    }
    std::string ch;
    utf8::append(ch, utf8::next(s_, pos_));
    return lit(ch);
  }

  ExprPtr parse_group(int depth) {
    size_t at = pos_++;
    if (more() && peek() == '?') {
      std::string_view rest = s_.substr(pos_);
      if (rest.starts_with("?:")) {
        pos_ += 2;
      } else if (rest.starts_with("?=") || rest.starts_with("?!")) {
        error(at, "lookahead (", rest.substr(0, 2), ") is not supported");
      } else if (rest.starts_with("?<=") || rest.starts_with("?<!")) {
        error(at, "lookbehind (", rest.substr(0, 3), ") is not supported");
      } else if (rest.starts_with("?P=")) {
        error(at, "backreferences are not supported");
      } else if (rest.starts_with("?<") || rest.starts_with("?P<")) {
        size_t close = s_.find('>', pos_);
        if (close == std::string_view::npos) error(at, "unterminated group name");
        pos_ = close + 1;
      } else {
        error(at, "inline flags and other (? groups are not supported");
      }
    }
    ExprPtr inner = parse_alternation(depth + 1);
    if (!more() || peek() != ')') error(at, "unclosed '('");
    ++pos_;
    return inner;
  }

  uint32_t parse_hex(size_t at, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!more()) error(at, "incomplete escape");
      char h = peek();
      int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
      if (d < 0) error(at, "bad hex digit in escape");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    if (v >= 0xD800 && v <= 0xDFFF) error(at, "surrogate code points are not supported");
    return v;
  }

  // An escape; in a class, `set` receives the ranges and the return is null.
  ExprPtr parse_escape(bool in_class, Ranges* set) {
    size_t at = pos_++;
    if (!more()) error(at, "pattern ends with a backslash");
    char e = peek();
    ++pos_;
    const Ranges* shorthand = nullptr;
    uint32_t cp = 0;
    switch (e) {
      case 'd': shorthand = &kDigit; break;
      case 'D': shorthand = &kNotDigit; break;
      case 'w': shorthand = &kWord; break;
      case 'W': shorthand = &kNotWord; break;
      case 's': shorthand = &kSpace; break;
      case 'S': shorthand = &kNotSpace; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 't': cp = '\t'; break;
      case 'f': cp = '\f'; break;
      case 'v': cp = '\v'; break;
      case '0': cp = 0; break;
      case 'x': cp = parse_hex(at, 2); break;
      case 'u': cp = parse_hex(at, 4); break;
      case 'b':
        if (in_class) {
          cp = '\b';
          break;
        }
        error(at, "word boundaries (\\b) are not supported");
      case 'B': error(at, "word boundaries (\\B) are not supported");
      case 'A': case 'Z': case 'z': case 'G': error(at, "the anchor \\", e, " is not supported");
      case 'p': case 'P': error(at, "Unicode property escapes (\\", e, ") are not supported");
      case 'k': error(at, "backreferences (\\k) are not supported");
      case 'c': error(at, "control escapes (\\c) are not supported");
      default:
        if (e >= '1' && e <= '9') error(at, "backreferences (\\", e, ") are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) error(at, "unknown escape \\", e);
        pos_ = at + 1;
        cp = utf8::next(s_, pos_);  // an escaped punctuation character is itself
    }
    if (in_class) {
      if (shorthand == &kDigit || shorthand == &kWord || shorthand == &kSpace) class_has_shorthand_ = true;
      if (shorthand == &kNotDigit || shorthand == &kNotWord || shorthand == &kNotSpace) class_has_negated_shorthand_ = true;
      if (shorthand) set->insert(set->end(), shorthand->begin(), shorthand->end());
      else set->push_back({cp, cp});
      last_class_char_ = shorthand ? -1 : int64_t(cp);
      return nullptr;
    }
    if (shorthand) return cls(*shorthand);
    std::string ch;
    utf8::append(ch, cp);
    return lit(ch);
  }

  ExprPtr parse_class() {
    size_t at = pos_++;
    bool negated = more() && peek() == '^';
    if (negated) ++pos_;
    Ranges set;
    bool first = true;
    class_has_shorthand_ = class_has_negated_shorthand_ = false;
    while (true) {
      if (!more()) error(at, "unclosed character class");
      char c = peek();
      if (c == ']' && !first) break;
      first = false;
      int64_t lo;
      if (c == '\\') {
        parse_escape(true, &set);
        lo = last_class_char_;
        if (lo < 0) continue;
        set.pop_back();
      } else {
        if (c == '[' && pos_ + 1 < s_.size() && s_[pos_ + 1] == ':') error(pos_, "POSIX classes are not supported");
        lo = utf8::next(s_, pos_);
      }
      int64_t hi = lo;
      if (pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\\') {
          parse_escape(true, &set);
          hi = last_class_char_;
          if (hi < 0) error(at, "a class shorthand cannot end a range");
          set.pop_back();
        } else {
          hi = utf8::next(s_, pos_);
        }
        if (hi < lo) error(at, "character range is out of order");
      }
      set.push_back({uint32_t(lo), uint32_t(hi)});
    }
    ++pos_;
    if (!negated) return cls(std::move(set));
    // Python reads \d \w \s in a class as Unicode sets, so their complement
    // is only safe within ASCII; a negated shorthand there is refused.
    if (class_has_negated_shorthand_) error(at, "\\D, \\W or \\S inside a negated class is not supported");
    if (!class_has_shorthand_) return cls(std::move(set), true);
    Ranges ascii;
    for (const auto& r : complement_ranges(set))
      if (r.lo <= 0x7F) ascii.push_back({r.lo, std::min<uint32_t>(r.hi, 0x7F)});
    if (ascii.empty()) error(at, "the class matches no character");
    return cls(std::move(ascii));
  }

  std::string_view s_;
  size_t pos_ = 0;
  int64_t last_class_char_ = -1;
  bool class_has_shorthand_ = false, class_has_negated_shorthand_ = false;
};

}  // namespace

ExprPtr regex_to_expr(std::string_view pattern) { return RegexParser(pattern).parse(); }

Grammar regex_to_grammar(std::string_view pattern) {
  Grammar g;
  g.set("root", regex_to_expr(pattern));
  return g;
}

}  // namespace serval::grammar
