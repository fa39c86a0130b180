// Fixtures shared by the LatentAttention tests (kernels/dispatch/latent_attention_test.cc, the
// CPU kernel; kernels/cuda/latent_attention_cuda_test.cc, the CUDA one): a host pool of two
// sequences' latent entries written through WriteKv, a batch of queries mixing a prefill chunk
// and decode tokens, and the entry geometries real MLA models cut their entries into.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/latent_attention_params.h"

namespace pd::kernels::testing {

// A pool of two sequences' entries: sequence s holds keys [0, keys[s]) in the scattered blocks
// of its table row.
struct LatentPool {
  int64_t pieces_per_half = 0, head_dim = 0, block_size = 0;
  DType dtype = DType::kF32;
  std::vector<float> storage;
  std::vector<int32_t> tables;  // [2][kTableBlocks]
  KvCacheView view;
  std::vector<float> entries;  // [2][kMaxKeys][entry], as written (f32)

  static constexpr int64_t kTableBlocks = 8;
  static constexpr int64_t kBlocks = 20;
  int64_t entry() const { return 2 * pieces_per_half * head_dim; }
  int64_t max_keys() const { return kTableBlocks * block_size; }
};

inline LatentPool MakeLatentPool(DType dtype, int64_t pieces_per_half, int64_t head_dim,
                                 int64_t block_size, std::mt19937& rng) {
  LatentPool p;
  p.pieces_per_half = pieces_per_half;
  p.head_dim = head_dim;
  p.block_size = block_size;
  p.dtype = dtype;
  constexpr int64_t kLayers = 2, kLayer = 1;
  const int64_t block_bytes =
      DenseKvBlockBytes(dtype, kLayers, pieces_per_half, block_size, head_dim);
  p.storage.assign(static_cast<size_t>(block_bytes * LatentPool::kBlocks / 4 + 1), 0.0f);
  p.view = DenseKvCacheView(p.storage.data(), dtype, LatentPool::kBlocks, kLayers, pieces_per_half,
                            block_size, head_dim, kLayer);
  p.tables = {9, 2, 14, 0, 7, 3, 11, 5, 1, 19, 4, 16, 8, 12, 6, 18};
  const int64_t entry = p.entry(), half = entry / 2, keys = p.max_keys();
  p.entries = RandomVector(2 * keys * entry, rng, 1.5f);
  for (int32_t s = 0; s < 2; ++s) {
    std::vector<int32_t> positions(static_cast<size_t>(keys));
    for (int64_t t = 0; t < keys; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    WriteKvParams w;
    w.k = p.entries.data() + s * keys * entry;
    w.v = w.k + half;
    w.k_token_stride = entry;
    w.v_token_stride = entry;
    w.cache = p.view;
    w.num_tokens = keys;
    w.positions = positions.data();
    w.block_tables = p.tables.data() + s * LatentPool::kTableBlocks;
    w.max_blocks_per_seq = LatentPool::kTableBlocks;
    EXPECT_TRUE(WriteKv(OpContext{}, w).ok());
  }
  return p;
}

struct LatentQueries {
  std::vector<float> q;
  std::vector<int32_t> positions, seqs;
};

// A prefill chunk of sequence 0 (positions 5..17) and decode tokens of both sequences.
inline LatentQueries MakeLatentQueries(const LatentPool& pool, int64_t heads, std::mt19937& rng) {
  LatentQueries out;
  for (int32_t pos = 5; pos < 18; ++pos) {
    out.positions.push_back(pos);
    out.seqs.push_back(0);
  }
  const int32_t last = static_cast<int32_t>(pool.max_keys() - 1);
  for (int32_t pos : {0, last, 3}) {
    out.positions.push_back(pos);
    out.seqs.push_back(1);
  }
  out.positions.push_back(last);
  out.seqs.push_back(0);
  out.q =
      RandomVector(static_cast<int64_t>(out.positions.size()) * (heads * pool.entry() + 2), rng);
  return out;
}

inline LatentAttentionParams LatentParams(const LatentPool& pool, const LatentQueries& qs,
                                          int64_t heads, int64_t value_dim,
                                          std::vector<float>* out) {
  LatentAttentionParams p;
  p.q = qs.q.data();
  p.q_token_stride = heads * pool.entry() + 2;  // padded rows
  p.out_token_stride = heads * value_dim + 1;
  p.cache = pool.view;
  p.value_dim = value_dim;
  p.num_heads = heads;
  p.num_tokens = static_cast<int64_t>(qs.positions.size());
  p.positions = qs.positions.data();
  p.token_seq = qs.seqs.data();
  p.block_tables = pool.tables.data();
  p.num_seqs = 2;
  p.max_blocks_per_seq = LatentPool::kTableBlocks;
  out->assign(static_cast<size_t>(p.num_tokens * p.out_token_stride), -7.0f);
  p.out = out->data();
  return p;
}

struct LatentGeometry {
  int64_t pieces_per_half, head_dim, block_size, heads, value_dim;
};

// The pieces a real MLA entry is cut into (DeepSeek's 256 + 32 as one K and one V piece of 144;
// 512 + 64 as two of 144 each), a value cutting a piece (and, at head_dim 64, an i4 group) in
// two, and a tiny one.
inline constexpr LatentGeometry kLatentGeometries[] = {
    {1, 144, 16, 12, 256}, {2, 144, 16, 6, 512}, {2, 64, 4, 5, 200}, {1, 8, 4, 3, 8}};

}  // namespace pd::kernels::testing
