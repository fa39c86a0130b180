// The built-ins of the Jinja2 subset (engine/chat/jinja.h): attribute and item access, filters,
// tests, string and dict methods and global functions, with the semantics of the Python
// objects Jinja2 would see. Internal to engine/chat; interpreter.cc calls them. Each call is
// charged to a Budget so that no template can make a render run unboundedly long.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/chat/value.h"

namespace pd::chat::internal {

// Payload on a status whose message must reach the caller unchanged: it already names its
// template line, or it is raise_exception's message.
inline constexpr absl::string_view kLocatedPayload = "pd.chat/located";

// Arguments of a call, filter or test (the subject of a filter or test not included).
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> kwargs;

  // The argument at `index` or named `name`; `fallback` when neither was given.
  Value Get(size_t index, absl::string_view name, const Value& fallback) const;
  // InvalidArgument when more than `max_positional` positional arguments or a keyword not in
  // `names` was given; `what` names the callee in the message.
  absl::Status Check(absl::string_view what, size_t max_positional,
                     std::initializer_list<absl::string_view> names) const;
};

// The resources a render may still use. Every built-in that walks a collection or builds a
// string charges for it; every Charge also checks the memory meter and, every few calls, the
// clock, so a render stops within a few steps of crossing any limit.
struct Budget {
  int64_t work_left = 0;         // element visits, characters copied, loop iterations
  int64_t iterations_left = 0;   // loop iterations and macro calls
  int64_t max_string_bytes = 0;  // largest string or output any operation may build
  int64_t max_items = 0;         // largest list (range(), list building)
  // Bytes of values built so far (the render's meter; null = not counted) and their limit.
  ValueMeter* meter = nullptr;
  int64_t max_memory_bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
  // The limits as configured, for the messages.
  int64_t max_work = 0;
  int64_t max_iterations = 0;
  absl::Duration max_duration = absl::InfiniteDuration();
  int64_t charges = 0;  // calls of Charge, to read the clock every 64th
  // The namespaces this render created. A namespace is shared and mutable, so it can hold
  // itself (`{% set ns.me = ns %}`): a reference cycle. The render empties them all when it
  // ends, which breaks every cycle (nothing built during a render outlives it).
  std::vector<Value> namespaces;

  // ResourceExhausted once the work runs out, the meter is past max_memory_bytes or the
  // deadline has passed.
  absl::Status Charge(int64_t units);
  // One loop iteration or macro call: Charge(1) and the iteration limit.
  absl::Status ChargeIteration();
  // ResourceExhausted when building `bytes` more would pass max_memory_bytes; counts nothing
  // (Value::String and Value::List count what they build). Call before a large allocation.
  absl::Status ReserveMemory(int64_t bytes) const;
  // Counts `bytes` built outside Value::String/List (a ValueList copy), then checks the limit.
  absl::Status ChargeMemory(int64_t bytes);
  // ResourceExhausted when a string of `bytes` would be over the limit.
  absl::Status CheckSize(size_t bytes) const;
};

// obj.name with Jinja2's rules: a method of the object first (str and dict methods), then the
// item `name`; Undefined (with a hint) when neither exists. Accessing anything on undefined
// fails with the undefined's message.
absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name);
// obj[key]: the item first (negative list and string indices count from the end; an index out
// of range is undefined), then, for a string key, the attribute.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] on a list or string (characters, not bytes), Python's slice rules.
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step, Budget* budget);

// The items iterating `v` yields: list items, dict keys, string characters; none for undefined.
// InvalidArgument for values that are not iterable.
absl::StatusOr<ValueList> Iterate(const Value& v, Budget* budget);
// Python's `needle in haystack`.
absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle, Budget* budget);

// Whether a filter or test of that name exists (the parser rejects unknown ones, as Jinja2's
// compiler does).
bool IsKnownFilter(absl::string_view name);
bool IsKnownTest(absl::string_view name);

// `subject | name(args)`.
absl::StatusOr<Value> CallFilter(absl::string_view name, const Value& subject, const CallArgs& args,
                                 Budget* budget);
// `subject is name(args)`.
absl::StatusOr<bool> CallTest(absl::string_view name, const Value& subject, const CallArgs& args,
                              Budget* budget);
// A bound method of a string or dict (the Callable's receiver) called with `args`.
absl::StatusOr<Value> CallMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args, Budget* budget);
// The global functions: range, namespace, dict, raise_exception, strftime_now.
// raise_exception fails with exactly its message (InvalidArgument).
bool IsGlobalFunction(absl::string_view name);
absl::StatusOr<Value> CallGlobal(absl::string_view name, const CallArgs& args, Budget* budget);

// Python's str.strip/lstrip/rstrip over ASCII whitespace, or over the characters of `chars`.
std::string StripString(absl::string_view s, const Value& chars, bool left, bool right);

}  // namespace pd::chat::internal
