// Parameters of AttentionMass (kernels/attention_mass.h): the attention weight each cached key
// receives, summed, for the H2O and SnapKV KV policies (docs/engine.md, "KV policies"). Plain
// struct shared by every backend.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace pd::kernels {

// num_tokens queries of one sequence at positions [start_pos, start_pos + num_tokens), each
// attending causally to keys [0, its position] as PrefillAttention does: for query j and query
// head h (kv head g = h / (num_heads / num_kv_heads)),
//   p_t = softmax_t(scale * q_j,h . k_t,g),  t in [0, start_pos + j]
//   mass[g * mass_head_stride + t] += p_t
// in this order: for each kv head, queries j ascending, then the group's heads ascending, each
// p_t added on its own (so splitting the queries over calls, in order, adds the same floats in
// the same order: chunked prefill and decode give bitwise the same mass). The dot product in
// f32 as eight running sums (lane l takes d = l mod 8, in order) added as ((l0 + l1) + (l2 +
// l3)) + ((l4 + l5) + (l6 + l7)); softmax in f32 with the row max subtracted and the sum taken
// over t ascending.
struct AttentionMassParams {
  const float* q = nullptr;    // [num_tokens][q_token_stride]; each [num_heads][head_dim], RoPE'd
  int64_t q_token_stride = 0;  // >= num_heads * head_dim
  // The keys as attention reads them, f32 (kernels::ReadKv of the cache):
  // [start_pos + num_tokens][k_token_stride], each [num_kv_heads][head_dim].
  const float* k = nullptr;
  int64_t k_token_stride = 0;  // >= num_kv_heads * head_dim
  // Or (k == nullptr) the keys read from the cache as they are needed: key t is slot t of
  // the sequence's blocks `block_table` ([num_table_blocks] ids) in layer cache->layer, widened
  // to f32 exactly as ReadKv widens it (the same floats as the k above would hold). The cache's
  // num_kv_heads and head_dim must be the call's. Saves ReadKv's copy of every K and V row.
  const KvCacheView* cache = nullptr;
  const int32_t* block_table = nullptr;
  int64_t num_table_blocks = 0;
  // With a cache: each key is a whole multi-head latent attention entry
  // (kernels/latent_attention_params.h), the K rows of the cache's num_kv_heads heads then
  // their V rows, LatentEntryDim(*cache) elements, each row widened as ReadKv widens it. The
  // call then has num_kv_heads 1 and head_dim the entry's (at most kMaxLatentEntryDim); q holds
  // the absorbed queries LatentAttention scores.
  bool latent = false;
  int64_t start_pos = 0;       // >= 0
  int64_t num_tokens = 0;      // > 0
  int64_t num_heads = 0;       // a multiple of num_kv_heads
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // (0, kMaxAttentionHeadDim]; latent: the entry's
  float scale = 0.0f;    // 0 means 1 / sqrt(head_dim)
  // [num_kv_heads][mass_head_stride], accumulated into; must not overlap q or k.
  float* mass = nullptr;
  int64_t mass_head_stride = 0;  // >= start_pos + num_tokens
  // kCuda: device scratch of AttentionMassWorkspaceFloats(num_tokens, num_heads) floats (each
  // query row's softmax max and sum); ignored on kCpu.
  float* workspace = nullptr;
};

constexpr int64_t AttentionMassWorkspaceFloats(int64_t num_tokens, int64_t num_heads) {
  return 2 * num_tokens * num_heads;
}

}  // namespace pd::kernels
