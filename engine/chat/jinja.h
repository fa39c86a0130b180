// A Jinja2 subset interpreter for chat templates (the `chat_template` of a Hugging Face
// tokenizer_config.json), checked byte for byte against Python's jinja2 3.1 on the templates in
// engine/chat/testdata (engine/chat/jinja_differential_test.cc). docs/chat_templates.md has the
// full list and the known differences.
//
// Supported:
//   - Text, {{ expr }}, {# comments #}, {% raw %}; whitespace control {%- -%} {{- -}} {#- -#}
//     and `+` to opt out; trim_blocks and lstrip_blocks (TemplateOptions; Hugging Face renders
//     with both on); one trailing newline dropped and \r\n read as \n, as Jinja2 does.
//   - Statements: if/elif/else; for (one or more targets, `if` loop filter, else, break and
//     continue; loop.index, index0, revindex, revindex0, first, last, length, previtem,
//     nextitem, depth, depth0, cycle); set (names, tuples, `ns.attr` on a namespace, and the
//     block form with filters); macro (positional and keyword arguments with defaults);
//     filter blocks.
//   - Expressions: none/true/false (also None/True/False), ints (0x, 0o, 0b, underscores),
//     floats, strings with Python escapes, lists, tuples, dicts; attribute (`m.role`, on dicts
//     too), subscript and slices (`[a:b:c]`, `[::-1]`); + - * / // % ** (left-associative, as
//     in Jinja2), unary - +, ~, == != < <= > >= (chained), in, not in, and, or, not,
//     `a if c else b` (else optional), calls with keyword arguments, filters and tests.
//   - Filters: abs, attr, capitalize, count, default/d, e/escape, first, float, indent, int,
//     items, join, last, length, list, lower, map (filter name or attribute=), reject,
//     rejectattr, replace, reverse, safe, select, selectattr, sort, string, sum, title, tojson
//     (Hugging Face's: json.dumps with ensure_ascii=False, indent, separators, sort_keys),
//     trim, upper.
//   - Tests: boolean, callable, defined, divisibleby, eq/equalto/==, even, false, float, ge,
//     gt, in, integer, iterable, le, lower, lt, mapping, ne, none, number, odd, sameas,
//     sequence, string, true, undefined, upper; all with `is not`.
//   - Methods: str strip lstrip rstrip startswith endswith split rsplit splitlines upper lower
//     replace title capitalize find count join isdigit isalpha isalnum isspace islower
//     isupper; dict items keys values get.
//   - Globals: range, namespace, dict, raise_exception(msg) (the render fails with exactly
//     msg), strftime_now(format).
//   - Undefined values behave like Jinja2's default Undefined: print as "", are false, iterate
//     as empty, `is defined` is false; any attribute, item, arithmetic or call on one fails.
//
// Not supported (a syntax error says so): include/import/extends/block, call blocks, recursive
// loops, with, *args/**kwargs. Strings are UTF-8; case conversions touch ASCII letters only.
// Ints are 64-bit (overflow is an error, where Python would grow).
//
// Errors: syntax errors are InvalidArgument with "line L, column C: ..."; render errors are
// InvalidArgument naming the problem and its line; exceeded RenderLimits are
// ResourceExhausted naming the limit (work, iterations, memory, time, output, items, depth). No
// input crashes or hangs the interpreter: recursion, output, loop iterations and all other work are
// bounded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/chat/value.h"

namespace pd::chat {

namespace internal {
struct Stmt;
}  // namespace internal

struct TemplateOptions {
  // Remove the first newline after a block or comment tag (Jinja2's trim_blocks).
  bool trim_blocks = false;
  // Strip spaces and tabs before a block or comment tag that starts its line (lstrip_blocks).
  bool lstrip_blocks = false;
  // Deepest nesting of blocks and expressions; bounds the interpreter's recursion.
  int max_nesting_depth = 64;
};

// What one render may use. Every limit trips deterministically (the same template and input
// fail at the same point) except max_duration, the wall-clock backstop for the work the others
// do not count. Exceeding any is ResourceExhausted naming the limit.
struct RenderLimits {
  // Largest output, and largest string any expression may build.
  int64_t max_output_bytes = int64_t{16} << 20;
  // Loop iterations, macro calls and elements visited by filters and operators, together.
  int64_t max_work = 20'000'000;
  // Loop iterations and macro calls alone (each also counts as work): the costly steps.
  int64_t max_iterations = 1'000'000;
  // Bytes of the strings and lists the render builds, summed over the render (a list counts
  // sizeof(Value) per item, and so does every copy a loop or filter iterates over): bounds its
  // memory whatever it frees meanwhile. The output counts separately (max_output_bytes).
  int64_t max_memory_bytes = int64_t{64} << 20;
  // Wall-clock time of one render, checked as it works.
  absl::Duration max_duration = absl::Seconds(1);
  // Deepest macro call chain.
  int max_call_depth = 16;
  // Longest list range() or a repetition may build.
  int64_t max_items = int64_t{1} << 20;

  // InvalidArgument naming the first limit that is not positive.
  absl::Status Validate() const;
};

// A parsed template. Immutable and cheap to copy; Render is thread-safe.
class Template {
 public:
  // InvalidArgument with line and column for syntax errors and unsupported constructs.
  static absl::StatusOr<Template> Parse(absl::string_view source,
                                        const TemplateOptions& options = {});

  // Renders with the variables of `context` (a dict with string keys; anything else is an
  // empty context). Errors: see the file comment.
  absl::StatusOr<std::string> Render(const Value& context, const RenderLimits& limits = {}) const;

 private:
  explicit Template(std::shared_ptr<const std::vector<std::unique_ptr<internal::Stmt>>> body)
      : body_(std::move(body)) {}

  std::shared_ptr<const std::vector<std::unique_ptr<internal::Stmt>>> body_;
};

}  // namespace pd::chat
