#include "engine/scheduler/scheduler_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/scheduler/compress_policy.h"
#include "engine/scheduler/window_policy.h"

namespace pd::engine {

absl::Status SchedulerConfig::Validate() const {
  if (max_batch_tokens <= 0 || max_running <= 0 || max_running > max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: need 0 < max_running <= max_batch_tokens, got ", max_running,
                     " and ", max_batch_tokens));
  }
  if (max_waiting <= 0) {
    return absl::InvalidArgumentError("scheduler: max_waiting must be > 0");
  }
  if (kv_dtype.empty()) {
    return absl::InvalidArgumentError("scheduler: kv_dtype is empty");
  }
  if (mask_grace_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: mask_grace_us must be >= 0, got ", mask_grace_us));
  }
  if (speculative != "off" && speculative != "ngram" && speculative != "draft") {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: speculative must be off, ngram or draft, got \"", speculative, "\""));
  }
  if (spec_max_tokens < 1 || spec_max_tokens > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: spec_max_tokens must be between 1 and 16, got ", spec_max_tokens));
  }
  if (absl::Status s = CompressPolicy::Validate(kv_policy, kv_budget_tokens, kv_recent_tokens);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("scheduler: ", s.message()));
  }
  if (!kv_policy.empty() && kv_window_tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler: kv_policy ", kv_policy, " and the sink + window policy (kv_window_tokens ",
        kv_window_tokens, ") exclude each other"));
  }
  return WindowPolicy::ValidateTokens(kv_sink_tokens, kv_window_tokens);
}

int64_t SchedulerConfig::ForwardMaxSeqs() const {
  if (speculative == "off") return max_running;
  return std::min(max_batch_tokens, max_running * (1 + spec_max_tokens));
}

}  // namespace pd::engine
