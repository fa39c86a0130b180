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
// Sink + window KV policy (opt-in: kv_window_tokens > 0): window_policy.h says what is kept,
// dropped and how positions stay exact. The remote-prefill hand-offs of a disaggregated
// deployment (both sides): remote_prefill_holds.h. Copying a prompt's blocks in from the
// node's tiers: tier_restore.h.
//
// Outputs are identical whatever the batch composition, chunking, cache hits or preemptions:
// the kernels are batch-invariant and a sampled token depends only on its logits and
// (seed, step).
//
// Thread-compatible: one thread calls Submit/Cancel/Step (a service wraps it in its own loop
// thread and queues). Output callbacks run inside Step().
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/hash/block_hash.h"
#include "common/time/clock.h"
#include "engine/grammar/token_trie.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/llama_forward.h"
#include "engine/model/tokenizer.h"
#include "engine/scheduler/compress_policy.h"
#include "engine/scheduler/draft_proposer.h"
#include "engine/scheduler/remote_prefill_holds.h"
#include "engine/scheduler/request.h"
#include "engine/scheduler/scheduler_config.h"
#include "engine/scheduler/score_buffers.h"
#include "engine/scheduler/spec_controller.h"
#include "engine/scheduler/window_policy.h"

namespace pd::engine {
namespace scheduler_internal {
struct Sequence;
}  // namespace scheduler_internal

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
  // Cumulative, migrated streams (request.resume) admitted here: the tokens of their resumed
  // prompts (prompt + resumed tokens) by where their KV came from: found in this pool, restored
  // from the node's tiers, or computed (here, or by the prefill worker it was sent to).
  int64_t resumed_pool_tokens = 0;
  int64_t resumed_tier_tokens = 0;
  int64_t resumed_computed_tokens = 0;
  int64_t window_dropped_blocks = 0;    // cumulative: blocks dropped by the sink + window policy
  int64_t kv_compactions = 0;           // cumulative: H2O / SnapKV compactions
  int64_t kv_evicted_tokens = 0;        // cumulative: cached tokens they dropped
  // Cumulative: device buffers of their scores allocated, and taken again from the pool
  // (staged forward passes: kCuda, or the staged host path; ScoreBufferPool).
  int64_t score_buffers_allocated = 0;
  int64_t score_buffers_reused = 0;
  int64_t decode_graph_captures = 0;    // cumulative: decode steps captured as device graphs
  int64_t decode_graph_replays = 0;     // cumulative: decode steps run as one graph launch
  bool decode_graphs_off = false;       // a capture failed: steps launch kernel by kernel
  // Mixture of experts: cumulative token-expert assignments, [layer][expert] flattened
  // (moe_experts entries a layer; empty for a dense model).
  int32_t moe_experts = 0;
  std::vector<int64_t> moe_expert_tokens;
  // Tensor parallelism: each rank's cumulative nanoseconds waiting for its peers (empty at
  // TP 1; LlamaForward::tp_wait_nanos).
  std::vector<int64_t> tp_wait_nanos;
  // Cumulative: steps a sequence sat out because its structured-output mask was late
  // (SchedulerConfig::mask_grace_us); its token was computed again the next step.
  int64_t late_masks = 0;
  // Cumulative: proposals cut short because a verify row's mask was late (the rows from it
  // on were not used).
  int64_t late_verify_masks = 0;
  // Cumulative, speculative decoding (SchedulerConfig::speculative): tokens proposed, those
  // accepted (each one a step saved), and sequence-steps that verified a proposal.
  int64_t spec_proposed_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verify_steps = 0;
  int64_t spec_declined_steps = 0;  // steps whose measured costs said proposals do not pay
  // Draft model (speculative "draft"): its forward passes, the tokens it computed to catch up
  // with its sequences (prompts, then what the target took), sequences whose draft blocks went
  // to others, and its free blocks.
  int64_t draft_forward_passes = 0;
  int64_t draft_catch_up_tokens = 0;
  int64_t draft_evictions = 0;
  int64_t draft_free_blocks = 0;
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
  // that does not fit the context, a request that could never fit the KV pool, or a resume
  // (GenerationRequest::resume) that could not have been streamed, or a prefill_kv_policy that
  // is not snapkv with valid budgets on a prefill-only request without resumed tokens;
  // FailedPrecondition for that policy beside the sink + window one, Unimplemented for it on
  // CUDA or an MLA model; AlreadyExists for a duplicate id; ResourceExhausted when the queue
  // is full.
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
  // releases its blocks. Under SnapKV `kept_tokens` is the prefill worker's
  // PrefilledBlocks::kept_tokens: InvalidArgument (local prefill) unless it is what this
  // worker's policy keeps of the prompt; 0 for a prompt sent whole.
  absl::Status CompleteRemotePrefill(RequestId id, uint32_t first_token,
                                     std::optional<TokenLogprob> first_logprob = std::nullopt,
                                     int64_t kept_tokens = 0);

  // The remote prefill of `id` failed and no write into its blocks is in progress any more
  // (the transfer was cancelled or finished): the request prefills locally into the same
  // blocks. NotFound when `id` has no remote prefill outstanding.
  absl::Status FailRemotePrefill(RequestId id);

  // Prefill side (GenerationRequest::on_prefilled): the held blocks of `id` were sent; drop
  // the request, keeping its full blocks as prefix-cache hits. NotFound when `id` is not held.
  absl::Status ReleasePrefilled(RequestId id);

  // Cancel for every queued and running request (shutdown).
  void CancelAll();

  // Drain by migration: every generation (not prefill-only requests, which finish) ends now
  // with kAbort and `why`, its last output carrying the tokens not sent yet but no held-back
  // text (GenerationOutput::text_offset says where the text stopped), so that another worker
  // can resume it exactly; later generations are refused with `why`. Non-OK `why`.
  void Evacuate(absl::Status why);

  // The full computed blocks of every running generation (not prefill-only requests), each
  // as (its hash, its pool block), stream by stream in order: what a drained worker offers
  // its node's tiers before Evacuate, so that the streams' next worker restores them. A
  // sequence under the sink + window policy that dropped blocks has none to offer.
  void ForEachRunningBlock(absl::FunctionRef<void(const BlockHash&, BlockId)> fn) const;

  // Runs one batch. Returns false when there was no batch to run (empty, or every running
  // request waits for a remote prefill). Errors from the forward pass fail the requests of
  // that batch (kError), not the scheduler.
  bool Step();

  // No request queued, running, waiting for a remote prefill or held after a prefill.
  bool idle() const { return waiting_.empty() && running_.empty() && handoffs_.empty(); }
  SchedulerStats Stats() const;

  // Tests: runs before each structured-output mask, on the thread that computes it (to make a
  // mask late on purpose). Set before the first Step.
  void SetMaskHookForTesting(std::function<void()> hook) { mask_hook_ = std::move(hook); }

  // Speculative decoding with a draft model (config.speculative "draft"): `draft` is its
  // forward pass over a KV pool of its own of `num_blocks` blocks of the scheduler's block
  // size, on the same device; it must outlive the scheduler. Call before the first step.
  // InvalidArgument when the draft's vocabulary is not the target's (it must share the
  // tokenizer), or speculative is not "draft".
  absl::Status UseDraftModel(LlamaForward* draft, int64_t num_blocks);

 private:
  using Sequence = scheduler_internal::Sequence;
  struct Batch;

  Scheduler(SchedulerConfig config, WindowPolicy window, CompressPolicy compress,
            LlamaForward* forward, kvcache::KvCacheManager* kv_cache, const Tokenizer* tokenizer,
            std::string fingerprint, Clock* clock);

  // Step's phases, in order.
  void ExpireAndCancel();
  void SweepFinished();
  void Admit();
  void EnsureSlots();
  // One token for each running sequence with exactly one to compute (decode), then prefill
  // chunks, oldest first, within max_batch_tokens. Empty when nothing can run. When
  // speculating and nothing is left to prefill, verify rows for the decodes' proposals.
  Batch CollectBatch();
  // Speculation: the most tokens `seq` (a decode) may have proposed this step, at most `max_k`
  // (0: none; it decodes one token).
  int64_t ProposalRoom(Sequence* seq, int64_t max_k);
  // Speculation: cuts seq->draft (the proposal) to what its grammar allows and gives its verify
  // rows slots; how many tokens are verified (0: none).
  size_t TakeProposal(Sequence* seq);
  // The physical block ids of seq's table, as a batch row reads them.
  std::vector<int32_t> TableIds(const Sequence& seq) const;
  // Runs the forward pass over `batch` (setting its rows' block tables) and samples one token
  // per member into `sampled`.
  absl::Status ForwardBatch(Batch* batch, std::vector<int32_t>* sampled);
  // The forward pass failed: every member of the batch ends with kError.
  void FailBatch(const Batch& batch, const absl::Status& status);
  // Advances every member by the tokens it computed and hands each whose tokens are all
  // computed its next token (`sampled`, one per member).
  void ApplyBatch(const Batch& batch, const std::vector<int32_t>& sampled);
  // After `seq`'s decode row took its token: accepts the proposed tokens its verify rows
  // (num_rows from first_row) confirm, each with the token sampled after it.
  void VerifyProposal(Sequence* seq, const Batch& batch, size_t decode_row,
                      const std::vector<int32_t>& sampled);
  void MoveHeld();
  // Prefill side, SnapKV (GenerationRequest::prefill_kv_policy): compresses each prompt whose
  // first token was sampled in this step, then hands its kept blocks off (Prefilled).
  void CompactPrefilled();
  // Decode side: after a refused or failed remote prefill, a compressed prompt (its blocks hold
  // only the kept tokens) goes back to the front of the queue to be prefilled here in full.
  void PrefillLocallyAfterRemote(Sequence* seq);
  // Prefill side: the policy a prefill-only request runs (off when it names none); errors as
  // Submit documents for prefill_kv_policy.
  absl::StatusOr<CompressPolicy> PrefillPolicy(const GenerationRequest& request) const;

  // Copies in what the node's tiers hold of seq's prompt (`chain`: its full blocks' hashes)
  // at its first admission (tier_restore.h) and releases the tier prefix.
  void RestoreTierPrefix(Sequence* seq, absl::Span<const BlockHash> chain);

  // Slot allocation parts.
  // Allocates up to `num_tokens` more slots for running_[index] (preempting the youngest
  // requests when blocks run out, as EnsureSlots describes). Returns the slots allocated; 0
  // when the sequence was preempted or finished instead.
  int64_t AllocateSlots(size_t index, int64_t num_tokens);
  enum class SlideOutcome { kSlid, kFailed, kPreemptedSelf };
  // Sink + window at its cap: drops the oldest window block of running_[index], preempting the
  // youngest requests while the sink copies do not fit. kFailed: the sequence finished with an
  // error; kPreemptedSelf: it was the youngest, it is waiting now.
  SlideOutcome SlideWindow(size_t index);
  // H2O / SnapKV at its cap: keeps CompressPolicy::KeepTokens of running_[index]'s cached
  // tokens (compress_policy.h), preempting the youngest requests while the fresh blocks do not
  // fit; outcomes as SlideWindow.
  SlideOutcome Compact(size_t index);
  // Whether `seq` is under the H2O / SnapKV policy (Sequence::compress: every request but a
  // prefill-only one when the policy is on; a prefill-only one under its prefill_kv_policy),
  // and the tokens it may hold before its next compaction or drop.
  bool Governed(const Sequence& seq) const;
  int64_t CacheCap(const Sequence& seq) const;
  // Preempts the youngest running request not waiting for a remote prefill, to free blocks
  // for running_[index]; false when that was running_[index] itself (it is waiting now).
  bool PreemptYoungestFor(size_t index);
  // Frees running_[running_index]'s blocks and puts it back at the front of the queue, to be
  // computed again from its tokens (its policy state reset); returns it. Preempt counts it.
  Sequence* Requeue(size_t running_index);
  void Preempt(size_t running_index);

  // Per-token parts.
  // Records the `n` tokens `seq` computed in this batch (and commits its full blocks to the
  // prefix cache while nothing was dropped).
  void RecordComputed(Sequence* seq, int64_t n);
  // `seq` computed all its tokens in batch row `row`: teacher forcing, logprobs from the row's
  // logits, then the token goes to the request (or to the prefill hand-off).
  void TakeSampledToken(Sequence* seq, size_t row, int32_t sampled);
  // `logprob` is the token's entry when the request asked for logprobs.
  void AcceptToken(Sequence* seq, uint32_t token, std::optional<TokenLogprob> logprob);
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);

  Sequence* FindRunning(RequestId id);
  // The vocabulary as a byte trie for structured output, built on first use (scheduler thread).
  const grammar::TokenTrie& GrammarTrie();
  absl::Status ReplayResume(Sequence* seq);
  // Moves `seq`'s structured-output matcher over `token` (the model's end token: only where the
  // sentence may end); false when the token does not continue the grammar. True without one.
  bool AdvanceMatcher(Sequence* seq, uint32_t token);
  absl::StatusOr<BlockHash> SeedFor(const std::string& cache_salt);

  const SchedulerConfig config_;
  WindowPolicy window_;
  CompressPolicy compress_;
  LlamaForward* forward_;
  kvcache::KvCacheManager* kv_;
  const Tokenizer* tokenizer_;
  const std::string fingerprint_;
  Clock* clock_;
  absl::flat_hash_map<std::string, BlockHash> seeds_;  // by cache salt

  // Governed sequences' score buffers on a staged forward pass's device (shared: a sequence
  // held elsewhere gives its buffer back when it goes).
  std::shared_ptr<ScoreBufferPool> score_buffers_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  RemotePrefillHolds handoffs_;  // remote-prefill bookkeeping; prefill-only requests held
  uint64_t next_sequence_id_ = 1;
  SchedulerStats stats_;
  std::vector<float> logits_;
  std::unique_ptr<grammar::TokenTrie> trie_;
  // Threads computing structured-output masks: each step's, and those still finishing a late
  // mask (joined once done, and all in the destructor).
  struct MaskThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<MaskThread> mask_threads_;
  std::function<void()> mask_hook_;
  std::unique_ptr<DraftProposer> draft_;  // speculative "draft"
  SpecController spec_;
  absl::Status evacuated_;  // non-OK after Evacuate: generations are refused with it
};

}  // namespace pd::engine
