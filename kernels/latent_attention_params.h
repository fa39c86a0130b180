// Parameters of LatentAttention (kernels/latent_attention.h): multi-head latent attention
// (DeepSeek's MLA) in its absorbed form, read straight from the paged KV pool. Plain struct
// shared by every backend.
//
// MLA caches one entry per token and layer (the compressed latent c followed by the shared RoPE
// key), cut into pieces that fit a KV block: the K rows of cache.num_kv_heads heads, then the V
// rows of as many heads, each cache.head_dim elements (engine/model/model_config.h,
// cache_kv_heads()). Entry element e lives in piece e / head_dim, element e % head_dim; piece i
// is kv (i / num_kv_heads) of head (i % num_kv_heads). Every query head scores the whole entry
// and sums the first value_dim elements (the latent c) with the softmax weights:
//   s_t   = scale * (q_j,h . entry_t),             t in [0, positions[j]]
//   out_j,h = sum_t softmax_t(s)_t * entry_t[0, value_dim)
// The caller absorbs the up-projections: q_j,h = [W_UK_h^T q_nope | q_rope] and the output
// goes through W_UV_h (docs/engine.md, "Multi-head latent attention").
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace pd::kernels {

// Largest entry (2 * num_kv_heads * head_dim) LatentAttention accepts: DeepSeek-V2/V3's 512 +
// 64 fits with room (the CPU kernel keeps a task's queries and sums in per-thread scratch).
inline constexpr int64_t kMaxLatentEntryDim = 1024;

// num_tokens queries, token j of sequence token_seq[j] at position positions[j], attending its
// keys [0, positions[j]] (written first: WriteKv). Batch invariant on the CPU: a query's output
// is bitwise the same however the tokens are batched (decode, a prefill chunk, several
// sequences) and on any thread count. Softmax in f32 with the running max subtracted (online,
// kernels/attention.h's chunks of keys); the reference two-pass in double.
struct LatentAttentionParams {
  const float* q = nullptr;      // [num_tokens][q_token_stride]; each [num_heads][entry]
  float* out = nullptr;          // [num_tokens][out_token_stride]; each [num_heads][value_dim]
  int64_t q_token_stride = 0;    // >= num_heads * entry
  int64_t out_token_stride = 0;  // >= num_heads * value_dim; out must not overlap q
  KvCacheView cache;             // entry = 2 * cache.num_kv_heads * cache.head_dim elements
  int64_t value_dim = 0;         // (0, entry]: the entry's leading elements summed
  int64_t num_heads = 0;         // query heads, all sharing the one entry per token
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;     // [num_tokens], >= 0
  const int32_t* token_seq = nullptr;     // [num_tokens] rows of block_tables, or nullptr: row 0
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq]
  int64_t num_seqs = 1;
  int64_t max_blocks_per_seq = 0;
  float scale = 0.0f;  // 0 means 1 / sqrt(entry)
};

}  // namespace pd::kernels
