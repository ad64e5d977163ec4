#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace serval::jinja {

std::string where(int line, int column) { return str_cat("line ", line, ", column ", column); }

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (static_cast<unsigned char>(c) >= 0x80);
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal body, as jinja2 does.
std::string unescape(const std::string& body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        bool ok = i + n < body.size();
        for (size_t k = 1; ok && k <= n; ++k) {
          int h = hex_value(body[i + k]);
          if (h < 0) ok = false;
          else cp = cp * 16 + static_cast<uint32_t>(h);
        }
        if (!ok) fail("truncated \\", e, " escape in a string literal");
        utf8::append(out, cp);
        i += n;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          utf8::append(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t start = find_tag(pos);
      std::string text = src_.substr(pos, start - pos);
      if (start == src_.size()) {
        emit_text(text, pos);
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (mod == '-') {
        text.erase(std::find_if(text.rbegin(), text.rend(), [](char c) { return !is_space(c); }).base(), text.end());
      } else if (mod != '+' && kind != '{') {
        lstrip(text, pos);
      }
      emit_text(text, pos);
      size_t inner = start + 2 + ((mod == '-' || (mod == '+' && kind != '{')) ? 1 : 0);
      if (kind == '#') {
        pos = end_comment(start, inner);
      } else if (kind == '{') {
        add(TokenKind::VarBegin, "{{", start);
        pos = lex_expression(inner, '}');
      } else if (is_raw(inner)) {
        pos = lex_raw(start, inner);
      } else {
        add(TokenKind::BlockBegin, "{%", start);
        pos = lex_expression(inner, '%');
      }
    }
    add(TokenKind::Eof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<size_t> line_starts_{0};
  std::vector<Token> tokens_;

  void position(size_t offset, int& line, int& col) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    line = static_cast<int>(it - line_starts_.begin());
    col = static_cast<int>(offset - *(it - 1)) + 1;
  }

  [[noreturn]] void error(size_t offset, const std::string& msg) const {
    int line, col;
    position(offset, line, col);
    fail("chat template syntax error at ", where(line, col), ": ", msg);
  }

  void add(TokenKind kind, std::string text, size_t offset) {
    Token t{kind, std::move(text)};
    position(offset, t.line, t.column);
    tokens_.push_back(std::move(t));
  }

  void emit_text(const std::string& text, size_t offset) {
    if (!text.empty()) add(TokenKind::Text, text, offset);
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between the line start and a block tag go.
  void lstrip(std::string& text, size_t text_offset) const {
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    bool line_starting = text_offset == 0 || src_[text_offset - 1] == '\n';
    if (l_pos == 0 && !line_starting) return;
    for (size_t i = l_pos; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return;
    text.erase(l_pos);
  }

  // After a block or comment end: "-" strips all whitespace, else trim_blocks
  // drops one newline.
  size_t after_tag_end(size_t pos, bool minus) const {
    if (minus) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t end_comment(size_t start, size_t inner) const {
    size_t end = src_.find("#}", inner);
    if (end == std::string::npos) error(start, "unterminated comment (missing #})");
    bool minus = end > inner && src_[end - 1] == '-';
    return after_tag_end(end + 2, minus);
  }

  size_t skip_spaces(size_t pos) const {
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    return pos;
  }

  bool is_raw(size_t inner) const {
    size_t p = skip_spaces(inner);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p = skip_spaces(p + 3);
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  size_t lex_raw(size_t start, size_t inner) {
    size_t p = skip_spaces(inner) + 3;
    p = skip_spaces(p);
    bool minus = src_[p] == '-';
    size_t body = after_tag_end(p + (minus ? 3 : 2), minus);
    // Find {%[-+]? endraw [-]?%}
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 2)) {
      size_t q = i + 2;
      bool strip_before = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      q = skip_spaces(q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_spaces(q + 6);
      bool strip_after = q < src_.size() && src_[q] == '-';
      if (strip_after) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(body, i - body);
      if (strip_before)
        text.erase(std::find_if(text.rbegin(), text.rend(), [](char c) { return !is_space(c); }).base(), text.end());
      emit_text(text, body);
      return after_tag_end(q + 2, strip_after);
    }
    error(start, "unterminated {% raw %} block (missing {% endraw %})");
  }

  // Tokens up to the closing "}}" (close == '}') or "%}" (close == '%').
  size_t lex_expression(size_t pos, char close) {
    int depth = 0;
    while (true) {
      pos = skip_spaces(pos);
      if (pos >= src_.size()) error(pos, close == '}' ? "unexpected end of template, expected '}}'"
                                                      : "unexpected end of template, expected '%}'");
      char c = src_[pos];
      bool minus_end = c == '-' && src_.compare(pos + 1, 2, std::string(1, close) + "}") == 0;
      if (depth == 0 && (minus_end || (c == close && pos + 1 < src_.size() && src_[pos + 1] == '}'))) {
        size_t end = pos + (minus_end ? 3 : 2);
        if (close == '}') {
          add(TokenKind::VarEnd, "}}", pos);
          return minus_end ? after_tag_end(end, true) : end;
        }
        add(TokenKind::BlockEnd, "%}", pos);
        return after_tag_end(end, minus_end);
      }
      if (c == '\'' || c == '"') {
        size_t p = pos + 1;
        while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
        if (p >= src_.size()) error(pos, "unterminated string literal");
        std::string body = src_.substr(pos + 1, p - pos - 1);
        std::string value;
        try {
          value = unescape(body);
        } catch (const Error& e) {
          error(pos, e.what());
        }
        add(TokenKind::String, value, pos);
        pos = p + 1;
      } else if (is_digit(c)) {
        size_t p = pos;
        while (p < src_.size() && (is_digit(src_[p]) || src_[p] == '_')) ++p;
        bool is_float = false;
        if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
          is_float = true;
          ++p;
          while (p < src_.size() && (is_digit(src_[p]) || src_[p] == '_')) ++p;
        }
        if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && is_digit(src_[q])) {
            is_float = true;
            p = q;
            while (p < src_.size() && is_digit(src_[p])) ++p;
          }
        }
        std::string num = src_.substr(pos, p - pos);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        add(is_float ? TokenKind::Float : TokenKind::Integer, num, pos);
        pos = p;
      } else if (is_name_start(c)) {
        size_t p = pos;
        while (p < src_.size() && is_name_char(src_[p])) ++p;
        add(TokenKind::Name, src_.substr(pos, p - pos), pos);
        pos = p;
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(pos, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-*/%~[](){}<>=.:|,;", c)) error(pos, str_cat("unexpected character '", c, "'"));
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        add(TokenKind::Operator, op, pos);
        pos += op.size();
      }
    }
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  // jinja2 normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace serval::jinja
