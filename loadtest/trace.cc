#include "loadtest/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace pd::loadtest {
namespace {

using nlohmann::json;

// a >= 0, b >= 1. Not (a + b - 1) / b: that overflows for input_length near INT64_MAX (found by
// tests/fuzz/trace_fuzzer).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Reads a required integer field >= `min`. Type checks come first: nlohmann's get<> would throw
// on a type mismatch, and we do not throw.
absl::StatusOr<int64_t> IntField(const json& obj, const char* field, int64_t min) {
  auto it = obj.find(field);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(absl::StrCat("missing field '", field, "'"));
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", field, "' must be an integer, got ", it->dump()));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("field '", field, "' is out of range"));
  }
  const int64_t v = it->get<int64_t>();
  if (v < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", field, "' must be >= ", min, ", got ", v));
  }
  return v;
}

}  // namespace

absl::StatusOr<BadLinePolicy> ParseBadLinePolicy(absl::string_view text) {
  if (text == "abort") {
    return BadLinePolicy::kAbort;
  }
  if (text == "skip") {
    return BadLinePolicy::kSkip;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--on_bad_line must be 'abort' or 'skip', got '", text, "'"));
}

absl::StatusOr<TraceRecord> ParseTraceLine(absl::string_view line, int64_t block_tokens) {
  const json obj = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) {
    return absl::InvalidArgumentError("not valid JSON");
  }
  if (!obj.is_object()) {
    return absl::InvalidArgumentError("not a JSON object");
  }
  TraceRecord r;
  auto ts = obj.find("timestamp");
  if (ts == obj.end()) {
    return absl::InvalidArgumentError("missing field 'timestamp'");
  }
  if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'timestamp' must be a number >= 0 (ms), got ", ts->dump()));
  }
  r.timestamp_ms = ts->get<double>();
  absl::StatusOr<int64_t> input = IntField(obj, "input_length", 1);
  if (!input.ok()) {
    return input.status();
  }
  absl::StatusOr<int64_t> output = IntField(obj, "output_length", 1);
  if (!output.ok()) {
    return output.status();
  }
  r.input_length = *input;
  r.output_length = *output;
  auto ids = obj.find("hash_ids");
  if (ids == obj.end()) {
    return absl::InvalidArgumentError("missing field 'hash_ids'");
  }
  if (!ids->is_array()) {
    return absl::InvalidArgumentError("field 'hash_ids' must be an array");
  }
  r.hash_ids.reserve(ids->size());
  for (const json& id : *ids) {
    if (!id.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat("field 'hash_ids' must hold integers >= 0, got ", id.dump()));
    }
    r.hash_ids.push_back(id.get<uint64_t>());
  }
  const int64_t want = CeilDiv(r.input_length, block_tokens);
  if (static_cast<int64_t>(r.hash_ids.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'hash_ids' has ", r.hash_ids.size(), " entries but input_length ", r.input_length,
        " needs ceil(", r.input_length, " / ", block_tokens, ") = ", want));
  }
  return r;
}

absl::StatusOr<Trace> ParseTrace(std::istream& in, absl::string_view name,
                                 const TraceOptions& options) {
  if (!(options.time_scale > 0) || !std::isfinite(options.time_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--time_scale must be > 0, got ", options.time_scale));
  }
  if (options.max_input_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_input_len must be >= 0, got ", options.max_input_len));
  }
  if (options.block_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace block size must be >= 1, got ", options.block_tokens));
  }
  Trace trace;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) {
      continue;
    }
    absl::StatusOr<TraceRecord> r = ParseTraceLine(line, options.block_tokens);
    if (!r.ok()) {
      std::string message = absl::StrCat(name, ":", line_number, ": ", r.status().message());
      if (options.on_bad_line == BadLinePolicy::kAbort) {
        return absl::InvalidArgumentError(
            absl::StrCat(message, " (--on_bad_line=skip skips such lines)"));
      }
      trace.skipped.push_back(std::move(message));
      continue;
    }
    r->line_number = line_number;
    if (options.max_input_len > 0 && r->input_length > options.max_input_len) {
      r->input_length = options.max_input_len;
      r->hash_ids.resize(static_cast<size_t>(CeilDiv(r->input_length, options.block_tokens)));
      ++trace.num_capped;
    }
    trace.records.push_back(*std::move(r));
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(name, ": read error after line ", line_number));
  }
  if (trace.records.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no valid trace record"));
  }
  std::stable_sort(
      trace.records.begin(), trace.records.end(),
      [](const TraceRecord& a, const TraceRecord& b) { return a.timestamp_ms < b.timestamp_ms; });
  const double first_ms = trace.records.front().timestamp_ms;
  for (TraceRecord& r : trace.records) {
    r.arrival_offset = absl::Milliseconds((r.timestamp_ms - first_ms) * options.time_scale);
  }
  return trace;
}

absl::StatusOr<Trace> LoadTrace(const std::string& path, const TraceOptions& options) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("trace '", path, "' cannot be opened: ", std::strerror(errno)));
  }
  return ParseTrace(in, path, options);
}

}  // namespace pd::loadtest
