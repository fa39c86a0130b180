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
// Sink + window KV policy (opt-in: kv_window_tokens > 0; StreamingLLM, Xiao et al. 2023). A
// sequence keeps its first S = ceil(kv_sink_tokens / block_size) blocks (the attention sinks),
// its last W = ceil(kv_window_tokens / block_size) full blocks and the block being filled:
// before the first token of a new block is computed with S + W + 1 blocks held, block S (the
// oldest after the sinks) is dropped. Every token of text block k therefore attends to the
// sinks, text blocks max(S, k - W) .. k - 1 and its own block up to itself, so a sequence
// generates past the model's context with at most S + W + 1 (+ S, below) blocks. Positions are
// StreamingLLM's, positions inside the cache: the query at cache slot c sees a sink key at slot
// s < S * block_size at distance c - s and a window key at its own slot distance. Realised
// without re-rotating the window: new tokens take RoPE position slot + dropped tokens (= their
// text position; RoPE scores depend only on the distance, which is the same inside the window),
// and the sinks are live copies of their original blocks rotated by the dropped tokens
// (LlamaForward::CopyBlocksShifted) after each drop; the originals stay held, so a sink key is
// rotated once from its original, never cumulatively. A prompt longer than the S + W + 1
// blocks is prefilled one block per chunk past that point, with the drops between, so a
// preempted sequence recomputes exactly what decoding computed. Blocks written before the
// first drop go to the prefix cache as usual; none after it (their KV depends on dropped
// context). A prompt that needs a drop is prefilled locally (never remote_prefill), and a
// prefill-only request must fit without one. Every device (on kCuda compiled and tested on the
// CPU through ForwardOptions::staged_metadata; not yet run on a GPU).
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
  // Sink + window KV policy (above); both 0 = off (the default). Rounded up to whole blocks;
  // kv_sink_tokens > 0 needs kv_window_tokens > 0.
  int64_t kv_sink_tokens = 0;
  int64_t kv_window_tokens = 0;

  absl::Status Validate() const;
};

struct SchedulerStats {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // prompt tokens computed (cumulative)
  int64_t decode_tokens = 0;   // tokens generated (cumulative)
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t pending_prefill_tokens = 0;   // prompt tokens queued or not yet computed
  int64_t held = 0;                     // prefill-only requests holding blocks for a transfer
  int64_t remote_prefills = 0;          // waiting for a prefill worker now
  int64_t remote_prefill_failures = 0;  // cumulative: fell back to local prefill
  int64_t tier_restored_blocks = 0;     // cumulative: blocks copied in from the node's tiers
  int64_t tier_restore_failures = 0;    // cumulative: restores cut short by a failed copy
  int64_t window_dropped_blocks = 0;    // cumulative: blocks dropped by the sink + window policy
  int64_t decode_graph_captures = 0;    // cumulative: decode steps captured as device graphs
  int64_t decode_graph_replays = 0;     // cumulative: decode steps run as one graph launch
  bool decode_graphs_off = false;       // a capture failed: steps launch kernel by kernel
  kvcache::KvCacheStats kv;
};

class Scheduler {
 public:
  // Everything passed must outlive the scheduler. The forward pass's KV pool must have
  // kv_cache->num_blocks() blocks of kv_cache->block_size() tokens. `tokenizer` turns tokens
  // into text deltas and stop-string matches. `clock` times requests.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      SchedulerConfig config, LlamaForward* forward, kvcache::KvCacheManager* kv_cache,
      const Tokenizer* tokenizer, std::string model_fingerprint, Clock* clock = Clock::Real());
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
  // Allocates up to `num_tokens` more slots for running_[index] (preempting the youngest
  // requests when blocks run out, as EnsureSlots describes). Returns the slots allocated; 0
  // when the sequence was preempted or finished instead.
  int64_t AllocateSlots(size_t index, int64_t num_tokens);
  // Preempts the youngest running request not waiting for a remote prefill, to free blocks
  // for running_[index]; false when that was running_[index] itself (it is waiting now).
  bool PreemptYoungestFor(size_t index);
  // Sink + window policy: drops the oldest window block of `seq` (whose tokens are all
  // computed) and rebuilds its sink copies; forks the sinks at the first drop.
  // ResourceExhausted (nothing changed) when the sink copies do not fit.
  absl::Status SlideWindow(Sequence* seq);
  bool windowed() const { return window_blocks_ > 0; }
  // Tokens a sequence may hold in the KV cache: (S + W + 1) * block_size, or unbounded.
  int64_t CacheCapTokens() const;
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
  int64_t sink_blocks_ = 0;    // S of the sink + window policy
  int64_t window_blocks_ = 0;  // W; 0 = policy off
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
};

}  // namespace pd::engine
