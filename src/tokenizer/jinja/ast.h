#pragma once
// The parsed form of a Jinja template: expressions and statements. Each node
// keeps the line/column where it starts so runtime errors can point at it.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace serval::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // literal
    Name,      // name
    List,      // args = items
    Tuple,     // args = items
    Dict,      // kwargs-like: args = key0, value0, key1, value1 ...
    GetAttr,   // args[0].name
    GetItem,   // args[0][args[1]]
    Slice,     // args[0][args[1]:args[2]:args[3]] (null parts omitted)
    Call,      // args[0](args[1..], kwargs)
    Filter,    // args[0] | name(args[1..], kwargs)
    Test,      // args[0] is [not] name(args[1..])
    Unary,     // name in {"not", "-", "+"}; args[0]
    Binary,    // args[0] name args[1]; name is an operator, "and", "or", "in", "not in"
    Cond,      // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0, column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // conditions[i] -> bodies[i]; else_body
    For,       // for targets in expr [if cond]: bodies[0]; else_body
    Set,       // targets (name or "ns.attr") = expr
    SetBlock,  // {% set targets[0] %} bodies[0] {% endset %}
    Macro,     // name(params with defaults) bodies[0]
    Break,
    Continue,
    Block,     // bodies[0] rendered in place ({% generation %}, {% filter %} with name = filter)
  };
  Kind kind;
  int line = 0, column = 0;
  std::string text;                 // Text; Macro / Block name
  ExprPtr expr;                     // Output value, For iterable, Set value
  ExprPtr cond;                     // For filter
  std::vector<std::string> targets;  // For/Set targets
  std::vector<ExprPtr> conditions;  // If
  std::vector<Body> bodies;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters (default may be null)
};

}  // namespace serval::jinja
