#include "tokenizer/jinja/expression_parser.h"

#include <cerrno>
#include <cstdlib>

#include "tokenizer/jinja/token_cursor.h"

namespace serval::jinja {

namespace {

class ExpressionParser : TokenCursor {
 public:
  ExpressionParser(const std::vector<Token>& toks, size_t& pos) : TokenCursor(toks, pos) {}

 private:
  static constexpr int kMaxDepth = 200;  // nesting bound: a hostile template must not exhaust the stack
  int depth_ = 0;

 public:

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

  // One left-associative level: `operand`s joined while `at_op` sees one of
  // the level's operators (its token's text names the operation).
  template <typename Operand, typename AtOp>
  ExprPtr left_assoc(Operand operand, AtOp at_op) {
    ExprPtr l = operand();
    while (at_op()) {
      const Token& at = next();
      l = binary(at, at.text, std::move(l), operand());
    }
    return l;
  }

  ExprPtr parse_or() {
    return left_assoc([&] { return parse_and(); }, [&] { return is_name("or"); });
  }

  ExprPtr parse_and() {
    return left_assoc([&] { return parse_not(); }, [&] { return is_name("and"); });
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
    return left_assoc([&] { return parse_concat(); }, [&] { return is_op("+") || is_op("-"); });
  }

  ExprPtr parse_concat() {
    return left_assoc([&] { return parse_math2(); }, [&] { return is_op("~"); });
  }

  ExprPtr parse_math2() {
    return left_assoc([&] { return parse_pow(); },
                      [&] { return is_op("*") || is_op("/") || is_op("//") || is_op("%"); });
  }

  ExprPtr parse_pow() {
    return left_assoc([&] { return parse_unary(true); }, [&] { return is_op("**"); });
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
          f->name += '.';  // not "." + take_name(): GCC 12 warns (-Wrestrict) on a literal + temporary
          f->name += take_name("a filter name");
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

ExprPtr parse_expression_at(const std::vector<Token>& toks, size_t& pos, bool with_condexpr, bool tuple) {
  ExpressionParser p(toks, pos);
  return tuple ? p.parse_tuple(with_condexpr) : p.parse_expression(with_condexpr);
}

}  // namespace serval::jinja
