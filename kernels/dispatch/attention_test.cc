#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"
#include "kernels/type_names.h"

namespace pd::kernels {
namespace {

using testing::Compare;
using testing::CpuVariant;
using testing::CpuVariants;
using testing::ErrorStats;
using testing::RandomVector;
using testing::VariantScope;

constexpr DType kAllKvDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI8,
                                  DType::kF8E4M3, DType::kI4};

// Attention output is a convex combination of V rows (N(0, 1) here), computed in f32 with an
// online softmax vs the reference's double two-pass softmax: max-abs 5e-6, NMSE 1e-11 (seen:
// 6e-7 and < 1e-13). The cache dtype does not matter: both sides read the same stored values.
constexpr double kMaxAbs = 5e-6;
constexpr double kMaxNmse = 1e-11;

struct Geometry {
  int64_t num_layers = 2;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t block_size = 4;
  int64_t num_blocks = 64;
  DType dtype = DType::kF32;
};

// A KV pool poisoned with NaN (0xff bytes in every dtype; for the quantized ones the scales are
// NaN), so any read of a slot that was never written (the future, other layers, other
// sequences) turns the output into NaN.
class Pool {
 public:
  explicit Pool(const Geometry& g)
      : g_(g),
        bytes_(g.num_blocks * DenseKvBlockBytes(g.dtype, g.num_layers, g.num_kv_heads, g.block_size,
                                                g.head_dim),
               0xff) {}

  KvCacheView View(int64_t layer) {
    return DenseKvCacheView(bytes_.data(), g_.dtype, g_.num_blocks, g_.num_layers, g_.num_kv_heads,
                            g_.block_size, g_.head_dim, layer);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  Geometry g_;
  std::vector<uint8_t> bytes_;
};

// Sequences with shuffled physical blocks; K/V of every position written to `layer`.
struct Batch {
  std::vector<int32_t> lens;
  int64_t max_blocks = 0;
  std::vector<int32_t> tables;  // [num_seqs][max_blocks]
};

Batch MakeBatch(Pool* pool, const Geometry& g, int64_t layer, const std::vector<int32_t>& lens,
                std::mt19937& rng) {
  Batch b;
  b.lens = lens;
  for (int32_t len : lens) {
    b.max_blocks = std::max<int64_t>(b.max_blocks, (len + g.block_size - 1) / g.block_size);
  }
  b.max_blocks += 1;  // spare capacity: table rows longer than needed
  std::vector<int32_t> free_blocks(g.num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  b.tables.assign(lens.size() * b.max_blocks, -7);  // unused entries are invalid ids
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t blocks = (lens[s] + g.block_size - 1) / g.block_size;
    for (int64_t i = 0; i < blocks; ++i) {
      b.tables[s * b.max_blocks + i] = free_blocks.at(next++);
    }
    const int64_t token_elems = g.num_kv_heads * g.head_dim;
    std::vector<float> k = RandomVector(lens[s] * token_elems, rng);
    std::vector<float> v = RandomVector(lens[s] * token_elems, rng);
    std::vector<int32_t> pos(lens[s]);
    std::iota(pos.begin(), pos.end(), 0);
    WriteKvParams w;
    w.k = k.data();
    w.v = v.data();
    w.k_token_stride = token_elems;
    w.v_token_stride = token_elems;
    w.cache = pool->View(layer);
    w.num_tokens = lens[s];
    w.positions = pos.data();
    w.block_tables = b.tables.data() + s * b.max_blocks;
    w.max_blocks_per_seq = b.max_blocks;
    EXPECT_TRUE(WriteKv(OpContext{}, w).ok());
  }
  return b;
}

DecodeAttentionParams DecodeParams(const Batch& b, const KvCacheView& view, int64_t num_heads,
                                   const float* q, float* out, int64_t q_pad) {
  DecodeAttentionParams p;
  p.q = q;
  p.out = out;
  p.q_seq_stride = num_heads * view.head_dim + q_pad;
  p.out_seq_stride = num_heads * view.head_dim;
  p.cache = view;
  p.block_tables = b.tables.data();
  p.max_blocks_per_seq = b.max_blocks;
  p.context_lens = b.lens.data();
  p.num_seqs = static_cast<int64_t>(b.lens.size());
  p.num_heads = num_heads;
  return p;
}

// Hand-computed: q = [1, 0]; keys [1, 0], [0, 1]; values [1, 2], [3, 4]; scale 1.
// p = softmax([1, 0]) = [0.7310586, 0.2689414]; out = [1.5378828, 2.5378828].
TEST(AttentionReferenceTest, HandComputed) {
  Geometry g;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.head_dim = 2;
  g.block_size = 2;
  g.num_blocks = 1;
  Pool pool(g);
  const float k[] = {1, 0, 0, 1}, v[] = {1, 2, 3, 4};
  const int32_t pos[] = {0, 1}, table[] = {0};
  WriteKvParams w;
  w.k = k;
  w.v = v;
  w.k_token_stride = 2;
  w.v_token_stride = 2;
  w.cache = pool.View(0);
  w.num_tokens = 2;
  w.positions = pos;
  w.block_tables = table;
  w.max_blocks_per_seq = 1;
  reference::WriteKv(w);
  const float q[] = {1, 0};
  float out[2];
  const int32_t len = 2;
  DecodeAttentionParams p;
  p.q = q;
  p.out = out;
  p.q_seq_stride = 2;
  p.out_seq_stride = 2;
  p.cache = pool.View(0);
  p.block_tables = table;
  p.max_blocks_per_seq = 1;
  p.context_lens = &len;
  p.num_seqs = 1;
  p.num_heads = 1;
  p.scale = 1.0f;
  reference::DecodeAttention(p);
  EXPECT_NEAR(out[0], 1.5378828f, 1e-6);
  EXPECT_NEAR(out[1], 2.5378828f, 1e-6);
  // Causal prefill of both tokens: token 0 sees only key 0, so its output is v0.
  float prefill_out[4];
  const float q2[] = {1, 0, 1, 0};
  PrefillAttentionParams pp;
  pp.q = q2;
  pp.out = prefill_out;
  pp.q_token_stride = 2;
  pp.out_token_stride = 2;
  pp.cache = pool.View(0);
  pp.block_table = table;
  pp.num_table_blocks = 1;
  pp.num_tokens = 2;
  pp.num_heads = 1;
  pp.scale = 1.0f;
  reference::PrefillAttention(pp);
  EXPECT_FLOAT_EQ(prefill_out[0], 1.0f);
  EXPECT_FLOAT_EQ(prefill_out[1], 2.0f);
  EXPECT_NEAR(prefill_out[2], 1.5378828f, 1e-6);
}

// WriteKv through dispatch stores exactly the reference's bytes, batched over sequences, into
// one layer only.
TEST(WriteKvCpuTest, MatchesReferenceBitForBit) {
  std::mt19937 rng(1);
  for (DType dtype : kAllKvDTypes) {
    for (const CpuVariant& variant : CpuVariants()) {
      VariantScope scope(variant);
      Geometry g;
      g.dtype = dtype;
      g.head_dim = 24;
      g.num_kv_heads = 3;
      Pool got(g), want(g);
      const int64_t num_tokens = 9, token_elems = g.num_kv_heads * g.head_dim;
      const int64_t stride = token_elems + 5;
      std::vector<float> k = RandomVector(num_tokens * stride, rng);
      std::vector<float> v = RandomVector(num_tokens * stride, rng);
      k[0] = NAN;     // quantized: the row's scale is NaN, its codes 0
      k[1] = 1e-41f;  // subnormal
      v[2] = 1e30f;   // inf in f16
      std::fill(v.begin() + stride + 24, v.begin() + stride + 48, 0.0f);  // a zero row
      k[2 * stride + 30] = INFINITY;
      for (int64_t d = 0; d < 23; ++d) {  // amax 127: int8 codes are x itself, ties at .5
        k[3 * stride + d] = static_cast<float>(d) - 11.5f;
      }
      k[3 * stride + 23] = 127.0f;
      // Three sequences (tables of 4 blocks), tokens interleaved as in a decode batch.
      std::vector<int32_t> tables(3 * 4);
      std::iota(tables.begin(), tables.end(), 5);
      std::vector<int32_t> seq = {0, 1, 2, 0, 1, 2, 2, 2, 0};
      std::vector<int32_t> pos = {0, 3, 15, 1, 4, 14, 13, 0, 7};
      WriteKvParams p;
      p.k = k.data();
      p.v = v.data();
      p.k_token_stride = stride;
      p.v_token_stride = stride;
      p.cache = got.View(1);
      p.num_tokens = num_tokens;
      p.positions = pos.data();
      p.token_seq = seq.data();
      p.block_tables = tables.data();
      p.num_seqs = 3;
      p.max_blocks_per_seq = 4;
      ASSERT_TRUE(WriteKv(scope.ctx(), p).ok());
      p.cache = want.View(1);
      reference::WriteKv(p);
      ASSERT_EQ(got.bytes(), want.bytes()) << variant.Name() << " dtype " << DTypeName(dtype);
    }
  }
}

// ReadKv inverts WriteKv: exactly for f32 (bf16/f16: the stored rounding), within the row's
// quantization step for i8/fp8; CPU equals the reference bit for bit on every ISA variant.
TEST(ReadKvCpuTest, InvertsWriteKvAndMatchesReference) {
  std::mt19937 rng(2);
  for (DType dtype : kAllKvDTypes) {
    for (const CpuVariant& variant : CpuVariants()) {
      VariantScope scope(variant);
      Geometry g;
      g.dtype = dtype;
      g.head_dim = 24;
      g.num_kv_heads = 3;
      Pool pool(g);
      const int64_t num_tokens = 7, token_elems = g.num_kv_heads * g.head_dim;
      const int64_t stride = token_elems + 3;
      std::vector<float> k = RandomVector(num_tokens * stride, rng);
      std::vector<float> v = RandomVector(num_tokens * stride, rng);
      std::vector<int32_t> tables(2 * 3);
      std::iota(tables.begin(), tables.end(), 9);
      std::vector<int32_t> seq = {0, 1, 1, 0, 1, 0, 0};
      std::vector<int32_t> pos = {0, 5, 11, 6, 0, 9, 3};
      WriteKvParams w;
      w.k = k.data();
      w.v = v.data();
      w.k_token_stride = stride;
      w.v_token_stride = stride;
      w.cache = pool.View(1);
      w.num_tokens = num_tokens;
      w.positions = pos.data();
      w.token_seq = seq.data();
      w.block_tables = tables.data();
      w.num_seqs = 2;
      w.max_blocks_per_seq = 3;
      ASSERT_TRUE(WriteKv(scope.ctx(), w).ok());
      std::vector<float> got_k(num_tokens * stride, -1.0f), got_v(got_k);
      std::vector<float> want_k(got_k), want_v(got_k);
      ReadKvParams r;
      r.k = got_k.data();
      r.v = got_v.data();
      r.k_token_stride = stride;
      r.v_token_stride = stride;
      r.cache = pool.View(1);
      r.num_tokens = num_tokens;
      r.positions = pos.data();
      r.token_seq = seq.data();
      r.block_tables = tables.data();
      r.num_seqs = 2;
      r.max_blocks_per_seq = 3;
      ASSERT_TRUE(ReadKv(scope.ctx(), r).ok());
      r.k = want_k.data();
      r.v = want_v.data();
      reference::ReadKv(r);
      ASSERT_EQ(got_k, want_k) << variant.Name() << " dtype " << DTypeName(dtype);
      ASSERT_EQ(got_v, want_v) << variant.Name() << " dtype " << DTypeName(dtype);
      // Relative step of one stored value: f32 exact, bf16 2^-8, f16 2^-11, fp8 2^-4, i8 one
      // code of amax / 127 (amax <= ~4.5 for these N(0, 1) rows), i4 half a code of amax / 7.
      const bool absolute = dtype == DType::kI8 || dtype == DType::kI4;
      const double tol = dtype == DType::kF32    ? 0.0
                         : dtype == DType::kBF16 ? 1.0 / 256
                         : dtype == DType::kF16  ? 1.0 / 2048
                         : dtype == DType::kI8   ? 0.02
                         : dtype == DType::kI4   ? 0.33
                                                 : 1.0 / 16;
      for (int64_t j = 0; j < num_tokens; ++j) {
        for (int64_t e = 0; e < token_elems; ++e) {
          const size_t i = static_cast<size_t>(j * stride + e);
          const double bound = absolute ? tol : tol * std::fabs(k[i]) + 1e-30;
          ASSERT_LE(std::fabs(got_k[i] - k[i]), bound) << DTypeName(dtype) << " k " << i;
          const double vbound = absolute ? tol : tol * std::fabs(v[i]) + 1e-30;
          ASSERT_LE(std::fabs(got_v[i] - v[i]), vbound) << DTypeName(dtype) << " v " << i;
        }
        // Stride padding is not written.
        ASSERT_EQ(got_k[j * stride + token_elems], -1.0f);
      }
    }
  }
}

// A view of some of a pool's heads (KvCacheView::first_head: a tensor-parallel rank's), built
// as LlamaForward builds it, writes exactly those heads' rows and scales of the pool: reading
// the whole pool back gives the same values in those heads and leaves the others untouched.
TEST(ReadKvCpuTest, HeadSubsetViewsAddressThePoolsHeads) {
  std::mt19937 rng(5);
  for (DType dtype : kAllKvDTypes) {
    Geometry g;
    g.dtype = dtype;
    g.num_kv_heads = 4;
    g.head_dim = 16;
    Pool pool(g), whole(g);
    const int64_t first = 2, heads = 2, n = 5, layer = 1;
    KvCacheView view = pool.View(layer);
    const int64_t shift = first * view.head_stride * DTypeSize(dtype);
    view.base = static_cast<uint8_t*>(view.base) + shift;
    if (IsQuantizedKvDType(dtype)) view.scale_offset += 4 * first * view.scale_head_stride - shift;
    view.first_head = first;
    view.num_kv_heads = heads;
    // Rows for all four heads; the view writes heads 2 and 3 of them, `whole` all four.
    const int64_t all = g.num_kv_heads * g.head_dim;
    std::vector<float> k = RandomVector(n * all, rng), v = RandomVector(n * all, rng);
    std::vector<int32_t> table = {7, 3};
    std::vector<int32_t> pos = {0, 1, 2, 5, 6};
    WriteKvParams w;
    w.k = k.data() + first * g.head_dim;
    w.v = v.data() + first * g.head_dim;
    w.k_token_stride = w.v_token_stride = all;
    w.cache = view;
    w.num_tokens = n;
    w.positions = pos.data();
    w.block_tables = table.data();
    w.max_blocks_per_seq = 2;
    ASSERT_TRUE(WriteKv(OpContext{}, w).ok()) << DTypeName(dtype);
    w.k = k.data();
    w.v = v.data();
    w.cache = whole.View(layer);
    ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
    std::vector<float> got_k(n * all), got_v(n * all), want_k(n * all), want_v(n * all);
    ReadKvParams r;
    r.k_token_stride = r.v_token_stride = all;
    r.num_tokens = n;
    r.positions = pos.data();
    r.block_tables = table.data();
    r.max_blocks_per_seq = 2;
    for (auto [cache, ko, vo] : {std::tuple{pool.View(layer), &got_k, &got_v},
                                 std::tuple{whole.View(layer), &want_k, &want_v}}) {
      r.cache = cache;
      r.k = ko->data();
      r.v = vo->data();
      ASSERT_TRUE(ReadKv(OpContext{}, r).ok());
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t e = 0; e < all; ++e) {
        const size_t i = static_cast<size_t>(t * all + e);
        if (e >= first * g.head_dim) {
          ASSERT_EQ(got_k[i], want_k[i]) << DTypeName(dtype) << " token " << t << " elem " << e;
          ASSERT_EQ(got_v[i], want_v[i]) << DTypeName(dtype) << " token " << t << " elem " << e;
        } else {
          // Heads 0 and 1 were never written: the pool's poison (0xff bytes, NaN scales) reads
          // back as NaN.
          ASSERT_TRUE(std::isnan(got_k[i]) && std::isnan(got_v[i]))
              << DTypeName(dtype) << " token " << t << " elem " << e;
        }
      }
    }
    // The view is validated against the block's real start: a kv_stride too small for the
    // pool's heads before it is refused.
    KvCacheView bad = view;
    bad.kv_stride = 3 * view.head_stride;
    w.cache = bad;
    w.k = k.data();
    EXPECT_FALSE(WriteKv(OpContext{}, w).ok()) << DTypeName(dtype);
  }
}

// GatherKvRows moves each (layer, kv head)'s kept rows, K and V with their scales, bytes as
// stored: every moved row reads back (ReadKv) bitwise as its source slot, in every dtype, for
// the whole pool and for a view of some heads (a tensor-parallel rank's), which leaves the
// other heads' rows alone.
TEST(GatherKvRowsCpuTest, MovesKeptRowsByteForByte) {
  std::mt19937 rng(11);
  for (DType dtype : kAllKvDTypes) {
    for (const int64_t first : {int64_t{0}, int64_t{1}}) {
      Geometry g;
      g.dtype = dtype;
      g.num_kv_heads = 3;
      Pool pool(g);
      const int64_t all = g.num_kv_heads * g.head_dim, n = 10, keep_n = 6;
      const std::vector<int32_t> src = {5, 9, 1}, dst = {20, 2};
      std::vector<int32_t> pos(n);
      for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t);
      for (int64_t layer = 0; layer < g.num_layers; ++layer) {
        const std::vector<float> k = RandomVector(n * all, rng), v = RandomVector(n * all, rng);
        WriteKvParams w;
        w.k = k.data();
        w.v = v.data();
        w.k_token_stride = w.v_token_stride = all;
        w.cache = pool.View(layer);
        w.num_tokens = n;
        w.positions = pos.data();
        w.block_tables = src.data();
        w.max_blocks_per_seq = 3;
        ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
      }
      // Each (layer, head) keeps its own ascending slots.
      std::vector<int32_t> keep;
      for (int64_t r = 0; r < g.num_layers * g.num_kv_heads; ++r) {
        std::vector<int32_t> slots(pos);
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(keep_n);
        std::sort(slots.begin(), slots.end());
        keep.insert(keep.end(), slots.begin(), slots.end());
      }
      GatherKvRowsParams p;
      p.cache = pool.View(0);
      if (first > 0) {  // heads [1, 3) only, as HeadSubsetViewsAddressThePoolsHeads builds it
        const int64_t shift = first * p.cache.head_stride * DTypeSize(dtype);
        p.cache.base = static_cast<uint8_t*>(p.cache.base) + shift;
        if (IsQuantizedKvDType(dtype)) {
          p.cache.scale_offset += 4 * first * p.cache.scale_head_stride - shift;
        }
        p.cache.first_head = first;
        p.cache.num_kv_heads = g.num_kv_heads - first;
      }
      p.num_layers = g.num_layers;
      p.src_blocks = src.data();
      p.num_src_blocks = 3;
      p.dst_blocks = dst.data();
      p.num_dst_blocks = 2;
      p.keep = keep.data();
      p.num_keep = keep_n;
      p.keep_heads = g.num_kv_heads;
      p.keep_first_head = first;
      ASSERT_TRUE(GatherKvRows(OpContext{}, p).ok()) << DTypeName(dtype);
      for (int64_t layer = 0; layer < g.num_layers; ++layer) {
        auto read = [&](const std::vector<int32_t>& table, int32_t slot) {
          std::vector<float> kv(2 * all);
          ReadKvParams r;
          r.k = kv.data();
          r.v = kv.data() + all;
          r.k_token_stride = r.v_token_stride = all;
          r.cache = pool.View(layer);
          r.num_tokens = 1;
          r.positions = &slot;
          r.block_tables = table.data();
          r.max_blocks_per_seq = static_cast<int64_t>(table.size());
          EXPECT_TRUE(ReadKv(OpContext{}, r).ok());
          return kv;
        };
        for (int64_t h = 0; h < g.num_kv_heads; ++h) {
          for (int32_t i = 0; i < keep_n; ++i) {
            const std::vector<float> got = read(dst, i);
            const std::vector<float> want =
                read(src, keep[(layer * g.num_kv_heads + h) * keep_n + i]);
            for (int64_t kv = 0; kv < 2; ++kv) {
              const size_t at = static_cast<size_t>(kv * all + h * g.head_dim);
              if (h < first) {  // not the view's: still the pool's poison
                ASSERT_TRUE(std::isnan(got[at])) << DTypeName(dtype);
              } else {
                ASSERT_EQ(0, std::memcmp(&got[at], &want[at], g.head_dim * sizeof(float)))
                    << DTypeName(dtype) << " layer " << layer << " head " << h << " row " << i;
              }
            }
          }
        }
      }
    }
  }
}

TEST(GatherKvRowsDispatchTest, RejectsBadInput) {
  Geometry g;
  Pool pool(g);
  const std::vector<int32_t> src = {5, 9}, dst = {20, 2}, overlap = {9}, outside = {64};
  std::vector<int32_t> keep(g.num_layers * g.num_kv_heads * 3, 1);
  GatherKvRowsParams p;
  p.cache = pool.View(0);
  p.num_layers = g.num_layers;
  p.src_blocks = src.data();
  p.num_src_blocks = 2;
  p.dst_blocks = dst.data();
  p.num_dst_blocks = 2;
  p.keep = keep.data();
  p.num_keep = 3;
  p.keep_heads = g.num_kv_heads;
  ASSERT_TRUE(GatherKvRows(OpContext{}, p).ok());
  auto message = [](const GatherKvRowsParams& bad) {
    const absl::Status s = GatherKvRows(OpContext{}, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  GatherKvRowsParams bad = p;
  bad.dst_blocks = overlap.data();
  bad.num_dst_blocks = 1;
  EXPECT_THAT(message(bad), ::testing::HasSubstr("in both src and dst"));
  bad = p;
  bad.dst_blocks = outside.data();
  bad.num_dst_blocks = 1;
  message(bad);
  bad = p;
  keep[4] = 8;  // two blocks of 4 slots
  EXPECT_THAT(message(bad), ::testing::HasSubstr("kept slot 8"));
  keep[4] = 1;
  bad = p;
  bad.keep_heads = 1;
  EXPECT_THAT(message(bad), ::testing::HasSubstr("within keep's 1"));
  bad = p;
  bad.num_keep = 9;
  message(bad);
  bad = p;
  bad.keep = nullptr;
  message(bad);
}

TEST(ReadKvDispatchTest, RejectsBadInput) {
  Geometry g;
  Pool pool(g);
  std::vector<float> k(64), v(64);
  std::vector<int32_t> table = {0, 1}, pos = {0};
  ReadKvParams r;
  r.k = k.data();
  r.v = v.data();
  r.k_token_stride = 32;
  r.v_token_stride = 32;
  r.cache = pool.View(0);
  r.num_tokens = 1;
  r.positions = pos.data();
  r.block_tables = table.data();
  r.max_blocks_per_seq = 2;
  ASSERT_TRUE(ReadKv(OpContext{}, r).ok());
  ReadKvParams bad = r;
  bad.v = k.data() + 16;
  EXPECT_THAT(ReadKv(OpContext{}, bad).message(), ::testing::HasSubstr("k and v overlap"));
  bad = r;
  pos[0] = 8;  // block 2 of a 2-block table
  EXPECT_THAT(ReadKv(OpContext{}, bad).message(), ::testing::HasSubstr("outside the block table"));
  pos[0] = 0;
  table[0] = 64;
  EXPECT_THAT(ReadKv(OpContext{}, bad).message(), ::testing::HasSubstr("block"));
  bad.positions = nullptr;
  EXPECT_THAT(ReadKv(OpContext{}, bad).message(), ::testing::HasSubstr("null"));
  // kCuda: the scalars are checked before any launch, whether or not CUDA is built.
  OpContext cuda;
  cuda.device = Device::kCuda;
  bad = r;
  bad.k_token_stride = 8;
  EXPECT_EQ(ReadKv(cuda, bad).code(), absl::StatusCode::kInvalidArgument);
}

struct DecodeCase {
  int64_t num_heads, num_kv_heads, head_dim, block_size;
  std::vector<int32_t> lens;
};

// Edge shapes: one token, exactly one block, one past a block, last block of length 1, long
// contexts; GQA 1, 2, 4, 8, 16 (16 > rows per task, so head groups split); head_dim 8 (< one
// AVX-512 vector), 80 (not a multiple of 16), 128, 256 (the maximum).
const std::vector<DecodeCase>& DecodeCases() {
  static const std::vector<DecodeCase> cases = {
      {1, 1, 8, 4, {1}},          {8, 4, 8, 16, {1, 16, 17, 33}}, {4, 1, 64, 16, {5, 100}},
      {16, 2, 80, 8, {9, 24, 1}}, {16, 1, 32, 4, {13}},           {4, 4, 128, 32, {65, 2}},
      {2, 1, 256, 16, {20}},
  };
  return cases;
}

TEST(DecodeAttentionCpuTest, MatchesReference) {
  std::mt19937 rng(2);
  for (DType dtype : kAllKvDTypes) {
    for (const DecodeCase& c : DecodeCases()) {
      Geometry g;
      g.dtype = dtype;
      g.num_kv_heads = c.num_kv_heads;
      g.head_dim = c.head_dim;
      g.block_size = c.block_size;
      g.num_blocks = 40;
      Pool pool(g);
      Batch b = MakeBatch(&pool, g, 1, c.lens, rng);
      const int64_t q_pad = 3, row = c.num_heads * c.head_dim;
      std::vector<float> q = RandomVector(c.lens.size() * (row + q_pad), rng);
      std::vector<float> want(c.lens.size() * row);
      reference::DecodeAttention(
          DecodeParams(b, pool.View(1), c.num_heads, q.data(), want.data(), q_pad));
      for (const CpuVariant& variant : CpuVariants()) {
        VariantScope scope(variant);
        std::vector<float> got(want.size(), -1);
        ASSERT_TRUE(DecodeAttention(scope.ctx(), DecodeParams(b, pool.View(1), c.num_heads,
                                                              q.data(), got.data(), q_pad))
                        .ok());
        const ErrorStats e = Compare(got.data(), want.data(), static_cast<int64_t>(got.size()));
        EXPECT_LE(e.max_abs, kMaxAbs)
            << variant.Name() << " dtype " << int(dtype) << " heads " << c.num_heads << "/"
            << c.num_kv_heads << " d " << c.head_dim;
        EXPECT_LE(e.nmse, kMaxNmse) << variant.Name() << " d " << c.head_dim;
      }
    }
  }
}

// The batch gives each sequence exactly what it gets alone.
TEST(DecodeAttentionCpuTest, BatchedEqualsLoopOfSingles) {
  std::mt19937 rng(3);
  Geometry g;
  g.dtype = DType::kBF16;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.block_size = 16;
  g.num_blocks = 40;
  Pool pool(g);
  Batch b = MakeBatch(&pool, g, 0, {1, 16, 17, 70, 150}, rng);
  const int64_t heads = 8, row = heads * g.head_dim;
  std::vector<float> q = RandomVector(b.lens.size() * row, rng);
  VariantScope scope({cpu::DetectedIsa(), 3});
  std::vector<float> batched(q.size()), single(q.size());
  ASSERT_TRUE(DecodeAttention(scope.ctx(),
                              DecodeParams(b, pool.View(0), heads, q.data(), batched.data(), 0))
                  .ok());
  for (size_t s = 0; s < b.lens.size(); ++s) {
    DecodeAttentionParams p =
        DecodeParams(b, pool.View(0), heads, q.data() + s * row, single.data() + s * row, 0);
    p.num_seqs = 1;
    p.block_tables = b.tables.data() + s * b.max_blocks;
    p.context_lens = b.lens.data() + s;
    ASSERT_TRUE(DecodeAttention(OpContext{}, p).ok());
  }
  EXPECT_EQ(batched, single);
}

PrefillAttentionParams PrefillParams(const Batch& b, const KvCacheView& view, int64_t num_heads,
                                     int64_t start, int64_t n, const float* q, float* out) {
  PrefillAttentionParams p;
  p.q = q;
  p.out = out;
  p.q_token_stride = num_heads * view.head_dim;
  p.out_token_stride = num_heads * view.head_dim;
  p.cache = view;
  p.block_table = b.tables.data();
  p.num_table_blocks = b.max_blocks;
  p.start_pos = start;
  p.num_tokens = n;
  p.num_heads = num_heads;
  return p;
}

// Causal prefill from position 0 and from a cached prefix (start > 0, aligned or not to a
// block), various GQA ratios and chunk sizes. Keys past the last prefill token are NaN in the
// pool, so reading beyond the causal limit would fail the test.
TEST(PrefillAttentionCpuTest, MatchesReference) {
  std::mt19937 rng(4);
  struct Case {
    int64_t heads, kv_heads, head_dim, block_size, start, n;
  };
  const Case cases[] = {
      {1, 1, 8, 4, 0, 1},    {8, 4, 8, 16, 0, 21},  {4, 1, 64, 16, 16, 16},
      {16, 2, 80, 8, 5, 11}, {2, 2, 128, 4, 37, 3}, {32, 2, 16, 4, 3, 9},
  };
  for (DType dtype : kAllKvDTypes) {
    for (const Case& c : cases) {
      Geometry g;
      g.dtype = dtype;
      g.num_kv_heads = c.kv_heads;
      g.head_dim = c.head_dim;
      g.block_size = c.block_size;
      g.num_blocks = 24;
      Pool pool(g);
      Batch b = MakeBatch(&pool, g, 1, {static_cast<int32_t>(c.start + c.n)}, rng);
      std::vector<float> q = RandomVector(c.n * c.heads * c.head_dim, rng);
      std::vector<float> want(q.size());
      reference::PrefillAttention(
          PrefillParams(b, pool.View(1), c.heads, c.start, c.n, q.data(), want.data()));
      for (const CpuVariant& variant : CpuVariants()) {
        VariantScope scope(variant);
        std::vector<float> got(q.size(), -1);
        ASSERT_TRUE(PrefillAttention(scope.ctx(), PrefillParams(b, pool.View(1), c.heads, c.start,
                                                                c.n, q.data(), got.data()))
                        .ok());
        const ErrorStats e = Compare(got.data(), want.data(), static_cast<int64_t>(got.size()));
        EXPECT_LE(e.max_abs, kMaxAbs)
            << variant.Name() << " dtype " << int(dtype) << " start " << c.start << " n " << c.n;
        EXPECT_LE(e.nmse, kMaxNmse) << variant.Name() << " start " << c.start;
      }
    }
  }
}

// Batch invariance: prefill of n tokens gives bitwise the outputs of n decode steps, and a
// chunked prefill (start > 0, as after a prefix-cache hit) those of one prefill from 0, on
// every ISA and thread count. Key chunks never straddle a block, and keys a row may not see
// enter with weight exactly 0, so each row's arithmetic does not depend on its task.
void CheckBitwiseConsistency(DType dtype) {
  std::mt19937 rng(5);
  Geometry g;
  g.dtype = dtype;
  g.num_kv_heads = 2;
  g.head_dim = 40;
  g.block_size = 8;
  g.num_blocks = 16;
  Pool pool(g);
  const int64_t heads = 4, n = 30, row = heads * g.head_dim;
  Batch b = MakeBatch(&pool, g, 0, {static_cast<int32_t>(n)}, rng);
  std::vector<float> q = RandomVector(n * row, rng);
  for (const CpuVariant& variant : CpuVariants()) {
    VariantScope scope(variant);
    std::vector<float> full(q.size()), chunked(q.size()), decoded(q.size());
    ASSERT_TRUE(PrefillAttention(scope.ctx(),
                                 PrefillParams(b, pool.View(0), heads, 0, n, q.data(), full.data()))
                    .ok());
    const int64_t chunks[][2] = {{0, 11}, {11, 13}, {24, 6}};  // {start, length}
    for (const auto& [start, len] : chunks) {
      ASSERT_TRUE(PrefillAttention(scope.ctx(), PrefillParams(b, pool.View(0), heads, start, len,
                                                              q.data() + start * row,
                                                              chunked.data() + start * row))
                      .ok());
    }
    for (int64_t i = 0; i < n; ++i) {
      Batch step = b;
      step.lens = {static_cast<int32_t>(i + 1)};
      ASSERT_TRUE(
          DecodeAttention(scope.ctx(), DecodeParams(step, pool.View(0), heads, q.data() + i * row,
                                                    decoded.data() + i * row, 0))
              .ok());
    }
    EXPECT_EQ(chunked, full) << variant.Name();
    EXPECT_EQ(decoded, full) << variant.Name();
  }
}

TEST(PrefillAttentionCpuTest, BitwiseConsistentWithDecodeAndChunking) {
  for (DType dtype : {DType::kF16, DType::kI8, DType::kF8E4M3, DType::kI4}) {
    SCOPED_TRACE(DTypeName(dtype));
    CheckBitwiseConsistency(dtype);
  }
}

// A layout other than the pool's (docs/architecture.md, "KV layout"):
// [K|V][layer][head][token][dim] per block. Only strides change.
TEST(DecodeAttentionCpuTest, HonoursNonDenseStrides) {
  std::mt19937 rng(6);
  const int64_t layers = 2, kvh = 2, bs = 4, d = 16, blocks = 6, heads = 4;
  std::vector<float> pool(blocks * 2 * layers * kvh * bs * d, NAN);
  KvCacheView v;
  v.base = pool.data();
  v.num_blocks = blocks;
  v.block_size = bs;
  v.num_kv_heads = kvh;
  v.head_dim = d;
  v.head_stride = bs * d;
  v.layer_stride = kvh * bs * d;
  v.kv_stride = layers * v.layer_stride;
  v.block_stride = 2 * v.kv_stride;
  v.layer = 1;
  const std::vector<int32_t> table = {4, 1, 3};
  const int32_t len = 10;
  std::vector<float> k = RandomVector(len * kvh * d, rng), val = RandomVector(len * kvh * d, rng);
  std::vector<int32_t> pos(len);
  std::iota(pos.begin(), pos.end(), 0);
  WriteKvParams w;
  w.k = k.data();
  w.v = val.data();
  w.k_token_stride = kvh * d;
  w.v_token_stride = kvh * d;
  w.cache = v;
  w.num_tokens = len;
  w.positions = pos.data();
  w.block_tables = table.data();
  w.max_blocks_per_seq = 3;
  ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
  Batch b{{len}, 3, table};
  std::vector<float> q = RandomVector(heads * d, rng), got(heads * d), want(heads * d);
  ASSERT_TRUE(
      DecodeAttention(OpContext{}, DecodeParams(b, v, heads, q.data(), got.data(), 0)).ok());
  reference::DecodeAttention(DecodeParams(b, v, heads, q.data(), want.data(), 0));
  EXPECT_LE(Compare(got.data(), want.data(), heads * d).max_abs, kMaxAbs);
}

// The quantization rule of kernels/attention_params.h on hand-computed rows (reference).
TEST(QuantizedKvTest, ReferenceQuantizesByTheRule) {
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    Geometry g;
    g.dtype = dtype;
    g.num_layers = 1;
    g.num_kv_heads = 1;
    g.head_dim = 4;
    g.block_size = 4;
    g.num_blocks = 1;
    Pool pool(g);
    // Tokens: a plain row, a zero row, a row with inf, a row with NaN (K); V rows are -K.
    const float k[] = {1, -0.5f, 0.25f, 0, 0, 0, 0, 0, 1, INFINITY, 2, 3, NAN, 1, 2, 3};
    float v[16];
    for (int i = 0; i < 16; ++i) {
      v[i] = -k[i];
    }
    const int32_t pos[] = {0, 1, 2, 3}, table[] = {0};
    WriteKvParams w;
    w.k = k;
    w.v = v;
    w.k_token_stride = w.v_token_stride = 4;
    w.cache = pool.View(0);
    w.num_tokens = 4;
    w.positions = pos;
    w.block_tables = table;
    w.max_blocks_per_seq = 1;
    reference::WriteKv(w);
    const uint8_t* codes = pool.bytes().data();
    float scales[8];  // [K|V][token]
    std::memcpy(scales, codes + w.cache.scale_offset, sizeof(scales));
    // i8: amax 1, inv 127: 127, nearbyint(-63.5) = -64 (ties to even), nearbyint(31.75) = 32.
    // fp8: inv 448: 448 = 0x7e, -224 = 0xf6, 112 = 0x6e.
    const std::vector<uint8_t> row0 = dtype == DType::kI8
                                          ? std::vector<uint8_t>{127, 0xc0, 32, 0}
                                          : std::vector<uint8_t>{0x7e, 0xf6, 0x6e, 0};
    EXPECT_EQ(std::vector<uint8_t>(codes, codes + 4), row0) << DTypeName(dtype);
    EXPECT_EQ(scales[0], dtype == DType::kI8 ? 1.0f / 127.0f : 1.0f / 448.0f);
    EXPECT_EQ(scales[1], 0.0f);  // zero row
    EXPECT_TRUE(std::isnan(scales[2]) && std::isnan(scales[3]));
    EXPECT_TRUE(std::isnan(scales[6]) && std::isnan(scales[7]));  // V rows too
    for (int i = 4; i < 16; ++i) {
      EXPECT_EQ(codes[i], 0) << "byte " << i << " " << DTypeName(dtype);
    }
    // V = -K: the codes are negated (i8: two's complement, fp8: the sign bit).
    EXPECT_EQ(codes[16], dtype == DType::kI8 ? 0x81 : 0xfe);
    EXPECT_EQ(scales[4], scales[0]);
  }
}

TEST(HadamardRotateTest, IsNormalizedAndItsOwnInverse) {
  float two[] = {1.0f, 2.0f};
  HadamardRotate(two, 2);
  EXPECT_FLOAT_EQ(two[0], 3.0f / std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(two[1], -1.0f / std::sqrt(2.0f));
  std::mt19937 rng(21);
  for (const int64_t n : {4, 8, 32, 64, 128}) {
    std::vector<float> x = RandomVector(n, rng);
    std::vector<float> y = x;
    HadamardRotate(y.data(), n);
    double norm_x = 0, norm_y = 0;
    for (int64_t i = 0; i < n; ++i) {
      norm_x += static_cast<double>(x[i]) * x[i];
      norm_y += static_cast<double>(y[i]) * y[i];
    }
    EXPECT_NEAR(norm_y, norm_x, 1e-5 * norm_x) << n;  // orthogonal
    HadamardRotate(y.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << n << " " << i;
  }
}

// i4 with head_dim 64: two groups of 32, each rotated (HadamardRotate) then quantized by the
// rule with its own scale. The CPU writes the reference's bytes and reads back the reference's
// floats; a non-finite value poisons its own group only.
TEST(QuantizedKvTest, I4GroupsAreRotatedAndScaledOnTheirOwn) {
  Geometry g;
  g.dtype = DType::kI4;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.head_dim = 64;
  g.block_size = 4;
  g.num_blocks = 1;
  ASSERT_EQ(KvScalesPerRow(DType::kI4, 64), 2);
  ASSERT_TRUE(KvRotated(DType::kI4, 64));
  std::mt19937 rng(22);
  // Token 0: group 0 a hundred times smaller than group 1; token 1: a NaN in group 1.
  std::vector<float> k = RandomVector(2 * 64, rng), v = RandomVector(2 * 64, rng);
  for (int i = 0; i < 32; ++i) k[i] *= 0.01f;
  k[64 + 40] = NAN;
  const int32_t pos[] = {0, 1}, table[] = {0};
  WriteKvParams w;
  w.k = k.data();
  w.v = v.data();
  w.k_token_stride = w.v_token_stride = 64;
  w.num_tokens = 2;
  w.positions = pos;
  w.block_tables = table;
  w.max_blocks_per_seq = 1;
  Pool ref(g), cpu(g);
  w.cache = ref.View(0);
  reference::WriteKv(w);
  w.cache = cpu.View(0);
  ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
  EXPECT_EQ(cpu.bytes(), ref.bytes());
  const uint8_t* codes = ref.bytes().data();
  const auto* scales = reinterpret_cast<const float*>(codes + w.cache.scale_offset);
  // The rule, recomputed here for token 0's K.
  for (int grp = 0; grp < 2; ++grp) {
    std::vector<float> x(k.begin() + grp * 32, k.begin() + grp * 32 + 32);
    HadamardRotate(x.data(), 32);
    float amax = 0;
    for (const float e : x) amax = std::max(amax, std::fabs(e));
    EXPECT_EQ(scales[grp], amax / 7.0f) << grp;
    for (int d = 0; d < 32; ++d) {
      const int e = grp * 32 + d;
      const int nibble = e % 2 == 0 ? codes[e / 2] & 0xF : codes[e / 2] >> 4;
      const float want = std::min(7.0f, std::max(-7.0f, std::nearbyint(x[d] * (7.0f / amax))));
      ASSERT_EQ((nibble ^ 8) - 8, static_cast<int>(want)) << "group " << grp << " d " << d;
    }
  }
  EXPECT_LT(scales[0], scales[1] / 20);  // the small group keeps its own, finer scale
  EXPECT_FALSE(std::isnan(scales[2]));   // token 1's group 0
  EXPECT_TRUE(std::isnan(scales[3]));    // ... its group 1 held the NaN
  // Read back: the CPU's floats are the reference's; token 0 within half a step of each value.
  std::vector<float> got_k(2 * 64), got_v(2 * 64), want_k(2 * 64), want_v(2 * 64);
  ReadKvParams r;
  r.k = got_k.data();
  r.v = got_v.data();
  r.k_token_stride = r.v_token_stride = 64;
  r.cache = cpu.View(0);
  r.num_tokens = 2;
  r.positions = pos;
  r.block_tables = table;
  r.max_blocks_per_seq = 1;
  ASSERT_TRUE(ReadKv(OpContext{}, r).ok());
  r.k = want_k.data();
  r.v = want_v.data();
  r.cache = ref.View(0);
  reference::ReadKv(r);
  for (size_t i = 0; i < got_k.size(); ++i) {
    if (std::isnan(want_k[i])) {
      ASSERT_TRUE(std::isnan(got_k[i])) << i;
    } else {
      ASSERT_EQ(got_k[i], want_k[i]) << i;
    }
  }
  EXPECT_EQ(got_v, want_v);
  for (int i = 0; i < 64; ++i) {
    // (Half a step of the group's scale per rotated value; the rotation back is orthogonal,
    // so each value is off by at most sqrt(32) times that.)
    EXPECT_LE(std::fabs(got_k[i] - k[i]), scales[i / 32] * 0.5f * std::sqrt(32.0f) + 1e-6f) << i;
  }
  for (int i = 64; i < 96; ++i) EXPECT_FALSE(std::isnan(got_k[i])) << i;
  for (int i = 96; i < 128; ++i) EXPECT_TRUE(std::isnan(got_k[i])) << i;
}

// A token's bytes depend only on its own K/V: writing tokens one at a time (decode, chunked
// prefill) or all at once gives the same pool, data and scales.
TEST(QuantizedKvTest, BytesIndependentOfWriteBatching) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::kI8, DType::kF8E4M3, DType::kI4}) {
    Geometry g;
    g.dtype = dtype;
    g.num_kv_heads = 2;
    g.head_dim = 40;
    g.block_size = 8;
    g.num_blocks = 8;
    Pool whole(g), split(g);
    const int64_t n = 21, token = g.num_kv_heads * g.head_dim;
    std::vector<float> k = RandomVector(n * token, rng), v = RandomVector(n * token, rng);
    std::vector<int32_t> pos(n), table = {5, 2, 7};
    std::iota(pos.begin(), pos.end(), 0);
    WriteKvParams w;
    w.k = k.data();
    w.v = v.data();
    w.k_token_stride = w.v_token_stride = token;
    w.cache = whole.View(1);
    w.num_tokens = n;
    w.positions = pos.data();
    w.block_tables = table.data();
    w.max_blocks_per_seq = 3;
    ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
    w.cache = split.View(1);
    w.num_tokens = 1;
    for (int64_t j = 0; j < n; ++j) {
      w.k = k.data() + j * token;
      w.v = v.data() + j * token;
      w.positions = pos.data() + j;
      ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
    }
    EXPECT_EQ(whole.bytes(), split.bytes()) << DTypeName(dtype);
  }
}

struct QuantError {
  double max_abs = 0.0;
  double mean_abs = 0.0;
};

QuantError MeasureError(const std::vector<float>& got, const std::vector<float>& want) {
  QuantError e;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    e.max_abs = std::isnan(d) ? INFINITY : std::max(e.max_abs, d);
    e.mean_abs += d;
  }
  e.mean_abs /= static_cast<double>(got.size());
  return e;
}

// Attention on a quantized cache vs the same K/V in an f32 cache (CPU, every ISA), K/V and q
// N(0, 1): decode over several sequences (partial blocks, GQA 4) and a prefill from
// start_pos > 0. Measured on this data (printed below, seeds fixed; the same on every ISA):
//   i8:        decode max-abs 0.0160 mean-abs 0.00235, prefill max-abs 0.0077 mean-abs 0.00104
//   fp8 E4M3:  decode max-abs 0.111  mean-abs 0.0088,  prefill max-abs 0.034  mean-abs 0.0041
//   i4:        decode max-abs 0.501  mean-abs 0.0358,  prefill max-abs 0.164  mean-abs 0.0164
//              (groups of 32 rotated; one step is amax / 7, ~18x i8's)
// The decode maximum comes from the 1-token sequence, whose output is its V row: the rounding
// error of one row (i8: up to amax / 254; E4M3: up to 2^-4 relative, i.e. amax / 28 near amax).
// Bounds: about 2x the measured figures.
TEST(QuantizedKvTest, AttentionCloseToF32Cache) {
  struct Bound {
    DType dtype;
    double max_abs, mean_abs;
  };
  const Bound bounds[] = {
      {DType::kI8, 0.03, 0.005}, {DType::kF8E4M3, 0.2, 0.018}, {DType::kI4, 1.0, 0.07}};
  for (const Bound& bound : bounds) {
    std::mt19937 rng(12);  // the same data for both dtypes
    Geometry g;
    g.num_kv_heads = 2;
    g.head_dim = 128;
    g.block_size = 16;
    g.num_blocks = 48;
    Geometry gq = g;
    gq.dtype = bound.dtype;
    Pool f32_pool(g), q_pool(gq);
    std::mt19937 rng_copy = rng;
    const std::vector<int32_t> lens = {1, 15, 17, 130, 300};
    Batch b = MakeBatch(&f32_pool, g, 1, lens, rng);
    Batch bq = MakeBatch(&q_pool, gq, 1, lens, rng_copy);  // same tables, same K/V
    ASSERT_EQ(b.tables, bq.tables);
    const int64_t heads = 8, row = heads * g.head_dim;
    std::vector<float> q = RandomVector(lens.size() * row, rng);
    std::vector<float> want(q.size());
    ASSERT_TRUE(DecodeAttention(OpContext{},
                                DecodeParams(b, f32_pool.View(1), heads, q.data(), want.data(), 0))
                    .ok());
    // Prefill of positions [100, 130) of sequence 3 (a cached prefix of 100 tokens).
    Batch seq3{{130},
               b.max_blocks,
               std::vector<int32_t>(b.tables.begin() + 3 * b.max_blocks,
                                    b.tables.begin() + 4 * b.max_blocks)};
    std::vector<float> pq = RandomVector(30 * row, rng), pwant(pq.size());
    ASSERT_TRUE(PrefillAttention(OpContext{}, PrefillParams(seq3, f32_pool.View(1), heads, 100, 30,
                                                            pq.data(), pwant.data()))
                    .ok());
    for (const CpuVariant& variant : CpuVariants()) {
      VariantScope scope(variant);
      std::vector<float> got(q.size()), pgot(pq.size());
      ASSERT_TRUE(DecodeAttention(scope.ctx(),
                                  DecodeParams(b, q_pool.View(1), heads, q.data(), got.data(), 0))
                      .ok());
      ASSERT_TRUE(PrefillAttention(scope.ctx(), PrefillParams(seq3, q_pool.View(1), heads, 100, 30,
                                                              pq.data(), pgot.data()))
                      .ok());
      const QuantError decode = MeasureError(got, want), prefill = MeasureError(pgot, pwant);
      if (variant.threads == 1) {
        std::printf(
            "[ quantized ] %s %-8s vs f32 cache: decode max-abs %.5f mean-abs %.6f, "
            "prefill max-abs %.5f mean-abs %.6f\n",
            variant.Name().c_str(), std::string(DTypeName(bound.dtype)).c_str(), decode.max_abs,
            decode.mean_abs, prefill.max_abs, prefill.mean_abs);
      }
      for (const QuantError& e : {decode, prefill}) {
        EXPECT_LE(e.max_abs, bound.max_abs) << variant.Name() << " " << DTypeName(bound.dtype);
        EXPECT_LE(e.mean_abs, bound.mean_abs) << variant.Name() << " " << DTypeName(bound.dtype);
      }
    }
  }
}

// A NaN or inf written into a quantized cache poisons the attention that reads it, as it would
// in an f32 cache; other sequences are unaffected.
TEST(QuantizedKvTest, NonFiniteRowReadsBackAsNan) {
  for (DType dtype : {DType::kI8, DType::kF8E4M3, DType::kI4}) {
    std::mt19937 rng(13);
    Geometry g;
    g.dtype = dtype;
    g.num_blocks = 16;
    Pool pool(g);
    Batch b = MakeBatch(&pool, g, 0, {6, 5}, rng);
    std::vector<float> k(g.num_kv_heads * g.head_dim, 0.5f);
    k[3] = INFINITY;
    const int32_t pos = 2;
    WriteKvParams w;
    w.k = w.v = k.data();
    w.k_token_stride = w.v_token_stride = g.num_kv_heads * g.head_dim;
    w.cache = pool.View(0);
    w.num_tokens = 1;
    w.positions = &pos;
    w.block_tables = b.tables.data();  // sequence 0
    w.max_blocks_per_seq = b.max_blocks;
    ASSERT_TRUE(WriteKv(OpContext{}, w).ok());
    const int64_t heads = 4;
    std::vector<float> q = RandomVector(2 * heads * g.head_dim, rng), out(q.size());
    ASSERT_TRUE(
        DecodeAttention(OpContext{}, DecodeParams(b, pool.View(0), heads, q.data(), out.data(), 0))
            .ok());
    const int64_t per_seq = heads * g.head_dim;
    EXPECT_TRUE(std::isnan(out[0])) << DTypeName(dtype);  // kv head 0 holds the inf
    EXPECT_FALSE(std::any_of(out.begin() + per_seq, out.end(), [](float x) {
      return std::isnan(x);
    })) << DTypeName(dtype);
  }
}

TEST(AttentionDispatchTest, RejectsBadInput) {
  std::mt19937 rng(7);
  Geometry g;
  Pool pool(g);
  Batch b = MakeBatch(&pool, g, 0, {6}, rng);
  std::vector<float> q(4 * g.head_dim), out(4 * g.head_dim);
  const DecodeAttentionParams ok = DecodeParams(b, pool.View(0), 4, q.data(), out.data(), 0);
  ASSERT_TRUE(DecodeAttention(OpContext{}, ok).ok());
  auto expect_invalid = [](const DecodeAttentionParams& p, const char* what) {
    const absl::Status s = DecodeAttention(OpContext{}, p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
  };
  DecodeAttentionParams p = ok;
  p.num_heads = 3;
  expect_invalid(p, "heads not a multiple of kv heads");
  p = ok;
  std::vector<int32_t> long_len = {static_cast<int32_t>(b.max_blocks * g.block_size + 1)};
  p.context_lens = long_len.data();
  expect_invalid(p, "context beyond the table");
  p = ok;
  std::vector<int32_t> zero_len = {0};
  p.context_lens = zero_len.data();
  expect_invalid(p, "empty context");
  p = ok;
  std::vector<int32_t> bad_table = b.tables;
  bad_table[1] = static_cast<int32_t>(g.num_blocks);
  p.block_tables = bad_table.data();
  expect_invalid(p, "block id out of range");
  p = ok;
  p.out = q.data() + 1;
  expect_invalid(p, "q/out overlap");
  p = ok;
  p.cache.head_dim = 300;
  expect_invalid(p, "head_dim too large");
  p = ok;
  p.cache.layer = 2;  // the pool has 2 layers
  expect_invalid(p, "layer outside the block");
  p = ok;
  p.cache.head_stride = 1;
  expect_invalid(p, "heads overlap");

  PrefillAttentionParams pp = PrefillParams(b, pool.View(0), 4, 4, 3, q.data(), out.data());
  pp.q_token_stride = pp.out_token_stride = 0;  // set below
  std::vector<float> q3(3 * 4 * g.head_dim), out3(q3.size());
  pp = PrefillParams(b, pool.View(0), 4, 4, 2, q3.data(), out3.data());
  EXPECT_TRUE(PrefillAttention(OpContext{}, pp).ok());
  pp.num_table_blocks = 1;  // positions 4..5 need 2 blocks of 4
  EXPECT_EQ(PrefillAttention(OpContext{}, pp).code(), absl::StatusCode::kInvalidArgument);

  WriteKvParams w;
  std::vector<float> kv(g.num_kv_heads * g.head_dim);
  const int32_t far = static_cast<int32_t>(b.max_blocks * g.block_size);
  w.k = kv.data();
  w.v = kv.data();
  w.k_token_stride = w.v_token_stride = g.num_kv_heads * g.head_dim;
  w.cache = pool.View(0);
  w.num_tokens = 1;
  w.positions = &far;
  w.block_tables = b.tables.data();
  w.max_blocks_per_seq = b.max_blocks;
  EXPECT_EQ(WriteKv(OpContext{}, w).code(), absl::StatusCode::kInvalidArgument);
  // Quantized views: the scale region must be aligned, after the data and inside the block.
  Geometry gq = g;
  gq.dtype = DType::kI8;
  Pool qpool(gq);
  Batch qb = MakeBatch(&qpool, gq, 1, {6}, rng);  // the last layer: its scales end the block
  const DecodeAttentionParams qok = DecodeParams(qb, qpool.View(1), 4, q.data(), out.data(), 0);
  ASSERT_TRUE(DecodeAttention(OpContext{}, qok).ok());
  p = qok;
  p.cache.scale_offset -= 16;  // overlaps the layer's V data
  expect_invalid(p, "scales over the data");
  p = qok;
  p.cache.scale_offset += 2;
  expect_invalid(p, "misaligned scales");
  p = qok;
  p.cache.scale_offset += 64;
  expect_invalid(p, "scales past the block");
  p = qok;
  p.cache.scale_head_stride = 1;
  expect_invalid(p, "scale rows overlap");
  // Layer 0's view with its scales right after its own data: they would lie on layer 1's data.
  p = DecodeParams(qb, qpool.View(0), 4, q.data(), out.data(), 0);
  ASSERT_TRUE(DecodeAttention(OpContext{}, p).ok());
  p.cache.scale_offset = p.cache.layer_stride;
  p.cache.block_stride = p.cache.scale_offset + 4 * 2 * p.cache.scale_layer_stride;
  expect_invalid(p, "scales over another layer's data");
  if (!SupportsAttention(Device::kCuda, DType::kBF16)) {
    EXPECT_EQ(DecodeAttention(OpContext{Device::kCuda, nullptr}, ok).code(),
              absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pd::kernels
