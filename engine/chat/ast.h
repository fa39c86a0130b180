// The syntax tree of the Jinja2 subset (engine/chat/jinja.h): built by parser.cc, walked by
// interpreter.cc. Internal to engine/chat. Immutable after parsing; shared read-only by renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/value.h"

namespace pd::chat::internal {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: items
    kTuple,    // children: items
    kDict,     // children: key, value, key, value, ...
    kGetAttr,  // children[0].name
    kGetItem,  // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]], each bound may be null
    kCall,     // children[0](children[1..], kwargs)
    kFilter,   // children[0] | name(children[1..], kwargs); children[0] null in filter blocks
    kTest,     // children[0] is [not] name(children[1..], kwargs)
    kNeg,      // -children[0]
    kPos,      // +children[0]
    kNot,      // not children[0]
    kAnd,      // children[0] and children[1]
    kOr,       // children[0] or children[1]
    kBinary,   // children[0] op children[1]; op in name: + - * / // % **
    kConcat,   // children joined with ~
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ...
    kCond,     // children[1] if children[0] else children[2] (null: undefined)
  };

  Kind kind = Kind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: == != < <= > >= in notin
  bool negated = false;          // kTest: `is not`
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body) ..., else_body
    kFor,          // for targets in expr [if filter] body [else else_body]
    kSet,          // set targets = expr, or set targets[0].attr = expr
    kSetBlock,     // {% set targets[0] [| filter] %}body{% endset %}
    kMacro,        // {% macro name(params) %}body{% endmacro %}
    kBreak,        // {% break %}
    kContinue,     // {% continue %}
    kFilterBlock,  // {% filter expr %}body{% endfilter %}; expr is a kFilter chain
  };

  Kind kind = Kind::kText;
  int line = 0;
  int column = 0;
  std::string text;  // kText: the text; kMacro: the name
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, StmtList>> branches;
  StmtList body;
  StmtList else_body;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace attribute
  ExprPtr filter;    // kFor: the loop filter; kSetBlock: filters applied to the body (or null)
  bool recursive = false;
  std::vector<std::string> params;  // kMacro
  std::vector<ExprPtr> defaults;    // kMacro: one per param, null when none
};

}  // namespace pd::chat::internal
