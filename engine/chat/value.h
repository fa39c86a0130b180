// Value: the dynamic value of the Jinja2 subset interpreter (engine/chat/jinja.h), modelled on
// the Python objects Jinja2 templates see: undefined, none, bool, int, float, string, list (and
// tuple), dict (insertion-ordered, like Python's), namespace and callables.
//
// Values are cheap to copy: strings, lists and dicts are shared and immutable once built (the
// templates run as in Jinja2's ImmutableSandboxedEnvironment, which forbids mutating them).
// A namespace is the one mutable, shared object: `{% set ns.x = 1 %}` changes every copy.
// Thread-compatible: a Value may be read from several threads; a namespace only by one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::chat {

class Value;
struct Dict;
struct Callable;

using ValueList = std::vector<Value>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // also tuples: is_tuple() changes only how it prints
    kDict,
    kNamespace,
    kCallable,
  };

  // Undefined; `hint` is the message an operation on it fails with ("'x' is undefined").
  Value() = default;
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items, bool is_tuple = false);
  static Value MakeDict(Dict dict);
  static Value Namespace(Dict attributes);
  static Value MakeCallable(Callable callable);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool (Python's bool is an int).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }
  double float_value() const { return d_; }
  // int and bool as int64; float truncated is not offered (callers decide).
  int64_t AsInt() const { return is_bool() ? (b_ ? 1 : 0) : i_; }
  // Any number as double.
  double AsDouble() const;
  // Valid only for the kind named.
  const std::string& str() const { return *s_; }
  const ValueList& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_namespace() const { return *dict_; }
  const Callable& callable() const { return *callable_; }
  // The undefined value's message.
  const std::string& undefined_hint() const;

  // Python truthiness: false for undefined, none, false, 0, 0.0, "", [] and {}.
  bool Truthy() const;
  // Python type name for messages ("int", "str", "dict", "undefined").
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;  // string, or the undefined hint
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<Dict> dict_;  // dict (never mutated once built) or namespace (mutable)
  std::shared_ptr<const Callable> callable_;
};

// An insertion-ordered mapping, like a Python dict. Lookups are linear: chat-template dicts are
// small.
struct Dict {
  std::vector<std::pair<Value, Value>> items;

  const Value* Find(const Value& key) const;
  const Value* Find(absl::string_view key) const;
  // Replaces the value of an existing key in place, or appends.
  void Set(Value key, Value value);
};

// Something a template can call: a built-in function, a method bound to a value, a macro, or a
// for loop's `loop.cycle`. The interpreter dispatches on `kind`.
struct Callable {
  enum class Kind { kGlobal, kMethod, kMacro, kCycle };
  Kind kind = Kind::kGlobal;
  std::string name;             // function or method name
  Value receiver;               // kMethod: the bound object; kCycle: the loop's index0 as Int
  const void* macro = nullptr;  // kMacro: the parser's macro node (owned by the template)
};

// Python semantics used by the interpreter and the filters.

// `a == b`: numbers compare by value (1 == 1.0 == true), lists and dicts element-wise,
// undefined equals only undefined.
bool Equals(const Value& a, const Value& b);
// `a < b` for numbers, strings (bytewise, which is code-point order for UTF-8) and lists;
// InvalidArgument naming both types otherwise (Python's TypeError).
absl::StatusOr<bool> LessThan(const Value& a, const Value& b);

// str(v): what `{{ v }}` prints. Undefined prints as "", none as "None", floats as Python's
// repr (1.0, 1e-05, 1e+16), lists and dicts as Python's repr.
std::string ToPythonStr(const Value& v);
// repr(v): strings quoted the way Python quotes them.
std::string ToPythonRepr(const Value& v);
// Python's repr of a float.
std::string FormatFloat(double d);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=sort_keys), which
// is the `tojson` filter Hugging Face installs. indent < 0 means None (one line, ", " and ": ");
// `item_sep`/`key_sep` override the separators when non-null. InvalidArgument for values JSON
// cannot hold (undefined, callables, non-string-like keys). `max_bytes` bounds the output
// (ResourceExhausted beyond it).
absl::StatusOr<std::string> ToJson(const Value& v, int64_t indent, const std::string* item_sep,
                                   const std::string* key_sep, bool sort_keys, int64_t max_bytes);

// Parses JSON text into a Value (objects keep their key order, as Python's json does). Numbers
// that fit int64 become ints, others floats. InvalidArgument for malformed JSON or nesting
// deeper than `max_depth`.
absl::StatusOr<Value> ParseJsonValue(absl::string_view json, int max_depth = 128);

namespace internal {

// Counts the bytes of the strings and lists built on this thread while it is installed: one per
// render (RenderTree), so that a template's memory is bounded whichever built-in or operator
// builds its values. Value::String adds the string's size, Value::List its items times
// sizeof(Value); values built with no meter installed (the render's context) are not counted.
// Installing nests: the constructor installs, the destructor restores the previous meter.
// Thread-compatible; lives on the stack of the thread it counts.
class ValueMeter {
 public:
  ValueMeter();
  ~ValueMeter();
  ValueMeter(const ValueMeter&) = delete;
  ValueMeter& operator=(const ValueMeter&) = delete;

  // The meter installed on this thread, or null.
  static ValueMeter* Current();

  void Add(int64_t bytes) { used_bytes_ += bytes; }
  int64_t used_bytes() const { return used_bytes_; }

 private:
  int64_t used_bytes_ = 0;
  ValueMeter* previous_;
};

}  // namespace internal

// UTF-8 helpers (lenient: a byte that does not start a well-formed character counts as one).
// Byte offsets of each character's start, plus the total size at the end.
std::vector<size_t> CharOffsets(absl::string_view s);
// Number of characters (Python's len(str)).
int64_t CharCount(absl::string_view s);

}  // namespace pd::chat
