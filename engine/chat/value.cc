#include "engine/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8/utf8.h"
#include "nlohmann/json.hpp"

namespace pd::chat {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Length of the well-formed UTF-8 character at s[i], or 1 for a byte that starts none (Python
// sees each such byte as one character).
size_t CharLengthAt(absl::string_view s, size_t i) {
  const utf8::Char c = utf8::Decode(s, i);
  return c.valid() ? c.length : 1;
}

void AppendHexEscape(std::string* out, const char* prefix, unsigned v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s%0*x", prefix, digits, v);
  out->append(buf);
}

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const utf8::Char ch = utf8::Decode(s, i);
    const size_t n = ch.valid() ? ch.length : 1;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (n == 1) {
      if (c == '\\' || c == static_cast<unsigned char>(quote)) {
        out.push_back('\\');
        out.push_back(static_cast<char>(c));
      } else if (c == '\n') {
        out.append("\\n");
      } else if (c == '\r') {
        out.append("\\r");
      } else if (c == '\t') {
        out.append("\\t");
      } else if (c < 0x20 || c == 0x7F) {
        AppendHexEscape(&out, "\\x", c, 2);
      } else {
        out.push_back(static_cast<char>(c));
      }
    } else if (ch.code_point < 0xA1 || ch.code_point == 0xAD) {
      // C1 controls, no-break space and soft hyphen are not printable in Python.
      AppendHexEscape(&out, "\\x", static_cast<unsigned>(ch.code_point), 2);
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  out.push_back(quote);
  return out;
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20) {
          AppendHexEscape(out, "\\u", c, 4);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) {
    return "NaN";
  }
  if (std::isinf(d)) {
    return d > 0 ? "Infinity" : "-Infinity";
  }
  return FormatFloat(d);
}

class JsonWriter {
 public:
  JsonWriter(int64_t indent, std::string item_sep, std::string key_sep, bool sort_keys,
             int64_t max_bytes)
      : indent_(indent),
        item_sep_(std::move(item_sep)),
        key_sep_(std::move(key_sep)),
        sort_keys_(sort_keys),
        max_bytes_(max_bytes) {}

  absl::Status Write(const Value& v, int depth) {
    if (out_.size() > static_cast<size_t>(max_bytes_)) {
      // Also reached after Newline() found the indentation would not fit.
      return absl::ResourceExhaustedError(
          absl::StrCat("tojson output exceeds the limit of ", max_bytes_, " bytes"));
    }
    if (depth > 256) {
      return absl::InvalidArgumentError("tojson: value nested too deeply");
    }
    switch (v.kind()) {
      case Value::Kind::kNone:
        out_.append("null");
        return absl::OkStatus();
      case Value::Kind::kBool:
        out_.append(v.bool_value() ? "true" : "false");
        return absl::OkStatus();
      case Value::Kind::kInt:
        absl::StrAppend(&out_, v.int_value());
        return absl::OkStatus();
      case Value::Kind::kFloat:
        out_.append(JsonFloat(v.float_value()));
        return absl::OkStatus();
      case Value::Kind::kString:
        AppendJsonString(v.str(), &out_);
        return absl::OkStatus();
      case Value::Kind::kList:
        return WriteList(v.list(), depth);
      case Value::Kind::kDict:
        return WriteDict(v.dict(), depth);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("tojson: object of type ", v.TypeName(), " is not JSON serializable"));
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  void Newline(int depth) {
    if (indent_ < 0) {
      return;
    }
    const int64_t spaces = std::min<int64_t>(indent_, max_bytes_ + 1) * depth;
    if (static_cast<int64_t>(out_.size()) + spaces >= max_bytes_) {
      out_.resize(static_cast<size_t>(max_bytes_) + 1);  // over the limit: Write() reports it
      return;
    }
    out_.push_back('\n');
    out_.append(static_cast<size_t>(spaces), ' ');
  }

  absl::Status WriteList(const ValueList& items, int depth) {
    if (items.empty()) {
      out_.append("[]");
      return absl::OkStatus();
    }
    out_.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out_.append(item_sep_);
      }
      Newline(depth + 1);
      if (absl::Status s = Write(items[i], depth + 1); !s.ok()) {
        return s;
      }
    }
    Newline(depth);
    out_.push_back(']');
    return absl::OkStatus();
  }

  absl::Status WriteDict(const Dict& dict, int depth) {
    if (dict.items.empty()) {
      out_.append("{}");
      return absl::OkStatus();
    }
    // Keys as json.dumps writes them: strings as they are; numbers, bools and none converted.
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [key, value] : dict.items) {
      std::string k;
      switch (key.kind()) {
        case Value::Kind::kString:
          k = key.str();
          break;
        case Value::Kind::kInt:
          k = absl::StrCat(key.int_value());
          break;
        case Value::Kind::kFloat:
          k = JsonFloat(key.float_value());
          break;
        case Value::Kind::kBool:
          k = key.bool_value() ? "true" : "false";
          break;
        case Value::Kind::kNone:
          k = "null";
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat(
              "tojson: keys must be str, int, float, bool or None, not ", key.TypeName()));
      }
      entries.emplace_back(std::move(k), &value);
    }
    if (sort_keys_) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out_.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) {
        out_.append(item_sep_);
      }
      Newline(depth + 1);
      AppendJsonString(entries[i].first, &out_);
      out_.append(key_sep_);
      if (absl::Status s = Write(*entries[i].second, depth + 1); !s.ok()) {
        return s;
      }
    }
    Newline(depth);
    out_.push_back('}');
    return absl::OkStatus();
  }

  int64_t indent_;
  std::string item_sep_;
  std::string key_sep_;
  bool sort_keys_;
  int64_t max_bytes_;
  std::string out_;
};

absl::StatusOr<Value> FromJson(const OrderedJson& j, int depth, int max_depth) {
  if (depth > max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nested deeper than ", max_depth, " levels"));
  }
  switch (j.type()) {
    case OrderedJson::value_t::null:
      return Value::None();
    case OrderedJson::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case OrderedJson::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case OrderedJson::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return Value::Float(static_cast<double>(u));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case OrderedJson::value_t::number_float:
      return Value::Float(j.get<double>());
    case OrderedJson::value_t::string:
      return Value::String(j.get<std::string>());
    case OrderedJson::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const OrderedJson& e : j) {
        absl::StatusOr<Value> v = FromJson(e, depth + 1, max_depth);
        if (!v.ok()) {
          return v.status();
        }
        items.push_back(*std::move(v));
      }
      return Value::List(std::move(items));
    }
    case OrderedJson::value_t::object: {
      Dict dict;
      for (auto it = j.begin(); it != j.end(); ++it) {
        absl::StatusOr<Value> v = FromJson(it.value(), depth + 1, max_depth);
        if (!v.ok()) {
          return v.status();
        }
        dict.Set(Value::String(it.key()), *std::move(v));
      }
      return Value::MakeDict(std::move(dict));
    }
    default:
      return absl::InvalidArgumentError("unsupported JSON value (binary)");
  }
}

}  // namespace

Value Value::Undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}

namespace internal {
namespace {
thread_local ValueMeter* current_meter = nullptr;
}  // namespace

ValueMeter::ValueMeter() : previous_(current_meter) { current_meter = this; }

ValueMeter::~ValueMeter() { current_meter = previous_; }

ValueMeter* ValueMeter::Current() { return current_meter; }

}  // namespace internal

Value Value::String(std::string s) {
  if (internal::ValueMeter* meter = internal::ValueMeter::Current(); meter != nullptr) {
    meter->Add(static_cast<int64_t>(s.size()));
  }
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::List(ValueList items, bool is_tuple) {
  if (internal::ValueMeter* meter = internal::ValueMeter::Current(); meter != nullptr) {
    meter->Add(static_cast<int64_t>(items.size() * sizeof(Value)));
  }
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = is_tuple;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::Namespace(Dict attributes) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.dict_ = std::make_shared<Dict>(std::move(attributes));
  return v;
}

Value Value::MakeCallable(Callable callable) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<const Callable>(std::move(callable));
  return v;
}

double Value::AsDouble() const {
  switch (kind_) {
    case Kind::kFloat:
      return d_;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0;
  }
}

const std::string& Value::undefined_hint() const {
  static const std::string* const kEmpty = new std::string("value is undefined");
  return s_ != nullptr ? *s_ : *kEmpty;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (Equals(k, key)) {
      return &v;
    }
  }
  return nullptr;
}

const Value* Dict::Find(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) {
      return &v;
    }
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      return a.AsDouble() == b.AsDouble();
    }
    return a.AsInt() == b.AsInt();
  }
  if (a.kind() != b.kind()) {
    return false;
  }
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) {
        return false;
      }
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equals(a.list()[i], b.list()[i])) {
          return false;
        }
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) {
        return false;
      }
      for (const auto& [k, v] : a.dict().items) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equals(v, *other)) {
          return false;
        }
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.mutable_namespace() == &b.mutable_namespace();
    case Value::Kind::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

absl::StatusOr<bool> LessThan(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      return a.AsDouble() < b.AsDouble();
    }
    return a.AsInt() < b.AsInt();
  }
  if (a.is_string() && b.is_string()) {
    return a.str() < b.str();
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const ValueList& x = a.list();
    const ValueList& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) {
        return LessThan(x[i], y[i]);
      }
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) {
    return "nan";
  }
  if (std::isinf(d)) {
    return d > 0 ? "inf" : "-inf";
  }
  char buf[64];
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  // sci = [-]D[.DDD]e(+|-)XX: the shortest digits that read back as d.
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(),
                  exponent);
  const bool negative = !mantissa.empty() && mantissa[0] == '-';
  std::string digits;
  for (char c : mantissa) {
    if (c >= '0' && c <= '9') {
      digits.push_back(c);
    }
  }
  const int decpt = exponent + 1;  // d = 0.DIGITS x 10^decpt
  if (decpt > 16 || decpt < -3) {
    return sci;  // Python's repr switches to exponent form here (1e+16, 1e-05)
  }
  std::string out = negative ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(decpt - n, '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

std::string ToPythonRepr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return ReprString(v.str());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) {
          out += ", ";
        }
        out += ToPythonRepr(v.list()[i]);
      }
      if (v.is_tuple() && v.list().size() == 1) {
        out += ",";
      }
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) {
          out += ", ";
        }
        first = false;
        out += ToPythonRepr(k) + ": " + ToPythonRepr(val);
      }
      return out + "}";
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return ToPythonStr(v);
  }
}

std::string ToPythonStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.bool_value() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.int_value());
    case Value::Kind::kFloat:
      return FormatFloat(v.float_value());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kCallable:
      return absl::StrCat("<function ", v.callable().name, ">");
    default:
      return ToPythonRepr(v);
  }
}

absl::StatusOr<std::string> ToJson(const Value& v, int64_t indent, const std::string* item_sep,
                                   const std::string* key_sep, bool sort_keys, int64_t max_bytes) {
  JsonWriter writer(indent, item_sep != nullptr ? *item_sep : (indent < 0 ? ", " : ","),
                    key_sep != nullptr ? *key_sep : ": ", sort_keys, max_bytes);
  if (absl::Status s = writer.Write(v, 0); !s.ok()) {
    return s;
  }
  std::string out = writer.Take();
  if (out.size() > static_cast<size_t>(max_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tojson output exceeds the limit of ", max_bytes, " bytes"));
  }
  return out;
}

absl::StatusOr<Value> ParseJsonValue(absl::string_view json, int max_depth) {
  const OrderedJson j = OrderedJson::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("malformed JSON");
  }
  return FromJson(j, 0, max_depth);
}

std::vector<size_t> CharOffsets(absl::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); i += CharLengthAt(s, i)) {
    offsets.push_back(i);
  }
  offsets.push_back(s.size());
  return offsets;
}

int64_t CharCount(absl::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i += CharLengthAt(s, i)) {
    ++n;
  }
  return n;
}

}  // namespace pd::chat
