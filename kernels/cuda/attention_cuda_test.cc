// GPU tests of the CUDA paged attention (label gpu): WriteKv, ReadKv, PrefillAttention,
// DecodeAttention, AttentionMass and GatherKvRows against the CPU ops on the same inputs. Skip
// without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/attention_mass.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/half.h"
#include "kernels/type_names.h"

namespace pd::kernels {
namespace {

using cuda::testing::CudaCtx;
using cuda::testing::DeviceBuffer;
using testing::Compare;
using testing::ErrorStats;
using testing::RandomVector;

// Both backends read the same stored cache values and accumulate in f32, in different orders
// (CPU: per-row online softmax over chunks of keys in order; GPU prefill: four warps, merged;
// GPU decode: splits of 256+ keys, each an online softmax over chunks of 8 to 64 keys, merged in
// split order). Each side is within ~5e-7 max-abs of the double reference on these inputs (the
// host emulation in launch_config_decode_test.cc, and kernels_attention_test for the CPU), so
// 2e-5 leaves room for the GPU's expf (2 ulp) and FMA contraction without hiding a wrong key
// or weight, which moves outputs by 1e-3 or more.
constexpr double kMaxAbs = 2e-5;
constexpr double kMaxNmse = 1e-10;

struct Shape {
  int64_t num_layers = 2;
  int64_t layer = 1;
  int64_t num_kv_heads = 2;
  int64_t num_heads = 8;
  int64_t head_dim = 64;
  int64_t block_size = 16;
  int64_t num_blocks = 40;
  DType dtype = DType::kBF16;
};

// A pool of the shape, NaN-poisoned (0xff bytes) so reading an unwritten slot shows up, with
// one block table row per sequence over shuffled physical blocks.
struct PagedPool {
  Shape s;
  std::vector<uint8_t> pool_host;
  std::vector<int32_t> tables;  // [num_seqs][max_blocks]
  int64_t max_blocks = 0;

  PagedPool(const Shape& shape, const std::vector<int32_t>& lens, std::mt19937& rng) : s(shape) {
    pool_host.assign(s.num_blocks * DenseKvBlockBytes(s.dtype, s.num_layers, s.num_kv_heads,
                                                      s.block_size, s.head_dim),
                     0xff);
    for (int32_t len : lens) {
      max_blocks = std::max<int64_t>(max_blocks, (len + s.block_size - 1) / s.block_size);
    }
    std::vector<int32_t> ids(s.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.assign(lens.size() * max_blocks, 0);
    size_t next = 0;
    for (size_t q = 0; q < lens.size(); ++q) {
      for (int64_t b = 0; b < (lens[q] + s.block_size - 1) / s.block_size; ++b) {
        tables[q * max_blocks + b] = ids.at(next++);
      }
    }
  }

  KvCacheView View(void* base) const {
    return DenseKvCacheView(base, s.dtype, s.num_blocks, s.num_layers, s.num_kv_heads, s.block_size,
                            s.head_dim, s.layer);
  }
};

// Writes K/V for every position of every sequence on both backends (CPU pool on the host, GPU
// pool on the device), checks the pools are bitwise equal and returns the device pool.
DeviceBuffer WriteAll(PagedPool& st, const std::vector<int32_t>& lens, std::mt19937& rng) {
  std::vector<int32_t> positions, token_seq;
  for (size_t q = 0; q < lens.size(); ++q) {
    for (int32_t p = 0; p < lens[q]; ++p) {
      positions.push_back(p);
      token_seq.push_back(static_cast<int32_t>(q));
    }
  }
  const int64_t n = static_cast<int64_t>(positions.size());
  const int64_t elems = st.s.num_kv_heads * st.s.head_dim;
  const std::vector<float> k = RandomVector(n * (elems + 4), rng);
  const std::vector<float> v = RandomVector(n * elems, rng);
  DeviceBuffer pool(st.pool_host);
  DeviceBuffer dk(k), dv(v), dpos(positions), dseq(token_seq), dtab(st.tables);
  WriteKvParams p;
  p.k_token_stride = elems + 4;  // strided K rows
  p.v_token_stride = elems;
  p.num_tokens = n;
  p.num_seqs = static_cast<int64_t>(lens.size());
  p.max_blocks_per_seq = st.max_blocks;
  WriteKvParams cpu = p;
  cpu.k = k.data();
  cpu.v = v.data();
  cpu.cache = st.View(st.pool_host.data());
  cpu.positions = positions.data();
  cpu.token_seq = token_seq.data();
  cpu.block_tables = st.tables.data();
  EXPECT_TRUE(WriteKv(OpContext{}, cpu).ok());
  WriteKvParams gpu = p;
  gpu.k = dk.as<float>();
  gpu.v = dv.as<float>();
  gpu.cache = st.View(pool.get());
  gpu.positions = dpos.as<int32_t>();
  gpu.token_seq = dseq.as<int32_t>();
  gpu.block_tables = dtab.as<int32_t>();
  EXPECT_TRUE(WriteKv(CudaCtx(), gpu).ok());
  EXPECT_EQ(pool.Download<uint8_t>(), st.pool_host) << "write_kv pools differ";
  return pool;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  const ErrorStats e = Compare(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_LE(e.max_abs, kMaxAbs) << what;
  EXPECT_LE(e.nmse, kMaxNmse) << what;
}

class CudaAttentionTest : public ::testing::TestWithParam<DType> {};

// Stores of special values round exactly as kernels/half.h on the CPU: NaN payloads, overflow
// to inf, f16 subnormals and ties.
TEST_P(CudaAttentionTest, WriteKvSpecialValuesMatchCpuBitwise) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(24);
  Shape s;
  s.dtype = GetParam();
  s.num_kv_heads = 1;
  s.head_dim = 16;
  const std::vector<int32_t> lens = {3};
  PagedPool st(s, lens, rng);
  const std::vector<float> special = {0.0f,
                                      -0.0f,
                                      INFINITY,
                                      -INFINITY,
                                      NAN,
                                      -NAN,
                                      70000.0f,
                                      65520.0f,
                                      65504.0f,
                                      1e-40f,
                                      6e-8f,
                                      3e-8f,
                                      1e38f,
                                      F32FromBits(0x3f808000u),
                                      F32FromBits(0x7fc12345u),
                                      F32FromBits(0xff800001u)};
  std::vector<float> k, v;
  for (int t = 0; t < 3; ++t) {
    for (float x : special) {
      k.push_back(x);
      v.push_back(-x);
    }
  }
  const std::vector<int32_t> positions = {0, 1, 2};
  DeviceBuffer pool(st.pool_host), dk(k), dv(v), dpos(positions), dtab(st.tables);
  WriteKvParams p;
  p.k_token_stride = p.v_token_stride = 16;
  p.num_tokens = 3;
  p.max_blocks_per_seq = st.max_blocks;
  WriteKvParams cpu = p;
  cpu.k = k.data();
  cpu.v = v.data();
  cpu.cache = st.View(st.pool_host.data());
  cpu.positions = positions.data();
  cpu.block_tables = st.tables.data();
  ASSERT_TRUE(WriteKv(OpContext{}, cpu).ok());
  WriteKvParams gpu = p;
  gpu.k = dk.as<float>();
  gpu.v = dv.as<float>();
  gpu.cache = st.View(pool.get());
  gpu.positions = dpos.as<int32_t>();
  gpu.block_tables = dtab.as<int32_t>();
  ASSERT_TRUE(WriteKv(CudaCtx(), gpu).ok());
  EXPECT_EQ(pool.Download<uint8_t>(), st.pool_host);
}

// ReadKv on the device returns bitwise the CPU's values (an exact op): every token of two
// sequences in shuffled order, strided outputs whose padding stays untouched, and rows with a
// NaN (a quantized row's NaN scale keeps its bits) and all zeros.
TEST_P(CudaAttentionTest, ReadKvMatchesCpuBitwise) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  Shape s;
  s.dtype = GetParam();
  const std::vector<int32_t> lens = {37, 20};
  PagedPool st(s, lens, rng);
  DeviceBuffer pool = WriteAll(st, lens, rng);
  const int64_t elems = s.num_kv_heads * s.head_dim;
  {  // Special rows on both pools: K of (0, 5) head 1 holds a NaN, V of (1, 19) is all zeros.
    std::vector<float> k = RandomVector(2 * elems, rng), v = RandomVector(2 * elems, rng);
    k[s.head_dim + 3] = NAN;
    std::fill(v.begin() + elems, v.end(), 0.0f);
    const std::vector<int32_t> positions = {5, 19}, token_seq = {0, 1};
    DeviceBuffer dk(k), dv(v), dpos(positions), dseq(token_seq), dtab(st.tables);
    WriteKvParams p;
    p.k_token_stride = p.v_token_stride = elems;
    p.num_tokens = 2;
    p.num_seqs = 2;
    p.max_blocks_per_seq = st.max_blocks;
    WriteKvParams cpu = p;
    cpu.k = k.data();
    cpu.v = v.data();
    cpu.cache = st.View(st.pool_host.data());
    cpu.positions = positions.data();
    cpu.token_seq = token_seq.data();
    cpu.block_tables = st.tables.data();
    ASSERT_TRUE(WriteKv(OpContext{}, cpu).ok());
    WriteKvParams gpu = p;
    gpu.k = dk.as<float>();
    gpu.v = dv.as<float>();
    gpu.cache = st.View(pool.get());
    gpu.positions = dpos.as<int32_t>();
    gpu.token_seq = dseq.as<int32_t>();
    gpu.block_tables = dtab.as<int32_t>();
    ASSERT_TRUE(WriteKv(CudaCtx(), gpu).ok());
    ASSERT_EQ(pool.Download<uint8_t>(), st.pool_host);
  }
  std::vector<std::pair<int32_t, int32_t>> tokens;  // (sequence, position)
  for (size_t q = 0; q < lens.size(); ++q) {
    for (int32_t p = 0; p < lens[q]; ++p) {
      tokens.emplace_back(static_cast<int32_t>(q), p);
    }
  }
  std::shuffle(tokens.begin(), tokens.end(), rng);
  std::vector<int32_t> positions, token_seq;
  for (const auto& [q, p] : tokens) {
    token_seq.push_back(q);
    positions.push_back(p);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t k_stride = elems + 3, v_stride = elems + 1;
  std::vector<float> k(n * k_stride, -1.0f), v(n * v_stride, -1.0f);
  DeviceBuffer dk(k), dv(v), dpos(positions), dseq(token_seq), dtab(st.tables);
  ReadKvParams p;
  p.k_token_stride = k_stride;
  p.v_token_stride = v_stride;
  p.num_tokens = n;
  p.num_seqs = 2;
  p.max_blocks_per_seq = st.max_blocks;
  ReadKvParams cpu = p;
  cpu.k = k.data();
  cpu.v = v.data();
  cpu.cache = st.View(st.pool_host.data());
  cpu.positions = positions.data();
  cpu.token_seq = token_seq.data();
  cpu.block_tables = st.tables.data();
  ASSERT_TRUE(ReadKv(OpContext{}, cpu).ok());
  ReadKvParams gpu = p;
  gpu.k = dk.as<float>();
  gpu.v = dv.as<float>();
  gpu.cache = st.View(pool.get());
  gpu.positions = dpos.as<int32_t>();
  gpu.token_seq = dseq.as<int32_t>();
  gpu.block_tables = dtab.as<int32_t>();
  ASSERT_TRUE(ReadKv(CudaCtx(), gpu).ok());
  const std::vector<float> got_k = dk.Download<float>(), got_v = dv.Download<float>();
  EXPECT_EQ(std::memcmp(got_k.data(), k.data(), k.size() * sizeof(float)), 0) << "k";
  EXPECT_EQ(std::memcmp(got_v.data(), v.data(), v.size() * sizeof(float)), 0) << "v";
  EXPECT_EQ(got_k[elems], -1.0f);  // padding untouched
  const int64_t nan_row =
      std::find(tokens.begin(), tokens.end(), std::make_pair(0, 5)) - tokens.begin();
  EXPECT_TRUE(std::isnan(got_k[nan_row * k_stride + s.head_dim + 3]));
}

// The decode op on the device: its workspace, poisoned (0xff bytes are NaNs in f32) so a
// partial the merge reads without a split having written it shows up in the output.
DeviceBuffer DecodeWorkspace(const DecodeAttentionParams& gpu) {
  const int64_t bytes = DecodeAttentionWorkspaceBytes(CudaCtx(), gpu);
  EXPECT_GT(bytes, 0);
  DeviceBuffer ws(std::vector<uint8_t>(bytes, 0xff));
  return ws;
}

struct DecodeVariant {
  int64_t num_heads, num_kv_heads, head_dim, block_size;
};

// GQA 1, 4 and 8 at head_dim 64 and 128; a group of 16 (two head tiles of 8); head_dim 80
// (320-byte f32 rows, 160-byte bf16/f16 rows: still whole 16-byte vectors) with block size 8;
// head_dim 256 with block size 1 (5000 blocks for the longest sequence).
const DecodeVariant kDecodeVariants[] = {{4, 4, 64, 16},   {8, 2, 128, 16}, {8, 1, 64, 16},
                                         {16, 2, 128, 16}, {16, 1, 64, 16}, {8, 1, 80, 8},
                                         {2, 1, 256, 1}};

// Lengths: one key, mid-block, a block edge, one past it, one below / at / past a split edge
// (256), and several splits (1000, 5000).
const std::vector<int32_t> kDecodeLens = {1, 15, 16, 17, 255, 256, 257, 1000, 5000};

Shape DecodeShape(const DecodeVariant& var, DType dtype, const std::vector<int32_t>& lens) {
  Shape s;
  s.num_heads = var.num_heads;
  s.num_kv_heads = var.num_kv_heads;
  s.head_dim = var.head_dim;
  s.block_size = var.block_size;
  s.dtype = dtype;
  s.num_blocks = 0;
  for (int32_t len : lens) {
    s.num_blocks += (len + s.block_size - 1) / s.block_size;
  }
  return s;
}

TEST_P(CudaAttentionTest, DecodeMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (const DecodeVariant& var : kDecodeVariants) {
    SCOPED_TRACE(::testing::Message() << var.num_heads << "/" << var.num_kv_heads << " d"
                                      << var.head_dim << " b" << var.block_size);
    const std::vector<int32_t>& lens = kDecodeLens;
    const Shape s = DecodeShape(var, GetParam(), lens);
    PagedPool st(s, lens, rng);
    DeviceBuffer pool = WriteAll(st, lens, rng);
    const int64_t num_seqs = static_cast<int64_t>(lens.size());
    const int64_t row = s.num_heads * s.head_dim;
    const std::vector<float> q = RandomVector(num_seqs * (row + 8), rng);
    DeviceBuffer dq(q), dout(num_seqs * row * sizeof(float)), dtab(st.tables), dlens(lens);
    std::vector<float> want(num_seqs * row);
    DecodeAttentionParams p;
    p.q_seq_stride = row + 8;
    p.out_seq_stride = row;
    p.max_blocks_per_seq = st.max_blocks;
    p.num_seqs = num_seqs;
    p.num_heads = s.num_heads;
    DecodeAttentionParams cpu = p;
    cpu.q = q.data();
    cpu.out = want.data();
    cpu.cache = st.View(st.pool_host.data());
    cpu.block_tables = st.tables.data();
    cpu.context_lens = lens.data();
    ASSERT_TRUE(DecodeAttention(OpContext{}, cpu).ok());
    DecodeAttentionParams gpu = p;
    gpu.q = dq.as<float>();
    gpu.out = dout.as<float>();
    gpu.cache = st.View(pool.get());
    gpu.block_tables = dtab.as<int32_t>();
    gpu.context_lens = dlens.as<int32_t>();
    DeviceBuffer ws = DecodeWorkspace(gpu);
    gpu.workspace = ws.get();
    gpu.workspace_bytes = DecodeAttentionWorkspaceBytes(CudaCtx(), gpu);
    ASSERT_TRUE(DecodeAttention(CudaCtx(), gpu).ok());
    const std::vector<float> got = dout.Download<float>();
    ExpectClose(got, want, "decode");

    // Batched equals one call per sequence, bitwise (each (sequence, head, split) is one block,
    // merged alone), and a second run gives the same bits (the merge order is fixed).
    for (int64_t q_i = 0; q_i < num_seqs; ++q_i) {
      DeviceBuffer one(row * sizeof(float));
      DecodeAttentionParams single = gpu;
      single.q = dq.as<float>() + q_i * p.q_seq_stride;
      single.out = one.as<float>();
      single.block_tables = dtab.as<int32_t>() + q_i * st.max_blocks;
      single.context_lens = dlens.as<int32_t>() + q_i;
      single.num_seqs = 1;
      ASSERT_TRUE(DecodeAttention(CudaCtx(), single).ok());
      const std::vector<float> alone = one.Download<float>();
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), got.begin() + q_i * row))
          << "length " << lens[q_i];
    }
    ASSERT_TRUE(DecodeAttention(CudaCtx(), gpu).ok());
    EXPECT_EQ(dout.Download<float>(), got) << "not deterministic";
  }
}

// A pool whose base is not 16-byte aligned takes the element-by-element path; same results.
TEST_P(CudaAttentionTest, DecodeMisalignedPoolMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  if (IsQuantizedKvDType(GetParam())) {
    GTEST_SKIP() << "quantized caches always load element by element (and need 4-byte scales)";
  }
  std::mt19937 rng(25);
  const std::vector<int32_t> lens = {1, 17, 300};
  const Shape s = DecodeShape(DecodeVariant{8, 2, 64, 16}, GetParam(), lens);
  PagedPool st(s, lens, rng);
  WriteAll(st, lens, rng);  // fills st.pool_host (the CPU pool), checked equal to the GPU's
  const int64_t offset = DTypeSize(s.dtype);
  std::vector<uint8_t> shifted(st.pool_host.size() + 16, 0);
  std::copy(st.pool_host.begin(), st.pool_host.end(), shifted.begin() + offset);
  DeviceBuffer pool(shifted);
  const int64_t num_seqs = static_cast<int64_t>(lens.size());
  const int64_t row = s.num_heads * s.head_dim;
  const std::vector<float> q = RandomVector(num_seqs * row, rng);
  DeviceBuffer dq(q), dout(num_seqs * row * sizeof(float)), dtab(st.tables), dlens(lens);
  std::vector<float> want(num_seqs * row);
  DecodeAttentionParams p;
  p.q_seq_stride = p.out_seq_stride = row;
  p.max_blocks_per_seq = st.max_blocks;
  p.num_seqs = num_seqs;
  p.num_heads = s.num_heads;
  DecodeAttentionParams cpu = p;
  cpu.q = q.data();
  cpu.out = want.data();
  cpu.cache = st.View(st.pool_host.data());
  cpu.block_tables = st.tables.data();
  cpu.context_lens = lens.data();
  ASSERT_TRUE(DecodeAttention(OpContext{}, cpu).ok());
  DecodeAttentionParams gpu = p;
  gpu.q = dq.as<float>();
  gpu.out = dout.as<float>();
  gpu.cache = st.View(static_cast<uint8_t*>(pool.get()) + offset);
  ASSERT_FALSE(cuda::DecodeVectorLoads(gpu.cache));
  gpu.block_tables = dtab.as<int32_t>();
  gpu.context_lens = dlens.as<int32_t>();
  DeviceBuffer ws = DecodeWorkspace(gpu);
  gpu.workspace = ws.get();
  gpu.workspace_bytes = DecodeAttentionWorkspaceBytes(CudaCtx(), gpu);
  ASSERT_TRUE(DecodeAttention(CudaCtx(), gpu).ok());
  ExpectClose(dout.Download<float>(), want, "misaligned decode");
}

TEST_P(CudaAttentionTest, PrefillMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  for (int64_t start_pos : {int64_t{0}, int64_t{13}, int64_t{32}}) {
    Shape s;
    s.dtype = GetParam();
    const int64_t num_tokens = 37;
    const std::vector<int32_t> lens = {static_cast<int32_t>(start_pos + num_tokens)};
    PagedPool st(s, lens, rng);
    DeviceBuffer pool = WriteAll(st, lens, rng);
    const int64_t row = s.num_heads * s.head_dim;
    const std::vector<float> q = RandomVector(num_tokens * row, rng);
    DeviceBuffer dq(q), dout(num_tokens * (row + 3) * sizeof(float)), dtab(st.tables);
    std::vector<float> want(num_tokens * (row + 3));
    PrefillAttentionParams p;
    p.q_token_stride = row;
    p.out_token_stride = row + 3;
    p.num_table_blocks = st.max_blocks;
    p.start_pos = start_pos;
    p.num_tokens = num_tokens;
    p.num_heads = s.num_heads;
    p.scale = start_pos == 13 ? 0.2f : 0.0f;
    // The padding of out is compared too: both sides must leave it as it was.
    dout.Upload(want);
    PrefillAttentionParams cpu = p;
    cpu.q = q.data();
    cpu.out = want.data();
    cpu.cache = st.View(st.pool_host.data());
    cpu.block_table = st.tables.data();
    ASSERT_TRUE(PrefillAttention(OpContext{}, cpu).ok());
    PrefillAttentionParams gpu = p;
    gpu.q = dq.as<float>();
    gpu.out = dout.as<float>();
    gpu.cache = st.View(pool.get());
    gpu.block_table = dtab.as<int32_t>();
    ASSERT_TRUE(PrefillAttention(CudaCtx(), gpu).ok());
    ExpectClose(dout.Download<float>(), want, "prefill");
  }
}

// AttentionMass (the H2O and SnapKV score pass) reading keys from the cache: a chunk of 20
// queries after 280 cached keys, added to a mass that already holds something. The CUDA sum of
// each row's exp differs from the CPU's in order (and expf by an ulp): within float tolerance.
TEST_P(CudaAttentionTest, AttentionMassMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  Shape s;
  s.dtype = GetParam();
  const std::vector<int32_t> lens = {300};
  PagedPool st(s, lens, rng);
  DeviceBuffer pool = WriteAll(st, lens, rng);
  const int64_t tokens = 20, start = 300 - tokens, stride = 305;
  const std::vector<float> q = RandomVector(tokens * s.num_heads * s.head_dim, rng);
  const std::vector<float> before = RandomVector(s.num_kv_heads * stride, rng);
  AttentionMassParams p;
  p.q_token_stride = s.num_heads * s.head_dim;
  p.num_table_blocks = st.max_blocks;
  p.start_pos = start;
  p.num_tokens = tokens;
  p.num_heads = s.num_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.mass_head_stride = stride;
  std::vector<float> want = before;
  const KvCacheView host_view = st.View(st.pool_host.data());
  AttentionMassParams cpu = p;
  cpu.q = q.data();
  cpu.cache = &host_view;
  cpu.block_table = st.tables.data();
  cpu.mass = want.data();
  ASSERT_TRUE(AttentionMass(OpContext{}, cpu).ok());
  DeviceBuffer dq(q), dtab(st.tables), dmass(before),
      dwork(static_cast<size_t>(AttentionMassWorkspaceFloats(tokens, s.num_heads)) * 4);
  const KvCacheView device_view = st.View(pool.get());
  AttentionMassParams gpu = p;
  gpu.q = dq.as<float>();
  gpu.cache = &device_view;
  gpu.block_table = dtab.as<int32_t>();
  gpu.mass = dmass.as<float>();
  gpu.workspace = dwork.as<float>();
  ASSERT_TRUE(AttentionMass(CudaCtx(), gpu).ok());
  const std::vector<float> got = dmass.Download<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << "mass " << i;
  }
  // The same pool read as MLA latent entries (the heads' K rows, then their V rows: 256
  // elements), scored by 4 heads into one row (AttentionMassParams::latent).
  const int64_t entry = 2 * s.num_kv_heads * s.head_dim, heads = 4;
  const std::vector<float> lq = RandomVector(tokens * heads * entry, rng);
  AttentionMassParams lp = p;
  lp.latent = true;
  lp.num_kv_heads = 1;
  lp.num_heads = heads;
  lp.head_dim = entry;
  lp.q_token_stride = heads * entry;
  const std::vector<float> row(before.begin(), before.begin() + stride);
  std::vector<float> lwant = row;
  AttentionMassParams lcpu = lp;
  lcpu.q = lq.data();
  lcpu.cache = &host_view;
  lcpu.block_table = st.tables.data();
  lcpu.mass = lwant.data();
  ASSERT_TRUE(AttentionMass(OpContext{}, lcpu).ok());
  DeviceBuffer dlq(lq), dlmass(row),
      dlwork(static_cast<size_t>(AttentionMassWorkspaceFloats(tokens, heads)) * 4);
  AttentionMassParams lgpu = lp;
  lgpu.q = dlq.as<float>();
  lgpu.cache = &device_view;
  lgpu.block_table = dtab.as<int32_t>();
  lgpu.mass = dlmass.as<float>();
  lgpu.workspace = dlwork.as<float>();
  ASSERT_TRUE(AttentionMass(CudaCtx(), lgpu).ok());
  const std::vector<float> lgot = dlmass.Download<float>();
  for (size_t i = 0; i < lwant.size(); ++i) {
    ASSERT_NEAR(lgot[i], lwant[i], 1e-5 * (1.0 + std::fabs(lwant[i]))) << "latent mass " << i;
  }
}

// GatherKvRows (the H2O and SnapKV compaction) moves the same bytes as the CPU: every kept row
// of both layers (the unwritten one's poison included) into fresh blocks.
TEST_P(CudaAttentionTest, GatherKvRowsMatchesCpuBitwise) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  Shape s;
  s.dtype = GetParam();
  const std::vector<int32_t> lens = {70};  // 5 blocks of 16
  PagedPool st(s, lens, rng);
  DeviceBuffer pool = WriteAll(st, lens, rng);
  const std::vector<int32_t> src(st.tables.begin(), st.tables.begin() + 5);
  std::vector<int32_t> dst;
  for (int32_t b = 0; b < s.num_blocks && dst.size() < 3; ++b) {
    if (std::find(src.begin(), src.end(), b) == src.end()) dst.push_back(b);
  }
  const int64_t keep_n = 40;
  std::vector<int32_t> keep;
  for (int64_t r = 0; r < s.num_layers * s.num_kv_heads; ++r) {
    std::vector<int32_t> slots(70);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(keep_n);
    std::sort(slots.begin(), slots.end());
    keep.insert(keep.end(), slots.begin(), slots.end());
  }
  GatherKvRowsParams p;
  p.num_layers = s.num_layers;
  p.num_src_blocks = 5;
  p.num_dst_blocks = 3;
  p.num_keep = keep_n;
  p.keep_heads = s.num_kv_heads;
  GatherKvRowsParams cpu = p;
  cpu.cache = st.View(st.pool_host.data());
  cpu.src_blocks = src.data();
  cpu.dst_blocks = dst.data();
  cpu.keep = keep.data();
  ASSERT_TRUE(GatherKvRows(OpContext{}, cpu).ok());
  DeviceBuffer dsrc(src), ddst(dst), dkeep(keep);
  GatherKvRowsParams gpu = p;
  gpu.cache = st.View(pool.get());
  gpu.src_blocks = dsrc.as<int32_t>();
  gpu.dst_blocks = ddst.as<int32_t>();
  gpu.keep = dkeep.as<int32_t>();
  ASSERT_TRUE(GatherKvRows(CudaCtx(), gpu).ok());
  EXPECT_EQ(pool.Download<uint8_t>(), st.pool_host) << "gathered pools differ";
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, CudaAttentionTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI8,
                                           DType::kF8E4M3, DType::kI4),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// A non-default stream: the work is queued on it and done after cudaStreamSynchronize.
TEST(CudaAttentionStreamTest, RunsOnTheGivenStream) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  Shape s;
  const std::vector<int32_t> lens = {20};
  PagedPool st(s, lens, rng);
  DeviceBuffer pool = WriteAll(st, lens, rng);
  const int64_t row = s.num_heads * s.head_dim;
  const std::vector<float> q = RandomVector(row, rng);
  DeviceBuffer dq(q), dout(row * sizeof(float)), dtab(st.tables), dlens(lens);
  std::vector<float> want(row);
  DecodeAttentionParams p;
  p.q_seq_stride = p.out_seq_stride = row;
  p.max_blocks_per_seq = st.max_blocks;
  p.num_seqs = 1;
  p.num_heads = s.num_heads;
  DecodeAttentionParams cpu = p;
  cpu.q = q.data();
  cpu.out = want.data();
  cpu.cache = st.View(st.pool_host.data());
  cpu.block_tables = st.tables.data();
  cpu.context_lens = lens.data();
  ASSERT_TRUE(DecodeAttention(OpContext{}, cpu).ok());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DecodeAttentionParams gpu = p;
  gpu.q = dq.as<float>();
  gpu.out = dout.as<float>();
  gpu.cache = st.View(pool.get());
  gpu.block_tables = dtab.as<int32_t>();
  gpu.context_lens = dlens.as<int32_t>();
  DeviceBuffer ws = DecodeWorkspace(gpu);
  gpu.workspace = ws.get();
  gpu.workspace_bytes = DecodeAttentionWorkspaceBytes(CudaCtx(), gpu);
  ASSERT_TRUE(DecodeAttention(CudaCtx(stream), gpu).ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  ExpectClose(dout.Download<float>(), want, "stream");
}

}  // namespace
}  // namespace pd::kernels
