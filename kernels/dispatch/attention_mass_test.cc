// AttentionMass: the CPU kernel against the reference (bitwise), the mass a query hands out
// (one per query head), chunked calls against one call, and dispatch's errors.
#include "kernels/attention_mass.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "build_config.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/reference/reference_ops.h"
#include "kernels/type_names.h"

namespace pd::kernels {
namespace {

using testing::CpuVariants;
using testing::RandomVector;
using testing::VariantScope;

struct Shape {
  int64_t start_pos, num_tokens, num_heads, num_kv_heads, head_dim;
};

AttentionMassParams Params(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                           std::vector<float>* mass) {
  AttentionMassParams p;
  p.q = q.data();
  p.q_token_stride = s.num_heads * s.head_dim + 3;  // padded rows
  p.k = k.data();
  p.k_token_stride = s.num_kv_heads * s.head_dim + 1;
  p.start_pos = s.start_pos;
  p.num_tokens = s.num_tokens;
  p.num_heads = s.num_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.mass_head_stride = s.start_pos + s.num_tokens + 5;
  mass->assign(static_cast<size_t>(s.num_kv_heads * p.mass_head_stride), 0.0f);
  p.mass = mass->data();
  return p;
}

TEST(AttentionMassTest, CpuMatchesTheReferenceBitwiseAndHandsOutOnePerQueryHead) {
  std::mt19937 rng(7);
  // (head_dim 12 is not a whole number of 8-lane steps; 37 queries of 2 heads split their kv
  // head's rows into several tiles; 16 heads of one kv head: MLA's single row.)
  for (const Shape& s : {Shape{0, 1, 1, 1, 8}, Shape{0, 37, 4, 2, 16}, Shape{20, 1, 8, 2, 64},
                         Shape{100, 9, 6, 3, 32}, Shape{5, 3, 4, 2, 12}, Shape{40, 1, 16, 1, 24}}) {
    const std::vector<float> q =
        RandomVector(s.num_tokens * (s.num_heads * s.head_dim + 3), rng, 2.0f);
    const std::vector<float> k =
        RandomVector((s.start_pos + s.num_tokens) * (s.num_kv_heads * s.head_dim + 1), rng, 2.0f);
    std::vector<float> want;
    AttentionMassParams r = Params(s, q, k, &want);
    reference::AttentionMass(r);
    for (const auto& variant : CpuVariants()) {
      VariantScope scope(variant);
      std::vector<float> got;
      AttentionMassParams p = Params(s, q, k, &got);
      ASSERT_TRUE(AttentionMass(scope.ctx(), p).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << variant.Name() << " start " << s.start_pos << " tokens " << s.num_tokens;
    }
    // Each query head hands out a mass of one, to keys at or before its position only.
    const int64_t group = s.num_heads / s.num_kv_heads;
    for (int64_t g = 0; g < s.num_kv_heads; ++g) {
      double total = 0;
      for (int64_t t = 0; t < r.mass_head_stride; ++t) {
        const float m = want[g * r.mass_head_stride + t];
        if (t >= s.start_pos + s.num_tokens) {
          EXPECT_EQ(m, 0.0f);
        }
        EXPECT_GE(m, 0.0f);
        total += m;
      }
      EXPECT_NEAR(total, static_cast<double>(s.num_tokens * group), 1e-4 * s.num_tokens * group);
    }
  }
}

// Decode adds one query at a time: the same floats in the same order as one call for all.
TEST(AttentionMassTest, QueriesSplitOverCallsAddTheSameBits) {
  std::mt19937 rng(11);
  const Shape whole{3, 12, 4, 2, 16};
  const std::vector<float> q = RandomVector(whole.num_tokens * (4 * 16 + 3), rng);
  const std::vector<float> k = RandomVector((3 + 12) * (2 * 16 + 1), rng);
  std::vector<float> once;
  AttentionMassParams p = Params(whole, q, k, &once);
  const OpContext ctx;
  ASSERT_TRUE(AttentionMass(ctx, p).ok());
  std::vector<float> split;
  AttentionMassParams c = Params(whole, q, k, &split);
  for (int64_t j = 0; j < whole.num_tokens; ++j) {
    c.q = q.data() + j * c.q_token_stride;
    c.start_pos = whole.start_pos + j;
    c.num_tokens = 1;
    ASSERT_TRUE(AttentionMass(ctx, c).ok());
  }
  EXPECT_EQ(0, std::memcmp(once.data(), split.data(), once.size() * sizeof(float)));
}

// Random K and V rows (heads x dim each) for positions [0, keys) written through WriteKv into
// `view` (slots in `table`'s blocks), and read back with ReadKv into *read_k / *read_v.
void WriteAndReadBack(const KvCacheView& view, const std::vector<int32_t>& table, int64_t keys,
                      std::mt19937& rng, std::vector<float>* read_k, std::vector<float>* read_v) {
  const int64_t row = view.num_kv_heads * view.head_dim;
  const std::vector<float> k = RandomVector(keys * row, rng, 2.0f);
  const std::vector<float> v = RandomVector(keys * row, rng, 2.0f);
  std::vector<int32_t> positions(static_cast<size_t>(keys));
  for (int64_t t = 0; t < keys; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  WriteKvParams w;
  w.k = k.data();
  w.v = v.data();
  w.k_token_stride = w.v_token_stride = row;
  w.cache = view;
  w.num_tokens = keys;
  w.positions = positions.data();
  w.block_tables = table.data();
  w.max_blocks_per_seq = static_cast<int64_t>(table.size());
  ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
  read_k->assign(k.size(), 0.0f);
  read_v->assign(k.size(), 0.0f);
  ReadKvParams r;
  r.k = read_k->data();
  r.v = read_v->data();
  r.k_token_stride = r.v_token_stride = row;
  r.cache = view;
  r.num_tokens = keys;
  r.positions = positions.data();
  r.block_tables = table.data();
  r.max_blocks_per_seq = w.max_blocks_per_seq;
  ASSERT_TRUE(ReadKv(OpContext{}, r).ok());
}

// Keys read from the cache (k == nullptr): the same bits as keys ReadKv read first, for every
// cache dtype, on every CPU variant and in the reference; blocks out of order in the table.
TEST(AttentionMassTest, KeysReadFromTheCacheGiveReadKvsBits) {
  std::mt19937 rng(13);
  const Shape s{21, 6, 6, 3, 32};  // 27 keys: 7 blocks of 4
  constexpr int64_t kLayers = 2, kBlockSize = 4, kBlocks = 16, kLayer = 1;
  const int64_t keys = s.start_pos + s.num_tokens, row = s.num_kv_heads * s.head_dim;
  const std::vector<int32_t> table = {9, 2, 14, 0, 7, 3, 11, 5};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3,
                      DType::kI4}) {
    const int64_t block_bytes =
        DenseKvBlockBytes(dtype, kLayers, s.num_kv_heads, kBlockSize, s.head_dim);
    std::vector<float> storage(static_cast<size_t>(block_bytes * kBlocks / 4 + 1), 0.0f);
    const KvCacheView view = DenseKvCacheView(storage.data(), dtype, kBlocks, kLayers,
                                              s.num_kv_heads, kBlockSize, s.head_dim, kLayer);
    std::vector<float> read_k, read_v;
    WriteAndReadBack(view, table, keys, rng, &read_k, &read_v);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    const std::vector<float> q = RandomVector(s.num_tokens * (s.num_heads * s.head_dim + 3), rng);
    std::vector<float> want;
    AttentionMassParams a = Params(s, q, read_k, &want);
    a.k_token_stride = row;
    reference::AttentionMass(a);
    auto from_cache = [&](std::vector<float>* mass) {
      AttentionMassParams c = Params(s, q, read_k, mass);
      c.k = nullptr;
      c.cache = &view;
      c.block_table = table.data();
      c.num_table_blocks = static_cast<int64_t>(table.size());
      return c;
    };
    std::vector<float> ref;
    reference::AttentionMass(from_cache(&ref));
    ASSERT_EQ(0, std::memcmp(ref.data(), want.data(), want.size() * sizeof(float)))
        << "reference, " << DTypeName(dtype);
    for (const auto& variant : CpuVariants()) {
      VariantScope scope(variant);
      std::vector<float> got;
      ASSERT_TRUE(AttentionMass(scope.ctx(), from_cache(&got)).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << variant.Name() << ", " << DTypeName(dtype);
    }
    // The cache path's own errors: a short table, a block outside the pool, other geometry.
    std::vector<float> mass;
    AttentionMassParams bad = from_cache(&mass);
    bad.num_table_blocks = 6;
    EXPECT_NE(AttentionMass(OpContext{}, bad).message().find("need 7 blocks"),
              absl::string_view::npos);
    const std::vector<int32_t> outside = {9, 2, 14, 0, 7, 3, 16};
    bad = from_cache(&mass);
    bad.block_table = outside.data();
    bad.num_table_blocks = 7;
    EXPECT_EQ(AttentionMass(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
    bad = from_cache(&mass);
    bad.num_heads = 4;
    bad.num_kv_heads = 2;
    EXPECT_NE(AttentionMass(OpContext{}, bad).message().find("differ"), absl::string_view::npos);
    bad = from_cache(&mass);
    bad.cache = nullptr;
    EXPECT_EQ(AttentionMass(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  }
}

// Latent keys (multi-head latent attention): each key is the whole entry, the K rows of the
// cache's heads then their V rows, read as ReadKv reads them. The same bits as those entries
// given as f32 rows of one kv head, for every cache dtype (i4's groups rotated back), on every
// CPU variant and in the reference; an entry of 2 x 3 heads of 64 (384 elements: wider than an
// attention head may be) with 8 query heads.
TEST(AttentionMassTest, LatentKeysAreTheCachesWholeEntries) {
  std::mt19937 rng(19);
  constexpr int64_t kHeads = 3, kDim = 64, kLayers = 2, kBlockSize = 4, kBlocks = 12;
  const Shape s{13, 5, 8, 1, 2 * kHeads * kDim};  // 18 keys: 5 blocks of 4
  const int64_t keys = s.start_pos + s.num_tokens, row = kHeads * kDim;
  const std::vector<int32_t> table = {7, 1, 10, 0, 4, 9};
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3, DType::kI4}) {
    const int64_t block_bytes = DenseKvBlockBytes(dtype, kLayers, kHeads, kBlockSize, kDim);
    std::vector<float> storage(static_cast<size_t>(block_bytes * kBlocks / 4 + 1), 0.0f);
    const KvCacheView view =
        DenseKvCacheView(storage.data(), dtype, kBlocks, kLayers, kHeads, kBlockSize, kDim, 1);
    std::vector<float> read_k, read_v;
    WriteAndReadBack(view, table, keys, rng, &read_k, &read_v);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    // The entries as f32 rows (Params pads them by one).
    std::vector<float> entries(static_cast<size_t>(keys * (2 * row + 1)), 0.0f);
    for (int64_t t = 0; t < keys; ++t) {
      std::copy(read_k.begin() + t * row, read_k.begin() + (t + 1) * row,
                entries.begin() + t * (2 * row + 1));
      std::copy(read_v.begin() + t * row, read_v.begin() + (t + 1) * row,
                entries.begin() + t * (2 * row + 1) + row);
    }
    const std::vector<float> q = RandomVector(s.num_tokens * (s.num_heads * s.head_dim + 3), rng);
    std::vector<float> want;
    reference::AttentionMass(Params(s, q, entries, &want));
    auto latent = [&](std::vector<float>* mass) {
      AttentionMassParams c = Params(s, q, entries, mass);
      c.k = nullptr;
      c.cache = &view;
      c.block_table = table.data();
      c.num_table_blocks = static_cast<int64_t>(table.size());
      c.latent = true;
      return c;
    };
    std::vector<float> ref;
    reference::AttentionMass(latent(&ref));
    ASSERT_EQ(0, std::memcmp(ref.data(), want.data(), want.size() * sizeof(float)))
        << "reference, " << DTypeName(dtype);
    for (const auto& variant : CpuVariants()) {
      VariantScope scope(variant);
      std::vector<float> got;
      ASSERT_TRUE(AttentionMass(scope.ctx(), latent(&got)).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << variant.Name() << ", " << DTypeName(dtype);
    }
    // Its errors: f32 rows, more than one kv head, another entry width.
    std::vector<float> mass;
    AttentionMassParams bad = latent(&mass);
    bad.k = entries.data();
    EXPECT_NE(AttentionMass(OpContext{}, bad).message().find("latent keys come from a cache"),
              absl::string_view::npos);
    bad = latent(&mass);
    bad.num_kv_heads = 2;
    EXPECT_NE(AttentionMass(OpContext{}, bad).message().find("as one kv head"),
              absl::string_view::npos);
    bad = latent(&mass);
    bad.head_dim = row;
    bad.q_token_stride = s.num_heads * row;
    EXPECT_NE(AttentionMass(OpContext{}, bad).message().find("latent entry is 384"),
              absl::string_view::npos);
  }
}

TEST(AttentionMassTest, BadParametersAndOtherDevicesAreRefused) {
  std::vector<float> q(64), k(64), mass;
  const Shape s{0, 2, 2, 1, 8};
  const OpContext cpu;
  AttentionMassParams p = Params(s, q, k, &mass);
  AttentionMassParams bad = p;
  bad.mass = nullptr;
  EXPECT_EQ(AttentionMass(cpu, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.num_heads = 3;
  EXPECT_EQ(AttentionMass(cpu, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.mass_head_stride = 1;
  EXPECT_NE(AttentionMass(cpu, bad).message().find("mass_head_stride"), absl::string_view::npos);
  bad = p;
  bad.q_token_stride = 4;
  EXPECT_EQ(AttentionMass(cpu, bad).code(), absl::StatusCode::kInvalidArgument);
  // kCuda: a build without CUDA says so; with CUDA, the workspace is required (checked before
  // anything is launched, so no device is needed here).
  OpContext cuda;
  cuda.device = Device::kCuda;
  if (PD_WITH_CUDA) {
    EXPECT_NE(AttentionMass(cuda, p).message().find("workspace"), absl::string_view::npos);
  } else {
    EXPECT_EQ(AttentionMass(cuda, p).code(), absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pd::kernels
