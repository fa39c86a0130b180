// Mooncake-format request traces (JSON Lines), e.g.
// ../shared/traces/mooncake_conversation_trace.jsonl:
//
//   {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ..., 13]}
//
// timestamp: arrival in milliseconds from the start of the trace (integer or decimal, >= 0).
// input_length, output_length: token counts (integers >= 1).
// hash_ids: ids (integers >= 0) of the prompt's blocks of `block_tokens` tokens (512 for
//   Mooncake traces); exactly ceil(input_length / block_tokens) of them, the last block partial.
// Other fields are ignored; empty lines are skipped.
//
// Pure parsing, no I/O except LoadTrace. Thread-compatible.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pd::loadtest {

// One request of a trace.
struct TraceRecord {
  int64_t line_number = 0;  // 1-based line in the file
  double timestamp_ms = 0;  // as in the file
  // When to send it, relative to the start of the replay: (timestamp - first timestamp) *
  // time_scale. Filled by ParseTrace.
  absl::Duration arrival_offset;
  int64_t input_length = 0;  // after the --max_input_len cap
  int64_t output_length = 0;
  std::vector<uint64_t> hash_ids;  // after the cap: ceil(input_length / block_tokens) ids
};

enum class BadLinePolicy { kAbort, kSkip };

// Parses "abort" / "skip"; InvalidArgument otherwise.
absl::StatusOr<BadLinePolicy> ParseBadLinePolicy(absl::string_view text);

struct TraceOptions {
  // Replay speed: arrival offsets are timestamp deltas multiplied by this (0.5 = twice as fast).
  // Must be > 0.
  double time_scale = 1.0;
  // Caps every prompt at this many tokens (dropping the hash ids past the cap); 0 = no cap.
  int64_t max_input_len = 0;
  // Tokens per hash id. Must be >= 1.
  int64_t block_tokens = 512;
  BadLinePolicy on_bad_line = BadLinePolicy::kAbort;
};

struct Trace {
  // Requests in arrival order (stable-sorted by timestamp).
  std::vector<TraceRecord> records;
  // One message per skipped malformed line ("<name>:<line>: <why>"), with kSkip.
  std::vector<std::string> skipped;
  // Records whose prompt the max_input_len cap shortened.
  int64_t num_capped = 0;
};

// Parses one line (no trailing newline). InvalidArgument saying what is wrong, without the
// line number (the caller adds it).
absl::StatusOr<TraceRecord> ParseTraceLine(absl::string_view line, int64_t block_tokens);

// Parses a whole trace. `name` labels messages ("trace.jsonl:17: ..."). With kAbort, the first
// malformed line fails the parse with InvalidArgument "<name>:<line>: <why>"; with kSkip it is
// recorded in `skipped`. InvalidArgument for bad options or a trace without any valid record.
absl::StatusOr<Trace> ParseTrace(std::istream& in, absl::string_view name,
                                 const TraceOptions& options);

// Opens and parses `path`. NotFound when the file cannot be opened; ParseTrace's errors.
absl::StatusOr<Trace> LoadTrace(const std::string& path, const TraceOptions& options);

}  // namespace pd::loadtest
