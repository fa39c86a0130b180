// Speculative decoding's draft-model proposer (issue #33): a smaller model with the target's
// tokenizer, run by the same worker on the same device, proposes each sequence's next tokens by
// greedy decoding over a paged KV cache of its own.
//
// Batched across sequences (a proposal of k tokens for every speculating sequence costs k
// forward passes of the draft in all, not k per sequence: the failure that made llama.cpp's
// speculation lower throughput at 4 users). The draft's KV is kept in step with the target's by
// content: for each sequence it remembers which tokens its KV holds, and a proposal first
// computes what the sequence took since (the tokens the target accepted are already there; the
// rejected ones are overwritten), so nothing needs to be told of rejections, preemption or
// migration. Keys (the request id) only say whose blocks are whose; blocks of sequences that
// ended are released (Release), and when the pool runs short the least recently used
// sequences' blocks go first.
//
// Greedy proposals are deterministic, so the scheduler's verification (a proposal is accepted
// exactly when the token plain decoding takes there is the proposed one) keeps the target's
// output token for token, greedy or sampled (docs/engine.md, "Speculative decoding").
//
// Thread-compatible: the scheduler's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/llama_forward.h"

namespace pd::engine {

class DraftProposer {
 public:
  // `forward`: the draft model's forward pass over its own pool of `num_blocks` blocks of
  // `block_size` tokens (not shared with anything else); must outlive the proposer.
  DraftProposer(LlamaForward* forward, int64_t num_blocks, int64_t block_size);

  struct Want {
    uint64_t key;                       // whose (stable while the sequence lives)
    absl::Span<const uint32_t> tokens;  // every token of the sequence (prompt + generated)
    int64_t k = 0;                      // most tokens to propose
  };
  // Up to want.k tokens for each want (maybe none: the draft is still computing the sequence's
  // prompt, over several steps when it is longer than a step's tokens, or no blocks are left,
  // or the draft's context ends). Runs at most max(k) forward passes of the draft. An error of
  // the draft's forward pass is returned (the scheduler then proposes nothing this step); the
  // sequences' draft state is dropped.
  absl::StatusOr<std::vector<std::vector<uint32_t>>> Propose(absl::Span<const Want> wants);
  // The sequence ended: its blocks are free.
  void Release(uint64_t key);

  struct Stats {
    int64_t forward_passes = 0;   // draft forward passes run
    int64_t catch_up_tokens = 0;  // tokens computed to catch up (prompts, accepted tokens)
    int64_t evictions = 0;        // sequences whose blocks went to others (pool short)
    int64_t free_blocks = 0;
    int64_t sequences = 0;  // sequences with draft state
  };
  Stats stats() const;
  const LlamaForward& forward() const { return *forward_; }

 private:
  struct Entry {
    std::vector<int32_t> blocks;
    std::vector<uint32_t> computed;  // the tokens whose K/V the blocks hold, from position 0
    int64_t last_used = 0;           // Propose call that last used it
  };
  // Grows `e` to `blocks` blocks, evicting least recently used entries (not used by the
  // current call) when the pool is short; false when even that is not enough.
  bool Reserve(Entry* e, int64_t blocks);
  void Drop(Entry* e);

  LlamaForward* forward_;
  int64_t block_size_;
  std::vector<int32_t> free_;
  absl::node_hash_map<uint64_t, Entry> entries_;  // (stable: Propose holds pointers)
  int64_t calls_ = 0;
  Stats stats_;
};

}  // namespace pd::engine
