// The scheduler's settings (a plain struct: services fill it from flags and validate it).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace pd::engine {

struct SchedulerConfig {
  int64_t max_batch_tokens = 256;  // token budget per step (decode tokens + prefill chunks)
  int64_t max_running = 32;        // sequences in the running set
  int64_t max_waiting = 1024;      // queue bound; Submit beyond it is ResourceExhausted
  std::string kv_dtype = "f32";    // name mixed into the block-hash seed
  // Sink + window KV policy (window_policy.h); both 0 = off (the default). Rounded up to whole
  // blocks; kv_sink_tokens > 0 needs kv_window_tokens > 0.
  int64_t kv_sink_tokens = 0;
  int64_t kv_window_tokens = 0;
  // H2O and SnapKV KV policies (compress_policy.h): "" (off, the default), "h2o" or "snapkv",
  // keeping kv_budget_tokens per sequence (rounded up to whole blocks), of which
  // kv_recent_tokens are the most recent (H2O's recent window, SnapKV's observation window).
  // Not with the sink + window policy.
  std::string kv_policy;
  int64_t kv_budget_tokens = 0;
  int64_t kv_recent_tokens = 0;
  // Structured output: how long the step may wait for a late token mask once its layers are
  // done (at least this, or a quarter of the step's time so far if that is longer). A sequence
  // whose mask is later sits the step out (its token is computed again next step) instead of
  // holding the batch; when every sequence of the step waits on its mask, the step waits.
  int64_t mask_grace_us = 2000;
  // Speculative decoding (docs/engine.md): "off", "ngram" (each decode proposes up to
  // spec_max_tokens tokens from its own prompt and output, verified in the same step) or
  // "draft" (a draft model proposes them: Scheduler::UseDraftModel must be called before the
  // first step, else nothing is proposed).
  std::string speculative = "off";
  int64_t spec_max_tokens = 4;
  // Propose only what the measured step costs say pays (SpecController); false: always.
  bool spec_adaptive = true;
  // Sequences one forward pass must hold: max_running, plus a verify row per proposed token
  // when speculating (at most max_batch_tokens).
  int64_t ForwardMaxSeqs() const;

  // InvalidArgument naming the values when a bound is not positive, max_running exceeds
  // max_batch_tokens, kv_dtype is empty, mask_grace_us is negative, speculative is unknown or
  // spec_max_tokens outside [1, 16], the sink + window counts or the H2O / SnapKV settings are
  // invalid, or both policies are asked for.
  absl::Status Validate() const;
};

}  // namespace pd::engine
