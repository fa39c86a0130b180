// Tensor parallelism's plan and weight shards (docs/engine.md, "Tensor parallelism").
//
// A worker with tensor_parallel = N runs N ranks. Rank r holds, Megatron-style:
//   - query heads [r * n_heads / N, (r + 1) * n_heads / N) (wq rows, wo columns, q biases);
//   - its KV heads: n_kv_heads / N of them when N divides n_kv_heads, else (N a multiple of
//     n_kv_heads) the one KV head its query heads read, which N / n_kv_heads ranks then share;
//   - MLP columns [r * hidden / N, (r + 1) * hidden / N) (w_gate / w_up rows, w_down columns);
//   - vocabulary rows [r * vocab / N, (r + 1) * vocab / N) of the embedding and the classifier
//     (the only split that may be uneven).
//   - with experts, each expert's columns [r * w / N, (r + 1) * w / N) of its width w, and the
//     same slice of the shared experts (n_shared_experts times as wide); the router is whole
//     on every rank, so every rank sends the same tokens to the same experts;
//   - with MLA, its heads' rows of q_proj / q_b_proj and kv_b_proj and columns of o_proj; the
//     latent projections (q_a_proj, kv_a_proj_with_mqa) are whole on every rank, and so is the
//     cache entry: rank 0 writes it and every rank reads all of it.
// Norm weights are shared (every rank reads the same). The attention output and the MLP output
// are row-parallel: each rank adds a partial sum, completed by one all-reduce each.
//
// The KV pool keeps the TP-independent layout ([layer][K|V][kv_head][token][head_dim] per
// block, the layout of TP = 1): on the CPU the ranks are threads sharing one pool, each reading
// and writing only its heads' rows, or (ForwardOptions::tp_rank_pools) each with a pool of its
// own heads, which memory::TpKvPool gathers into that layout. So transfers, tiers, the Redis
// index and the router see the same blocks at every TP size, and a block written at one TP is
// read at another as is.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace pd::engine {

// What rank `rank` of a TP group of `size` ranks holds.
struct TpRankPlan {
  int rank = 0;
  int size = 1;
  int32_t head_begin = 0, num_heads = 0;        // query heads
  int32_t kv_head_begin = 0, num_kv_heads = 0;  // KV heads of the pool it reads
  // Whether it writes its KV heads' rows (with shared KV heads, the first rank of a head's
  // group writes it and the others read it).
  bool writes_kv = true;
  int32_t hidden_begin = 0, hidden_width = 0;  // MLP columns (dense layers)
  int32_t expert_begin = 0, expert_width = 0;  // each expert's columns (mixture of experts)
  int64_t vocab_begin = 0, vocab_count = 0;    // embedding / classifier rows
};

struct TpPlan {
  int size = 1;
  // KV heads shared between ranks (size > n_kv_heads): a rank reads rows another wrote, so the
  // ranks meet after writing a layer's new KV and before attending.
  bool shared_kv = false;
  int32_t pool_kv_heads = 0;  // the model's KV heads: what one pool block holds
  std::vector<TpRankPlan> ranks;
};

// The plan for `size` ranks. InvalidArgument naming the numbers when size < 1, size does not
// divide the query heads, the MLP width or the experts' width, or (without MLA) neither of size
// and n_kv_heads divides the other.
absl::StatusOr<TpPlan> PlanTensorParallel(const ModelConfig& config, int size);

// The KV heads (of the pool layout's ModelConfig::cache_kv_heads()) each rank's pool holds
// with per-rank pools (ForwardOptions::tp_rank_pools, memory::TpKvPool): its KV heads, the
// same head for ranks that share one; with MLA every rank the whole latent entry.
struct TpPoolHeads {
  int64_t begin = 0;
  int64_t count = 0;
};
std::vector<TpPoolHeads> PoolHeadsOfRanks(const ModelConfig& config, const TpPlan& plan);

// The config a rank's forward pass runs with: its heads, KV heads and MLP width; vocab_size stays
// the model's (token ids and logits rows are the whole vocabulary's).
ModelConfig ShardConfig(const ModelConfig& config, const TpRankPlan& rank);

// Rank `rank`'s weights: views of `full` where its slice is contiguous rows (wq, wk, wv, w_gate,
// w_up, their biases and scales; the embedding and classifier rows of its vocabulary), owned
// copies of the column slices (wo, w_down). `full` must outlive the result. int8 weights keep
// their per-row scales (a row-parallel matrix's partial sums share them).
absl::StatusOr<std::unique_ptr<ModelWeights>> ShardWeights(const ModelWeights& full,
                                                           const TpPlan& plan, int rank);

}  // namespace pd::engine
