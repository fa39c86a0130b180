// Device routing of kernels/dispatch, without running any device code: on Device::kCuda every
// op validates its scalar parameters first (InvalidArgument, same as kCpu), and reports
// Unimplemented only when the build has no CUDA backend. Runs on every build (label unit).
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/copy.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/type_names.h"

namespace pd::kernels {
namespace {

const OpContext kCuda{Device::kCuda, nullptr, nullptr};

// Every op reports the same CUDA availability: the backend is all or nothing.
TEST(DeviceDispatchTest, CudaSupportIsConsistentAcrossOps) {
  const bool cuda = SupportsRmsNorm(Device::kCuda, DType::kF32);
  EXPECT_EQ(SupportsAttention(Device::kCuda, DType::kF32), cuda);
  EXPECT_EQ(SupportsAttention(Device::kCuda, DType::kBF16), cuda);
  EXPECT_EQ(SupportsAttention(Device::kCuda, DType::kF16), cuda);
  EXPECT_EQ(SupportsAttention(Device::kCuda, DType::kI8), cuda);
  EXPECT_EQ(SupportsAttention(Device::kCuda, DType::kF8E4M3), cuda);
  EXPECT_EQ(SupportsAttention(Device::kCuda, DType::kI4), cuda);
  EXPECT_EQ(SupportsRope(Device::kCuda), cuda);
  EXPECT_EQ(SupportsElementwise(Device::kCuda), cuda);
  EXPECT_EQ(SupportsSample(Device::kCuda), cuda);
  EXPECT_EQ(SupportsCopyBlocks(Device::kCuda), cuda);
  EXPECT_EQ(SupportsConvert(Device::kCuda, DType::kBF16, DType::kF16), cuda);
  for (DType w : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(SupportsMatMul(Device::kCuda, w), cuda);
  }
  EXPECT_FALSE(SupportsRmsNorm(Device::kCuda, DType::kBF16));  // f32 activations only
}

// Quantized KV caches follow the CUDA backend like the other dtypes: supported when it is
// built, validated on kCuda before any launch (InvalidArgument), Unimplemented without it.
// ReadKv (the sink + window policy's) likewise.
TEST(DeviceDispatchTest, QuantizedKvCacheFollowsTheCudaBackend) {
  const bool cuda = SupportsRmsNorm(Device::kCuda, DType::kF32);
  std::vector<float> buf(256);
  float* f = buf.data();
  const int32_t zero = 0, one = 1;
  for (DType q : {DType::kI8, DType::kF8E4M3, DType::kI4}) {
    EXPECT_TRUE(SupportsAttention(Device::kCpu, q));
    EXPECT_EQ(SupportsAttention(Device::kCuda, q), cuda);
    DecodeAttentionParams dp;
    dp.q = f;
    dp.out = f + 32;
    dp.block_tables = &zero;
    dp.context_lens = &one;
    dp.cache = DenseKvCacheView(f + 64, q, 1, 1, 2, 4, 2, 0);
    dp.q_seq_stride = 3;  // < num_heads * head_dim
    dp.out_seq_stride = 4;
    dp.max_blocks_per_seq = 1;
    dp.num_seqs = 1;
    dp.num_heads = 2;
    EXPECT_EQ(DecodeAttention(kCuda, dp).code(), absl::StatusCode::kInvalidArgument);
    WriteKvParams wp;
    wp.k = f;
    wp.v = f + 4;
    wp.k_token_stride = wp.v_token_stride = 4;
    wp.cache = dp.cache;
    wp.num_tokens = 1;
    wp.positions = &zero;
    wp.block_tables = &zero;
    wp.max_blocks_per_seq = 1;
    if (!cuda) {
      EXPECT_EQ(WriteKv(kCuda, wp).code(), absl::StatusCode::kUnimplemented);
    }
    ReadKvParams rp;
    rp.k = f;
    rp.v = f + 4;
    rp.k_token_stride = rp.v_token_stride = 4;
    rp.cache = dp.cache;
    rp.num_tokens = 1;
    rp.positions = &zero;
    rp.block_tables = &zero;
    rp.max_blocks_per_seq = 1;
    if (!cuda) {
      EXPECT_EQ(ReadKv(kCuda, rp).code(), absl::StatusCode::kUnimplemented);
    }
    rp.v_token_stride = 3;  // < num_kv_heads * head_dim
    EXPECT_EQ(ReadKv(kCuda, rp).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(DeviceDispatchTest, CudaValidatesScalarsBeforeTheDevice) {
  std::vector<float> buf(64);
  float* f = buf.data();
  // Null or non-positive sizes: InvalidArgument whether or not CUDA is built, before any launch.
  EXPECT_EQ(RmsNorm(kCuda, RmsNormParams{f, f, f, 0, 4, 4, 4, 1e-5f, DType::kF32}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SiluMul(kCuda, SiluMulParams{f, f + 8, f + 16, 1, 4, 2, 4, 4}).code(),
            absl::StatusCode::kInvalidArgument);  // stride < dim
  EXPECT_EQ(Add(kCuda, AddParams{f, f, nullptr, 4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Convert(kCuda, ConvertParams{f, f + 2, 4, DType::kF32, DType::kF32}).code(),
            absl::StatusCode::kInvalidArgument);  // overlap
  RopeParams rope;
  rope.q = f;
  rope.positions = reinterpret_cast<const int32_t*>(f);
  rope.inv_freq = f;
  rope.num_tokens = 1;
  rope.num_heads = 1;
  rope.head_dim = 3;  // odd
  rope.q_token_stride = 3;
  EXPECT_EQ(Rope(kCuda, rope).code(), absl::StatusCode::kInvalidArgument);
  MatMulParams mm;
  mm.x = f;
  mm.w = f + 32;
  mm.y = f + 8;  // overlaps x
  mm.num_rows = 1;
  mm.in_features = 16;
  mm.out_features = 4;
  mm.x_row_stride = 16;
  mm.y_row_stride = 4;
  EXPECT_EQ(MatMul(kCuda, mm).code(), absl::StatusCode::kInvalidArgument);
  SamplingParams sp;
  sp.logits = f;
  sp.out_tokens = reinterpret_cast<int32_t*>(f + 32);
  sp.num_seqs = 1;
  sp.vocab_size = 8;
  sp.logits_stride = 4;  // < vocab
  EXPECT_EQ(Sample(kCuda, sp).code(), absl::StatusCode::kInvalidArgument);
  if (SupportsSample(Device::kCuda)) {
    sp.logits_stride = 8;
    sp.temperature = f;  // rows are device memory on cuda: seeds and steps are required
    EXPECT_EQ(Sample(kCuda, sp).code(), absl::StatusCode::kInvalidArgument);
  }
  CopyBlocksParams cp{f, f + 1, nullptr, nullptr, 1, 16, 16, 16, 2, 2};  // pools overlap
  EXPECT_EQ(CopyBlocks(kCuda, cp).code(), absl::StatusCode::kInvalidArgument);
  DecodeAttentionParams dp;
  dp.q = f;
  dp.out = f + 32;
  dp.block_tables = reinterpret_cast<const int32_t*>(f);
  dp.context_lens = reinterpret_cast<const int32_t*>(f);
  dp.cache = DenseKvCacheView(f, DType::kBF16, 1, 1, 2, 4, 2, 0);
  dp.q_seq_stride = dp.out_seq_stride = 6;
  dp.max_blocks_per_seq = 1;
  dp.num_seqs = 1;
  dp.num_heads = 3;  // not a multiple of num_kv_heads 2
  EXPECT_EQ(DecodeAttention(kCuda, dp).code(), absl::StatusCode::kInvalidArgument);
}

// Without the CUDA backend, valid calls on kCuda are Unimplemented naming the device. (With it,
// they would launch on host pointers: the GPU tests in kernels/cuda cover that path.)
TEST(DeviceDispatchTest, UnbuiltCudaIsUnimplemented) {
  if (SupportsRmsNorm(Device::kCuda, DType::kF32)) {
    GTEST_SKIP() << "built with CUDA";
  }
  std::vector<float> a(16), b(16), out(16);
  const absl::Status s = Add(kCuda, AddParams{a.data(), b.data(), out.data(), 16});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("cuda"), absl::string_view::npos) << s;
  std::vector<unsigned char> src(64), dst(64);
  EXPECT_EQ(CopyBlocks(kCuda, CopyBlocksParams{src.data(), dst.data(), nullptr, nullptr, 2, 32, 32,
                                               32, 2, 2})
                .code(),
            absl::StatusCode::kUnimplemented);
}

// DecodeAttention's workspace: none on kCpu; on kCuda (when built) the split-KV partials, sized
// from the shapes alone, and checked before any launch: a missing, short, misaligned or
// overlapping workspace is InvalidArgument naming the sizes.
TEST(DeviceDispatchTest, DecodeAttentionWorkspace) {
  std::vector<float> buf(4096);
  float* f = buf.data();
  const int32_t zero = 0, one = 1;
  DecodeAttentionParams dp;
  dp.q = f;
  dp.out = f + 64;
  dp.block_tables = &zero;
  dp.context_lens = &one;
  dp.cache = DenseKvCacheView(f + 128, DType::kBF16, 1, 1, 2, 16, 8, 0);
  dp.q_seq_stride = dp.out_seq_stride = 32;
  dp.max_blocks_per_seq = 20;  // 320 tokens: two splits of 256
  dp.num_seqs = 2;
  dp.num_heads = 4;
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(OpContext{}, dp), 0);
  if (!SupportsAttention(Device::kCuda, DType::kBF16)) {
    EXPECT_EQ(DecodeAttentionWorkspaceBytes(kCuda, dp), 0);
    EXPECT_EQ(DecodeAttention(kCuda, dp).code(), absl::StatusCode::kUnimplemented);
    return;
  }
  // 2 sequences x 4 heads x 2 splits records of head_dim + 2 floats.
  const int64_t need = 2 * 4 * 2 * (8 + 2) * 4;
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(kCuda, dp), need);
  DecodeAttentionParams wide = dp;
  wide.max_blocks_per_seq = 32;  // 512 tokens: still two splits
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(kCuda, wide), need);
  wide.max_blocks_per_seq = 33;
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(kCuda, wide), need / 2 * 3);
  DecodeAttentionParams bad = dp;
  bad.num_seqs = 0;
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(kCuda, bad), 0);

  absl::Status st = DecodeAttention(kCuda, dp);  // no workspace
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(absl::StrCat("workspace of 0 bytes, need ", need)),
            absl::string_view::npos)
      << st;
  dp.workspace = f + 1024;
  dp.workspace_bytes = need - 4;
  st = DecodeAttention(kCuda, dp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(absl::StrCat("workspace of ", need - 4, " bytes, need ", need)),
            absl::string_view::npos)
      << st;
  dp.workspace_bytes = need;
  dp.workspace = reinterpret_cast<char*>(f + 1024) + 2;
  EXPECT_EQ(DecodeAttention(kCuda, dp).code(), absl::StatusCode::kInvalidArgument);  // misaligned
  dp.workspace = f + 80;                                                             // overlaps out
  EXPECT_EQ(DecodeAttention(kCuda, dp).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::kernels
