#pragma once
// Evaluator: renders a parsed template. Scoping follows jinja2: each for-loop
// iteration and each macro call gets its own frame, so {% set %} inside a
// loop does not leak out (templates use namespace() for that); if-blocks
// share the enclosing frame.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace serval::jinja {

class Evaluator {
 public:
  // `variables` are the template's globals (render(**variables)); the
  // builtins (range, namespace, dict, raise_exception, strftime_now) sit below.
  explicit Evaluator(const Value& variables);

  std::string render(const Body& body);
  Value eval(const Expr& e);
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  Value eval_inner(const Expr& e);
  Value eval_binary(const Expr& e);
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void assign_targets(const std::vector<std::string>& targets, const Value& v);
  Value make_macro(const Stmt& s);
  std::string capture(const Body& body);

  static constexpr int kMaxMacroDepth = 100;  // recursion bound for hostile templates
  std::vector<std::shared_ptr<Frame>> frames_;
  std::string* out_ = nullptr;
  int macro_depth_ = 0;
};

// Template-facing builtins, defined in filters.cpp / tests.cpp / methods.cpp.
using FilterFn = Value (*)(Evaluator&, const Value&, CallArgs&);
using TestFn = bool (*)(Evaluator&, const Value&, CallArgs&);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// The builtin globals: range, namespace, dict, raise_exception, strftime_now.
void add_builtin_globals(std::unordered_map<std::string, Value>& frame);
// obj.name for str/dict/list methods (a bound callable), else Undefined.
Value bound_method(const Value& obj, const std::string& name);

// Argument `index` (positional) or `name` (keyword) of a call, or `def`.
Value arg(const CallArgs& args, size_t index, const char* name, Value def = Value());
// Throws when the call has arguments beyond `max_positional` or keywords not in `names`.
void check_args(const CallArgs& args, const char* fn, size_t max_positional, std::initializer_list<const char*> names);

// Operators and element access with Python/jinja2 semantics (operators.cpp).
Value binary_op(const std::string& op, const Value& a, const Value& b);
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Throws the UndefinedError jinja2 raises when an undefined value is used.
[[noreturn]] void undefined_error(const Value& u);
bool contains(const Value& container, const Value& item);
// fmt % args with Python's printf-style rules (args: a tuple, a mapping, or one value).
std::string percent_format(const std::string& fmt, const Value& args);

}  // namespace serval::jinja
