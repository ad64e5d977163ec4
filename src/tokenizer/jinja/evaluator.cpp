#include "tokenizer/jinja/evaluator.h"

#include "core/error.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/lexer.h"

namespace serval::jinja {

Value arg(const CallArgs& args, size_t index, const char* name, Value def) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [k, v] : args.keywords)
    if (k == name) return v;
  return def;
}

void check_args(const CallArgs& args, const char* fn, size_t max_positional, std::initializer_list<const char*> names) {
  if (args.positional.size() > max_positional)
    fail(fn, "() takes at most ", max_positional, " positional argument", max_positional == 1 ? "" : "s", " (",
         args.positional.size(), " given)");
  for (const auto& kw : args.keywords) {
    bool known = false;
    for (const char* n : names) known = known || kw.first == n;
    if (!known) fail(fn, "() got an unexpected keyword argument '", kw.first, "'");
  }
}

namespace {

// Rethrows any failure inside a node as a TemplateRuntimeError naming the
// node's position; raise_exception() messages and already-positioned errors
// pass through unchanged.
template <typename F>
auto at_position(int line, int column, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const TemplateRaisedError&) {
    throw;
  } catch (const TemplateRuntimeError&) {
    throw;
  } catch (const std::exception& e) {
    throw TemplateRuntimeError(str_cat("chat template error at ", where(line, column), ": ", e.what()));
  }
}

}  // namespace

Evaluator::Evaluator(const Value& variables) {
  auto builtins = std::make_shared<Frame>();
  add_builtin_globals(*builtins);
  auto globals = std::make_shared<Frame>();
  if (variables.is_object())
    for (const auto& [k, v] : variables.as_object().items) (*globals)[k] = v;
  frames_ = {builtins, globals};
}

std::string Evaluator::render(const Body& body) { return capture(body); }

std::string Evaluator::capture(const Body& body) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_body(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Value Evaluator::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto hit = (*it)->find(name);
    if (hit != (*it)->end()) return hit->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Evaluator::assign(const std::string& name, Value v) { (*frames_.back())[name] = std::move(v); }

void Evaluator::assign_targets(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    assign(targets[0], v);
    return;
  }
  Array items = v.iterate();
  if (items.size() != targets.size())
    fail(items.size() < targets.size() ? "not enough" : "too many", " values to unpack (expected ", targets.size(),
         ", got ", items.size(), ")");
  for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
}

Evaluator::Flow Evaluator::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec(const Stmt& s) {
  return at_position(s.line, s.column, [&]() -> Flow {
    switch (s.kind) {
      case Stmt::Kind::Text: *out_ += s.text; return Flow::Normal;
      case Stmt::Kind::Output: *out_ += eval(*s.expr).str(); return Flow::Normal;
      case Stmt::Kind::If:
        for (size_t i = 0; i < s.conditions.size(); ++i)
          if (eval(*s.conditions[i]).truthy()) return exec_body(s.bodies[i]);
        return exec_body(s.else_body);
      case Stmt::Kind::For: return exec_for(s);
      case Stmt::Kind::Set: exec_set(s); return Flow::Normal;
      case Stmt::Kind::SetBlock: assign(s.targets[0], Value(capture(s.bodies[0]))); return Flow::Normal;
      case Stmt::Kind::Macro: assign(s.text, make_macro(s)); return Flow::Normal;
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Block: {
        if (s.text.empty()) return exec_body(s.bodies[0]);
        CallArgs none;
        *out_ += apply_filter(s.text, Value(capture(s.bodies[0])), none).str();
        return Flow::Normal;
      }
    }
    return Flow::Normal;
  });
}

void Evaluator::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  const std::string& target = s.targets[0];
  size_t dot = target.find('.');
  if (dot == std::string::npos) {
    assign_targets(s.targets, v);
    return;
  }
  Value ns = lookup(target.substr(0, dot));
  if (!ns.is_object() || !ns.as_object().is_namespace)
    fail("cannot assign attribute on non-namespace object '", target.substr(0, dot), "'");
  ns.as_object().set(target.substr(dot + 1), std::move(v));
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s) {
  Value iterable = eval(*s.expr);
  if (iterable.is_none()) fail("'NoneType' object is not iterable");
  Array items = iterable.iterate();
  if (s.cond) {
    Array kept;
    for (auto& item : items) {
      frames_.push_back(std::make_shared<Frame>());
      try {
        assign_targets(s.targets, item);
        if (eval(*s.cond).truthy()) kept.push_back(item);
      } catch (...) {
        frames_.pop_back();
        throw;
      }
      frames_.pop_back();
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body) == Flow::Break ? Flow::Break : Flow::Normal;
  const size_t n = items.size();
  for (size_t i = 0; i < n; ++i) {
    auto loop = std::make_shared<Object>();
    loop->set("index", Value(i + 1));
    loop->set("index0", Value(i));
    loop->set("revindex", Value(n - i));
    loop->set("revindex0", Value(n - i - 1));
    loop->set("first", Value(i == 0));
    loop->set("last", Value(i + 1 == n));
    loop->set("length", Value(n));
    loop->set("depth", Value(1));
    loop->set("depth0", Value(0));
    loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    loop->set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    loop->set("cycle", Value(Callable{"loop.cycle", [i](CallArgs& a) -> Value {
                                        if (a.positional.empty()) fail("no items for cycling given");
                                        return a.positional[i % a.positional.size()];
                                      }}));
    frames_.push_back(std::make_shared<Frame>());
    Flow f;
    try {
      assign("loop", Value(loop));
      assign_targets(s.targets, items[i]);
      f = exec_body(s.bodies[0]);
    } catch (...) {
      frames_.pop_back();
      throw;
    }
    frames_.pop_back();
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Evaluator::make_macro(const Stmt& s) {
  const Stmt* stmt = &s;
  return Value(Callable{s.text, [this, stmt](CallArgs& args) -> Value {
                          if (args.positional.size() > stmt->params.size())
                            fail("macro '", stmt->text, "' takes not more than ", stmt->params.size(), " argument(s)");
                          if (macro_depth_ >= kMaxMacroDepth)
                            fail("macro '", stmt->text, "' nested more than ", kMaxMacroDepth, " calls deep");
                          ++macro_depth_;
                          struct Leave {
                            int& d;
                            ~Leave() { --d; }
                          } leave{macro_depth_};
                          std::vector<std::shared_ptr<Frame>> saved = frames_;
                          frames_ = {saved[0], saved[1], std::make_shared<Frame>()};
                          try {
                            for (const auto& kw : args.keywords) {
                              bool known = false;
                              for (const auto& p : stmt->params) known = known || p.first == kw.first;
                              if (!known) fail("macro '", stmt->text, "' takes no keyword argument '", kw.first, "'");
                            }
                            for (size_t i = 0; i < stmt->params.size(); ++i) {
                              const auto& [name, def] = stmt->params[i];
                              Value v = arg(args, i, name.c_str(), Value::undefined("'" + name + "' is undefined"));
                              if (v.is_undefined() && def) v = eval(*def);
                              assign(name, v);
                            }
                            std::string text = capture(stmt->bodies[0]);
                            frames_ = saved;
                            return Value(text);
                          } catch (...) {
                            frames_ = saved;
                            throw;
                          }
                        }});
}

Value Evaluator::eval(const Expr& e) {
  return at_position(e.line, e.column, [&] { return eval_inner(e); });
}

Value Evaluator::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (!callee.is_callable()) fail("'", callee.type_name(), "' object is not callable");
  return callee.as_callable().fn(args);
}

Value Evaluator::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) fail("no filter named '", name, "'");
  return f(*this, input, args);
}

bool Evaluator::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) fail("no test named '", name, "'");
  return t(*this, input, args);
}

Value Evaluator::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  Value a = eval(*e.args[0]);
  if (op == "and") return a.truthy() ? eval(*e.args[1]) : a;
  if (op == "or") return a.truthy() ? a : eval(*e.args[1]);
  return binary_op(op, a, eval(*e.args[1]));
}

Value Evaluator::eval_inner(const Expr& e) {
  auto eval_args = [&](size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) args.keywords.emplace_back(k, eval(*v));
    return args;
  };
  switch (e.kind) {
    case Expr::Kind::Literal: return e.literal;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      Array items;
      for (const auto& a : e.args) items.push_back(eval(*a));
      return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
    }
    case Expr::Kind::Dict: {
      auto o = std::make_shared<Object>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        o->set(k.is_string() ? k.as_string() : k.str(), eval(*e.args[i + 1]));
      }
      return Value(o);
    }
    case Expr::Kind::GetAttr: return get_attr(eval(*e.args[0]), e.name);
    case Expr::Kind::GetItem: return get_item(eval(*e.args[0]), eval(*e.args[1]));
    case Expr::Kind::Slice: {
      auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value(None{}); };
      return slice(eval(*e.args[0]), part(1), part(2), part(3));
    }
    case Expr::Kind::Call: {
      Value callee = eval(*e.args[0]);
      CallArgs args = eval_args(1);
      return call(callee, args);
    }
    case Expr::Kind::Filter: {
      Value input = eval(*e.args[0]);
      CallArgs args = eval_args(1);
      return apply_filter(e.name, input, args);
    }
    case Expr::Kind::Test: {
      Value input = eval(*e.args[0]);
      CallArgs args = eval_args(1);
      return Value(apply_test(e.name, input, args) != e.negated);
    }
    case Expr::Kind::Unary: {
      Value v = eval(*e.args[0]);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) fail("bad operand type for unary ", e.name, ": '", v.type_name(), "'");
      if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
      return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
    }
    case Expr::Kind::Binary: return eval_binary(e);
    case Expr::Kind::Cond:
      if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
  }
  return Value();
}

}  // namespace serval::jinja
