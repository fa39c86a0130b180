// Access, iteration, methods and globals; the filters and tests are in filters.cc.
#include "engine/chat/builtins.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"

namespace pd::chat::internal {
namespace {

bool IsPySpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= 0x1c && c <= 0x1f);
}

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

// A slice bound: none/omitted -> nullopt-like flag; ints (and bools) as int64.
absl::Status SliceIndex(const Value& v, bool* present, int64_t* out) {
  if (v.is_none()) {
    *present = false;
    return absl::OkStatus();
  }
  if (!v.is_int() && !v.is_bool()) {
    return TypeError(absl::StrCat("slice indices must be integers or None, not ", v.TypeName()));
  }
  *present = true;
  *out = v.AsInt();
  return absl::OkStatus();
}

const char* const kStringMethods[] = {
    "strip",   "lstrip",  "rstrip",  "startswith", "endswith", "split",  "rsplit", "upper",
    "lower",   "replace", "title",   "capitalize", "find",     "count",  "join",   "splitlines",
    "isdigit", "isalpha", "isalnum", "isspace",    "islower",  "isupper"};
const char* const kDictMethods[] = {"items", "keys", "values", "get"};

bool IsMethodOf(const Value& obj, absl::string_view name) {
  if (obj.is_string()) {
    return std::find(std::begin(kStringMethods), std::end(kStringMethods), name) !=
           std::end(kStringMethods);
  }
  if (obj.is_dict()) {
    return std::find(std::begin(kDictMethods), std::end(kDictMethods), name) !=
           std::end(kDictMethods);
  }
  return false;
}

std::string ObjectName(const Value& obj) {
  if (obj.is_none()) {
    return "None";
  }
  return absl::StrCat("'", obj.TypeName(), " object'");
}

Value Missing(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat(ObjectName(obj), " has no attribute '", name, "'"));
}

std::string PyTitleCase(absl::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (absl::ascii_isalpha(c)) {
      c = prev_cased ? absl::ascii_tolower(c) : absl::ascii_toupper(c);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

// Python's str.split(sep, maxsplit) (sep none: runs of whitespace) and rsplit.
ValueList PySplit(absl::string_view s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (!sep.is_string()) {
    // Whitespace split: collect the words, then merge per maxsplit.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsPySpace(s[i])) {
        ++i;
      }
      if (i >= s.size()) {
        break;
      }
      const size_t b = i;
      while (i < s.size() && !IsPySpace(s[i])) {
        ++i;
      }
      words.emplace_back(b, i);
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (const auto& [b, e] : words) {
        parts.emplace_back(s.substr(b, e - b));
      }
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) {
        parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      }
      size_t end = s.size();
      while (end > 0 && IsPySpace(s[end - 1])) {
        --end;
      }
      parts.emplace_back(s.substr(words[maxsplit].first, end - words[maxsplit].first));
    } else {
      const size_t first_kept = words.size() - static_cast<size_t>(maxsplit);
      size_t begin = 0;
      while (begin < s.size() && IsPySpace(s[begin])) {
        ++begin;
      }
      parts.emplace_back(s.substr(begin, words[first_kept - 1].second - begin));
      for (size_t k = first_kept; k < words.size(); ++k) {
        parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      }
    }
  } else {
    const std::string& d = sep.str();
    std::vector<size_t> cuts;  // positions of the separators, left to right
    for (size_t p = s.find(d); p != absl::string_view::npos; p = s.find(d, p + d.size())) {
      cuts.push_back(p);
    }
    if (maxsplit >= 0 && cuts.size() > static_cast<size_t>(maxsplit)) {
      if (from_right) {
        // rsplit scans from the right: the non-overlapping matches it finds may differ for
        // self-overlapping separators, which chat templates do not use.
        cuts.erase(cuts.begin(), cuts.end() - maxsplit);
      } else {
        cuts.resize(static_cast<size_t>(maxsplit));
      }
    }
    size_t b = 0;
    for (size_t p : cuts) {
      parts.emplace_back(s.substr(b, p - b));
      b = p + d.size();
    }
    parts.emplace_back(s.substr(b));
  }
  ValueList out;
  for (std::string& p : parts) {
    out.push_back(Value::String(std::move(p)));
  }
  return out;
}

// Python's str.replace(old, new, count); an empty `old` inserts `new` between characters.
absl::StatusOr<std::string> PyReplace(absl::string_view s, absl::string_view old,
                                      absl::string_view repl, int64_t count, Budget* budget) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::vector<size_t> offsets = CharOffsets(s);
    const size_t n = offsets.size() - 1;
    for (size_t i = 0; i <= n; ++i) {
      if (count < 0 || done < count) {
        out.append(repl.data(), repl.size());
        ++done;
      }
      if (i < n) {
        absl::StrAppend(&out, s.substr(offsets[i], offsets[i + 1] - offsets[i]));
      }
      PD_RETURN_IF_ERROR(budget->CheckSize(out.size()));
    }
    return out;
  }
  size_t b = 0;
  for (size_t p = s.find(old); p != absl::string_view::npos && (count < 0 || done < count);
       p = s.find(old, b)) {
    absl::StrAppend(&out, s.substr(b, p - b));
    out.append(repl.data(), repl.size());
    b = p + old.size();
    ++done;
    PD_RETURN_IF_ERROR(budget->CheckSize(out.size()));
  }
  absl::StrAppend(&out, s.substr(b));
  PD_RETURN_IF_ERROR(budget->CheckSize(out.size()));
  return out;
}

absl::StatusOr<bool> PrefixMatch(const std::string& s, const Value& arg, bool suffix) {
  const auto one = [&](const Value& p) -> absl::StatusOr<bool> {
    if (!p.is_string()) {
      return TypeError(absl::StrCat(suffix ? "endswith" : "startswith",
                                    " first arg must be str or a tuple of str, not ",
                                    p.TypeName()));
    }
    return suffix ? absl::EndsWith(s, p.str()) : absl::StartsWith(s, p.str());
  };
  if (arg.is_tuple()) {
    for (const Value& p : arg.list()) {
      PD_ASSIGN_OR_RETURN(bool m, one(p));
      if (m) {
        return true;
      }
    }
    return false;
  }
  return one(arg);
}

template <typename Pred>
bool AllChars(const std::string& s, Pred pred) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}

absl::StatusOr<Value> StringMethod(const std::string& s, absl::string_view name,
                                   const CallArgs& args, Budget* budget) {
  PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(s.size()) + 1));
  const Value none = Value::None();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {"chars"}));
    return Value::String(
        StripString(s, args.Get(0, "chars", none), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {}));
    if (args.positional.empty()) {
      return TypeError(absl::StrCat(name, "() takes at least 1 argument (0 given)"));
    }
    PD_ASSIGN_OR_RETURN(bool m, PrefixMatch(s, args.positional[0], name == "endswith"));
    return Value::Bool(m);
  }
  if (name == "split" || name == "rsplit") {
    PD_RETURN_IF_ERROR(args.Check(name, 2, {"sep", "maxsplit"}));
    const Value& sep = args.Get(0, "sep", none);
    const Value& maxsplit = args.Get(1, "maxsplit", Value::Int(-1));
    if (!sep.is_none() && !sep.is_string()) {
      return TypeError(absl::StrCat("must be str or None, not ", sep.TypeName()));
    }
    if (sep.is_string() && sep.str().empty()) {
      return TypeError("empty separator");
    }
    if (!maxsplit.is_int() && !maxsplit.is_bool()) {
      return TypeError("maxsplit must be an integer");
    }
    return Value::List(PySplit(s, sep, maxsplit.AsInt(), name == "rsplit"));
  }
  if (name == "splitlines") {
    PD_RETURN_IF_ERROR(args.Check(name, 0, {}));
    ValueList lines;
    size_t b = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        lines.push_back(Value::String(s.substr(b, i - b)));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') {
          ++i;
        }
        b = i + 1;
      }
    }
    if (b < s.size()) {
      lines.push_back(Value::String(s.substr(b)));
    }
    return Value::List(std::move(lines));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    PD_RETURN_IF_ERROR(args.Check(name, 0, {}));
    if (name == "upper") {
      return Value::String(absl::AsciiStrToUpper(s));
    }
    if (name == "lower") {
      return Value::String(absl::AsciiStrToLower(s));
    }
    if (name == "title") {
      return Value::String(PyTitleCase(s));
    }
    std::string out = absl::AsciiStrToLower(s);
    if (!out.empty()) {
      out[0] = absl::ascii_toupper(out[0]);
    }
    return Value::String(std::move(out));
  }
  if (name == "replace") {
    PD_RETURN_IF_ERROR(args.Check(name, 3, {"count"}));
    if (args.positional.size() < 2 || !args.positional[0].is_string() ||
        !args.positional[1].is_string()) {
      return TypeError("replace() takes two str arguments");
    }
    const Value& count = args.Get(2, "count", Value::Int(-1));
    if (!count.is_int()) {
      return TypeError("replace() count must be an integer");
    }
    PD_ASSIGN_OR_RETURN(std::string out,
                        PyReplace(s, args.positional[0].str(), args.positional[1].str(),
                                  count.int_value(), budget));
    return Value::String(std::move(out));
  }
  if (name == "find" || name == "count") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {}));
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return TypeError(absl::StrCat(name, "() takes one str argument"));
    }
    const std::string& sub = args.positional[0].str();
    if (name == "find") {
      const size_t p = s.find(sub);
      return Value::Int(p == std::string::npos ? -1 : CharCount(absl::string_view(s).substr(0, p)));
    }
    if (sub.empty()) {
      return Value::Int(CharCount(s) + 1);
    }
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) {
      ++n;
    }
    return Value::Int(n);
  }
  if (name == "join") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {}));
    if (args.positional.empty()) {
      return TypeError("join() takes exactly one argument");
    }
    PD_ASSIGN_OR_RETURN(ValueList items, Iterate(args.positional[0], budget));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                      items[i].TypeName(), " found"));
      }
      if (i > 0) {
        out += s;
      }
      out += items[i].str();
      PD_RETURN_IF_ERROR(budget->CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  PD_RETURN_IF_ERROR(args.Check(name, 0, {}));
  if (name == "isdigit") {
    return Value::Bool(AllChars(s, [](char c) { return absl::ascii_isdigit(c); }));
  }
  if (name == "isalpha") {
    return Value::Bool(AllChars(s, [](char c) { return absl::ascii_isalpha(c); }));
  }
  if (name == "isalnum") {
    return Value::Bool(AllChars(s, [](char c) { return absl::ascii_isalnum(c); }));
  }
  if (name == "isspace") {
    return Value::Bool(AllChars(s, IsPySpace));
  }
  const bool has_cased = std::any_of(s.begin(), s.end(), absl::ascii_isalpha);
  if (name == "islower") {
    return Value::Bool(has_cased && std::none_of(s.begin(), s.end(), absl::ascii_isupper));
  }
  return Value::Bool(has_cased && std::none_of(s.begin(), s.end(), absl::ascii_islower));
}

absl::StatusOr<Value> DictMethod(const Dict& d, absl::string_view name, const CallArgs& args,
                                 Budget* budget) {
  PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(d.items.size()) + 1));
  if (name == "get") {
    PD_RETURN_IF_ERROR(args.Check(name, 2, {}));
    if (args.positional.empty()) {
      return TypeError("get expected at least 1 argument, got 0");
    }
    const Value* v = d.Find(args.positional[0]);
    return v != nullptr ? *v : args.Get(1, "", Value::None());
  }
  PD_RETURN_IF_ERROR(args.Check(name, 0, {}));
  ValueList out;
  out.reserve(d.items.size());
  for (const auto& [k, v] : d.items) {
    if (name == "items") {
      out.push_back(Value::List({k, v}, /*is_tuple=*/true));
    } else {
      out.push_back(name == "keys" ? k : v);
    }
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Range(const CallArgs& args, Budget* budget) {
  PD_RETURN_IF_ERROR(args.Check("range", 3, {}));
  int64_t v[3] = {0, 0, 1};
  const size_t n = args.positional.size();
  if (n == 0) {
    return TypeError("range expected at least 1 argument, got 0");
  }
  for (size_t i = 0; i < n; ++i) {
    const Value& a = args.positional[i];
    if (!a.is_int() && !a.is_bool()) {
      return TypeError(
          absl::StrCat("'", a.TypeName(), "' object cannot be interpreted as an integer"));
    }
  }
  if (n == 1) {
    v[1] = args.positional[0].AsInt();
  } else {
    v[0] = args.positional[0].AsInt();
    v[1] = args.positional[1].AsInt();
    if (n == 3) {
      v[2] = args.positional[2].AsInt();
    }
  }
  if (v[2] == 0) {
    return TypeError("range() arg 3 must not be zero");
  }
  // Length without overflow: in long double, then bounded.
  const long double span =
      v[2] > 0 ? static_cast<long double>(v[1]) - v[0] : static_cast<long double>(v[0]) - v[1];
  const long double len = span <= 0 ? 0 : std::ceil(span / std::fabs((long double)v[2]));
  if (len > static_cast<long double>(budget->max_items)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("range() of more than ", budget->max_items, " items"));
  }
  const int64_t count = static_cast<int64_t>(len);
  PD_RETURN_IF_ERROR(budget->Charge(count));
  PD_RETURN_IF_ERROR(budget->ReserveMemory(count * static_cast<int64_t>(sizeof(Value))));
  ValueList out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(Value::Int(v[0] + i * v[2]));
  }
  return Value::List(std::move(out));
}

// namespace(...) and dict(...): a mapping from an optional dict and keyword arguments.
absl::StatusOr<Dict> MappingFromArgs(absl::string_view what, const CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) {
    return TypeError(
        absl::StrCat(what, " expected at most 1 argument, got ", args.positional.size()));
  }
  if (args.positional.size() == 1) {
    const Value& a = args.positional[0];
    if (a.is_dict() || a.is_namespace()) {
      d = a.is_dict() ? a.dict() : a.mutable_namespace();
    } else {
      return TypeError(absl::StrCat(what, "() argument must be a mapping, not ", a.TypeName()));
    }
  }
  for (const auto& [k, v] : args.kwargs) {
    d.Set(Value::String(k), v);
  }
  return d;
}

}  // namespace

Value CallArgs::Get(size_t index, absl::string_view name, const Value& fallback) const {
  if (index < positional.size()) {
    return positional[index];
  }
  for (const auto& [k, v] : kwargs) {
    if (k == name) {
      return v;
    }
  }
  return fallback;
}

absl::Status CallArgs::Check(absl::string_view what, size_t max_positional,
                             std::initializer_list<absl::string_view> names) const {
  if (positional.size() > max_positional) {
    return absl::InvalidArgumentError(absl::StrCat(what, "() takes at most ", max_positional,
                                                   " positional arguments (", positional.size(),
                                                   " given)"));
  }
  for (const auto& [k, v] : kwargs) {
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "() got an unexpected keyword argument '", k, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status Budget::Charge(int64_t units) {
  work_left -= units;
  if (work_left < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template render exceeded its work limit of ", max_work, " steps"));
  }
  PD_RETURN_IF_ERROR(ReserveMemory(0));
  // absl::Now() costs tens of nanoseconds: read it on the first charge and every 64th.
  if ((charges++ & 63) == 0 && absl::Now() > deadline) {
    return absl::ResourceExhaustedError(absl::StrCat("template render exceeded its time limit of ",
                                                     absl::FormatDuration(max_duration)));
  }
  return absl::OkStatus();
}

absl::Status Budget::ChargeIteration() {
  if (--iterations_left < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("template render exceeded its limit of ",
                                                     max_iterations,
                                                     " loop iterations and macro calls"));
  }
  return Charge(1);
}

absl::Status Budget::ReserveMemory(int64_t bytes) const {
  if (meter != nullptr && meter->used_bytes() + bytes > max_memory_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template render exceeded its memory limit of ", max_memory_bytes,
                     " bytes (strings and lists built)"));
  }
  return absl::OkStatus();
}

absl::Status Budget::ChargeMemory(int64_t bytes) {
  PD_RETURN_IF_ERROR(ReserveMemory(bytes));
  if (meter != nullptr) {
    meter->Add(bytes);
  }
  return absl::OkStatus();
}

absl::Status Budget::CheckSize(size_t bytes) const {
  if (bytes > static_cast<size_t>(max_string_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template built a string over the limit of ", max_string_bytes, " bytes"));
  }
  return absl::OkStatus();
}

std::string StripString(absl::string_view s, const Value& chars, bool left, bool right) {
  const auto strip = [&](char c) {
    return chars.is_string() ? chars.str().find(c) != std::string::npos : IsPySpace(c);
  };
  size_t b = 0, e = s.size();
  while (left && b < e && strip(s[b])) {
    ++b;
  }
  while (right && e > b && strip(s[e - 1])) {
    --e;
  }
  return std::string(s.substr(b, e - b));
}

absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name) {
  if (obj.is_undefined()) {
    return absl::InvalidArgumentError(obj.undefined_hint());
  }
  if (IsMethodOf(obj, name)) {
    Callable c;
    c.kind = Callable::Kind::kMethod;
    c.name = std::string(name);
    c.receiver = obj;
    return Value::MakeCallable(std::move(c));
  }
  if (obj.is_dict() || obj.is_namespace()) {
    const Value* v = obj.is_dict() ? obj.dict().Find(name) : obj.mutable_namespace().Find(name);
    if (v != nullptr) {
      return *v;
    }
  }
  return Missing(obj, name);
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) {
    return absl::InvalidArgumentError(obj.undefined_hint());
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(key); v != nullptr) {
      return *v;
    }
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.AsInt();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list().size());
      i = i < 0 ? i + n : i;
      if (i >= 0 && i < n) {
        return obj.list()[static_cast<size_t>(i)];
      }
    } else {
      const std::vector<size_t> offsets = CharOffsets(obj.str());
      const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
      i = i < 0 ? i + n : i;
      if (i >= 0 && i < n) {
        return Value::String(obj.str().substr(offsets[i], offsets[i + 1] - offsets[i]));
      }
    }
    return Value::Undefined(absl::StrCat(ObjectName(obj), " has no element ", key.AsInt()));
  }
  if (key.is_string()) {
    return GetAttr(obj, key.str());
  }
  if (obj.is_namespace()) {
    return absl::InvalidArgumentError("'Namespace' object is not subscriptable");
  }
  return Value::Undefined(absl::StrCat(ObjectName(obj), " has no element ", ToPythonRepr(key)));
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                            const Value& step_v, Budget* budget) {
  if (obj.is_undefined()) {
    return absl::InvalidArgumentError(obj.undefined_hint());
  }
  if (!obj.is_list() && !obj.is_string()) {
    return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  bool has_start = false, has_stop = false, has_step = false;
  int64_t start = 0, stop = 0, step = 1;
  PD_RETURN_IF_ERROR(SliceIndex(start_v, &has_start, &start));
  PD_RETURN_IF_ERROR(SliceIndex(stop_v, &has_stop, &stop));
  PD_RETURN_IF_ERROR(SliceIndex(step_v, &has_step, &step));
  if (!has_step) {
    step = 1;
  }
  if (step == 0) {
    return TypeError("slice step cannot be zero");
  }
  std::vector<size_t> offsets;
  int64_t len = 0;
  if (obj.is_list()) {
    len = static_cast<int64_t>(obj.list().size());
  } else {
    offsets = CharOffsets(obj.str());
    len = static_cast<int64_t>(offsets.size()) - 1;
  }
  PD_RETURN_IF_ERROR(budget->Charge(len + 1));
  // CPython's PySlice_AdjustIndices.
  const int64_t lower = step > 0 ? 0 : -1;
  const int64_t upper = step > 0 ? len : len - 1;
  const auto adjust = [&](bool present, int64_t v, int64_t fallback) {
    if (!present) {
      return fallback;
    }
    if (v < 0) {
      v = v < INT64_MIN + len ? lower : v + len;
      return std::max(v, lower);
    }
    return std::min(v, upper);
  };
  start = adjust(has_start, start, step > 0 ? lower : upper);
  stop = adjust(has_stop, stop, step > 0 ? upper : lower);
  ValueList items;
  std::string chars;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (obj.is_list()) {
      items.push_back(obj.list()[static_cast<size_t>(i)]);
    } else {
      chars.append(obj.str(), offsets[i], offsets[i + 1] - offsets[i]);
    }
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) {
      break;
    }
    i += step;
  }
  if (obj.is_list()) {
    return Value::List(std::move(items), obj.is_tuple());
  }
  return Value::String(std::move(chars));
}

absl::StatusOr<ValueList> Iterate(const Value& v, Budget* budget) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(v.list().size())));
      PD_RETURN_IF_ERROR(
          budget->ChargeMemory(static_cast<int64_t>(v.list().size() * sizeof(Value))));
      return v.list();
    case Value::Kind::kDict: {
      PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(v.dict().items.size())));
      PD_RETURN_IF_ERROR(
          budget->ChargeMemory(static_cast<int64_t>(v.dict().items.size() * sizeof(Value))));
      ValueList keys;
      for (const auto& [k, val] : v.dict().items) {
        keys.push_back(k);
      }
      return keys;
    }
    case Value::Kind::kString: {
      PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(v.str().size())));
      PD_RETURN_IF_ERROR(
          budget->ChargeMemory(static_cast<int64_t>(v.str().size() * sizeof(Value))));
      const std::vector<size_t> offsets = CharOffsets(v.str());
      ValueList chars;
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(Value::String(v.str().substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      return chars;
    }
    default:
      return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle, Budget* budget) {
  if (haystack.is_string()) {
    if (!needle.is_string()) {
      return TypeError(
          absl::StrCat("'in <string>' requires string as left operand, not ", needle.TypeName()));
    }
    PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(haystack.str().size())));
    return absl::StrContains(haystack.str(), needle.str());
  }
  if (haystack.is_dict()) {
    PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(haystack.dict().items.size())));
    return haystack.dict().Find(needle) != nullptr;
  }
  if (haystack.is_list()) {
    PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(haystack.list().size())));
    for (const Value& v : haystack.list()) {
      if (Equals(v, needle)) {
        return true;
      }
    }
    return false;
  }
  if (haystack.is_undefined()) {
    return false;
  }
  return TypeError(absl::StrCat("argument of type '", haystack.TypeName(), "' is not iterable"));
}

absl::StatusOr<Value> CallMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args, Budget* budget) {
  if (receiver.is_string()) {
    return StringMethod(receiver.str(), name, args, budget);
  }
  if (receiver.is_dict()) {
    return DictMethod(receiver.dict(), name, args, budget);
  }
  return TypeError(absl::StrCat("'", receiver.TypeName(), "' has no method ", name));
}

bool IsGlobalFunction(absl::string_view name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now";
}

absl::StatusOr<Value> CallGlobal(absl::string_view name, const CallArgs& args, Budget* budget) {
  if (name == "range") {
    return Range(args, budget);
  }
  if (name == "namespace" || name == "dict") {
    PD_ASSIGN_OR_RETURN(Dict d, MappingFromArgs(name, args));
    PD_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(d.items.size()) + 1));
    if (name == "dict") return Value::MakeDict(std::move(d));
    Value ns = Value::Namespace(std::move(d));
    budget->namespaces.push_back(ns);
    return ns;
  }
  if (name == "raise_exception") {
    absl::Status raised = absl::InvalidArgumentError(
        args.positional.empty() ? "raise_exception called" : ToPythonStr(args.positional[0]));
    raised.SetPayload(kLocatedPayload, absl::Cord("raise_exception"));
    return raised;
  }
  if (name == "strftime_now") {
    PD_RETURN_IF_ERROR(args.Check(name, 1, {}));
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return TypeError("strftime_now() takes one str argument");
    }
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof(buf), args.positional[0].str().c_str(), &local);
    return Value::String(std::string(buf, n));
  }
  return TypeError(absl::StrCat("'", name, "' is not a function"));
}

}  // namespace pd::chat::internal
