#include "tokenizer/jinja/parser.h"

#include <cstdlib>
#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja/lexer.h"

namespace serval::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().kind != TokenKind::Eof) error(cur(), str_cat("unexpected '", cur().text, "'"));
    return body;
  }

 private:
  static constexpr int kMaxDepth = 200;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;

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

  // ---- statements ----

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
      first += "." + take_name("an attribute name");
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

  // ---- expressions ----

  ExprPtr parse_tuple(bool with_condexpr) {
    const Token& at = cur();
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::Tuple, at);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().kind == TokenKind::BlockEnd || cur().kind == TokenKind::VarEnd || is_op(")")) break;
      t->args.push_back(parse_expression(with_condexpr));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const Token& at = next();
      auto c = make(Expr::Kind::Cond, at);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(expr));
      if (is_name("else")) {
        next();
        c->args.push_back(parse_condexpr());
      } else {
        c->args.push_back(nullptr);
      }
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto b = make(Expr::Kind::Binary, at);
    b->name = std::move(op);
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const Token& at = next();
      l = binary(at, "or", std::move(l), parse_and());
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const Token& at = next();
      l = binary(at, "and", std::move(l), parse_not());
    }
    return l;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto u = make(Expr::Kind::Unary, next());
      u->name = "not";
      u->args.push_back(parse_not());
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr l = parse_math1();
    while (true) {
      const Token& at = cur();
      std::string op;
      if (at.kind == TokenKind::Operator &&
          (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" || at.text == "<=" || at.text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return l;
      }
      l = binary(at, op, std::move(l), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      l = binary(at, at.text, std::move(l), parse_concat());
    }
    return l;
  }

  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const Token& at = next();
      l = binary(at, "~", std::move(l), parse_math2());
    }
    return l;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      l = binary(at, at.text, std::move(l), parse_pow());
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      l = binary(at, "**", std::move(l), parse_unary(true));
    }
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    // Nesting bound: a hostile template must not exhaust the stack.
    if (++depth_ > kMaxDepth) error(cur(), "expression nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto u = make(Expr::Kind::Unary, cur());
      u->name = next().text;
      u->args.push_back(parse_unary(false));
      node = std::move(u);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case TokenKind::Name: {
        next();
        auto e = make(Expr::Kind::Literal, t);
        if (t.text == "true" || t.text == "True") e->literal = Value(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value(None{});
        else {
          e->kind = Expr::Kind::Name;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::String: {
        std::string s;
        while (cur().kind == TokenKind::String) s += next().text;
        auto e = make(Expr::Kind::Literal, t);
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenKind::Integer: {
        next();
        auto e = make(Expr::Kind::Literal, t);
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) error(t, "integer literal out of range: " + t.text);
        e->literal = Value(static_cast<int64_t>(v));
        return e;
      }
      case TokenKind::Float: {
        next();
        auto e = make(Expr::Kind::Literal, t);
        e->literal = Value(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case TokenKind::Operator:
        if (t.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return make(Expr::Kind::Tuple, t);
          }
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          next();
          auto e = make(Expr::Kind::List, t);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(Expr::Kind::Dict, t);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    error(t, str_cat("unexpected ", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const Token& at = cur();
      if (is_op(".")) {
        next();
        if (cur().kind == TokenKind::Name) {
          auto e = make(Expr::Kind::GetAttr, at);
          e->name = next().text;
          e->args.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().kind == TokenKind::Integer) {
          auto e = make(Expr::Kind::GetItem, at);
          e->args.push_back(std::move(node));
          e->args.push_back(parse_primary());
          node = std::move(e);
        } else {
          error(cur(), str_cat("expected an attribute name after '.', got ", describe(cur())));
        }
      } else if (is_op("[")) {
        next();
        node = parse_subscript(at, std::move(node));
      } else if (is_op("(")) {
        auto e = make(Expr::Kind::Call, at);
        e->args.push_back(std::move(node));
        parse_call_args(*e);
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(const Token& at, ExprPtr node) {
    ExprPtr parts[3];
    int colons = 0;
    for (int i = 0; i < 3; ++i) {
      if (!is_op(":") && !is_op("]")) parts[i] = parse_expression(true);
      if (i < 2 && is_op(":")) {
        next();
        ++colons;
      } else {
        break;
      }
    }
    expect_op("]");
    if (colons == 0) {
      if (!parts[0]) error(at, "empty subscript");
      auto e = make(Expr::Kind::GetItem, at);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::Slice, at);
    e->args.push_back(std::move(node));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // '(' args ')' into e.args (after any already there) and e.kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (cur().kind == TokenKind::Name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error(cur(), "positional argument after a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      const Token& at = cur();
      if (is_op("|")) {
        next();
        auto f = make(Expr::Kind::Filter, at);
        f->name = take_name("a filter name");
        while (is_op(".")) {
          next();
          f->name += "." + take_name("a filter name");
        }
        f->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*f);
        node = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = make(Expr::Kind::Test, at);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->name = take_name("a test name");
        t->args.push_back(std::move(node));
        const Token& c = cur();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((c.kind == TokenKind::Name || c.kind == TokenKind::String || c.kind == TokenKind::Integer ||
                    c.kind == TokenKind::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) error(c, "you cannot chain multiple tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(t);
      } else if (is_op("(")) {
        auto e = make(Expr::Kind::Call, at);
        e->args.push_back(std::move(node));
        parse_call_args(*e);
        node = std::move(e);
      } else {
        return node;
      }
    }
  }
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse_all(); }

}  // namespace serval::jinja
