// Fuzzes the Jinja2 subset interpreter (engine/chat/jinja.h): parses the input as a template,
// with and without trim_blocks/lstrip_blocks, and renders it with a fixed chat-like context
// under small limits.
//
// Checks: nothing crashes or hangs (libFuzzer's timeout and ASan/UBSan catch those); errors
// are InvalidArgument, ResourceExhausted, OutOfRange (integer overflow) or Unimplemented
// (tojson options we do not offer); output stays within the output limit; rendering is
// deterministic (the same template renders twice to the same bytes).
#include <cstdint>
#include <string>

#include "engine/chat/jinja.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr char kContext[] = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9 <b>"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "  again\n"}
  ],
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2.5, null]}}}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3, "x": 1.5
})";

bool ExpectedError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsResourceExhausted(s) || absl::IsOutOfRange(s) ||
         absl::IsUnimplemented(s);
}

const pd::chat::Value& Context() {
  static const pd::chat::Value* const kValue = [] {
    absl::StatusOr<pd::chat::Value> v = pd::chat::ParseJsonValue(kContext);
    CHECK(v.ok()) << v.status();
    return new pd::chat::Value(*std::move(v));
  }();
  return *kValue;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input = pd::fuzz::AsView(data, size);
  pd::chat::RenderLimits limits;
  limits.max_output_bytes = 64 << 10;
  limits.max_work = 200'000;
  limits.max_call_depth = 8;
  limits.max_items = 10'000;
  for (bool trim : {false, true}) {
    pd::chat::TemplateOptions options;
    options.trim_blocks = options.lstrip_blocks = trim;
    options.max_nesting_depth = 48;
    absl::StatusOr<pd::chat::Template> t = pd::chat::Template::Parse(input, options);
    if (!t.ok()) {
      CHECK(absl::IsInvalidArgument(t.status())) << t.status();
      continue;
    }
    const absl::StatusOr<std::string> a = t->Render(Context(), limits);
    if (!a.ok()) {
      CHECK(ExpectedError(a.status())) << a.status();
      continue;
    }
    CHECK_LE(a->size(), static_cast<size_t>(limits.max_output_bytes));
    if (a->find("strftime_now") == std::string::npos &&
        input.find("strftime_now") == absl::string_view::npos) {
      const absl::StatusOr<std::string> b = t->Render(Context(), limits);
      CHECK(b.ok() && *b == *a) << "render is not deterministic";
    }
  }
  return 0;
}
