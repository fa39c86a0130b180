// What a generation request asks for and what the scheduler reports back, in engine terms (no
// protobuf: services convert at their edge).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/strong_id.h"

namespace pd::engine {

// Sampling and stopping, mirroring pdserve.v1.SamplingParams (see proto/pd/v1/generation.proto
// for the meaning of each field).
struct SamplingOptions {
  uint32_t max_tokens = 0;   // 0 = until the context is full
  uint32_t min_tokens = 0;   // stop conditions are ignored before this many tokens
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off
  uint64_t seed = 0;         // the draw for step i is SamplingUniform(seed, i)
  std::vector<std::string> stop;          // stop strings
  std::vector<uint32_t> stop_token_ids;   // ids that end generation like EOS
  bool ignore_eos = false;
};

enum class FinishReason : uint8_t {
  kNone = 0,        // not finished
  kStop = 1,        // EOS or a stop token id
  kLength = 2,      // max_tokens or the context window
  kStopString = 3,  // a stop string matched
  kAbort = 4,       // cancelled or past its deadline
  kError = 5,       // failed inside the engine
};

struct RequestTimings {
  absl::Duration queue;        // submitted -> first scheduled
  absl::Duration prefill;      // first scheduled -> prompt fully computed
  absl::Duration first_token;  // submitted -> first token emitted
  absl::Duration total;        // submitted -> finished
};

// One streamed update. Emitted on the scheduler's thread.
struct GenerationOutput {
  RequestId id;
  std::vector<uint32_t> new_tokens;  // generated since the last output
  std::string text;                  // UTF-8 delta, never ending inside a character
  FinishReason finish_reason = FinishReason::kNone;  // set on the last output only
  absl::Status status;               // non-OK with kAbort / kError
  // Set on the last output.
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;        // prompt tokens reused from the prefix cache
  uint32_t completion_tokens = 0;
  uint32_t num_preemptions = 0;
  RequestTimings timings;
};

struct GenerationRequest {
  RequestId id;
  std::vector<uint32_t> prompt;  // token ids, non-empty
  SamplingOptions sampling;
  std::string cache_salt;        // isolates this tenant's prefix cache
  std::optional<absl::Time> deadline;
  // Receives every output of this request, the last one with finish_reason set. Runs on the
  // scheduler thread: must be quick and must not call into the scheduler.
  std::function<void(GenerationOutput)> on_output;
};

}  // namespace pd::engine
