// Fuzzes the Mooncake trace reader (loadtest/trace.h): ParseTrace over the input as a JSON
// Lines file, with the default options (512-token blocks, abort on a bad line) and with
// skipping, a prompt cap and 1-token blocks; and ParseTraceLine on every line.
//
// Checks: errors are InvalidArgument; every record satisfies the documented invariants
// (lengths >= 1, ceil(input_length / block_tokens) hash ids, after the cap), records are in
// timestamp order with non-negative arrival offsets, and abort and skip agree on clean input.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "loadtest/trace.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using pd::loadtest::BadLinePolicy;
using pd::loadtest::Trace;
using pd::loadtest::TraceOptions;
using pd::loadtest::TraceRecord;

void CheckRecord(const TraceRecord& r, const TraceOptions& o) {
  CHECK_GE(r.line_number, 1);
  CHECK(std::isfinite(r.timestamp_ms) && r.timestamp_ms >= 0) << r.timestamp_ms;
  CHECK_GE(r.input_length, 1);
  CHECK_GE(r.output_length, 1);
  if (o.max_input_len > 0) {
    CHECK_LE(r.input_length, o.max_input_len);
  }
  const int64_t blocks = r.input_length / o.block_tokens + (r.input_length % o.block_tokens != 0);
  CHECK_EQ(static_cast<int64_t>(r.hash_ids.size()), blocks);
}

absl::StatusOr<Trace> ParseAndCheck(absl::string_view input, const TraceOptions& o) {
  std::istringstream in{std::string(input)};
  absl::StatusOr<Trace> trace = pd::loadtest::ParseTrace(in, "fuzz.jsonl", o);
  if (!trace.ok()) {
    CHECK(absl::IsInvalidArgument(trace.status())) << trace.status();
    return trace;
  }
  CHECK(!trace->records.empty());
  if (o.on_bad_line == BadLinePolicy::kAbort) {
    CHECK(trace->skipped.empty());
  }
  int64_t capped = 0;
  for (size_t i = 0; i < trace->records.size(); ++i) {
    const TraceRecord& r = trace->records[i];
    CheckRecord(r, o);
    CHECK(r.arrival_offset >= absl::ZeroDuration());
    if (i > 0) {
      CHECK_LE(trace->records[i - 1].timestamp_ms, r.timestamp_ms);
      CHECK(trace->records[i - 1].arrival_offset <= r.arrival_offset);
    }
    capped += o.max_input_len > 0 && r.input_length == o.max_input_len;
  }
  CHECK_LE(trace->num_capped, capped);
  return trace;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input = pd::fuzz::AsView(data, size);
  TraceOptions strict;  // 512-token blocks, abort
  TraceOptions lenient;
  lenient.on_bad_line = BadLinePolicy::kSkip;
  lenient.max_input_len = 1000;
  lenient.time_scale = 0.5;
  TraceOptions tiny_blocks;
  tiny_blocks.block_tokens = 1;
  tiny_blocks.on_bad_line = BadLinePolicy::kSkip;

  const absl::StatusOr<Trace> a = ParseAndCheck(input, strict);
  ParseAndCheck(input, lenient).IgnoreError();
  ParseAndCheck(input, tiny_blocks).IgnoreError();
  if (a.ok()) {
    TraceOptions skip = strict;
    skip.on_bad_line = BadLinePolicy::kSkip;
    const absl::StatusOr<Trace> b = ParseAndCheck(input, skip);
    CHECK(b.ok() && b->skipped.empty() && b->records.size() == a->records.size());
  }
  for (absl::string_view line : absl::StrSplit(input, '\n')) {
    for (int64_t block_tokens : {int64_t{1}, int64_t{512}, int64_t{1} << 40}) {
      absl::StatusOr<TraceRecord> r = pd::loadtest::ParseTraceLine(line, block_tokens);
      if (!r.ok()) {
        CHECK(absl::IsInvalidArgument(r.status())) << r.status();
        continue;
      }
      TraceOptions o;
      o.block_tokens = block_tokens;
      TraceRecord numbered = *r;
      numbered.line_number = 1;
      CheckRecord(numbered, o);
    }
  }
  return 0;
}
