// One request as the scheduler tracks it (private to engine/scheduler): its tokens, its place in
// the KV cache, its text stream and its hand-off state. Shared by the scheduler and its parts
// (the sink + window policy, the remote-prefill hand-offs). Thread-compatible, like the
// scheduler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/tokenizer.h"
#include "engine/scheduler/request.h"

namespace pd::engine::scheduler_internal {

struct Sequence {
  GenerationRequest request;
  kvcache::SequenceId kv_id;
  BlockHash seed;
  std::vector<uint32_t> tokens;  // prompt + generated
  size_t prompt_len = 0;
  std::vector<BlockHash> chain;  // hashes of the full blocks of tokens[0, num_computed)
  int64_t num_computed = 0;      // tokens whose KV is in the pool
  int64_t num_allocated = 0;     // tokens with a slot in the block table (dropped included)
  // Sink + window policy: text tokens dropped from the cache. Text position p >= the sinks
  // lives at cache slot p - dropped; RoPE uses the text position.
  int64_t dropped = 0;
  bool admitted_once = false;
  uint32_t cached_tokens = 0;  // at first admission
  uint32_t num_preemptions = 0;
  // Text: generated text so far and how much of it was sent (the rest is held back because it
  // could start a stop string).
  std::unique_ptr<DecodeStream> detok;
  std::string text;
  size_t text_sent = 0;
  std::vector<uint32_t> unsent_tokens;
  std::vector<TokenLogprob> unsent_logprobs;  // aligned with unsent_tokens when asked
  FinishReason finished = FinishReason::kNone;
  absl::Status status;
  bool cancel_requested = false;
  bool remote_started = false;  // remote_prefill was called (only at first admission)
  bool remote_pending = false;  // waiting for Complete/FailRemotePrefill
  bool prefilled_remotely = false;
  bool held = false;             // prefill-only: computed, blocks held for the transfer
  uint32_t restored_tokens = 0;  // restored from the node's tiers at first admission
  absl::Duration restore_time;
  absl::Time submitted, first_scheduled, prefill_done, first_token;

  // The tier prefix's sources are released exactly once, even when the request never runs.
  void ReleaseTierPrefix() {
    if (request.tier_prefix.release) {
      auto release = std::move(request.tier_prefix.release);
      request.tier_prefix = TierPrefix();
      release();
    }
  }
  ~Sequence() { ReleaseTierPrefix(); }

  size_t num_generated() const { return tokens.size() - prompt_len; }

  // Appends a generated token (and its logprob entry when asked) to the tokens and to what is
  // not sent yet.
  void AppendToken(uint32_t token, std::optional<TokenLogprob> logprob);

  // Whether `token` ends generation: one of the model's `eos_ids` (unless ignore_eos) or of the
  // request's stop_token_ids.
  bool IsStopToken(uint32_t token, absl::Span<const uint32_t> eos_ids) const;

  // Stop strings (request.sampling.stop) against the generated text: true when one ends in
  // the text not sent yet, which is then cut where the match starts (text already sent stays
  // sent). Otherwise false, with `*hold` the length of the longest text tail that could still
  // grow into a stop string (at least its value on entry).
  bool CutAtStopString(size_t* hold);

  // The next streamed output: the tokens (and logprobs) not sent yet and the text up to its
  // last `hold` bytes (held back because they could start a stop string).
  GenerationOutput TakeStreamOutput(size_t hold);

  // The last output, once `finished` and `status` are set: what was not sent yet (held-back
  // text included; an incomplete UTF-8 tail flushed raw unless the text ended at a stop
  // string), the usage counts and the timings up to `now`.
  GenerationOutput TakeFinalOutput(absl::Time now);

 private:
  // An output carrying the tokens and logprobs not sent yet (and nothing else).
  GenerationOutput TakeUnsent();
};

}  // namespace pd::engine::scheduler_internal
