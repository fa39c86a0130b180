// What a generation request asks for and what the scheduler reports back, in engine terms (no
// protobuf: services convert at their edge).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "common/hash/block_hash.h"
#include "engine/grammar/matcher.h"

namespace pd::engine {

// Sampling and stopping, mirroring pdserve.v1.SamplingParams (see proto/pd/v1/generation.proto
// for the meaning of each field).
struct SamplingOptions {
  uint32_t max_tokens = 0;   // 0 = until the context is full
  uint32_t min_tokens = 0;   // stop conditions are ignored before this many tokens
  float temperature = 0.0f;  // 0 or below 1e-5 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off (vLLM's min_p, after temperature)
  uint64_t seed = 0;         // the draw for step i is SamplingUniform(seed, i)
  // Logit processing before temperature, in this order (vLLM's): logit_bias is added, then the
  // repetition penalty scales the logits of tokens in the prompt or the output so far (logit /
  // r if positive, logit * r otherwise), then frequency_penalty * count and presence_penalty
  // (count > 0) are subtracted, count being how often the token occurs among the generated
  // tokens (resumed and forced ones included). kernels::LogitEdit is the exact arithmetic.
  float presence_penalty = 0.0f;    // [-2, 2]; 0 = off
  float frequency_penalty = 0.0f;   // [-2, 2]; 0 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  // (token id, bias in [-100, 100]) pairs, ids unique and inside the vocabulary; empty = none.
  std::vector<std::pair<uint32_t, float>> logit_bias;
  std::vector<std::string> stop;         // stop strings
  std::vector<uint32_t> stop_token_ids;  // ids that end generation like EOS
  bool ignore_eos = false;
  // Log-probabilities of the generated tokens: -1 = not asked (no cost); N in [0, 20] = each
  // token's logprob plus its N most likely alternatives (GenerationOutput::logprobs).
  int32_t logprobs = -1;
  // Teacher forcing (engine-internal, for scoring text: tools and tests, not the API): the
  // first forced_tokens.size() generated tokens are these instead of sampled ones; stop
  // conditions and logprobs apply to them as to sampled tokens.
  std::vector<uint32_t> forced_tokens;
  // Scoring tools too (engine-internal): with logprobs >= 0, each TokenLogprob also carries the
  // whole distribution (TokenLogprob::all), for divergences between engine configurations.
  bool full_distribution = false;
  // Structured output: the generated text must be a sentence of this grammar (null = free
  // text). Each step samples only tokens whose bytes continue it; the model's EOS is allowed
  // exactly when the sentence is complete, and ends generation (STOP). Not combinable with
  // forced_tokens, ignore_eos or min_tokens. docs/structured-outputs.md.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // This request takes no speculative proposals (SchedulerConfig::speculative applies to the
  // others). Its output is the same either way; only its speed may change.
  bool no_speculation = false;
};

// The log-probability of one generated token and its most likely alternatives: log_softmax of
// the logits after logit_bias, the penalties and a structured-output mask (a masked token has
// logprob -inf), before temperature, min-p, top-k and top-p; without those, the raw model
// distribution (what vLLM reports by default). OpenAI's logprobs likewise reflect logit_bias.
// Computed by kernels::LogProbs (kernels/logprobs_params.h defines the non-finite cases: a NaN
// logit has logprob -inf, a row of NaN logits gives NaN).
struct TokenLogprob {
  float logprob = 0.0f;  // of the generated token (natural log, <= 0)
  // The SamplingOptions::logprobs most likely tokens as (id, logprob), most likely first, ties
  // by ascending id (the order of greedy sampling); fewer only when fewer tokens have p > 0.
  // The generated token appears here only if it is among them.
  std::vector<std::pair<uint32_t, float>> top;
  // SamplingOptions::full_distribution: every token's logprob, by id (else empty).
  std::vector<float> all;
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
  absl::Duration restore;      // copying blocks in from the node's DRAM/NVMe tiers
  absl::Duration prefill;      // first scheduled -> prompt fully computed
  absl::Duration first_token;  // submitted -> first token emitted
  absl::Duration total;        // submitted -> finished
};

// One streamed update. Emitted on the scheduler's thread.
struct GenerationOutput {
  RequestId id;
  std::vector<uint32_t> new_tokens;  // generated since the last output
  // One entry per new_tokens entry, in order, when the request asked (sampling.logprobs >= 0);
  // empty otherwise. Each token's entry is emitted once, even if the request is preempted and
  // recomputed later.
  std::vector<TokenLogprob> logprobs;
  std::string text;  // UTF-8 delta, never ending inside a character
  // Bytes of the request's generated text streamed up to and including `text` (a resumed
  // request counts from the start of the text of its ResumeState::tokens).
  uint64_t text_offset = 0;
  FinishReason finish_reason = FinishReason::kNone;  // set on the last output only
  absl::Status status;                               // non-OK with kAbort / kError
  // Set on the last output.
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;    // prompt tokens reused from the prefix cache
  uint32_t restored_tokens = 0;  // of cached_tokens, restored from the node's tiers
  uint32_t completion_tokens = 0;
  uint32_t num_preemptions = 0;
  bool prefilled_remotely = false;  // the prompt's KV came from a prefill worker
  RequestTimings timings;
};

// Disaggregated prefill, decode side: where the uncached blocks of a prompt should be filled.
// At admission the scheduler allocates the whole prompt (Kv ImportBlocks: cached prefix plus
// private destination blocks) and calls `start` on its thread with the blocks to fill; the
// request then waits outside the batch. The owner of the request must later call exactly one
// of Scheduler::CompleteRemotePrefill (the KV is in the blocks; first token sampled remotely)
// or Scheduler::FailRemotePrefill (nothing usable arrived: the request prefills locally into
// the same blocks). The blocks stay reserved until then, even if the request is cancelled
// meanwhile, so a late remote write never lands in a reused block.
//
// Under SnapKV (SchedulerConfig::kv_policy "snapkv") a request without resumed tokens goes to
// the prefill worker too: `kv_policy` names the policy, the prefill worker compresses the
// prompt as this worker would (PrefilledBlocks::kept_tokens) and `block_ids` are the blocks of
// the kept tokens only (no cached prefix, `chain` empty).
struct KvPolicySpec {
  std::string policy;  // "" = none, else "snapkv"
  int64_t budget_tokens = 0;  // whole blocks
  int64_t recent_tokens = 0;
};

struct RemotePrefillTarget {
  RequestId id;
  int64_t num_cached_tokens = 0;   // tokens the decode worker had cached (not to be sent)
  int64_t first_block = 0;         // logical index of block_ids[0]
  std::vector<BlockId> block_ids;  // destination blocks, in order, incl. a partial last one
  std::vector<BlockHash> chain;    // hashes of every full block of the prompt
  KvPolicySpec kv_policy;          // the policy the prefill worker must run (see above)
};

// Prefill-only requests (prefill worker): once the prompt is computed and the first token is
// sampled, the scheduler calls `on_prefilled` on its thread with that token and the physical
// blocks of the whole prompt (logical block i at index i), and keeps them referenced (out of
// the batch, never preempted or evicted) until Scheduler::ReleasePrefilled. No other output
// is emitted for such a request except a final error output if it fails before that point.
struct PrefilledBlocks {
  RequestId id;
  uint32_t first_token = 0;
  // first_token's entry when the request asked for logprobs (sampling.logprobs >= 0): pass it
  // to the decode side's Scheduler::CompleteRemotePrefill.
  std::optional<TokenLogprob> first_logprob;
  int64_t cached_tokens = 0;    // prompt tokens this worker reused from its own cache
  int64_t restored_tokens = 0;  // of cached_tokens, restored from the node's tiers
  absl::Duration restore;       // copying those in
  std::vector<BlockId> block_ids;
  // Under GenerationRequest::prefill_kv_policy: the tokens each (layer, kv head) kept, in
  // block_ids (which then hold only those); 0 without a policy.
  int64_t kept_tokens = 0;
  absl::Duration queue;    // submitted -> first scheduled
  absl::Duration prefill;  // first scheduled -> prompt computed
};

// Blocks of the prompt's hash chain that the node's lower tiers (pd-tierd's DRAM/NVMe) hold
// and that the service made readable before submitting the request. At first admission the
// scheduler copies the ones that continue its own cached prefix into fresh pool blocks,
// commits them as prefix-cache hits, then computes only the rest of the prompt. Exactness:
// only blocks whose hash equals the scheduler's own chain hash at that index are used, and a
// copy that fails its check (copy_in returns false) ends the restore there.
struct TierPrefix {
  int64_t first_block = 0;       // chain index of chain[0]
  std::vector<BlockHash> chain;  // hashes of the restorable blocks, consecutive, in order
  // Copies chain block `index` (an index into the whole prompt chain) into pool block `dst`
  // and verifies the copy; false = unusable, stop restoring there. Scheduler thread.
  std::function<bool(int64_t index, BlockId dst)> copy_in;
  // Called exactly once on the scheduler thread when the sources are no longer needed (after
  // the first admission, or when the request ends before it), e.g. to unpin them.
  std::function<void()> release;
};

// Where a migrated request's generation stands (GenerationRequest::resume).
struct ResumeState {
  std::vector<uint32_t> tokens;  // generated and streamed before the move
  // Bytes of those tokens' text that were streamed (GenerationOutput::text_offset of the last
  // output): the rest was held back (a possible stop string, an unfinished character) and is
  // sent by the resumed request once known.
  uint64_t text_offset = 0;
};

struct GenerationRequest {
  RequestId id;
  std::vector<uint32_t> prompt;  // token ids, non-empty
  SamplingOptions sampling;
  std::string cache_salt;  // isolates this tenant's prefix cache
  std::optional<absl::Time> deadline;
  // Receives every output of this request, the last one with finish_reason set. Runs on the
  // scheduler thread: must be quick and must not call into the scheduler.
  std::function<void(GenerationOutput)> on_output;
  // Decode side of a disaggregated prefill (see RemotePrefillTarget); null = prefill here.
  // Runs on the scheduler thread: must be quick (start an RPC elsewhere).
  std::function<void(RemotePrefillTarget)> remote_prefill;
  // Prefill side (see PrefilledBlocks); null = a normal generation. Mutually exclusive with
  // remote_prefill. Runs on the scheduler thread: must be quick.
  std::function<void(PrefilledBlocks)> on_prefilled;
  // Prefill side only: the decode worker's KV policy (RemotePrefillTarget::kv_policy). The
  // prompt is computed in full without cached blocks, compressed after the first token is
  // sampled, and on_prefilled gets the kept tokens' blocks. Submit refuses a policy this
  // scheduler cannot run (InvalidArgument for bad values, Unimplemented on CUDA or MLA).
  KvPolicySpec prefill_kv_policy;
  // Blocks restorable from the node's tiers; empty chain = none.
  TierPrefix tier_prefix;
  // Migration (docs/migration.md): the request already generated these tokens on another
  // worker, which failed or drained after streaming them. The request continues after them as
  // if it had generated them here: they count towards max_tokens, min_tokens and usage, move
  // the structured-output matcher and the text decoder on, and the sampler's draws continue at
  // step resume.tokens.size(); they are computed with the prompt (here, or by the prefill
  // worker of remote_prefill, which is given the same resume) and not emitted again.
  ResumeState resume;
};

}  // namespace pd::engine
