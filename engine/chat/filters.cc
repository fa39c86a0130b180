// The filters (`value | name(args)`) and tests (`value is name(args)`) of the Jinja2 subset,
// with Jinja2 3.1's semantics and Hugging Face's `tojson`.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "engine/chat/builtins.h"

namespace pd::chat::internal {
namespace {

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::StatusOr<Value> Str(std::string s, Budget* budget) {
  PD_RETURN_IF_ERROR(budget->CheckSize(s.size()));
  PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(s.size()) + 1));
  return Value::String(std::move(s));
}

// Jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0, each as obj[part].
absl::StatusOr<Value> AttrPath(const Value& item, absl::string_view path) {
  Value v = item;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index = 0;
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return absl::ascii_isdigit(c);
    }) && absl::SimpleAtoi(part, &index);
    PD_ASSIGN_OR_RETURN(v,
                        GetItem(v, numeric ? Value::Int(index) : Value::String(std::string(part))));
  }
  return v;
}

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(CharCount(v.str()));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(v.list().size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.dict().items.size()));
    default:
      return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

// Jinja2's do_title: each run between [-\s({[<] separators gets an upper-case first letter.
std::string JinjaTitle(const std::string& s) {
  std::string out = s;
  const auto is_sep = [](char c) {
    return c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f) || c == '(' || c == '{' || c == '[' || c == '<';
  };
  bool start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool sep = is_sep(out[i]);
    if (i > 0 && sep != is_sep(out[i - 1])) {
      start = true;
    }
    out[i] = start ? absl::ascii_toupper(out[i]) : absl::ascii_tolower(out[i]);
    start = false;
  }
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's int(str) (base 10): optional sign, digits with single underscores, surrounding
// whitespace.
bool ParsePyInt(const std::string& s, int64_t* out) {
  std::string t = StripString(s, Value::None(), true, true);
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_' && i > 0 && absl::ascii_isdigit(t[i - 1]) && i + 1 < t.size() &&
        absl::ascii_isdigit(t[i + 1])) {
      continue;
    }
    digits.push_back(c);
  }
  return !digits.empty() && absl::SimpleAtoi(digits, out) &&
         digits.find_first_not_of("+-0123456789") == std::string::npos;
}

bool ParsePyFloat(const std::string& s, double* out) {
  const std::string t = StripString(s, Value::None(), true, true);
  if (t.empty()) {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && t.find_first_of("xXpP") == std::string::npos;
}

absl::StatusOr<Value> ToInt(const Value& v, const Value& fallback) {
  int64_t i = 0;
  double d = 0;
  if (v.is_int() || v.is_bool()) {
    return Value::Int(v.AsInt());
  }
  if (v.is_string() && ParsePyInt(v.str(), &i)) {
    return Value::Int(i);
  }
  if (v.is_float()) {
    d = v.float_value();
  } else if (!v.is_string() || !ParsePyFloat(v.str(), &d)) {
    return fallback;
  }
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) {
    return fallback;
  }
  return Value::Int(static_cast<int64_t>(d));
}

absl::StatusOr<Value> ToJsonFilter(const Value& v, const CallArgs& args, Budget* budget) {
  PD_RETURN_IF_ERROR(
      args.Check("tojson", 1, {"indent", "ensure_ascii", "separators", "sort_keys"}));
  const Value none = Value::None();
  const Value& indent = args.Get(0, "indent", none);
  const Value& ensure_ascii = args.Get(99, "ensure_ascii", Value::Bool(false));
  const Value& separators = args.Get(99, "separators", none);
  const Value& sort_keys = args.Get(99, "sort_keys", Value::Bool(false));
  if (!indent.is_none() && !indent.is_int()) {
    return TypeError("tojson: indent must be an integer or None");
  }
  if (ensure_ascii.Truthy()) {
    return absl::UnimplementedError("tojson: ensure_ascii=True is not supported");
  }
  std::string item_sep, key_sep;
  const bool custom = !separators.is_none();
  if (custom) {
    if (!separators.is_list() || separators.list().size() != 2 ||
        !separators.list()[0].is_string() || !separators.list()[1].is_string()) {
      return TypeError("tojson: separators must be a pair of strings");
    }
    item_sep = separators.list()[0].str();
    key_sep = separators.list()[1].str();
  }
  const int64_t n = indent.is_int() ? std::max<int64_t>(indent.int_value(), 0) : -1;
  PD_ASSIGN_OR_RETURN(std::string out,
                      ToJson(v, n, custom ? &item_sep : nullptr, custom ? &key_sep : nullptr,
                             sort_keys.Truthy(), budget->max_string_bytes));
  return Str(std::move(out), budget);
}

absl::StatusOr<Value> Indent(const Value& v, const CallArgs& args, Budget* budget) {
  PD_RETURN_IF_ERROR(args.Check("indent", 3, {"width", "first", "blank"}));
  const Value& width = args.Get(0, "width", Value::Int(4));
  const bool first = args.Get(1, "first", Value::Bool(false)).Truthy();
  const bool blank = args.Get(2, "blank", Value::Bool(false)).Truthy();
  std::string indention;
  if (width.is_string()) {
    indention = width.str();
  } else if (width.is_int() && width.int_value() >= 0) {
    PD_RETURN_IF_ERROR(budget->CheckSize(static_cast<size_t>(width.int_value())));
    indention.assign(static_cast<size_t>(width.int_value()), ' ');
  } else {
    return TypeError("indent: width must be a string or a non-negative integer");
  }
  const std::string s = ToPythonStr(v) + "\n";
  std::vector<std::string> lines = absl::StrSplit(s, '\n');
  lines.pop_back();  // splitlines() drops the piece after the final newline
  PD_RETURN_IF_ERROR(
      budget->CheckSize(s.size() + lines.size() * (indention.size() + 1) + indention.size()));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) {
        out += indention;
      }
    }
    out += lines[i];
  }
  if (first) {
    out = indention + out;
  }
  return Str(std::move(out), budget);
}

absl::StatusOr<Value> SelectOrReject(absl::string_view name, const Value& v, const CallArgs& args,
                                     Budget* budget) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool select = name == "select" || name == "selectattr";
  PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return TypeError(absl::StrCat(name, ": missing attribute name"));
    }
    attr = args.positional[0].str();
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) {
      return TypeError(absl::StrCat(name, ": the test name must be a string"));
    }
    test = args.positional[next].str();
    test_args.positional.assign(args.positional.begin() + next + 1, args.positional.end());
    test_args.kwargs = args.kwargs;
  }
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      PD_ASSIGN_OR_RETURN(subject, AttrPath(item, attr));
    }
    bool pass = false;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      PD_ASSIGN_OR_RETURN(pass, CallTest(test, subject, test_args, budget));
    }
    if (pass == select) {
      out.push_back(item);
    }
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Map(const Value& v, const CallArgs& args, Budget* budget) {
  PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
  ValueList out;
  const Value none = Value::None();
  if (args.positional.empty()) {
    const Value& attr = args.Get(99, "attribute", none);
    if (!attr.is_string()) {
      return TypeError("map: needs a filter name or attribute=");
    }
    const Value undefined;
    const Value& fallback = args.Get(99, "default", undefined);
    for (const Value& item : items) {
      PD_ASSIGN_OR_RETURN(Value x, AttrPath(item, attr.str()));
      out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
    }
    return Value::List(std::move(out));
  }
  if (!args.positional[0].is_string()) {
    return TypeError("map: the filter name must be a string");
  }
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.kwargs = args.kwargs;
  for (const Value& item : items) {
    PD_ASSIGN_OR_RETURN(Value x, CallFilter(args.positional[0].str(), item, filter_args, budget));
    out.push_back(std::move(x));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Sort(const Value& v, const CallArgs& args, Budget* budget) {
  PD_RETURN_IF_ERROR(args.Check("sort", 3, {"reverse", "case_sensitive", "attribute"}));
  PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
  const bool reverse = args.Get(0, "reverse", Value::Bool(false)).Truthy();
  const bool case_sensitive = args.Get(1, "case_sensitive", Value::Bool(false)).Truthy();
  const Value none = Value::None();
  const Value& attr = args.Get(2, "attribute", none);
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (const Value& item : items) {
    Value key = item;
    if (attr.is_string()) {
      PD_ASSIGN_OR_RETURN(key, AttrPath(item, attr.str()));
    }
    if (key.is_string() && !case_sensitive) {
      key = Value::String(absl::AsciiStrToLower(key.str()));
    }
    keyed.emplace_back(std::move(key), item);
  }
  const int64_t n = static_cast<int64_t>(keyed.size());
  PD_RETURN_IF_ERROR(budget->Charge(n * (1 + static_cast<int64_t>(std::log2(n + 1)))));
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    absl::StatusOr<bool> lt = reverse ? LessThan(b.first, a.first) : LessThan(a.first, b.first);
    if (!lt.ok()) {
      error.Update(lt.status());
      return false;
    }
    return *lt;
  });
  PD_RETURN_IF_ERROR(error);
  ValueList out;
  for (auto& [key, item] : keyed) {
    out.push_back(std::move(item));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Join(const Value& v, const CallArgs& args, Budget* budget) {
  PD_RETURN_IF_ERROR(args.Check("join", 2, {"d", "attribute"}));
  PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
  const Value empty = Value::String("");
  const Value none = Value::None();
  const std::string sep = ToPythonStr(args.Get(0, "d", empty));
  const Value& attr = args.Get(1, "attribute", none);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (attr.is_string()) {
      PD_ASSIGN_OR_RETURN(item, AttrPath(item, attr.str()));
    }
    if (i > 0) {
      out += sep;
    }
    out += ToPythonStr(item);
    PD_RETURN_IF_ERROR(budget->CheckSize(out.size()));
  }
  return Str(std::move(out), budget);
}

}  // namespace

absl::StatusOr<Value> CallFilter(absl::string_view name, const Value& v, const CallArgs& args,
                                 Budget* budget) {
  PD_RETURN_IF_ERROR(budget->Charge(1));
  const Value none = Value::None();
  if (name == "length" || name == "count") {
    return Length(v);
  }
  if (name == "safe") {
    return v;
  }
  if (name == "string") {
    return Str(ToPythonStr(v), budget);
  }
  if (name == "trim") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {"chars"}));
    return Str(StripString(ToPythonStr(v), args.Get(0, "chars", none), true, true), budget);
  }
  if (name == "upper" || name == "lower") {
    const std::string s = ToPythonStr(v);
    return Str(name == "upper" ? absl::AsciiStrToUpper(s) : absl::AsciiStrToLower(s), budget);
  }
  if (name == "capitalize") {
    std::string s = absl::AsciiStrToLower(ToPythonStr(v));
    if (!s.empty()) {
      s[0] = absl::ascii_toupper(s[0]);
    }
    return Str(std::move(s), budget);
  }
  if (name == "title") {
    return Str(JinjaTitle(ToPythonStr(v)), budget);
  }
  if (name == "e" || name == "escape" || name == "forceescape") {
    return Str(HtmlEscape(ToPythonStr(v)), budget);
  }
  if (name == "default" || name == "d") {
    PD_RETURN_IF_ERROR(args.Check(name, 2, {"default_value", "boolean"}));
    const Value empty = Value::String("");
    const bool boolean = args.Get(1, "boolean", Value::Bool(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) {
      return args.Get(0, "default_value", empty);
    }
    return v;
  }
  if (name == "join") {
    return Join(v, args, budget);
  }
  if (name == "first" || name == "last") {
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
    if (items.empty()) {
      return Value::Undefined(absl::StrCat("No ", name, " item, sequence was empty."));
    }
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
    return Value::List(std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      return Slice(v, none, none, Value::Int(-1), budget);
    }
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "int") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {"default"}));
    return ToInt(v, args.Get(0, "default", Value::Int(0)));
  }
  if (name == "float") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {"default"}));
    double d = 0;
    if (v.is_number()) {
      return Value::Float(v.AsDouble());
    }
    if (v.is_string() && ParsePyFloat(v.str(), &d)) {
      return Value::Float(d);
    }
    return args.Get(0, "default", Value::Float(0));
  }
  if (name == "abs") {
    if (v.is_float()) {
      return Value::Float(std::fabs(v.float_value()));
    }
    if ((v.is_int() || v.is_bool()) && v.AsInt() != INT64_MIN) {
      return Value::Int(v.AsInt() < 0 ? -v.AsInt() : v.AsInt());
    }
    return TypeError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
  }
  if (name == "replace") {
    PD_RETURN_IF_ERROR(args.Check(name, 3, {"old", "new", "count"}));
    CallArgs method_args;
    method_args.positional.push_back(Value::String(ToPythonStr(args.Get(0, "old", none))));
    method_args.positional.push_back(Value::String(ToPythonStr(args.Get(1, "new", none))));
    const Value& count = args.Get(2, "count", none);
    method_args.positional.push_back(count.is_none() ? Value::Int(-1) : count);
    return CallMethod(Value::String(ToPythonStr(v)), "replace", method_args, budget);
  }
  if (name == "items") {
    if (v.is_undefined()) {
      return Value::List({});
    }
    if (!v.is_dict()) {
      return TypeError("Can only get item pairs from a mapping.");
    }
    return CallMethod(v, "items", CallArgs{}, budget);
  }
  if (name == "tojson") {
    return ToJsonFilter(v, args, budget);
  }
  if (name == "indent") {
    return Indent(v, args, budget);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(name, v, args, budget);
  }
  if (name == "map") {
    return Map(v, args, budget);
  }
  if (name == "sort") {
    return Sort(v, args, budget);
  }
  if (name == "attr") {
    if (args.positional.size() != 1 || !args.positional[0].is_string()) {
      return TypeError("attr: needs one attribute name");
    }
    return GetAttr(v, args.positional[0].str());
  }
  if (name == "sum") {
    PD_RETURN_IF_ERROR(args.Check(name, 2, {"attribute", "start"}));
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(v, budget));
    const Value& attr = args.Get(0, "attribute", none);
    Value total = args.Get(1, "start", Value::Int(0));
    for (Value item : items) {
      if (attr.is_string()) {
        PD_ASSIGN_OR_RETURN(item, AttrPath(item, attr.str()));
      }
      if (!item.is_number() || !total.is_number()) {
        return TypeError(absl::StrCat("unsupported operand type(s) for +: '", total.TypeName(),
                                      "' and '", item.TypeName(), "'"));
      }
      if (item.is_float() || total.is_float()) {
        total = Value::Float(total.AsDouble() + item.AsDouble());
      } else {
        int64_t r = 0;
        if (__builtin_add_overflow(total.AsInt(), item.AsInt(), &r)) {
          return absl::OutOfRangeError("sum: integer overflow");
        }
        total = Value::Int(r);
      }
    }
    return total;
  }
  return absl::InvalidArgumentError(absl::StrCat("no filter named '", name, "'"));
}

bool IsKnownFilter(absl::string_view name) {
  static constexpr absl::string_view kFilters[] = {
      "abs",        "attr",    "capitalize", "count",       "d",      "default",    "e",
      "escape",     "first",   "float",      "forceescape", "indent", "int",        "items",
      "join",       "last",    "length",     "list",        "lower",  "map",        "reject",
      "rejectattr", "replace", "reverse",    "safe",        "select", "selectattr", "sort",
      "string",     "sum",     "title",      "tojson",      "trim",   "upper"};
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(absl::string_view name) {
  static constexpr absl::string_view kTests[] = {
      "defined",     "undefined", "none",     "string", "mapping", "number",
      "integer",     "float",     "boolean",  "true",   "false",   "callable",
      "iterable",    "sequence",  "lower",    "upper",  "odd",     "even",
      "divisibleby", "eq",        "equalto",  "==",     "ne",      "!=",
      "sameas",      "lt",        "lessthan", "<",      "gt",      "greaterthan",
      ">",           "le",        "<=",       "ge",     ">=",      "in"};
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<bool> CallTest(absl::string_view name, const Value& v, const CallArgs& args,
                              Budget* budget) {
  PD_RETURN_IF_ERROR(budget->Charge(1));
  const Value undefined;
  const Value& arg = args.Get(0, "", undefined);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "callable") return v.is_callable();
  if (name == "iterable") {
    return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
  }
  if (name == "sequence") {
    return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
  }
  if (name == "lower" || name == "upper") {
    const std::string s = ToPythonStr(v);
    const bool cased = std::any_of(s.begin(), s.end(), absl::ascii_isalpha);
    return cased && (name == "lower" ? std::none_of(s.begin(), s.end(), absl::ascii_isupper)
                                     : std::none_of(s.begin(), s.end(), absl::ascii_islower));
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) {
      return TypeError(absl::StrCat("test '", name, "' needs an integer, got ", v.TypeName()));
    }
    int64_t d = 2;
    if (name == "divisibleby") {
      if (!arg.is_int() || arg.int_value() == 0) {
        return TypeError("divisibleby needs a non-zero integer argument");
      }
      d = arg.int_value();
    }
    const int64_t r = d == -1 ? 0 : v.AsInt() % d;
    return name == "odd" ? r != 0 : r == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equals(v, arg);
  if (name == "ne" || name == "!=") return !Equals(v, arg);
  if (name == "sameas") {
    return v.kind() == arg.kind() && (v.is_none() || v.is_undefined() || Equals(v, arg));
  }
  if (name == "lt" || name == "lessthan" || name == "<") return LessThan(v, arg);
  if (name == "gt" || name == "greaterthan" || name == ">") return LessThan(arg, v);
  if (name == "le" || name == "<=") {
    PD_ASSIGN_OR_RETURN(bool gt, LessThan(arg, v));
    return !gt;
  }
  if (name == "ge" || name == ">=") {
    PD_ASSIGN_OR_RETURN(bool lt, LessThan(v, arg));
    return !lt;
  }
  if (name == "in") return Contains(arg, v, budget);
  return absl::InvalidArgumentError(absl::StrCat("no test named '", name, "'"));
}

}  // namespace pd::chat::internal
