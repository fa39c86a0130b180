// One request as the scheduler tracks it (private to engine/scheduler): its tokens, its place in
// the KV cache, its text stream and its hand-off state. Shared by the scheduler and its parts
// (the sink + window policy, the remote-prefill hand-offs). Thread-compatible, like the
// scheduler.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_trie.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/tokenizer.h"
#include "engine/scheduler/compress_policy.h"
#include "engine/scheduler/request.h"
#include "engine/scheduler/score_buffers.h"
#include "engine/scheduler/token_sampling.h"
#include "kernels/device_memory.h"

namespace pd::engine::scheduler_internal {

// A token mask computed off the scheduler's thread (Scheduler::ForwardBatch) while the forward
// pass runs. The job owns what it touches (the matcher, shared with its sequence, and its own
// buffer), so a mask that is late can go on after the step, and after its sequence ended. The
// matcher is not touched by anyone else until the job is done (Wait).
//
// Speculative decoding: the job also computes the masks of the verify rows, one per proposed
// token, from the matcher's positions after each (`verify`). Those are computed on a copy of
// the matcher, taken before the first mask is signalled done, so the sequence's matcher is
// free as soon as its own mask is; a verify mask that is late is abandoned (Abandon: the rest
// are not computed) and its row's token is not used.
class MaskJob {
 public:
  explicit MaskJob(std::shared_ptr<grammar::Matcher> matcher,
                   std::vector<grammar::Matcher::Position> verify = {})
      : matcher_(std::move(matcher)), verify_(std::move(verify)), verify_masks_(verify_.size()) {}
  void Run(const grammar::TokenTrie& trie) {
    matcher_->FillTokenMask(trie, &mask_);
    if (!verify_.empty()) copy_ = std::make_unique<grammar::Matcher>(*matcher_);
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  // The verify rows' masks, after Run (on the same thread); `before` runs before each.
  void RunVerify(const grammar::TokenTrie& trie, const std::function<void()>& before) {
    for (size_t j = 0; j < verify_.size(); ++j) {
      if (abandoned_.load()) return;
      if (before) before();
      copy_->Restore(verify_[j]);
      copy_->FillTokenMask(trie, &verify_masks_[j]);
      absl::MutexLock lock(&mu_);
      ++verify_done_;
    }
  }
  // True once done; waits until then or `deadline`, whichever comes first.
  bool WaitUntil(absl::Time deadline) {
    const bool done = mu_.LockWhenWithDeadline(absl::Condition(&done_), deadline);
    mu_.Unlock();
    return done;
  }
  void Wait() { WaitUntil(absl::InfiniteFuture()); }
  // True once verify mask j is done; waits until then or `deadline`.
  bool WaitVerifyUntil(size_t j, absl::Time deadline) {
    auto ready = [this, j]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return verify_done_ > j; };
    const bool done = mu_.LockWhenWithDeadline(absl::Condition(&ready), deadline);
    mu_.Unlock();
    return done;
  }
  // The verify masks not yet started are not computed.
  void Abandon() { abandoned_.store(true); }
  // Once done: the mask (the tokenizer's vocabulary, TokenTrie::mask_words() words).
  const std::vector<uint32_t>& mask() const { return mask_; }
  // Once verify mask j is done: that mask.
  const std::vector<uint32_t>& verify_mask(size_t j) const { return verify_masks_[j]; }
  size_t num_verify() const { return verify_.size(); }

 private:
  std::shared_ptr<grammar::Matcher> matcher_;
  std::vector<uint32_t> mask_;
  std::vector<grammar::Matcher::Position> verify_;
  std::unique_ptr<grammar::Matcher> copy_;
  std::vector<std::vector<uint32_t>> verify_masks_;
  std::atomic<bool> abandoned_{false};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  size_t verify_done_ ABSL_GUARDED_BY(mu_) = 0;
};

// A governed sequence's scores where the forward pass adds to them
// (ForwardSequence::attention_mass): the host vector, or when the forward stages its metadata
// (kCuda, or the staged host path) a buffer on its device, which the host vector mirrors only
// around a compaction (Scheduler::Compact downloads, selects, moves and uploads).
// The device buffer comes from the scheduler's ScoreBufferPool and goes back to it when the
// scores are cleared or the sequence is destroyed.
struct KvScores {
  std::vector<float> host;
  kernels::DeviceBuffer device;
  std::shared_ptr<ScoreBufferPool> pool;  // where `device` goes back (null: freed)
  KvScores() = default;
  KvScores(KvScores&&) = default;
  KvScores& operator=(KvScores&&) = delete;
  ~KvScores() { clear(); }
  bool empty() const { return host.empty(); }
  float* forward_data() { return device.data() != nullptr ? device.as<float>() : host.data(); }
  void clear() {
    host.clear();
    host.shrink_to_fit();
    if (pool != nullptr) pool->Give(std::move(device));
    device = kernels::DeviceBuffer();
    pool.reset();
  }
};

struct Sequence {
  GenerationRequest request;
  kvcache::SequenceId kv_id;
  BlockHash seed;
  std::vector<uint32_t> tokens;  // prompt + generated
  size_t prompt_len = 0;
  size_t num_resumed = 0;  // of the generated tokens, those of request.resume (not emitted here)
  std::vector<BlockHash> chain;  // hashes of the full blocks of tokens[0, num_computed)
  int64_t num_computed = 0;      // tokens whose KV is in the pool
  int64_t num_allocated = 0;     // tokens with a slot in the block table (dropped included)
  // Sink + window policy: text tokens dropped from the cache. Text position p >= the sinks
  // lives at cache slot p - dropped; RoPE uses the text position.
  int64_t dropped = 0;
  // H2O / SnapKV (compress_policy.h; empty otherwise): the attention each cached slot has
  // received, [layer][kv head][CompressPolicy::ScoreSlots], and whether SnapKV compressed the
  // prompt already.
  KvScores scores;
  bool compressed = false;
  // The KV policy governing this sequence: the scheduler's for a generation, the request's
  // prefill_kv_policy for a prefill-only request (off for the others).
  CompressPolicy compress;
  // Decode side, SnapKV prefilled remotely: the tokens the prefill worker keeps (the blocks
  // imported for it); 0 = the whole prompt comes, or it is prefilled here.
  int64_t remote_keep = 0;
  // Prefill side, SnapKV: the sampled first token (and its logprob entry), handed off once the
  // prompt is compressed (Scheduler::CompactPrefilled).
  std::optional<uint32_t> compact_first_token;
  std::optional<TokenLogprob> compact_first_logprob;
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
  // Structured output (request.sampling.grammar): where the generated bytes are in the grammar,
  // and the tokens allowed at the step being computed.
  std::shared_ptr<grammar::Matcher> matcher;
  std::vector<uint32_t> allowed;
  // The mask of the matcher's current state, being computed (it was late: the sequence sat a
  // step out) or done; reset once a token moves the matcher on.
  std::shared_ptr<MaskJob> mask_job;
  // Speculative decoding: the tokens proposed at this step (verify rows of the batch), and how
  // many to propose next (adapted to what was accepted; 0 until the first proposal).
  std::vector<uint32_t> draft;
  // With a grammar: the matcher's position after each proposed token (draft_positions[j]
  // after draft[0..j]), for the verify rows' masks.
  std::vector<grammar::Matcher::Position> draft_positions;
  int64_t spec_k = 0;
  // Logit bias and penalties (request.sampling, HasLogitEdits): the edits of the step being
  // computed, from `tokens` alone (so a preempted, resumed or remotely prefilled request
  // rebuilds the same ones). Unused, and empty, for other requests.
  LogitEditBuilder logit_edits;

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

  // The last output, once `finished` and `status` are set: what was not sent yet (when status
  // is OK, held-back text included and an incomplete UTF-8 tail flushed raw unless the text
  // ended at a stop string; otherwise no held-back text), the usage counts and the timings up
  // to `now`.
  GenerationOutput TakeFinalOutput(absl::Time now);

 private:
  // An output carrying the tokens and logprobs not sent yet (and nothing else).
  GenerationOutput TakeUnsent();
};

}  // namespace pd::engine::scheduler_internal
