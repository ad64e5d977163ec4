#include "tokenizer/jinja/parser.h"

#include <cstdlib>
#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja/expression_parser.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/token_cursor.h"

namespace serval::jinja {

namespace {

struct TokenStore {
  std::vector<Token> toks;
  size_t pos = 0;
};

// Statements; expressions are parsed by expression_parser.cpp on the same tokens.
class Parser : TokenStore, TokenCursor {
 public:
  explicit Parser(std::vector<Token> tokens) : TokenStore{std::move(tokens)}, TokenCursor(toks, pos) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().kind != TokenKind::Eof) error(cur(), str_cat("unexpected '", cur().text, "'"));
    return body;
  }

 private:
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;

  ExprPtr parse_tuple(bool with_condexpr) { return parse_expression_at(toks, pos, with_condexpr, true); }
  ExprPtr parse_expression(bool with_condexpr) { return parse_expression_at(toks, pos, with_condexpr, false); }

  // Parses until a {% name %} with name in `ends` (left unconsumed after the '{%').
  Body parse_body(std::initializer_list<const char*> ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::Eof) {
        if (ends.size() != 0) {
          std::string names;
          for (const char* e : ends) names += std::string(names.empty() ? "'" : " or '") + e + "'";
          error(t, "unexpected end of template, expected " + names);
        }
        return body;
      }
      if (t.kind == TokenKind::Text) {
        auto s = make_stmt(Stmt::Kind::Text, t);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::VarBegin) {
        next();
        auto s = make_stmt(Stmt::Kind::Output, t);
        s->expr = parse_tuple(true);
        if (cur().kind != TokenKind::VarEnd) error(cur(), str_cat("expected '}}', got ", describe(cur())));
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::BlockBegin) {
        const Token& tag = peek();
        if (tag.kind != TokenKind::Name) error(tag, str_cat("expected a tag name, got ", describe(tag)));
        for (const char* e : ends)
          if (tag.text == e) {
            next();  // '{%'; the caller consumes the name
            return body;
          }
        next();
        body.push_back(parse_statement());
      } else {
        error(t, str_cat("unexpected ", describe(t)));
      }
    }
  }

  StmtPtr parse_statement() {
    if (++depth_ > kMaxDepth) error(cur(), "blocks nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    const Token& tag = cur();
    std::string name = tag.text;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "break" || name == "continue") {
      next();
      expect_block_end();
      return make_stmt(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, tag);
    }
    if (name == "generation" || name == "filter") {
      next();
      auto s = make_stmt(Stmt::Kind::Block, tag);
      if (name == "filter") s->text = take_name("a filter name");
      expect_block_end();
      s->bodies.push_back(parse_body({name == "filter" ? "endfilter" : "endgeneration"}));
      next();
      expect_block_end();
      return s;
    }
    error(tag, str_cat("unknown or unsupported tag '", name, "'"));
  }

  StmtPtr parse_if() {
    auto s = make_stmt(Stmt::Kind::If, next());
    s->conditions.push_back(parse_tuple(true));
    expect_block_end();
    while (true) {
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      std::string tag = next().text;
      if (tag == "elif") {
        s->conditions.push_back(parse_tuple(true));
        expect_block_end();
        continue;
      }
      if (tag == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"});
        next();
      }
      expect_block_end();
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> targets;
    bool paren = is_op("(");
    if (paren) next();
    targets.push_back(take_name("a variable name"));
    while (is_op(",")) {
      next();
      targets.push_back(take_name("a variable name"));
    }
    if (paren) expect_op(")");
    return targets;
  }

  StmtPtr parse_for() {
    auto s = make_stmt(Stmt::Kind::For, next());
    s->targets = parse_targets();
    expect_name("in");
    s->expr = parse_tuple(false);
    if (is_name("if")) {
      next();
      s->cond = parse_expression(true);
    }
    if (is_name("recursive")) error(cur(), "recursive for loops are not supported");
    expect_block_end();
    s->bodies.push_back(parse_body({"else", "endfor"}));
    if (next().text == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    const Token& at = next();
    std::string first = take_name("a variable name");
    if (is_op(".")) {  // ns.attr = value
      next();
      first += '.';  // not "." + take_name(): GCC 12 warns (-Wrestrict) on a literal + temporary
      first += take_name("an attribute name");
      auto s = make_stmt(Stmt::Kind::Set, at);
      s->targets.push_back(first);
      expect_op("=");
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    std::vector<std::string> targets{first};
    while (is_op(",")) {
      next();
      targets.push_back(take_name("a variable name"));
    }
    if (cur().kind == TokenKind::BlockEnd && targets.size() == 1) {  // {% set x %}...{% endset %}
      next();
      auto s = make_stmt(Stmt::Kind::SetBlock, at);
      s->targets = targets;
      s->bodies.push_back(parse_body({"endset"}));
      next();
      expect_block_end();
      return s;
    }
    auto s = make_stmt(Stmt::Kind::Set, at);
    s->targets = targets;
    expect_op("=");
    s->expr = parse_tuple(true);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(Stmt::Kind::Macro, next());
    s->text = take_name("a macro name");
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string param = take_name("a parameter name");
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression(true);
      }
      s->params.emplace_back(param, std::move(def));
    }
    next();
    expect_block_end();
    s->bodies.push_back(parse_body({"endmacro"}));
    next();
    if (cur().kind == TokenKind::Name) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse_all(); }

}  // namespace serval::jinja
