#include "engine/chat/interpreter.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "engine/chat/builtins.h"

namespace pd::chat::internal {
namespace {

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::Status Locate(absl::Status s, int line) {
  if (s.ok() || s.GetPayload(kLocatedPayload).has_value() || line <= 0 ||
      absl::IsResourceExhausted(s)) {
    return s;
  }
  absl::Status located(s.code(), absl::StrCat("line ", line, ": ", s.message()));
  located.SetPayload(kLocatedPayload, absl::Cord("1"));
  return located;
}

enum class Flow { kNormal, kBreak, kContinue };

// The attributes of a for loop's `loop` variable, in the order ExecFor sets them.
constexpr int kNumLoopKeys = 12;
const Value* LoopKeys() {
  static const Value* const keys = [] {
    static const char* const names[kNumLoopKeys] = {"index",  "index0",   "revindex", "revindex0",
                                                    "first",  "last",     "length",   "depth",
                                                    "depth0", "previtem", "nextitem", "cycle"};
    auto* v = new Value[kNumLoopKeys];
    for (int k = 0; k < kNumLoopKeys; ++k) {
      v[k] = Value::String(names[k]);
    }
    return v;
  }();
  return keys;
}

// Variables set in one scope (the template, one loop iteration, one macro call).
using Frame = std::vector<std::pair<std::string, Value>>;

class Interpreter {
 public:
  // `meter` counts the values this render builds (installed on this thread by the caller).
  Interpreter(const Value& context, const RenderLimits& limits, ValueMeter* meter)
      : context_(context), limits_(limits) {
    budget_.work_left = limits.max_work;
    budget_.iterations_left = limits.max_iterations;
    budget_.max_string_bytes = limits.max_output_bytes;
    budget_.max_items = limits.max_items;
    budget_.meter = meter;
    budget_.max_memory_bytes = limits.max_memory_bytes;
    budget_.deadline = absl::Now() + limits.max_duration;
    budget_.max_work = limits.max_work;
    budget_.max_iterations = limits.max_iterations;
    budget_.max_duration = limits.max_duration;
    frames_.emplace_back();
  }
  ~Interpreter() {
    // Breaks the reference cycles namespaces may form (Budget::namespaces).
    for (const Value& ns : budget_.namespaces) ns.mutable_namespace() = Dict();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  absl::StatusOr<std::string> Run(const StmtList& body) {
    std::string out;
    PD_ASSIGN_OR_RETURN(Flow flow, ExecList(body, &out));
    (void)flow;
    return out;
  }

 private:
  // ---- scopes ------------------------------------------------------------------------------

  Value Lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      for (const auto& [k, v] : *f) {
        if (k == name) {
          return v;
        }
      }
    }
    if (context_.is_dict()) {
      if (const Value* v = context_.dict().Find(name); v != nullptr) {
        return *v;
      }
    }
    if (IsGlobalFunction(name)) {
      Callable c;
      c.kind = Callable::Kind::kGlobal;
      c.name = name;
      return Value::MakeCallable(std::move(c));
    }
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  void Assign(const std::string& name, Value v) {
    for (auto& [k, old] : frames_.back()) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    frames_.back().emplace_back(name, std::move(v));
  }

  absl::Status Append(std::string* out, absl::string_view s) {
    if (out->size() + s.size() > static_cast<size_t>(limits_.max_output_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat("template output exceeds the limit of ",
                                                       limits_.max_output_bytes, " bytes"));
    }
    out->append(s.data(), s.size());
    return absl::OkStatus();
  }

  // ---- statements --------------------------------------------------------------------------

  absl::StatusOr<Flow> ExecList(const StmtList& body, std::string* out) {
    for (const StmtPtr& s : body) {
      absl::StatusOr<Flow> flow = Exec(*s, out);
      if (!flow.ok()) {
        return Locate(flow.status(), s->line);
      }
      if (*flow != Flow::kNormal) {
        return flow;
      }
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> Exec(const Stmt& s, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        PD_RETURN_IF_ERROR(Append(out, s.text));
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        PD_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        PD_RETURN_IF_ERROR(Append(out, ToPythonStr(v)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          PD_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (c.Truthy()) {
            return ExecList(body, out);
          }
        }
        return ExecList(s.else_body, out);
      case Stmt::Kind::kFor:
        return ExecFor(s, out);
      case Stmt::Kind::kSet: {
        PD_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (!s.attr.empty()) {
          const Value ns = Lookup(s.targets[0]);
          if (!ns.is_namespace()) {
            return TypeError("can only assign attributes of a namespace() object");
          }
          ns.mutable_namespace().Set(Value::String(s.attr), std::move(v));
          return Flow::kNormal;
        }
        PD_RETURN_IF_ERROR(AssignTargets(s.targets, v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        PD_ASSIGN_OR_RETURN(Value v, RenderToValue(s.body, s.filter.get()));
        Assign(s.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        PD_ASSIGN_OR_RETURN(Value v, RenderToValue(s.body, s.expr.get()));
        PD_RETURN_IF_ERROR(Append(out, ToPythonStr(v)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: {
        Callable c;
        c.kind = Callable::Kind::kMacro;
        c.name = s.text;
        c.macro = &s;
        Assign(s.text, Value::MakeCallable(std::move(c)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  // The body rendered to a string, through the filter chain `filters` when not null.
  absl::StatusOr<Value> RenderToValue(const StmtList& body, const Expr* filters) {
    std::string text;
    PD_ASSIGN_OR_RETURN(Flow flow, ExecList(body, &text));
    (void)flow;
    Value v = Value::String(std::move(text));
    if (filters != nullptr) {
      return EvalFilter(*filters, &v);
    }
    return v;
  }

  absl::Status AssignTargets(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      Assign(targets[0], v);
      return absl::OkStatus();
    }
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, &budget_));
    if (items.size() != targets.size()) {
      return TypeError(
          absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      Assign(targets[i], items[i]);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s, std::string* out) {
    PD_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(iterable, &budget_));
    if (s.filter != nullptr) {
      ValueList kept;
      for (const Value& item : items) {
        PD_RETURN_IF_ERROR(budget_.ChargeIteration());
        frames_.emplace_back();
        absl::Status bound = AssignTargets(s.targets, item);
        absl::StatusOr<Value> pass = bound.ok() ? Eval(*s.filter) : bound;
        frames_.pop_back();
        PD_RETURN_IF_ERROR(pass.status());
        if (pass->Truthy()) {
          kept.push_back(item);
        }
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      return ExecList(s.else_body, out);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    ++loop_depth_;
    for (int64_t i = 0; i < n; ++i) {
      absl::Status charged = budget_.ChargeIteration();
      if (!charged.ok()) {
        --loop_depth_;
        return charged;
      }
      frames_.emplace_back();
      Dict loop;
      // The keys are made once per process: an iteration allocates no key strings.
      const Value* keys = LoopKeys();
      loop.items.reserve(kNumLoopKeys);
      const auto add = [&](int k, Value v) { loop.items.emplace_back(keys[k], std::move(v)); };
      add(0, Value::Int(i + 1));
      add(1, Value::Int(i));
      add(2, Value::Int(n - i));
      add(3, Value::Int(n - i - 1));
      add(4, Value::Bool(i == 0));
      add(5, Value::Bool(i == n - 1));
      add(6, Value::Int(n));
      // depth counts recursive-loop levels (not nesting); loops are never recursive here.
      add(7, Value::Int(1));
      add(8, Value::Int(0));
      add(9, i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
      add(10, i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item"));
      Callable cycle;
      cycle.kind = Callable::Kind::kCycle;
      cycle.name = "cycle";
      cycle.receiver = Value::Int(i);
      add(11, Value::MakeCallable(std::move(cycle)));
      Assign("loop", Value::MakeDict(std::move(loop)));
      absl::Status bound = AssignTargets(s.targets, items[i]);
      absl::StatusOr<Flow> flow = bound.ok() ? ExecList(s.body, out) : bound;
      frames_.pop_back();
      if (!flow.ok()) {
        --loop_depth_;
        return flow.status();
      }
      if (*flow == Flow::kBreak) {
        break;
      }
    }
    --loop_depth_;
    return Flow::kNormal;
  }

  // ---- calls -------------------------------------------------------------------------------

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first_child) {
    CallArgs args;
    for (size_t i = first_child; i < e.children.size(); ++i) {
      PD_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [name, expr] : e.kwargs) {
      PD_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.kwargs.emplace_back(name, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Call(const Value& callee, const CallArgs& args) {
    if (callee.is_undefined()) {
      return absl::InvalidArgumentError(callee.undefined_hint());
    }
    if (!callee.is_callable()) {
      return TypeError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
    }
    const Callable& c = callee.callable();
    switch (c.kind) {
      case Callable::Kind::kGlobal:
        return CallGlobal(c.name, args, &budget_);
      case Callable::Kind::kMethod:
        return CallMethod(c.receiver, c.name, args, &budget_);
      case Callable::Kind::kCycle:
        if (args.positional.empty() || !args.kwargs.empty()) {
          return TypeError("no items for cycling given");
        }
        return args
            .positional[static_cast<size_t>(c.receiver.int_value()) % args.positional.size()];
      case Callable::Kind::kMacro:
        return CallMacro(*static_cast<const Stmt*>(c.macro), args);
    }
    return TypeError("bad callable");
  }

  absl::StatusOr<Value> CallMacro(const Stmt& m, const CallArgs& args) {
    if (call_depth_ >= limits_.max_call_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("macro calls nested deeper than ", limits_.max_call_depth));
    }
    PD_RETURN_IF_ERROR(budget_.ChargeIteration());
    if (args.positional.size() > m.params.size()) {
      return TypeError(absl::StrCat("macro '", m.text, "' takes not more than ", m.params.size(),
                                    " argument(s)"));
    }
    for (const auto& [name, v] : args.kwargs) {
      if (std::find(m.params.begin(), m.params.end(), name) == m.params.end()) {
        return TypeError(
            absl::StrCat("macro '", m.text, "' takes no keyword argument '", name, "'"));
      }
    }
    // The macro sees the template's top-level variables and its own parameters.
    std::vector<Frame> saved = std::move(frames_);
    frames_.clear();
    frames_.push_back(saved.front());
    frames_.emplace_back();
    ++call_depth_;
    absl::StatusOr<std::string> text = [&]() -> absl::StatusOr<std::string> {
      for (size_t i = 0; i < m.params.size(); ++i) {
        const Value undefined;
        const Value& given = args.Get(i, m.params[i], undefined);
        bool present = i < args.positional.size();
        for (const auto& kw : args.kwargs) {
          present = present || kw.first == m.params[i];
        }
        if (present) {
          Assign(m.params[i], given);
        } else if (m.defaults[i] != nullptr) {
          PD_ASSIGN_OR_RETURN(Value d, Eval(*m.defaults[i]));
          Assign(m.params[i], std::move(d));
        } else {
          Assign(m.params[i],
                 Value::Undefined(absl::StrCat("parameter '", m.params[i], "' was not provided")));
        }
      }
      std::string body;
      PD_ASSIGN_OR_RETURN(Flow flow, ExecList(m.body, &body));
      (void)flow;
      return body;
    }();
    --call_depth_;
    frames_ = std::move(saved);
    PD_RETURN_IF_ERROR(text.status());
    return Value::String(*std::move(text));
  }

  // A kFilter node; `subject` replaces the innermost null subject (filter and set blocks).
  absl::StatusOr<Value> EvalFilter(const Expr& e, const Value* subject) {
    Value v;
    if (e.children[0] == nullptr) {
      if (subject == nullptr) {
        return TypeError("filter without a subject");
      }
      v = *subject;
    } else if (e.children[0]->kind == Expr::Kind::kFilter) {
      PD_ASSIGN_OR_RETURN(v, EvalFilter(*e.children[0], subject));
    } else {
      PD_ASSIGN_OR_RETURN(v, Eval(*e.children[0]));
    }
    PD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
    return CallFilter(e.name, v, args, &budget_);
  }

  // ---- expressions -------------------------------------------------------------------------

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        PD_ASSIGN_OR_RETURN(CallArgs items, EvalArgs(e, 0));
        PD_RETURN_IF_ERROR(budget_.Charge(static_cast<int64_t>(items.positional.size())));
        return Value::List(std::move(items.positional), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          PD_ASSIGN_OR_RETURN(Value k, Eval(*e.children[i]));
          PD_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1]));
          if ((k.is_list() && !k.is_tuple()) || k.is_dict() || k.is_undefined()) {
            return TypeError(absl::StrCat("unhashable type: '", k.TypeName(), "'"));
          }
          PD_RETURN_IF_ERROR(budget_.Charge(static_cast<int64_t>(d.items.size()) + 1));
          PD_RETURN_IF_ERROR(budget_.ChargeMemory(2 * static_cast<int64_t>(sizeof(Value))));
          d.Set(std::move(k), std::move(v));
        }
        return Value::MakeDict(std::move(d));
      }
      case Expr::Kind::kGetAttr: {
        PD_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        PD_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        PD_ASSIGN_OR_RETURN(Value key, Eval(*e.children[1]));
        PD_RETURN_IF_ERROR(budget_.Charge(
            1 + (obj.is_dict() ? static_cast<int64_t>(obj.dict().items.size()) : 0)));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        PD_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        Value bounds[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (e.children[i + 1] != nullptr) {
            PD_ASSIGN_OR_RETURN(bounds[i], Eval(*e.children[i + 1]));
          }
        }
        return Slice(obj, bounds[0], bounds[1], bounds[2], &budget_);
      }
      case Expr::Kind::kCall: {
        PD_ASSIGN_OR_RETURN(Value callee, Eval(*e.children[0]));
        PD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return Call(callee, args);
      }
      case Expr::Kind::kFilter:
        return EvalFilter(e, nullptr);
      case Expr::Kind::kTest: {
        PD_ASSIGN_OR_RETURN(Value subject, Eval(*e.children[0]));
        PD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        PD_ASSIGN_OR_RETURN(bool r, CallTest(e.name, subject, args, &budget_));
        return Value::Bool(r != e.negated);
      }
      case Expr::Kind::kNot: {
        PD_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        PD_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        if (a.Truthy() == (e.kind == Expr::Kind::kOr)) {
          return a;
        }
        return Eval(*e.children[1]);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        PD_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        return Unary(e.kind == Expr::Kind::kNeg, v);
      }
      case Expr::Kind::kBinary: {
        PD_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        PD_ASSIGN_OR_RETURN(Value b, Eval(*e.children[1]));
        return Binary(e.name, a, b);
      }
      case Expr::Kind::kConcat: {
        std::string s;
        for (const ExprPtr& c : e.children) {
          PD_ASSIGN_OR_RETURN(Value v, Eval(*c));
          s += ToPythonStr(v);
          PD_RETURN_IF_ERROR(budget_.CheckSize(s.size()));
        }
        PD_RETURN_IF_ERROR(budget_.Charge(static_cast<int64_t>(s.size()) + 1));
        return Value::String(std::move(s));
      }
      case Expr::Kind::kCompare:
        return Compare(e);
      case Expr::Kind::kCond: {
        PD_ASSIGN_OR_RETURN(Value c, Eval(*e.children[0]));
        if (c.Truthy()) {
          return Eval(*e.children[1]);
        }
        if (e.children[2] == nullptr) {
          return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                               " evaluated to false and no else section was "
                                               "defined"));
        }
        return Eval(*e.children[2]);
      }
    }
    return TypeError("unknown expression");
  }

  absl::StatusOr<Value> Compare(const Expr& e) {
    PD_ASSIGN_OR_RETURN(Value left, Eval(*e.children[0]));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      PD_ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1]));
      const std::string& op = e.ops[i];
      bool r = false;
      if (op == "==" || op == "!=") {
        r = Equals(left, right) == (op == "==");
      } else if (op == "in" || op == "notin") {
        PD_ASSIGN_OR_RETURN(bool in, Contains(right, left, &budget_));
        r = in == (op == "in");
      } else {
        for (const Value* v : {&left, &right}) {
          if (v->is_undefined()) {
            return absl::InvalidArgumentError(v->undefined_hint());
          }
        }
        absl::StatusOr<bool> lt =
            (op == "<" || op == ">=") ? LessThan(left, right) : LessThan(right, left);
        if (!lt.ok()) {
          return TypeError(absl::StrCat("'", op, "' not supported between instances of '",
                                        left.TypeName(), "' and '", right.TypeName(), "'"));
        }
        r = (op == "<" || op == ">") ? *lt : !*lt;
      }
      if (!r) {
        return Value::Bool(false);
      }
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  absl::StatusOr<Value> Unary(bool negate, const Value& v) {
    if (v.is_undefined()) {
      return absl::InvalidArgumentError(v.undefined_hint());
    }
    if (v.is_float()) {
      return Value::Float(negate ? -v.float_value() : v.float_value());
    }
    if (v.is_int() || v.is_bool()) {
      if (negate && v.AsInt() == INT64_MIN) {
        return absl::OutOfRangeError("integer overflow");
      }
      return Value::Int(negate ? -v.AsInt() : v.AsInt());
    }
    return TypeError(
        absl::StrCat("bad operand type for unary ", negate ? "-" : "+", ": '", v.TypeName(), "'"));
  }

  absl::StatusOr<Value> Repeat(const Value& seq, int64_t times) {
    times = std::max<int64_t>(times, 0);
    if (seq.is_string()) {
      if (!seq.str().empty() &&
          times > limits_.max_output_bytes / static_cast<int64_t>(seq.str().size())) {
        return budget_.CheckSize(static_cast<size_t>(limits_.max_output_bytes) + 1);
      }
      PD_RETURN_IF_ERROR(budget_.Charge(times * static_cast<int64_t>(seq.str().size()) + 1));
      PD_RETURN_IF_ERROR(budget_.ReserveMemory(times * static_cast<int64_t>(seq.str().size())));
      std::string out;
      for (int64_t i = 0; i < times; ++i) {
        out += seq.str();
      }
      return Value::String(std::move(out));
    }
    if (!seq.list().empty() &&
        times > limits_.max_items / static_cast<int64_t>(seq.list().size())) {
      return absl::ResourceExhaustedError(
          absl::StrCat("list repetition of more than ", limits_.max_items, " items"));
    }
    PD_RETURN_IF_ERROR(budget_.Charge(times * static_cast<int64_t>(seq.list().size()) + 1));
    PD_RETURN_IF_ERROR(budget_.ReserveMemory(times * static_cast<int64_t>(seq.list().size()) *
                                             static_cast<int64_t>(sizeof(Value))));
    ValueList out;
    for (int64_t i = 0; i < times; ++i) {
      out.insert(out.end(), seq.list().begin(), seq.list().end());
    }
    return Value::List(std::move(out), seq.is_tuple());
  }

  absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b);

  const Value& context_;
  RenderLimits limits_;
  Budget budget_;
  std::vector<Frame> frames_;
  int call_depth_ = 0;
  int loop_depth_ = 0;
};

absl::StatusOr<Value> Interpreter::Binary(const std::string& op, const Value& a, const Value& b) {
  for (const Value* v : {&a, &b}) {
    if (v->is_undefined()) {
      return absl::InvalidArgumentError(v->undefined_hint());
    }
  }
  const auto unsupported = [&]() {
    return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                  "' and '", b.TypeName(), "'"));
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      PD_RETURN_IF_ERROR(budget_.CheckSize(a.str().size() + b.str().size()));
      PD_RETURN_IF_ERROR(budget_.Charge(static_cast<int64_t>(a.str().size() + b.str().size())));
      PD_RETURN_IF_ERROR(
          budget_.ReserveMemory(static_cast<int64_t>(a.str().size() + b.str().size())));
      return Value::String(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      PD_RETURN_IF_ERROR(budget_.Charge(static_cast<int64_t>(a.list().size() + b.list().size())));
      PD_RETURN_IF_ERROR(budget_.ReserveMemory(
          static_cast<int64_t>((a.list().size() + b.list().size()) * sizeof(Value))));
      ValueList out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(out), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
      return Repeat(a, b.AsInt());
    }
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
      return Repeat(b, a.AsInt());
    }
  }
  if (!a.is_number() || !b.is_number()) {
    return unsupported();
  }
  const bool ints = !a.is_float() && !b.is_float();
  const int64_t x = a.AsInt(), y = b.AsInt();
  const double fx = a.AsDouble(), fy = b.AsDouble();
  int64_t r = 0;
  const auto overflow = [] { return absl::OutOfRangeError("integer overflow"); };
  if (op == "+") {
    if (!ints) return Value::Float(fx + fy);
    if (__builtin_add_overflow(x, y, &r)) return overflow();
    return Value::Int(r);
  }
  if (op == "-") {
    if (!ints) return Value::Float(fx - fy);
    if (__builtin_sub_overflow(x, y, &r)) return overflow();
    return Value::Int(r);
  }
  if (op == "*") {
    if (!ints) return Value::Float(fx * fy);
    if (__builtin_mul_overflow(x, y, &r)) return overflow();
    return Value::Int(r);
  }
  if (op == "/" || op == "//" || op == "%") {
    if (fy == 0) {
      return TypeError(op == "%" ? "integer division or modulo by zero" : "division by zero");
    }
    if (op == "/") {
      return Value::Float(fx / fy);
    }
    if (ints) {
      if (x == INT64_MIN && y == -1) {
        if (op == "%") {
          return Value::Int(0);
        }
        return overflow();
      }
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::Int(op == "//" ? q : m);
    }
    if (op == "//") {
      return Value::Float(std::floor(fx / fy));
    }
    double m = std::fmod(fx, fy);
    if (m != 0 && ((m < 0) != (fy < 0))) {
      m += fy;
    }
    return Value::Float(m);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t result = 1, base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if (e & 1) {
          if (__builtin_mul_overflow(result, base, &result)) return overflow();
        }
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
          return overflow();
        }
      }
      return Value::Int(result);
    }
    if (fx == 0 && fy < 0) {
      return TypeError("0.0 cannot be raised to a negative power");
    }
    return Value::Float(std::pow(fx, fy));
  }
  return unsupported();
}

}  // namespace

absl::StatusOr<std::string> RenderTree(const StmtList& body, const Value& context,
                                       const RenderLimits& limits) {
  // Values built from here on count against this render's memory limit (the context's not).
  ValueMeter meter;
  absl::StatusOr<std::string> out = Interpreter(context, limits, &meter).Run(body);
  if (!out.ok()) {
    // The payloads are internal bookkeeping: callers get the code and the message only.
    return absl::Status(out.status().code(), out.status().message());
  }
  return out;
}

}  // namespace pd::chat::internal
