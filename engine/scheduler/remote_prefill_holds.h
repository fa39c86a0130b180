// The two hand-offs of a disaggregated prefill, and the KV blocks each holds meanwhile.
//
// Decode side (GenerationRequest::remote_prefill): at its first admission the scheduler imports
// the prompt's blocks (KvCacheManager::ImportBlocks) and Start hands them to the request's hook.
// The request then waits outside the batch with its blocks reserved (never preempted, and freed
// only once it resolves, even when cancelled meanwhile, so a late remote write never lands in
// a reused block) until Complete or Fail.
//
// Prefill side (GenerationRequest::on_prefilled): once the prompt is computed, Prefilled hands
// its blocks to the request's hook, and Hold keeps the request with its blocks referenced (out
// of the batch, never preempted or evicted) until Release.
//
// Thread-compatible: the scheduler's thread only; hooks run on it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/base/strong_id.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/scheduler/request.h"

namespace pd::engine {
namespace scheduler_internal {
struct Sequence;
}  // namespace scheduler_internal

class RemotePrefillHolds {
 public:
  using Sequence = scheduler_internal::Sequence;

  // `kv` must outlive this. `vocab_size` bounds the token ids a prefill worker may send back.
  RemotePrefillHolds(kvcache::KvCacheManager* kv, int64_t vocab_size);
  ~RemotePrefillHolds();
  RemotePrefillHolds(const RemotePrefillHolds&) = delete;
  RemotePrefillHolds& operator=(const RemotePrefillHolds&) = delete;

  // Decode side: marks `seq` (admitted, its whole prompt imported as `import`, or under SnapKV
  // its seq->remote_keep kept tokens) pending and calls its remote_prefill hook with the
  // destination blocks and `chain`, the hashes of every full block of the prompt (empty under
  // SnapKV), and the policy the prefill worker must run.
  void Start(Sequence* seq, kvcache::ImportTarget import, std::vector<BlockHash> chain);

  // Decode side: the remote prefill of request `id` (`seq`, null when it is not running)
  // wrote the prompt's KV and sampled `first_token` with `*first_logprob`. NotFound when `seq`
  // is null or not pending; otherwise `seq` is no longer pending, and:
  // - the request finished meanwhile (cancelled): OK, nothing else changes;
  // - `first_token` is out of the vocabulary, or the request asked for logprobs and
  //   `*first_logprob` is missing, has more alternatives than asked or an id out of the
  //   vocabulary: InvalidArgument, counted in num_failures() (the request prefills locally);
  // - `kept_tokens` (what a SnapKV prefill worker kept, 0 without) differs from
  //   seq->remote_keep: InvalidArgument, counted likewise;
  // - else OK: the prompt counts as computed, its full blocks are committed to the prefix
  //   cache (not a compressed prompt's), prefilled_remotely is set and `*first_logprob` is
  //   reset when the request did not ask; the caller then accepts `first_token`.
  absl::Status Complete(RequestId id, Sequence* seq, uint32_t first_token,
                        std::optional<TokenLogprob>* first_logprob, int64_t kept_tokens = 0);

  // Decode side: the remote prefill of `id` (`seq`, null when not running) failed and no write
  // into its blocks is in progress any more: `seq` is no longer pending (it prefills locally
  // into the same blocks). Counted in num_failures() unless the request finished meanwhile.
  // NotFound when `seq` is null or not pending.
  absl::Status Fail(RequestId id, Sequence* seq);

  // Remote prefills that fell back to local prefill (cumulative).
  int64_t num_failures() const { return num_failures_; }

  // Prefill side: `seq`'s prompt is computed and `first_token` (with `logprob`, its entry when
  // asked) sampled. Calls its on_prefilled hook with the blocks of the whole prompt and marks
  // it held; the caller then moves it here with Hold.
  void Prefilled(Sequence* seq, uint32_t first_token, std::optional<TokenLogprob> logprob);

  // Keeps `seq` (held, its blocks referenced in the KV cache) until Release.
  void Hold(std::unique_ptr<Sequence> seq);

  // The held blocks of `id` were sent: frees them (full blocks stay as prefix-cache hits) and
  // drops the request. NotFound when `id` is not held.
  absl::Status Release(RequestId id);

  bool Holds(RequestId id) const;
  bool empty() const { return held_.empty(); }
  int64_t num_held() const { return static_cast<int64_t>(held_.size()); }

 private:
  kvcache::KvCacheManager* kv_;
  const int64_t vocab_size_;
  int64_t num_failures_ = 0;
  std::vector<std::unique_ptr<Sequence>> held_;
};

}  // namespace pd::engine
