// CPU-side tests of the split-KV decode attention's launch and index logic (label unit, part of
// kernels_cuda_launch_test; beside launch_config_test.cc, which would pass 1,500 lines with
// them). The shapes, the split/key/head/workspace mappings and the 16-byte load rule are checked
// directly; then an emulation runs DecodeSplitKernel and DecodeMergeKernel on the host, every
// (block, thread) of both grids through the same launch_config.h functions the .cu calls, and
// compares the result with kernels/reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::cuda {
namespace {

TEST(CudaDecodeLaunchTest, SplitsAreWholeBlocksOfAtLeast256Tokens) {
  EXPECT_EQ(DecodeSplitTokens(16), 256);
  EXPECT_EQ(DecodeSplitTokens(1), 256);
  EXPECT_EQ(DecodeSplitTokens(256), 256);
  EXPECT_EQ(DecodeSplitTokens(48), 288);  // 6 blocks
  EXPECT_EQ(DecodeSplitTokens(300), 300);
  EXPECT_EQ(DecodeNumSplits(/*max_blocks_per_seq=*/512, /*block_size=*/16), 32);
  EXPECT_EQ(DecodeNumSplits(16, 16), 1);
  EXPECT_EQ(DecodeNumSplits(17, 16), 2);  // 272 tokens
  EXPECT_EQ(DecodeNumSplits(1, 1), 1);
  EXPECT_EQ(DecodeNumSplits(8192, 16), 64);  // a 131072-token context: at most 64 splits
  EXPECT_EQ(DecodeSplitTokens(16, 131072), 2048);
  EXPECT_EQ(DecodeNumSplits(8192, 16, /*max_context_len=*/1000), 4);  // a bound: 4 x 256
  EXPECT_EQ(DecodeNumSplits(8192, 16, 20000), 63);                    // splits of 320 (20 blocks)
  EXPECT_EQ(DecodeSplitTokens(16, 20000), 320);
  EXPECT_EQ(DecodeNumSplits(16, 16, 100000), 1);  // a bound past the table is the table
  EXPECT_EQ(DecodeContextBound(16, 16, 0), 256);
  EXPECT_EQ(DecodeContextBound(16, 16, 100), 100);
  EXPECT_EQ(DecodeNumSplits(7, 48), 2);  // 336 tokens, splits of 288
}

TEST(CudaDecodeLaunchTest, GeometryAndLaunchShapes) {
  // The benchmark's shape: 32 heads over 8 kv heads, head_dim 64, 32 sequences x 8192 tokens.
  DecodeGeometry g = DecodeGeometryOf(32, 8, 64, 16, 512);
  EXPECT_EQ(g.split_tokens, 256);
  EXPECT_EQ(g.num_splits, 32);
  EXPECT_EQ(g.group, 4);
  EXPECT_EQ(g.head_tiles, 1);
  EXPECT_EQ(g.tile_heads, 4);
  EXPECT_EQ(g.chunk_keys, 32);
  LaunchShape s = DecodeSplitLaunch(g, 32, 8, 64);
  EXPECT_EQ(s.grid, 32 * 8 * 32);
  EXPECT_EQ(s.threads, kDecodeThreads);
  const DecodeSmemLayout sl = DecodeSmemLayoutOf(g, 64);
  EXPECT_EQ(s.shared_bytes, sl.total_floats * 4);
  EXPECT_EQ(sl.total_floats, 4 * 64 + 2 * 32 * 64 + 4 * 32 + 3 * 4);
  // Regions in order, none overlapping.
  EXPECT_EQ(sl.k - sl.q, 4 * 64);
  EXPECT_EQ(sl.v - sl.k, 32 * 64);
  EXPECT_EQ(sl.p - sl.v, 32 * 64);
  EXPECT_EQ(sl.max - sl.p, 4 * 32);
  EXPECT_EQ(sl.sum - sl.max, 4);
  EXPECT_EQ(sl.corr - sl.sum, 4);
  const LaunchShape m = DecodeMergeLaunch(32, 32);
  EXPECT_EQ(m.grid, 32 * 32);
  EXPECT_EQ(m.threads, kDecodeMergeThreads);
  // Chunk keys follow head_dim: 8 KiB of f32 per staged K (or V) chunk, at most 64 keys.
  EXPECT_EQ(DecodeChunkKeys(128), 16);
  EXPECT_EQ(DecodeChunkKeys(256), 8);
  EXPECT_EQ(DecodeChunkKeys(80), 25);
  EXPECT_EQ(DecodeChunkKeys(8), kDecodeMaxChunkKeys);
  // MQA-like groups take several tiles; 12 heads per kv head: a tile of 8 and one of 4.
  g = DecodeGeometryOf(32, 1, 128, 16, 100);
  EXPECT_EQ(g.head_tiles, 4);
  EXPECT_EQ(g.tile_heads, 8);
  EXPECT_EQ(DecodeSplitLaunch(g, 3, 1, 128).grid, 3 * 1 * 4 * g.num_splits);
  g = DecodeGeometryOf(12, 1, 64, 16, 16);
  EXPECT_EQ(g.head_tiles, 2);
  EXPECT_EQ(g.num_splits, 1);
  // Shared memory stays under the 48 KiB a launch gets without opting in, for every head_dim
  // the op accepts and the largest tile; the accumulators fit their registers.
  for (int64_t hd = 1; hd <= kMaxAttentionHeadDim; ++hd) {
    const DecodeGeometry w = DecodeGeometryOf(64, 1, hd, 16, 4);
    ASSERT_LE(DecodeSplitLaunch(w, 1, 1, hd).shared_bytes, 48 * 1024) << hd;
    ASSERT_LE(w.tile_heads * hd, int64_t{kDecodeMaxAccPerThread} * kDecodeThreads) << hd;
    ASSERT_GE(w.chunk_keys, 1);
    // Regions start on 16-byte boundaries, in order, without overlap.
    const DecodeSmemLayout l = DecodeSmemLayoutOf(w, hd);
    for (int64_t start : {l.q, l.k, l.v, l.p, l.max, l.sum, l.corr}) {
      ASSERT_EQ(start % 4, 0) << hd;
    }
    ASSERT_GE(l.k, l.q + w.tile_heads * hd);
    ASSERT_GE(l.v, l.k + w.chunk_keys * hd);
    ASSERT_GE(l.p, l.v + w.chunk_keys * hd);
    ASSERT_GE(l.max, l.p + w.tile_heads * w.chunk_keys);
    ASSERT_GE(l.sum, l.max + w.tile_heads);
    ASSERT_GE(l.corr, l.sum + w.tile_heads);
    ASSERT_EQ(l.total_floats, l.corr + w.tile_heads);
  }
}

// Block b <-> (seq, kv head, head tile, split): every combination once, the split fastest.
TEST(CudaDecodeLaunchTest, SplitBlocksCoverTheGridOnce) {
  const int64_t seqs = 3, kv_heads = 2;
  const DecodeGeometry g = DecodeGeometryOf(/*num_heads=*/24, kv_heads, 64, 16, 40);  // group 12
  ASSERT_EQ(g.head_tiles, 2);
  ASSERT_EQ(g.num_splits, 3);  // 640 tokens
  const LaunchShape s = DecodeSplitLaunch(g, seqs, kv_heads, 64);
  std::vector<int> seen(seqs * kv_heads * g.head_tiles * g.num_splits, 0);
  for (int64_t b = 0; b < s.grid; ++b) {
    const DecodeSplitBlock blk = DecodeSplitBlockAt(b, g, kv_heads);
    ASSERT_LT(blk.seq, seqs);
    ASSERT_LT(blk.kv_head, kv_heads);
    ASSERT_LT(blk.head_tile, g.head_tiles);
    ASSERT_LT(blk.split, g.num_splits);
    ++seen[((blk.seq * kv_heads + blk.kv_head) * g.head_tiles + blk.head_tile) * g.num_splits +
           blk.split];
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  const DecodeSplitBlock b1 = DecodeSplitBlockAt(1, g, kv_heads);
  EXPECT_EQ(b1.split, 1);
  EXPECT_EQ(b1.head_tile, 0);
  const DecodeSplitBlock last = DecodeSplitBlockAt(s.grid - 1, g, kv_heads);
  EXPECT_EQ(last.seq, seqs - 1);
  EXPECT_EQ(last.kv_head, kv_heads - 1);
  EXPECT_EQ(last.head_tile, 1);
  EXPECT_EQ(last.split, 2);
}

// Cut for a bound (max_context_len) shorter than a sequence, the last split takes the rest: the
// splits still cover [0, len) once, and the used count stops at the grid's splits.
TEST(CudaDecodeLaunchTest, ContextsPastTheBoundGoToTheLastSplit) {
  const DecodeGeometry g = DecodeGeometryOf(8, 2, 64, 16, /*max_blocks_per_seq=*/100,
                                            /*max_context_len=*/600);
  EXPECT_EQ(g.split_tokens, 256);
  EXPECT_EQ(g.num_splits, 3);
  for (int64_t len : {1, 600, 768, 769, 1600}) {
    int64_t next = 0;
    for (int64_t split = 0; split < g.num_splits; ++split) {
      const KeyRange r = DecodeSplitKeys(split, g.split_tokens, len, g.num_splits);
      if (r.begin < r.end) {
        ASSERT_EQ(r.begin, next) << len;
        next = r.end;
      }
    }
    EXPECT_EQ(next, len);
    EXPECT_LE(DecodeUsedSplits(len, g.split_tokens, g.num_splits), g.num_splits);
  }
  EXPECT_EQ(DecodeSplitKeys(2, 256, 1600, 3).end, 1600);
  EXPECT_EQ(DecodeUsedSplits(1600, 256, 3), 3);
  EXPECT_EQ(DecodeUsedSplits(300, 256, 3), 2);
  // The workspace for the table's coverage holds any bound's records.
  EXPECT_GE(DecodeWorkspaceBytes(4, 8, 64, 100, 16), DecodeWorkspaceBytes(4, 8, 64, 100, 16, 600));
}

TEST(CudaDecodeLaunchTest, SplitKeysPartitionTheContext) {
  auto keys = [](int64_t split, int64_t len) { return DecodeSplitKeys(split, 256, len); };
  // Length 1: split 0 holds the one key, split 1 is empty (its block exits).
  EXPECT_EQ(keys(0, 1).begin, 0);
  EXPECT_EQ(keys(0, 1).end, 1);
  EXPECT_GE(keys(1, 1).begin, keys(1, 1).end);
  // Ending mid-block (17 = one block of 16 and one key) and just below a split boundary.
  EXPECT_EQ(keys(0, 17).end, 17);
  EXPECT_EQ(keys(0, 255).end, 255);
  // Exactly one split: the next one is empty; one more key starts it.
  EXPECT_EQ(keys(0, 256).end, 256);
  EXPECT_GE(keys(1, 256).begin, keys(1, 256).end);
  EXPECT_EQ(keys(1, 257).begin, 256);
  EXPECT_EQ(keys(1, 257).end, 257);
  EXPECT_EQ(keys(3, 1000).begin, 768);
  EXPECT_EQ(keys(3, 1000).end, 1000);
  EXPECT_EQ(DecodeUsedSplits(1, 256), 1);
  EXPECT_EQ(DecodeUsedSplits(256, 256), 1);
  EXPECT_EQ(DecodeUsedSplits(257, 256), 2);
  EXPECT_EQ(DecodeUsedSplits(5000, 256), 20);
  // Every length up to a few splits, for a power-of-two and an odd block size: the non-empty
  // splits are exactly the used ones, start on block boundaries and cover [0, len) once.
  for (int64_t block_size : {int64_t{16}, int64_t{48}, int64_t{1}}) {
    const int64_t st = DecodeSplitTokens(block_size);
    for (int64_t len = 1; len <= 3 * st + 5; ++len) {
      const int64_t splits = DecodeNumSplits(CeilDiv(len, block_size), block_size);
      int64_t next = 0, used = 0;
      for (int64_t split = 0; split < splits; ++split) {
        const KeyRange r = DecodeSplitKeys(split, st, len);
        if (r.begin >= r.end) {
          continue;
        }
        ++used;
        ASSERT_EQ(r.begin, next) << block_size << " " << len << " " << split;
        ASSERT_EQ(r.begin % block_size, 0);
        ASSERT_LE(r.end - r.begin, st);
        next = r.end;
      }
      ASSERT_EQ(next, len) << block_size << " " << len;
      ASSERT_EQ(used, DecodeUsedSplits(len, st)) << block_size << " " << len;
    }
  }
}

// Query heads of (kv head, tile): a partition of all heads, each reading its own kv head.
TEST(CudaDecodeLaunchTest, TileHeadsFollowTheGqaGroups) {
  struct Case {
    int64_t num_heads, num_kv_heads;
  };
  for (const Case& c :
       {Case{8, 8}, Case{32, 8}, Case{8, 1}, Case{12, 1}, Case{32, 1}, Case{24, 2}, Case{16, 2}}) {
    const DecodeGeometry g = DecodeGeometryOf(c.num_heads, c.num_kv_heads, 64, 16, 1);
    std::vector<int> seen(c.num_heads, 0);
    for (int64_t kv = 0; kv < c.num_kv_heads; ++kv) {
      for (int64_t tile = 0; tile < g.head_tiles; ++tile) {
        const HeadRange hr = DecodeTileHeads(kv, tile, g.group);
        ASSERT_GE(hr.count, 1);
        ASSERT_LE(hr.count, g.tile_heads);
        for (int64_t h = hr.first; h < hr.first + hr.count; ++h) {
          ASSERT_EQ(KvHeadOf(h, c.num_heads, c.num_kv_heads), kv) << c.num_heads << " " << h;
          ++seen[h];
        }
      }
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }))
        << c.num_heads << "/" << c.num_kv_heads;
  }
  const HeadRange tail = DecodeTileHeads(/*kv_head=*/1, /*head_tile=*/1, /*group=*/12);
  EXPECT_EQ(tail.first, 20);
  EXPECT_EQ(tail.count, 4);
}

// Records of (seq, head, split): disjoint, inside DecodeWorkspaceBytes, a (seq, head)'s splits
// adjacent (the merge reads partials first .. first + used - 1).
TEST(CudaDecodeLaunchTest, WorkspaceRecordsAreDisjointAndInBounds) {
  const int64_t seqs = 3, heads = 5, head_dim = 12, max_blocks = 40, block_size = 16;
  const int64_t splits = DecodeNumSplits(max_blocks, block_size);
  ASSERT_EQ(splits, 3);
  const int64_t bytes = DecodeWorkspaceBytes(seqs, heads, head_dim, max_blocks, block_size);
  EXPECT_EQ(bytes, seqs * heads * splits * (head_dim + 2) * 4);
  std::vector<int> hits(bytes / 4, 0);
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t first = DecodePartialIndex(s, h, 0, heads, splits);
      for (int64_t split = 0; split < splits; ++split) {
        const int64_t partial = DecodePartialIndex(s, h, split, heads, splits);
        ASSERT_EQ(partial, first + split);
        for (int64_t d = 0; d < head_dim; ++d) {
          ++hits.at(DecodeAccOffset(partial, head_dim, d));
        }
        ++hits.at(DecodeMaxOffset(partial, head_dim));
        ++hits.at(DecodeSumOffset(partial, head_dim));
      }
    }
  }
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }));
}

// A 16-byte aligned host buffer (the vector path's alignment is checked on real addresses).
struct alignas(16) Bytes16 {
  uint8_t b[16];
};

TEST(CudaDecodeLaunchTest, VectorLoadRule) {
  std::vector<Bytes16> buf(4096);
  uint8_t* base = buf[0].b;
  auto view = [&](void* p, DType dtype, int64_t head_dim) {
    return DenseKvCacheView(p, dtype, 4, 2, 2, 16, head_dim, 1);
  };
  EXPECT_TRUE(DecodeVectorLoads(view(base, DType::kF32, 64)));
  EXPECT_TRUE(DecodeVectorLoads(view(base, DType::kF32, 4)));
  EXPECT_FALSE(DecodeVectorLoads(view(base, DType::kF32, 6)));  // 24-byte rows
  EXPECT_TRUE(DecodeVectorLoads(view(base, DType::kBF16, 64)));
  EXPECT_TRUE(DecodeVectorLoads(view(base, DType::kF16, 8)));
  EXPECT_FALSE(DecodeVectorLoads(view(base, DType::kBF16, 4)));  // 8-byte rows
  EXPECT_FALSE(DecodeVectorLoads(view(base, DType::kF16, 12)));
  EXPECT_FALSE(DecodeVectorLoads(view(base, DType::kI8, 64)));  // needs its row scales
  EXPECT_FALSE(DecodeVectorLoads(view(base, DType::kF8E4M3, 64)));
  EXPECT_FALSE(DecodeVectorLoads(view(base + 2, DType::kBF16, 64)));  // misaligned pool
  EXPECT_FALSE(DecodeVectorLoads(view(base + 4, DType::kF32, 64)));
  KvCacheView odd = view(base, DType::kBF16, 64);
  odd.head_stride += 4;  // padded heads: 8-byte aligned only
  odd.kv_stride = 2 * odd.head_stride;
  odd.layer_stride = 2 * odd.kv_stride;
  odd.block_stride = 2 * odd.layer_stride;
  EXPECT_FALSE(DecodeVectorLoads(odd));
  odd.head_stride += 4;  // 16-byte aligned again
  odd.kv_stride = 2 * odd.head_stride;
  odd.layer_stride = 2 * odd.kv_stride;
  odd.block_stride = 2 * odd.layer_stride;
  EXPECT_TRUE(DecodeVectorLoads(odd));
  // Staging units: vectors of 4 (f32) or 8 (bf16/f16) elements, or single elements.
  EXPECT_EQ(DecodeStageShapeOf(DType::kF32, 64, true).units_per_row, 16);
  EXPECT_EQ(DecodeStageShapeOf(DType::kF32, 64, true).elems_per_unit, 4);
  EXPECT_EQ(DecodeStageShapeOf(DType::kBF16, 64, true).units_per_row, 8);
  EXPECT_EQ(DecodeStageShapeOf(DType::kF16, 128, true).elems_per_unit, 8);
  EXPECT_EQ(DecodeStageShapeOf(DType::kI8, 64, false).units_per_row, 64);
  EXPECT_EQ(DecodeStageShapeOf(DType::kBF16, 64, false).elems_per_unit, 1);
  // Each element of each row of a chunk is staged by exactly one unit.
  for (bool vector : {true, false}) {
    const int head_dim = 24, rows = 7;
    const DecodeStageShape shape = DecodeStageShapeOf(DType::kBF16, head_dim, vector);
    std::vector<int> hits(rows * head_dim, 0);
    for (int i = 0; i < rows * shape.units_per_row; ++i) {
      const DecodeStageUnit u = DecodeStageUnitAt(i, shape);
      for (int e = 0; e < shape.elems_per_unit; ++e) {
        ++hits.at(u.row * head_dim + u.elem + e);
      }
    }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; })) << vector;
  }
}

// UnpackKvWord reads the words of a 16-byte vector as the elements they hold, in order.
TEST(CudaDecodeLaunchTest, UnpackedVectorsEqualElementLoads) {
  std::mt19937 rng(40);
  std::normal_distribution<float> dist;
  std::vector<float> f(32);
  for (float& x : f) {
    x = dist(rng);
  }
  f[1] = std::numeric_limits<float>::infinity();
  f[2] = 6e-8f;  // an f16 subnormal
  f[3] = -0.0f;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> bytes(f.size() * DTypeSize(dtype));
    std::vector<float> want(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      if (dtype == DType::kF32) {
        std::memcpy(&bytes[4 * i], &f[i], 4);
        want[i] = f[i];
      } else {
        const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(f[i]) : F32ToF16(f[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
        want[i] = dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
      }
    }
    std::vector<float> got(f.size(), -1.0f);
    const int64_t per_word = KvWordElems(dtype);
    for (size_t w = 0; w < bytes.size() / 4; ++w) {
      uint32_t word = 0;
      std::memcpy(&word, &bytes[4 * w], 4);
      UnpackKvWord(word, dtype, &got[w * per_word]);
    }
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_EQ(F32Bits(got[i]), F32Bits(want[i])) << static_cast<int>(dtype) << " " << i;
    }
  }
}

TEST(CudaDecodeLaunchTest, SoftmaxRescaleAndMerge) {
  SoftmaxRescale rs = SoftmaxRescaleOf(-INFINITY, 2.0f);  // the first chunk
  EXPECT_EQ(rs.max, 2.0f);
  EXPECT_EQ(rs.correction, 0.0f);
  rs = SoftmaxRescaleOf(3.0f, 1.0f);
  EXPECT_EQ(rs.max, 3.0f);
  EXPECT_EQ(rs.correction, 1.0f);
  rs = SoftmaxRescaleOf(1.0f, 3.0f);
  EXPECT_FLOAT_EQ(rs.correction, std::exp(-2.0f));
  // Two splits of one (seq, head), head_dim 2: scores {0, ln 3} and {ln 2}, values 1, 2, 3 in
  // dim 0. out = (1 + 3 * 2 + 2 * 3) / (1 + 3 + 2) = 13 / 6.
  const int64_t hd = 2;
  std::vector<float> ws(2 * DecodeRecordFloats(hd));
  const float l3 = std::log(3.0f), l2 = std::log(2.0f);
  // split 0: max ln 3, sum e^-ln3 + 1 = 4/3, acc = 1/3 * 1 + 1 * 2
  ws[DecodeAccOffset(0, hd, 0)] = 1.0f / 3.0f + 2.0f;
  ws[DecodeAccOffset(0, hd, 1)] = 0.0f;
  ws[DecodeMaxOffset(0, hd)] = l3;
  ws[DecodeSumOffset(0, hd)] = 4.0f / 3.0f;
  ws[DecodeAccOffset(1, hd, 0)] = 3.0f;
  ws[DecodeAccOffset(1, hd, 1)] = 1.0f;
  ws[DecodeMaxOffset(1, hd)] = l2;
  ws[DecodeSumOffset(1, hd)] = 1.0f;
  const DecodeMergeTotals t = DecodeMergeTotalsOf(ws.data(), 0, 2, hd);
  EXPECT_FLOAT_EQ(t.max, l3);
  EXPECT_FLOAT_EQ(t.sum, 4.0f / 3.0f + 2.0f / 3.0f);
  EXPECT_FLOAT_EQ(DecodeMergeElement(ws.data(), 0, 2, hd, t, 0), 13.0f / 6.0f);
  EXPECT_FLOAT_EQ(DecodeMergeElement(ws.data(), 0, 2, hd, t, 1), (2.0f / 3.0f) / 2.0f);
  // One split: acc / sum exactly.
  const DecodeMergeTotals one = DecodeMergeTotalsOf(ws.data(), 1, 1, hd);
  EXPECT_EQ(one.sum, 1.0f);
  EXPECT_EQ(DecodeMergeElement(ws.data(), 1, 1, hd, one, 0), 3.0f);
  // A NaN sum (a poisoned row) poisons the output, as on the CPU.
  ws[DecodeSumOffset(1, hd)] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(DecodeMergeTotalsOf(ws.data(), 0, 2, hd).sum));
}

// ---- Emulation of both kernels on the host.

// The device LoadKv (device_utils.cuh) on the host.
float HostLoadKv(const void* base, DType dtype, int64_t off) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[off];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(base)[off]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[off]);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(base)[off]);
    case DType::kF8E4M3:
      return E4M3ToF32(static_cast<const uint8_t*>(base)[off]);
    case DType::kI4:
      break;  // (two codes a byte: the staging reads them with KvI4Code)
  }
  return 0.0f;
}

float HostRowScale(const KvCacheView& c, int64_t block_id, int64_t kv_head, int64_t pos,
                   bool value) {
  if (!IsQuantizedKvDType(c.dtype)) {
    return 1.0f;
  }
  float s = 0.0f;
  std::memcpy(
      &s, static_cast<const char*>(c.base) + KvScaleByteOffset(c, block_id, kv_head, pos, value),
      4);
  return s;
}

// The butterfly of WarpReduceSum: lane l adds lane l ^ offset for offsets 16, 8, 4, 2, 1.
float WarpSum(std::vector<float> lanes) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    std::vector<float> next(kWarpSize);
    for (int l = 0; l < kWarpSize; ++l) {
      next[l] = lanes[l] + lanes[l ^ offset];
    }
    lanes = next;
  }
  return lanes[0];
}

// What the emulation saw, for the coverage checks.
struct EmulationStats {
  int64_t blocks_run = 0;    // split blocks that did not exit at once
  int64_t keys_staged = 0;   // (kv head, tile, key) rows staged
  int64_t vector_units = 0;  // 16-byte loads
};

// DecodeSplitKernel for grid block `block`, every thread of it in turn between the barriers.
void EmulateSplitBlock(const DecodeAttentionParams& p, const DecodeGeometry& g, int64_t block,
                       bool vector, float scale, std::vector<float>* workspace,
                       EmulationStats* stats) {
  const KvCacheView& c = p.cache;
  const DecodeSplitBlock blk = DecodeSplitBlockAt(block, g, c.num_kv_heads);
  const KeyRange keys =
      DecodeSplitKeys(blk.split, g.split_tokens, p.context_lens[blk.seq], g.num_splits);
  if (keys.begin >= keys.end) {
    return;
  }
  ++stats->blocks_run;
  const HeadRange heads = DecodeTileHeads(blk.kv_head, blk.head_tile, g.group);
  const int count = static_cast<int>(heads.count);
  const int head_dim = static_cast<int>(c.head_dim);
  const int chunk_keys = static_cast<int>(g.chunk_keys);
  const DecodeSmemLayout sl = DecodeSmemLayoutOf(g, head_dim);
  // Shared memory starts as NaN: a read of anything not written this chunk shows up.
  std::vector<float> smem(sl.total_floats, std::numeric_limits<float>::quiet_NaN());
  float* qs = smem.data() + sl.q;
  float* ks = smem.data() + sl.k;
  float* vs = smem.data() + sl.v;
  float* ps = smem.data() + sl.p;
  float* run_max = smem.data() + sl.max;
  float* run_sum = smem.data() + sl.sum;
  float* corr = smem.data() + sl.corr;
  const int32_t* table =
      p.block_tables + BlockTableIndex(blk.seq, p.max_blocks_per_seq, 0, c.block_size);
  const float* q = p.q + blk.seq * p.q_seq_stride + heads.first * head_dim;
  const int tile_elems = count * head_dim;
  for (int tid = 0; tid < kDecodeThreads; ++tid) {
    for (int i = tid; i < tile_elems; i += kDecodeThreads) {
      qs[i] = q[i] * scale;
    }
    if (tid < count) {
      run_max[tid] = -INFINITY;
      run_sum[tid] = 0.0f;
    }
  }
  if (KvRotated(c.dtype, head_dim)) {  // an i4 cache: the query tile rotated, a group a thread
    const int group = static_cast<int>(KvScaleGroup(c.dtype, head_dim));
    for (int tid = 0; tid < kDecodeThreads; ++tid) {
      for (int i = tid; i < tile_elems / group; i += kDecodeThreads) {
        HadamardRotateRn(qs + i * group, group);
      }
    }
  }
  std::vector<float> acc(kDecodeThreads * kDecodeMaxAccPerThread, 0.0f);  // [thread][j]
  const DType dtype = c.dtype;
  const DecodeStageShape shape = DecodeStageShapeOf(dtype, head_dim, vector);
  for (int64_t first = keys.begin; first < keys.end; first += chunk_keys) {
    const int rows = static_cast<int>(std::min<int64_t>(keys.end - first, chunk_keys));
    std::fill(ks, ks + chunk_keys * head_dim, std::numeric_limits<float>::quiet_NaN());
    std::fill(vs, vs + chunk_keys * head_dim, std::numeric_limits<float>::quiet_NaN());
    // StageKvChunk.
    for (int tid = 0; tid < kDecodeThreads; ++tid) {
      for (int i = tid; i < rows * shape.units_per_row; i += kDecodeThreads) {
        const DecodeStageUnit u = DecodeStageUnitAt(i, shape);
        const int64_t t = first + u.row;
        const int64_t block_id = table[t / c.block_size];
        const int64_t k_off = KvElementOffset(c, block_id, blk.kv_head, t, false) + u.elem;
        float* k_dst = ks + u.row * head_dim + u.elem;
        float* v_dst = vs + u.row * head_dim + u.elem;
        if (vector) {
          // The kernel stores whole float4s here.
          ASSERT_EQ((k_dst - smem.data()) % 4, 0);
          ASSERT_EQ((v_dst - smem.data()) % 4, 0);
          const int64_t es = DTypeSize(dtype);
          const char* kp = static_cast<const char*>(c.base) + k_off * es;
          const char* vp = static_cast<const char*>(c.base) + (k_off + c.kv_stride) * es;
          ASSERT_EQ(reinterpret_cast<uintptr_t>(kp) % 16, 0u);
          ASSERT_EQ(reinterpret_cast<uintptr_t>(vp) % 16, 0u);
          uint32_t kw[4], vw[4];
          std::memcpy(kw, kp, 16);
          std::memcpy(vw, vp, 16);
          const int64_t n = KvWordElems(dtype);
          for (int w = 0; w < 4; ++w) {
            UnpackKvWord(kw[w], dtype, k_dst + w * n);
            UnpackKvWord(vw[w], dtype, v_dst + w * n);
          }
          ++stats->vector_units;
        } else if (dtype == DType::kI4) {
          const int64_t row = k_off - u.elem;
          const int64_t g = u.elem / KvScaleGroup(DType::kI4, head_dim);
          *k_dst = MulRn(KvI4Code(c.base, row, u.elem),
                         KvI4Scale(c, block_id, blk.kv_head, t, false, g));
          *v_dst = MulRn(KvI4Code(c.base, row + c.kv_stride, u.elem),
                         KvI4Scale(c, block_id, blk.kv_head, t, true, g));
        } else {
          *k_dst =
              HostLoadKv(c.base, dtype, k_off) * HostRowScale(c, block_id, blk.kv_head, t, false);
          *v_dst = HostLoadKv(c.base, dtype, k_off + c.kv_stride) *
                   HostRowScale(c, block_id, blk.kv_head, t, true);
        }
      }
    }
    stats->keys_staged += rows;
    // Scores: warp w, items w, w + kDecodeWarps, ...; lane partial sums, then the butterfly.
    for (int warp = 0; warp < kDecodeWarps; ++warp) {
      for (int i = warp; i < count * rows; i += kDecodeWarps) {
        const LocalRowCol hk = LocalRowColAt(i, rows);
        std::vector<float> lanes(kWarpSize, 0.0f);
        for (int lane = 0; lane < kWarpSize; ++lane) {
          for (int d = lane; d < head_dim; d += kWarpSize) {
            lanes[lane] += qs[hk.row * head_dim + d] * ks[hk.col * head_dim + d];
          }
        }
        ps[hk.row * chunk_keys + hk.col] = WarpSum(lanes);
      }
    }
    // Softmax step, per head.
    for (int h = 0; h < count; ++h) {
      float* row = ps + h * chunk_keys;
      float chunk_max = -INFINITY;
      for (int r = 0; r < rows; ++r) {
        chunk_max = std::fmax(chunk_max, row[r]);
      }
      const SoftmaxRescale rs = SoftmaxRescaleOf(run_max[h], chunk_max);
      std::vector<float> lanes(kWarpSize, 0.0f);
      for (int r = 0; r < rows; ++r) {
        row[r] = std::exp(row[r] - rs.max);
        lanes[r % kWarpSize] += row[r];
      }
      run_sum[h] = run_sum[h] * rs.correction + WarpSum(lanes);
      run_max[h] = rs.max;
      corr[h] = rs.correction;
    }
    // Accumulate.
    for (int tid = 0; tid < kDecodeThreads; ++tid) {
      for (int j = 0; j < kDecodeMaxAccPerThread; ++j) {
        const int e = tid + j * kDecodeThreads;
        if (e < tile_elems) {
          const LocalRowCol hd = LocalRowColAt(e, head_dim);
          const float* w = ps + hd.row * chunk_keys;
          float a = acc[tid * kDecodeMaxAccPerThread + j] * corr[hd.row];
          for (int r = 0; r < rows; ++r) {
            a += w[r] * vs[r * head_dim + hd.col];
          }
          acc[tid * kDecodeMaxAccPerThread + j] = a;
        }
      }
    }
  }
  std::vector<float>& ws = *workspace;
  for (int tid = 0; tid < kDecodeThreads; ++tid) {
    for (int j = 0; j < kDecodeMaxAccPerThread; ++j) {
      const int e = tid + j * kDecodeThreads;
      if (e < tile_elems) {
        const LocalRowCol hd = LocalRowColAt(e, head_dim);
        const int64_t partial =
            DecodePartialIndex(blk.seq, heads.first + hd.row, blk.split, p.num_heads, g.num_splits);
        ws.at(DecodeAccOffset(partial, head_dim, hd.col)) = acc[tid * kDecodeMaxAccPerThread + j];
      }
    }
    if (tid < count) {
      const int64_t partial =
          DecodePartialIndex(blk.seq, heads.first + tid, blk.split, p.num_heads, g.num_splits);
      ws.at(DecodeMaxOffset(partial, head_dim)) = run_max[tid];
      ws.at(DecodeSumOffset(partial, head_dim)) = run_sum[tid];
    }
  }
}

// DecodeMergeKernel for every block of its grid.
void EmulateMerge(const DecodeAttentionParams& p, const DecodeGeometry& g,
                  const std::vector<float>& ws) {
  const int64_t head_dim = p.cache.head_dim;
  const LaunchShape m = DecodeMergeLaunch(p.num_seqs, p.num_heads);
  for (int64_t b = 0; b < m.grid; ++b) {
    const RowHead rh = RowHeadAt(b, p.num_heads);
    const int64_t used = DecodeUsedSplits(p.context_lens[rh.row], g.split_tokens, g.num_splits);
    const int64_t first = DecodePartialIndex(rh.row, rh.head, 0, p.num_heads, g.num_splits);
    ASSERT_LE(used, g.num_splits);
    ASSERT_LE(DecodeSumOffset(first + used - 1, head_dim) + 1, static_cast<int64_t>(ws.size()));
    const DecodeMergeTotals totals = DecodeMergeTotalsOf(ws.data(), first, used, head_dim);
    float* out = p.out + rh.row * p.out_seq_stride + rh.head * head_dim;
    std::vector<float> merged(head_dim);
    for (int64_t tid = 0; tid < m.threads; ++tid) {
      for (int64_t d = tid; d < head_dim; d += m.threads) {
        merged[d] = DecodeMergeElement(ws.data(), first, used, head_dim, totals, d);
      }
    }
    if (KvRotated(p.cache.dtype, head_dim)) {  // an i4 cache: rotated back, a group a thread
      const int64_t group = KvScaleGroup(p.cache.dtype, head_dim);
      for (int64_t tid = 0; tid < m.threads; ++tid) {
        for (int64_t i = tid; i < head_dim / group; i += m.threads) {
          HadamardRotateRn(merged.data() + i * group, group);
        }
      }
    }
    std::copy(merged.begin(), merged.end(), out);
  }
}

struct EmulationCase {
  DType dtype;
  int64_t num_heads, num_kv_heads, head_dim, block_size;
  int64_t pool_offset_bytes = 0;  // > 0: a misaligned pool (the scalar path)
  int64_t max_context_len = 0;    // > 0: a bound below the longest length (its last split grows)
  std::string Name() const {
    return std::to_string(static_cast<int>(dtype)) + " " + std::to_string(num_heads) + "/" +
           std::to_string(num_kv_heads) + " d" + std::to_string(head_dim) + " b" +
           std::to_string(block_size) + " +" + std::to_string(pool_offset_bytes) + " bound " +
           std::to_string(max_context_len);
  }
};

// The split + merge emulation against reference::DecodeAttention (double, two-pass) for one
// pool: mixed lengths (one key, mid-block, a block edge, one below / at / above a split edge,
// several splits), a block table wider than any sequence needs (blocks past the end exit).
// Tolerance: max-abs 5e-6, the CPU kernel's against the same reference (only the f32 summation
// order differs: chunks of keys, then splits merged).
void RunEmulation(const EmulationCase& ec) {
  SCOPED_TRACE(ec.Name());
  std::mt19937 rng(static_cast<uint32_t>(ec.num_heads * 131 + ec.head_dim + ec.block_size));
  const std::vector<int32_t> lens = {1, 15, 16, 17, 255, 256, 257, 512, 1000};
  const int64_t num_seqs = static_cast<int64_t>(lens.size());
  const int64_t bs = ec.block_size, num_layers = 2;
  int64_t max_blocks = 0, num_blocks = 0;
  for (int32_t len : lens) {
    max_blocks = std::max(max_blocks, CeilDiv(len, bs));
    num_blocks += CeilDiv(len, bs);
  }
  max_blocks += 3;  // spare splits for every sequence
  const int64_t block_bytes =
      DenseKvBlockBytes(ec.dtype, num_layers, ec.num_kv_heads, bs, ec.head_dim);
  std::vector<Bytes16> storage(CeilDiv(num_blocks * block_bytes + ec.pool_offset_bytes, 16));
  void* base = storage[0].b + ec.pool_offset_bytes;
  const KvCacheView view = DenseKvCacheView(base, ec.dtype, num_blocks, num_layers, ec.num_kv_heads,
                                            bs, ec.head_dim, /*layer=*/1);
  // Shuffled physical blocks; every position written through the reference WriteKv.
  std::vector<int32_t> ids(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) {
    ids[i] = static_cast<int32_t>(i);
  }
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(num_seqs * max_blocks, -1), positions, token_seq;
  size_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t b = 0; b < CeilDiv(lens[s], bs); ++b) {
      tables[s * max_blocks + b] = ids[next++];
    }
    for (int32_t pos = 0; pos < lens[s]; ++pos) {
      positions.push_back(pos);
      token_seq.push_back(static_cast<int32_t>(s));
    }
  }
  std::normal_distribution<float> dist;
  const int64_t kv_elems = ec.num_kv_heads * ec.head_dim;
  std::vector<float> k(positions.size() * kv_elems), v(k.size());
  for (float& x : k) {
    x = dist(rng);
  }
  for (float& x : v) {
    x = dist(rng);
  }
  WriteKvParams w;
  w.k = k.data();
  w.v = v.data();
  w.k_token_stride = w.v_token_stride = kv_elems;
  w.cache = view;
  w.num_tokens = static_cast<int64_t>(positions.size());
  w.positions = positions.data();
  w.token_seq = token_seq.data();
  w.block_tables = tables.data();
  w.num_seqs = num_seqs;
  w.max_blocks_per_seq = max_blocks;
  reference::WriteKv(w);

  const int64_t row = ec.num_heads * ec.head_dim, q_stride = row + 5, out_stride = row + 3;
  std::vector<float> q(num_seqs * q_stride);
  for (float& x : q) {
    x = dist(rng);
  }
  std::vector<float> got(num_seqs * out_stride, 0.0f), want(got.size(), 0.0f);
  DecodeAttentionParams p;
  p.q = q.data();
  p.out = want.data();
  p.q_seq_stride = q_stride;
  p.out_seq_stride = out_stride;
  p.cache = view;
  p.block_tables = tables.data();
  p.max_blocks_per_seq = max_blocks;
  p.context_lens = lens.data();
  p.num_seqs = num_seqs;
  p.num_heads = ec.num_heads;
  p.max_context_len = ec.max_context_len;
  reference::DecodeAttention(p);

  p.out = got.data();
  const DecodeGeometry g = DecodeGeometryOf(p);
  const bool vector = DecodeVectorLoads(view);
  EXPECT_EQ(vector, !IsQuantizedKvDType(ec.dtype) && ec.pool_offset_bytes == 0 &&
                        ec.head_dim * DTypeSize(ec.dtype) % 16 == 0);
  // NaN-filled: a record the merge reads without a split block having written it shows up.
  std::vector<float> ws(
      DecodeWorkspaceBytes(num_seqs, ec.num_heads, ec.head_dim, max_blocks, bs) / 4,
      std::numeric_limits<float>::quiet_NaN());
  const LaunchShape split = DecodeSplitLaunch(g, num_seqs, ec.num_kv_heads, ec.head_dim);
  ASSERT_LE(split.shared_bytes, 48 * 1024);
  EmulationStats stats;
  for (int64_t b = 0; b < split.grid; ++b) {
    EmulateSplitBlock(p, g, b, vector, AttentionScale(p.scale, ec.head_dim), &ws, &stats);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }
  EmulateMerge(p, g, ws);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  // Each key is staged once per (kv head, head tile); only blocks with keys did any work.
  int64_t total_keys = 0, used_splits = 0;
  for (int32_t len : lens) {
    total_keys += len;
    used_splits += DecodeUsedSplits(len, g.split_tokens, g.num_splits);
  }
  EXPECT_EQ(stats.keys_staged, total_keys * ec.num_kv_heads * g.head_tiles);
  EXPECT_EQ(stats.blocks_run, used_splits * ec.num_kv_heads * g.head_tiles);
  EXPECT_GT(split.grid, stats.blocks_run);  // the spare splits exited
  if (vector) {
    EXPECT_EQ(stats.vector_units,
              total_keys * ec.num_kv_heads * g.head_tiles * ec.head_dim * DTypeSize(ec.dtype) / 16);
  }
  double max_abs = 0.0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t i = 0; i < out_stride; ++i) {
      const float a = got[s * out_stride + i], b = want[s * out_stride + i];
      if (i >= row) {
        EXPECT_EQ(a, 0.0f) << "padding written, seq " << s;  // out's padding stays untouched
        continue;
      }
      ASSERT_FALSE(std::isnan(a)) << "seq " << s << " elem " << i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(a) - b));
    }
  }
  EXPECT_LE(max_abs, 5e-6);
}

TEST(CudaDecodeLaunchTest, SplitMergeEmulationMatchesReference) {
  const EmulationCase cases[] = {
      // bf16 and f32 on the 16-byte path: GQA 1, 4, 8, a two-tile group (16) and one with a
      // 4-head tail tile (12); head_dim 64 and 128; a block size that is not a power of two.
      {DType::kBF16, 4, 4, 64, 16},
      {DType::kBF16, 8, 2, 128, 16},
      {DType::kBF16, 8, 1, 64, 16},
      {DType::kBF16, 16, 1, 64, 16},
      {DType::kF32, 12, 1, 64, 48},
      {DType::kF32, 8, 2, 128, 16},
      // The scalar path: a misaligned pool, rows not a whole number of vectors, quantized.
      {DType::kBF16, 8, 2, 64, 16, /*pool_offset_bytes=*/2},
      {DType::kF16, 4, 1, 20, 16},
      {DType::kI8, 8, 2, 64, 16},
      {DType::kF8E4M3, 4, 1, 128, 8},
      // i4: rotated groups of 32 (64, 256), one rotated group of 8 (stories260K's head), an
      // unrotated row of 48.
      {DType::kI4, 8, 2, 64, 16},
      {DType::kI4, 2, 1, 256, 8},
      {DType::kI4, 8, 4, 8, 16},
      {DType::kI4, 4, 1, 48, 16},
      // Cut for 300 keys (2 splits of 256) while sequences reach 1000: the last split takes
      // the rest.
      {DType::kBF16, 8, 2, 64, 16, 0, /*max_context_len=*/300},
  };
  for (const EmulationCase& ec : cases) {
    RunEmulation(ec);
  }
}

}  // namespace
}  // namespace pd::kernels::cuda
