// Scheduler: continuous batching over one LlamaForward and one KV cache.
//
// Each Step() builds one batch under a token budget: every running sequence that has a token to
// decode gets one token, then prompts still prefilling get chunks of the remaining budget
// (chunked prefill), oldest first. Admission is FCFS and all-or-nothing on KV blocks (a prompt
// is admitted when its uncached blocks fit). When decode needs a block and none is free, the
// most recently admitted running request is preempted: its blocks are freed and it goes back to
// the front of the queue with its generated tokens appended to its prompt, to be recomputed
// (mostly from the prefix cache) when blocks free up.
//
// Outputs are identical whatever the batch composition, chunking, cache hits or preemptions:
// the kernels are batch-invariant and a sampled token depends only on its logits and
// (seed, step).
//
// Thread-compatible: one thread calls Submit/Cancel/Step (a service wraps it in its own loop
// thread and queues). Output callbacks run inside Step().
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/hash/block_hash.h"
#include "common/time/clock.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/llama_forward.h"
#include "engine/model/tokenizer.h"
#include "engine/scheduler/request.h"

namespace pd::engine {

struct SchedulerConfig {
  int64_t max_batch_tokens = 256;  // token budget per step (decode tokens + prefill chunks)
  int64_t max_running = 32;        // sequences in the running set
  int64_t max_waiting = 1024;      // queue bound; Submit beyond it is ResourceExhausted
  std::string kv_dtype = "f32";    // name mixed into the block-hash seed

  absl::Status Validate() const;
};

struct SchedulerStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t steps = 0;
  int64_t prefill_tokens = 0;   // prompt tokens computed (cumulative)
  int64_t decode_tokens = 0;    // tokens generated (cumulative)
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t pending_prefill_tokens = 0;  // prompt tokens queued or not yet computed
  int64_t held = 0;                 // prefill-only requests holding blocks for a transfer
  int64_t remote_prefills = 0;      // waiting for a prefill worker now
  int64_t remote_prefill_failures = 0;  // cumulative: fell back to local prefill
  int64_t tier_restored_blocks = 0;  // cumulative: blocks copied in from the node's tiers
  int64_t tier_restore_failures = 0;  // cumulative: restores cut short by a failed copy
  kvcache::KvCacheStats kv;
};

class Scheduler {
 public:
  // Everything passed must outlive the scheduler. The forward pass's KV pool must have
  // kv_cache->num_blocks() blocks of kv_cache->block_size() tokens. `tokenizer` turns tokens
  // into text deltas and stop-string matches. `clock` times requests.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(SchedulerConfig config,
                                                           LlamaForward* forward,
                                                           kvcache::KvCacheManager* kv_cache,
                                                           const Tokenizer* tokenizer,
                                                           std::string model_fingerprint,
                                                           Clock* clock = Clock::Real());
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. InvalidArgument for an empty prompt, an out-of-range token id, a prompt
  // that does not fit the context, or a request that could never fit the KV pool;
  // AlreadyExists for a duplicate id; ResourceExhausted when the queue is full.
  absl::Status Submit(GenerationRequest request);

  // Ends a request with kAbort / CANCELLED (its last output is emitted in the next Step).
  // NotFound when the id is not queued or running.
  absl::Status Cancel(RequestId id);

  // Decode side of a disaggregated prefill (GenerationRequest::remote_prefill): the prompt's
  // KV is in the target blocks and the prefill worker sampled `first_token`, with
  // `first_logprob` its PrefilledBlocks::first_logprob. The request continues with decode.
  // NotFound when `id` has no remote prefill outstanding; InvalidArgument when `first_token`
  // is out of the vocabulary, or when the request asked for logprobs and `first_logprob` is
  // missing, has more alternatives than asked or an id out of the vocabulary (the request
  // then prefills locally, as after FailRemotePrefill, and computes its own entry). An entry
  // given for a request that did not ask is ignored. A request cancelled meanwhile just
  // releases its blocks.
  absl::Status CompleteRemotePrefill(RequestId id, uint32_t first_token,
                                     std::optional<TokenLogprob> first_logprob = std::nullopt);

  // The remote prefill of `id` failed and no write into its blocks is in progress any more
  // (the transfer was cancelled or finished): the request prefills locally into the same
  // blocks. NotFound when `id` has no remote prefill outstanding.
  absl::Status FailRemotePrefill(RequestId id);

  // Prefill side (GenerationRequest::on_prefilled): the held blocks of `id` were sent; drop
  // the request, keeping its full blocks as prefix-cache hits. NotFound when `id` is not held.
  absl::Status ReleasePrefilled(RequestId id);

  // Cancel for every queued and running request (shutdown).
  void CancelAll();

  // Runs one batch. Returns false when there was no batch to run (empty, or every running
  // request waits for a remote prefill). Errors from the forward pass fail the requests of
  // that batch (kError), not the scheduler.
  bool Step();

  // No request queued, running, waiting for a remote prefill or held after a prefill.
  bool idle() const { return waiting_.empty() && running_.empty() && held_.empty(); }
  SchedulerStats Stats() const;

 private:
  struct Sequence;

  Scheduler(SchedulerConfig config, LlamaForward* forward, kvcache::KvCacheManager* kv_cache,
            const Tokenizer* tokenizer, std::string fingerprint, Clock* clock);

  void ExpireAndCancel();
  void Admit();
  // Copies the blocks of seq's tier prefix that continue the pool's cached prefix of `chain`
  // into fresh blocks and commits them as prefix-cache hits (they are evictable, not held).
  // Returns the number of blocks restored (0 when nothing continues the cached prefix or the
  // pool has no room). Releases the tier prefix.
  int64_t RestoreFromTiers(Sequence* seq, absl::Span<const BlockHash> chain);
  void EnsureSlots();
  void Preempt(size_t running_index);
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);
  // `logprob` is the token's entry when the request asked for logprobs.
  void AcceptToken(Sequence* seq, uint32_t token, std::optional<TokenLogprob> logprob);
  void SweepFinished();
  void MoveHeld();
  Sequence* FindRunning(RequestId id);
  void OnPrefilled(Sequence* seq, uint32_t token, std::optional<TokenLogprob> logprob);
  absl::StatusOr<BlockHash> SeedFor(const std::string& cache_salt);

  const SchedulerConfig config_;
  LlamaForward* forward_;
  kvcache::KvCacheManager* kv_;
  const Tokenizer* tokenizer_;
  const std::string fingerprint_;
  Clock* clock_;
  absl::flat_hash_map<std::string, BlockHash> seeds_;  // by cache salt

  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::vector<std::unique_ptr<Sequence>> held_;     // prefilled, blocks held until released
  uint64_t next_sequence_id_ = 1;
  SchedulerStats stats_;
  std::vector<float> logits_;
  std::vector<uint8_t> sample_workspace_;
};

}  // namespace pd::engine
