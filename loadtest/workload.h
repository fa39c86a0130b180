// Workloads: the sequence of requests a load test sends (prompt tokens, output length and, for
// trace replay, when to send each one).
//
//   synthetic      every prompt unique (no prefix sharing); input and output lengths drawn from
//                  LengthSpecs.
//   shared_prefix  num_prefixes prefixes of prefix_len tokens times suffixes_per_prefix
//                  suffixes of suffix_len tokens: a pool of P x S distinct prompts, sent in a
//                  seeded random order that visits the whole pool before repeating a prompt.
//   trace          a Mooncake trace replayed record by record; prompts synthesized from the
//                  hash ids (equal ids give equal 512-token blocks, see prompt_synth.h).
//
// All are deterministic for a given seed. Multi-turn chat is not implemented yet (issue #7).
// A Workload is used by one thread (the load runner's issuer); thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "loadtest/length_spec.h"
#include "loadtest/prompt_synth.h"
#include "loadtest/trace.h"

namespace pd::loadtest {

// One request to send.
struct RequestSpec {
  int64_t index = 0;             // 0-based position in the workload
  std::vector<uint32_t> prompt;  // token ids, never empty
  int64_t output_len = 0;        // sent as max_tokens (with ignore_eos), >= 1
  // Trace replay: when to send it, relative to the start of the run. nullopt otherwise.
  std::optional<absl::Duration> arrival_offset;
  int64_t source_line = 0;  // trace line number; 0 for generated workloads
};

class Workload {
 public:
  virtual ~Workload() = default;
  // "synthetic", "shared_prefix" or "trace".
  virtual absl::string_view name() const = 0;
  // Fills `out` with the next request; false once the workload is exhausted (trace end).
  virtual bool Next(RequestSpec* out) = 0;
  // Number of requests when finite (traces), nullopt for endless generated workloads.
  virtual std::optional<int64_t> size() const = 0;
};

struct SyntheticOptions {
  LengthSpec input_len = LengthSpec::Fixed(128);
  LengthSpec output_len = LengthSpec::Fixed(128);
  VocabRange vocab;
  uint64_t seed = 0;
};

struct SharedPrefixOptions {
  int64_t num_prefixes = 8;          // P >= 1
  int64_t suffixes_per_prefix = 16;  // S >= 1
  int64_t prefix_len = 512;          // tokens, >= 1
  int64_t suffix_len = 64;           // tokens, >= 0 (0: the P prefixes alone)
  LengthSpec output_len = LengthSpec::Fixed(128);
  VocabRange vocab;
  uint64_t seed = 0;
};

struct TraceWorkloadOptions {
  int64_t block_tokens = 512;  // tokens per hash id; as given to ParseTrace
  VocabRange vocab;
};

// InvalidArgument for invalid options (lengths, counts, vocabulary range).
absl::StatusOr<std::unique_ptr<Workload>> MakeSyntheticWorkload(const SyntheticOptions& options);
absl::StatusOr<std::unique_ptr<Workload>> MakeSharedPrefixWorkload(
    const SharedPrefixOptions& options);
absl::StatusOr<std::unique_ptr<Workload>> MakeTraceWorkload(Trace trace,
                                                            const TraceWorkloadOptions& options);

}  // namespace pd::loadtest
