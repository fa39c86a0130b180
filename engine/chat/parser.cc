#include "engine/chat/parser.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "engine/chat/builtins.h"

namespace pd::chat::internal {
namespace {

bool IsReserved(absl::string_view name) {
  return name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
         name == "None";
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth)
      : tokens_(std::move(tokens)), max_depth_(max_depth) {}

  absl::StatusOr<StmtList> Run() {
    std::string which;
    PD_ASSIGN_OR_RETURN(StmtList body, ParseBody({}, &which));
    return body;
  }

 private:
  // Counts nesting; every recursive path of the parser goes through one.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) { ++p_->depth_; }
    ~DepthGuard() { --p_->depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser* p_;
  };

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) {
      ++pos_;
    }
  }
  bool IsOp(absl::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(absl::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool SkipOp(absl::string_view op) {
    if (IsOp(op)) {
      Next();
      return true;
    }
    return false;
  }
  bool SkipName(absl::string_view name) {
    if (IsName(name)) {
      Next();
      return true;
    }
    return false;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText:
        return "template data";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kEnd:
        return "end of template";
      case TokenType::kString:
        return "string";
      default:
        return absl::StrCat("'", t.value, "'");
    }
  }

  absl::Status Fail(const Token& at, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", at.line, ", column ", at.column, ": ", what));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return Fail(Cur(), absl::StrCat("expected ", expected, ", got ", Describe(Cur())));
  }
  absl::Status CheckDepth() const {
    if (depth_ > max_depth_) {
      return Fail(Cur(), absl::StrCat("template nested deeper than ", max_depth_, " levels"));
    }
    return absl::OkStatus();
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) {
      return Unexpected(absl::StrCat("'", op, "'"));
    }
    return absl::OkStatus();
  }
  absl::Status Expect(TokenType type, absl::string_view what) {
    if (Cur().type != type) {
      return Unexpected(what);
    }
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() { return Expect(TokenType::kBlockEnd, "end of statement block"); }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) {
      return Unexpected("a name");
    }
    std::string name = Cur().value;
    Next();
    return name;
  }

  ExprPtr NewExpr(Expr::Kind kind, const Token& at) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  ExprPtr Binary(Expr::Kind kind, const Token& at, ExprPtr a, ExprPtr b, std::string op = "") {
    ExprPtr e = NewExpr(kind, at);
    e->name = std::move(op);
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  // ---- statements ---------------------------------------------------------------------------

  // Statements up to a block whose keyword is one of `ends` (consumed, name in *which, the
  // block's end left to the caller), or to the end of the template when `ends` is empty.
  absl::StatusOr<StmtList> ParseBody(std::initializer_list<absl::string_view> ends,
                                     std::string* which) {
    DepthGuard guard(this);
    PD_RETURN_IF_ERROR(CheckDepth());
    StmtList body;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kText: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kText;
          s->text = t.value;
          body.push_back(std::move(s));
          Next();
          break;
        }
        case TokenType::kVarBegin: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kOutput;
          s->line = t.line;
          s->column = t.column;
          Next();
          PD_ASSIGN_OR_RETURN(s->expr, ParseTuple(true, {}));
          PD_RETURN_IF_ERROR(Expect(TokenType::kVarEnd, "end of print statement"));
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& name = Peek(1);
          if (name.type == TokenType::kName) {
            for (absl::string_view end : ends) {
              if (name.value == end) {
                *which = name.value;
                Next();
                Next();
                return body;
              }
            }
          }
          Next();
          PD_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kEnd:
          if (ends.size() != 0) {
            std::vector<std::string> quoted;
            for (absl::string_view e : ends) {
              quoted.push_back(absl::StrCat("'", e, "'"));
            }
            return Fail(t, absl::StrCat("unexpected end of template, expected ",
                                        absl::StrJoin(quoted, " or ")));
          }
          return body;
        default:
          return Fail(t, absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    const Token at = Cur();
    if (at.type != TokenType::kName) {
      return Fail(at, "tag name expected");
    }
    auto s = std::make_unique<Stmt>();
    s->line = at.line;
    s->column = at.column;
    const std::string keyword = at.value;
    Next();
    if (keyword == "if") {
      PD_RETURN_IF_ERROR(ParseIf(s.get()));
    } else if (keyword == "for") {
      PD_RETURN_IF_ERROR(ParseFor(s.get()));
    } else if (keyword == "set") {
      PD_RETURN_IF_ERROR(ParseSet(s.get()));
    } else if (keyword == "macro") {
      PD_RETURN_IF_ERROR(ParseMacro(s.get()));
    } else if (keyword == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      PD_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr));
      PD_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string which;
      PD_ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}, &which));
      PD_RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (keyword == "break" || keyword == "continue") {
      if (loop_depth_ == 0) {
        return Fail(at, absl::StrCat("'", keyword, "' outside of a for loop"));
      }
      s->kind = keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      PD_RETURN_IF_ERROR(ExpectBlockEnd());
    } else {
      return Fail(at, absl::StrCat("unknown or unsupported tag '", keyword, "'"));
    }
    return s;
  }

  absl::Status ParseIf(Stmt* s) {
    s->kind = Stmt::Kind::kIf;
    std::string which = "if";
    while (true) {
      PD_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, {}));
      PD_RETURN_IF_ERROR(ExpectBlockEnd());
      PD_ASSIGN_OR_RETURN(StmtList body, ParseBody({"elif", "else", "endif"}, &which));
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (which == "elif") {
        continue;
      }
      if (which == "else") {
        PD_RETURN_IF_ERROR(ExpectBlockEnd());
        PD_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &which));
      }
      return ExpectBlockEnd();
    }
  }

  // Assignment targets: name, or names separated by commas (optionally in parentheses).
  absl::Status ParseTargets(std::vector<std::string>* targets) {
    const bool paren = SkipOp("(");
    while (true) {
      PD_ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (IsReserved(name)) {
        return Fail(Cur(), absl::StrCat("cannot assign to '", name, "'"));
      }
      targets->push_back(std::move(name));
      if (!SkipOp(",")) {
        break;
      }
      if (Cur().type != TokenType::kName) {
        break;  // trailing comma
      }
    }
    if (paren) {
      PD_RETURN_IF_ERROR(ExpectOp(")"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseFor(Stmt* s) {
    s->kind = Stmt::Kind::kFor;
    PD_RETURN_IF_ERROR(ParseTargets(&s->targets));
    if (!SkipName("in")) {
      return Unexpected("'in'");
    }
    PD_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, {"recursive"}, /*with_condexpr=*/false));
    if (SkipName("if")) {
      PD_ASSIGN_OR_RETURN(s->filter, ParseExpression());
    }
    if (SkipName("recursive")) {
      return Fail(Cur(), "recursive for loops are not supported");
    }
    PD_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string which;
    ++loop_depth_;
    absl::StatusOr<StmtList> body = ParseBody({"endfor", "else"}, &which);
    --loop_depth_;
    if (!body.ok()) {
      return body.status();
    }
    s->body = *std::move(body);
    if (which == "else") {
      PD_RETURN_IF_ERROR(ExpectBlockEnd());
      // break/continue in the else branch belong to an enclosing loop, if any.
      PD_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &which));
    }
    return ExpectBlockEnd();
  }

  absl::Status ParseSet(Stmt* s) {
    s->kind = Stmt::Kind::kSet;
    if (Cur().type == TokenType::kName && Peek(1).type == TokenType::kOperator &&
        Peek(1).value == "." && Peek(2).type == TokenType::kName) {
      s->targets.push_back(Cur().value);
      s->attr = Peek(2).value;
      Next();
      Next();
      Next();
    } else {
      PD_RETURN_IF_ERROR(ParseTargets(&s->targets));
    }
    if (SkipOp("=")) {
      PD_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, {}));
      return ExpectBlockEnd();
    }
    if (!s->attr.empty() || s->targets.size() != 1) {
      return Unexpected("'='");
    }
    s->kind = Stmt::Kind::kSetBlock;
    if (IsOp("|")) {
      PD_ASSIGN_OR_RETURN(s->filter, ParseFilterChain(nullptr));
    }
    PD_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string which;
    PD_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &which));
    return ExpectBlockEnd();
  }

  absl::Status ParseMacro(Stmt* s) {
    s->kind = Stmt::Kind::kMacro;
    PD_ASSIGN_OR_RETURN(s->text, ExpectName());
    PD_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s->params.empty()) {
        PD_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) {
          break;
        }
      }
      PD_ASSIGN_OR_RETURN(std::string param, ExpectName());
      s->params.push_back(std::move(param));
      ExprPtr def;
      if (SkipOp("=")) {
        PD_ASSIGN_OR_RETURN(def, ParseExpression());
      } else if (!s->defaults.empty() && s->defaults.back() != nullptr) {
        return Fail(Cur(), "non-default argument follows default argument");
      }
      s->defaults.push_back(std::move(def));
    }
    Next();
    PD_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string which;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;  // a loop around the definition does not make break valid inside
    absl::StatusOr<StmtList> body = ParseBody({"endmacro"}, &which);
    loop_depth_ = saved_loops;
    if (!body.ok()) {
      return body.status();
    }
    s->body = *std::move(body);
    if (Cur().type == TokenType::kName && Cur().value == s->text) {
      Next();  // {% endmacro name %}
    }
    return ExpectBlockEnd();
  }

  // ---- expressions --------------------------------------------------------------------------

  bool IsTupleEnd(std::initializer_list<absl::string_view> extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd ||
        t.type == TokenType::kEnd || (t.type == TokenType::kOperator && t.value == ")")) {
      return true;
    }
    if (t.type == TokenType::kName) {
      for (absl::string_view e : extra_end) {
        if (t.value == e) {
          return true;
        }
      }
      // The loop filter ends the iterable of a for loop.
      if (extra_end.size() != 0 && t.value == "if") {
        return true;
      }
    }
    return false;
  }

  // Expressions separated by commas form a tuple; one without a comma is itself.
  absl::StatusOr<ExprPtr> ParseTuple(bool explicit_parens,
                                     std::initializer_list<absl::string_view> extra_end,
                                     bool with_condexpr = true) {
    const Token at = Cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        PD_RETURN_IF_ERROR(ExpectOp(","));
      }
      if (IsTupleEnd(extra_end)) {
        break;
      }
      PD_ASSIGN_OR_RETURN(ExprPtr e, with_condexpr ? ParseExpression() : ParseOr());
      items.push_back(std::move(e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) {
        return std::move(items[0]);
      }
      if (!explicit_parens) {
        return Unexpected("an expression");
      }
    }
    ExprPtr t = NewExpr(Expr::Kind::kTuple, at);
    t->children = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    const Token at = Cur();
    PD_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (SkipName("if")) {
      PD_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        PD_ASSIGN_OR_RETURN(otherwise, ParseExpression());
      }
      ExprPtr c = NewExpr(Expr::Kind::kCond, at);
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(expr));
      c->children.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const Token at = Cur();
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary(Expr::Kind::kOr, at, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const Token at = Cur();
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary(Expr::Kind::kAnd, at, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      PD_RETURN_IF_ERROR(CheckDepth());
      const Token at = Cur();
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr e = NewExpr(Expr::Kind::kNot, at);
      e->children.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const Token at = Cur();
    PD_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek(1).type == TokenType::kName && Peek(1).value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (cmp == nullptr) {
        cmp = NewExpr(Expr::Kind::kCompare, at);
        cmp->children.push_back(std::move(first));
      }
      PD_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      cmp->ops.push_back(std::move(op));
      cmp->children.push_back(std::move(operand));
    }
    return cmp != nullptr ? std::move(cmp) : std::move(first);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token at = Cur();
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(Expr::Kind::kBinary, at, std::move(left), std::move(right), at.value);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const Token at = Cur();
    PD_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) {
      return first;
    }
    ExprPtr e = NewExpr(Expr::Kind::kConcat, at);
    e->children.push_back(std::move(first));
    while (SkipOp("~")) {
      PD_ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      e->children.push_back(std::move(next));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token at = Cur();
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = Binary(Expr::Kind::kBinary, at, std::move(left), std::move(right), at.value);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const Token at = Cur();
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = Binary(Expr::Kind::kBinary, at, std::move(left), std::move(right), "**");
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    PD_RETURN_IF_ERROR(CheckDepth());
    const Token at = Cur();
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      Next();
      PD_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = NewExpr(at.value == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, at);
      node->children.push_back(std::move(operand));
    } else {
      PD_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    PD_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      PD_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token at = Cur();
    switch (at.type) {
      case TokenType::kName: {
        Next();
        ExprPtr e = NewExpr(Expr::Kind::kLiteral, at);
        if (at.value == "true" || at.value == "True") {
          e->literal = Value::Bool(true);
        } else if (at.value == "false" || at.value == "False") {
          e->literal = Value::Bool(false);
        } else if (at.value == "none" || at.value == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = at.value;
        }
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().value;
          Next();
        }
        ExprPtr e = NewExpr(Expr::Kind::kLiteral, at);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenType::kInt:
      case TokenType::kFloat: {
        Next();
        ExprPtr e = NewExpr(Expr::Kind::kLiteral, at);
        PD_ASSIGN_OR_RETURN(e->literal, NumberLiteral(at));
        return e;
      }
      case TokenType::kOperator:
        if (at.value == "(") {
          Next();
          PD_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, {}));
          PD_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (at.value == "[" || at.value == "{") {
          return ParseListOrDict(at.value == "{");
        }
        break;
      default:
        break;
    }
    return Fail(at, absl::StrCat("unexpected ", Describe(at)));
  }

  absl::StatusOr<Value> NumberLiteral(const Token& t) const {
    const std::string& v = t.value;
    if (t.type == TokenType::kFloat) {
      return Value::Float(std::strtod(v.c_str(), nullptr));
    }
    int base = 10;
    size_t start = 0;
    if (v.size() > 2 && v[0] == '0') {
      const char b = static_cast<char>(v[1] | 0x20);
      base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
      start = base == 10 ? 0 : 2;
    }
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str() + start, &end, base);
    if (errno == ERANGE || end == v.c_str() + start || *end != '\0') {
      return Fail(t, absl::StrCat("integer literal ", v, " does not fit in 64 bits"));
    }
    return Value::Int(static_cast<int64_t>(n));
  }

  absl::StatusOr<ExprPtr> ParseListOrDict(bool dict) {
    const Token at = Cur();
    Next();
    const char* close = dict ? "}" : "]";
    ExprPtr e = NewExpr(dict ? Expr::Kind::kDict : Expr::Kind::kList, at);
    while (!IsOp(close)) {
      if (!e->children.empty()) {
        PD_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(close)) {
          break;
        }
      }
      PD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      e->children.push_back(std::move(item));
      if (dict) {
        PD_RETURN_IF_ERROR(ExpectOp(":"));
        PD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        e->children.push_back(std::move(value));
      }
    }
    Next();
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const Token at = Cur();
      if (IsOp(".")) {
        Next();
        if (Cur().type == TokenType::kName) {
          ExprPtr e = NewExpr(Expr::Kind::kGetAttr, at);
          e->name = Cur().value;
          e->children.push_back(std::move(node));
          node = std::move(e);
          Next();
        } else if (Cur().type == TokenType::kInt) {
          ExprPtr index = NewExpr(Expr::Kind::kLiteral, Cur());
          PD_ASSIGN_OR_RETURN(index->literal, NumberLiteral(Cur()));
          Next();
          node = Binary(Expr::Kind::kGetItem, at, std::move(node), std::move(index));
        } else {
          return Fail(Cur(), "expected name or number");
        }
      } else if (IsOp("[")) {
        Next();
        PD_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), at));
      } else if (IsOp("(")) {
        PD_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // After `[`: an index or a slice a:b:c with any part omitted.
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node, const Token& at) {
    ExprPtr parts[3];
    bool slice = false;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) {
        if (!SkipOp(":")) {
          break;
        }
        slice = true;
      }
      if (!IsOp(":") && !IsOp("]")) {
        PD_ASSIGN_OR_RETURN(parts[i], ParseExpression());
      }
    }
    if (!slice && parts[0] == nullptr) {
      return Unexpected("an expression");
    }
    PD_RETURN_IF_ERROR(ExpectOp("]"));
    if (!slice) {
      return Binary(Expr::Kind::kGetItem, at, std::move(node), std::move(parts[0]));
    }
    ExprPtr e = NewExpr(Expr::Kind::kSlice, at);
    e->children.push_back(std::move(node));
    for (ExprPtr& p : parts) {
      e->children.push_back(std::move(p));
    }
    return e;
  }

  // `(args, name=value, ...)` into e's children (after those it has) and kwargs.
  absl::Status ParseCallArgs(Expr* e) {
    PD_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        PD_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) {
          break;
        }
      }
      first = false;
      if (IsOp("*") || IsOp("**")) {
        return Fail(Cur(), "*args and **kwargs in calls are not supported");
      }
      if (Cur().type == TokenType::kName && Peek(1).type == TokenType::kOperator &&
          Peek(1).value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        PD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) {
          return Fail(Cur(), "positional argument follows keyword argument");
        }
        PD_ASSIGN_OR_RETURN(ExprPtr arg, ParseExpression());
        e->children.push_back(std::move(arg));
      }
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr e = NewExpr(Expr::Kind::kCall, Cur());
    e->children.push_back(std::move(callee));
    PD_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        PD_ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node)));
      } else if (IsName("is")) {
        PD_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        PD_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // `| name[(args)]` repeated; `subject` may be null (filter blocks, set blocks).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr subject) {
    bool first = true;
    while (first ? (subject == nullptr || IsOp("|")) : IsOp("|")) {
      const Token at = Cur();
      if (!(first && subject == nullptr && !IsOp("|"))) {
        Next();  // the pipe
      }
      first = false;
      ExprPtr f = NewExpr(Expr::Kind::kFilter, at);
      PD_ASSIGN_OR_RETURN(f->name, ExpectName());
      while (SkipOp(".")) {
        PD_ASSIGN_OR_RETURN(std::string part, ExpectName());
        absl::StrAppend(&f->name, ".", part);
      }
      if (!IsKnownFilter(f->name)) {
        return Fail(at, absl::StrCat("no filter named '", f->name, "'"));
      }
      f->children.push_back(std::move(subject));
      if (IsOp("(")) {
        PD_RETURN_IF_ERROR(ParseCallArgs(f.get()));
      }
      subject = std::move(f);
    }
    return subject;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr subject) {
    const Token at = Cur();
    Next();  // is
    ExprPtr t = NewExpr(Expr::Kind::kTest, at);
    t->negated = SkipName("not");
    PD_ASSIGN_OR_RETURN(t->name, ExpectName());
    if (!IsKnownTest(t->name)) {
      return Fail(at, absl::StrCat("no test named '", t->name, "'"));
    }
    t->children.push_back(std::move(subject));
    const Token& c = Cur();
    if (IsOp("(")) {
      PD_RETURN_IF_ERROR(ParseCallArgs(t.get()));
    } else if ((c.type == TokenType::kName || c.type == TokenType::kString ||
                c.type == TokenType::kInt || c.type == TokenType::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) {
        return Fail(c, "you cannot chain multiple tests with is");
      }
      DepthGuard guard(this);
      PD_RETURN_IF_ERROR(CheckDepth());
      PD_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      PD_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      t->children.push_back(std::move(arg));
    }
    return t;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int max_depth_;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<StmtList> Parse(std::vector<Token> tokens, int max_depth) {
  if (tokens.empty() || tokens.back().type != TokenType::kEnd) {
    tokens.push_back(Token{});
  }
  return Parser(std::move(tokens), max_depth).Run();
}

}  // namespace pd::chat::internal
