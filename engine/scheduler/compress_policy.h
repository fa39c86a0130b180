// H2O and SnapKV KV policies (opt-in: SchedulerConfig::kv_policy "h2o" or "snapkv"): a sequence
// keeps a budget of B cached tokens, chosen by the attention they receive
// (kernels::AttentionMass, accumulated by the forward pass per layer and kv head).
//
// H2O (Zhang et al. 2023, "Heavy-Hitter Oracle"): every query of the sequence, prompt and
// generated, adds its softmax weights to its kv head's scores. When the cache holds B +
// block_size tokens (all computed), each (layer, kv head) keeps its R most recent tokens and
// the B - R others with the highest cumulative score (ties: the earlier token), and the
// sequence goes on with B tokens; the scores move with their tokens. A prompt longer than B +
// block_size is prefilled up to that, then one block per chunk with a compaction between,
// exactly as decoding would have computed it (so a preempted sequence recomputes the same
// KV, bit for bit).
//
// SnapKV (Li et al. 2024): only the prompt's last R queries (the observation window) score.
// Once the whole prompt is computed, each (layer, kv head) keeps the window and the B - R
// earlier positions whose max-pooled score (a window of kSnapKvPool positions) is highest; the
// generated tokens are then all kept.
//
// Both: each (layer, kv head) selects on its own and the kept rows move, byte for byte with
// their original RoPE rotation, into fresh private blocks (LlamaForward::GatherKvRows,
// KvCacheManager::ReplaceBlocks); new tokens take RoPE position slot + dropped (their text
// position). The full-prefix blocks computed before the first compaction stay in the prefix
// cache; a governed sequence itself never reuses cached blocks (the scores of a cached prefix
// were never computed), is never restored from the tiers, and does not speculate. Under H2O it
// is prefilled where it decodes; under SnapKV a prefill worker may compute and compress the
// prompt (GenerationRequest::prefill_kv_policy) and send only the kept tokens' blocks. Every
// device: on kCuda (and the staged host path) the scores live in device memory and come to the
// host only for a compaction's selection. Per-head attention caches only (not MLA).
//
// Thread-compatible value type; the scheduler decides when (it owns preemption and the batch).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::engine {

// SnapKV's pooling window (positions; odd, centred).
inline constexpr int64_t kSnapKvPool = 7;

class CompressPolicy {
 public:
  enum class Kind { kOff, kH2o, kSnapKv };

  CompressPolicy() = default;  // off

  // InvalidArgument naming the value for an unknown policy ("", "h2o", "snapkv"), a budget
  // that is not positive, recent tokens outside [1, budget), or budget flags without a policy.
  static absl::Status Validate(absl::string_view policy, int64_t budget_tokens,
                               int64_t recent_tokens);
  // Rounds the budget up to whole blocks of `block_size`. InvalidArgument as Validate, or when
  // budget + block_size exceeds the model's `context_tokens`.
  static absl::StatusOr<CompressPolicy> Create(absl::string_view policy, int64_t budget_tokens,
                                               int64_t recent_tokens, int64_t block_size,
                                               int64_t context_tokens);

  bool enabled() const { return kind_ != Kind::kOff; }
  Kind kind() const { return kind_; }
  int64_t budget() const { return budget_; }  // B, whole blocks
  int64_t recent() const { return recent_; }  // R

  // Tokens a sequence may hold before its next compaction: H2O B + block_size; SnapKV the
  // prompt until it is compressed, then unbounded (the largest int64_t); off unbounded.
  int64_t CacheCapTokens(int64_t prompt_len, bool compressed) const;
  // Slots per (layer, kv head) of a sequence's score array: H2O B + block_size, SnapKV the
  // prompt (0 when off).
  int64_t ScoreSlots(int64_t prompt_len) const;
  // The first of a chunk's new tokens (at text positions [start, start + n)) whose queries
  // score: H2O 0; SnapKV the prompt's last R (n or more: none scores).
  int64_t ScoreFrom(int64_t prompt_len, int64_t start) const;
  // Blocks a sequence may hold at once that would need `unbounded_blocks` without the policy
  // (the compaction's fresh blocks included).
  int64_t MaxBlocks(int64_t unbounded_blocks) const;
  // Whether the context bounds a sequence's length (as WindowPolicy::ContextBoundsLength):
  // H2O keeps its cache bounded, so only without max_tokens.
  bool ContextBoundsLength(uint32_t max_tokens) const {
    return kind_ != Kind::kH2o || max_tokens == 0;
  }

  // The tokens a compaction of `held` tokens keeps: min(B, held).
  int64_t KeepTokens(int64_t held) const { return held < budget_ ? held : budget_; }
  // Each of `rows` (layer, kv head) rows of `scores` (stride `stride`, `held` slots used)
  // keeps KeepTokens(held) slots, ascending: (*keep)[row * KeepTokens(held) + i].
  void Select(const float* scores, int64_t stride, int64_t held, int64_t rows,
              std::vector<int32_t>* keep) const;

 private:
  CompressPolicy(Kind kind, int64_t budget, int64_t recent, int64_t block_size)
      : kind_(kind), budget_(budget), recent_(recent), block_size_(block_size) {}

  Kind kind_ = Kind::kOff;
  int64_t budget_ = 0;
  int64_t recent_ = 0;
  int64_t block_size_ = 0;
};

}  // namespace pd::engine
