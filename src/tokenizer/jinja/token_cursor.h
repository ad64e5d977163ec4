#pragma once
// TokenCursor: the token-stream helpers shared by the statement parser
// (parser.cpp) and the expression parser (expression_parser.cpp): look at the
// current token, take it, expect one, and build nodes that remember where
// they start.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace serval::jinja {

class TokenCursor {
 protected:
  TokenCursor(const std::vector<Token>& toks, size_t& pos) : toks_(toks), pos_(pos) {}

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  const Token& next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }

  [[noreturn]] static void error(const Token& t, const std::string& msg) {
    fail("chat template syntax error at ", where(t.line, t.column), ": ", msg);
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::Eof: return "end of template";
      case TokenKind::BlockEnd: return "end of statement block '%}'";
      case TokenKind::VarEnd: return "end of print statement '}}'";
      case TokenKind::String: return "a string";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op, size_t n = 0) const {
    const Token& t = peek(n);
    return t.kind == TokenKind::Operator && t.text == op;
  }
  bool is_name(const char* name, size_t n = 0) const {
    const Token& t = peek(n);
    return t.kind == TokenKind::Name && t.text == name;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur(), str_cat("expected '", op, "', got ", describe(cur())));
    next();
  }
  void expect_name(const char* name) {
    if (!is_name(name)) error(cur(), str_cat("expected '", name, "', got ", describe(cur())));
    next();
  }
  std::string take_name(const char* what) {
    if (cur().kind != TokenKind::Name) error(cur(), str_cat("expected ", what, ", got ", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd) error(cur(), str_cat("expected end of statement block, got ", describe(cur())));
    next();
  }

  static ExprPtr make(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  static StmtPtr make_stmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  const std::vector<Token>& toks_;
  size_t& pos_;
};

}  // namespace serval::jinja
