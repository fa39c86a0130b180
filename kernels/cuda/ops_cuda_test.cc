// GPU tests of the CUDA element-wise, norm, RoPE, convert, matmul and block-copy ops (label
// gpu): each against the CPU op on the same random inputs. Skip without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/convert.h"
#include "kernels/copy.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/elementwise.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/matmul_params.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace pd::kernels {
namespace {

using cuda::testing::CudaCtx;
using cuda::testing::DeviceBuffer;
using testing::Compare;
using testing::ErrorStats;
using testing::RandomVector;

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double max_abs,
                 double max_nmse, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const ErrorStats e = Compare(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_LE(e.max_abs, max_abs) << what;
  EXPECT_LE(e.nmse, max_nmse) << what;
}

TEST(CudaOpsTest, RmsNormMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  for (int64_t dim : {1, 31, 1000, 4096, 5000}) {  // 5000: more than 1024 threads per row
    const int64_t rows = 5, in_stride = dim + 3;
    const std::vector<float> in = RandomVector(rows * in_stride, rng);
    const std::vector<float> w = RandomVector(dim, rng);
    std::vector<float> want(rows * dim);
    DeviceBuffer din(in), dw(w), dout(want.size() * sizeof(float));
    RmsNormParams cpu{in.data(), w.data(), want.data(), rows,       dim,
                      in_stride, dim,      1e-5f,       DType::kF32};
    ASSERT_TRUE(RmsNorm(OpContext{}, cpu).ok());
    RmsNormParams gpu{din.get(), dw.as<float>(), dout.get(), rows, dim, in_stride,
                      dim,       1e-5f,          DType::kF32};
    ASSERT_TRUE(RmsNorm(CudaCtx(), gpu).ok());
    ExpectClose(dout.Download<float>(), want, 1e-4, 1e-11, "rms_norm dim " + std::to_string(dim));
  }
}

TEST(CudaOpsTest, ConvertMatchesCpuBitwise) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  // Random values over many binades plus the edge values: zeros, inf, NaN, subnormals of all
  // three types, overflow to inf, ties.
  std::vector<float> f = RandomVector(3001, rng, 100.0f);
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, 1e-40f, 6e-8f, 3e-8f,
                  65504.0f, 65520.0f, 1e38f, 3.4e38f, F32FromBits(0x3f808000u)}) {
    f.push_back(x);
  }
  const int64_t n = static_cast<int64_t>(f.size());
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType from : types) {
    // Inputs of `from`: the f32 values converted on the CPU.
    std::vector<uint8_t> in(n * DTypeSize(from));
    ASSERT_TRUE(
        Convert(OpContext{}, ConvertParams{f.data(), in.data(), n, DType::kF32, from}).ok());
    for (DType to : types) {
      std::vector<uint8_t> want(n * DTypeSize(to));
      ASSERT_TRUE(Convert(OpContext{}, ConvertParams{in.data(), want.data(), n, from, to}).ok());
      DeviceBuffer din(in), dout(want.size());
      ASSERT_TRUE(Convert(CudaCtx(), ConvertParams{din.get(), dout.get(), n, from, to}).ok());
      EXPECT_EQ(dout.Download<uint8_t>(), want)
          << static_cast<int>(from) << " -> " << static_cast<int>(to);
    }
  }
}

TEST(CudaOpsTest, SiluMulAndAddMatchCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  const int64_t rows = 7, dim = 1000;
  // gate and up are the two halves of one fused [rows][2 * dim] projection.
  const std::vector<float> fused = RandomVector(rows * 2 * dim, rng, 3.0f);
  std::vector<float> want(rows * dim);
  DeviceBuffer dfused(fused), dout(want.size() * sizeof(float));
  SiluMulParams cpu{fused.data(), fused.data() + dim, want.data(), rows, dim, 2 * dim, 2 * dim,
                    dim};
  ASSERT_TRUE(SiluMul(OpContext{}, cpu).ok());
  SiluMulParams gpu{dfused.as<float>(),
                    dfused.as<float>() + dim,
                    dout.as<float>(),
                    rows,
                    dim,
                    2 * dim,
                    2 * dim,
                    dim};
  ASSERT_TRUE(SiluMul(CudaCtx(), gpu).ok());
  ExpectClose(dout.Download<float>(), want, 1e-5, 1e-12, "silu_mul");

  // In place: out aliases gate exactly.
  std::vector<float> inplace_want = fused;
  SiluMulParams cpu_inplace{inplace_want.data(),
                            inplace_want.data() + dim,
                            inplace_want.data(),
                            rows,
                            dim,
                            2 * dim,
                            2 * dim,
                            2 * dim};
  ASSERT_TRUE(SiluMul(OpContext{}, cpu_inplace).ok());
  SiluMulParams gpu_inplace{dfused.as<float>(),
                            dfused.as<float>() + dim,
                            dfused.as<float>(),
                            rows,
                            dim,
                            2 * dim,
                            2 * dim,
                            2 * dim};
  ASSERT_TRUE(SiluMul(CudaCtx(), gpu_inplace).ok());
  ExpectClose(dfused.Download<float>(), inplace_want, 1e-5, 1e-12, "silu_mul in place");

  const int64_t n = 100003;  // odd tail
  const std::vector<float> a = RandomVector(n, rng), b = RandomVector(n, rng);
  std::vector<float> sum(n);
  ASSERT_TRUE(Add(OpContext{}, AddParams{a.data(), b.data(), sum.data(), n}).ok());
  DeviceBuffer da(a), db(b);
  ASSERT_TRUE(Add(CudaCtx(), AddParams{da.as<float>(), db.as<float>(), da.as<float>(), n}).ok());
  EXPECT_EQ(da.Download<float>(), sum);  // one f32 rounding: bitwise
}

// A MoE layer's combine: experts in turn add their weighted rows into the tokens routed to them.
// The product is rounded before the add on both devices, so the sums are bitwise the CPU's.
TEST(CudaOpsTest, ScaledScatterAddIsBitwiseTheCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(35);
  const int64_t tokens = 37, dim = 2049;
  std::vector<float> want = RandomVector(tokens * dim, rng);
  DeviceBuffer dout(want);
  for (int expert = 0; expert < 4; ++expert) {
    std::vector<int32_t> rows;
    for (int32_t t = expert; t < tokens; t += 1 + expert) rows.push_back(t);
    const auto n = static_cast<int64_t>(rows.size());
    const std::vector<float> in = RandomVector(n * dim, rng, 2.0f);
    const std::vector<float> w = RandomVector(n, rng);
    ScaledScatterAddParams p{in.data(), rows.data(), w.data(), want.data(), n,
                             dim,       tokens,      dim,      dim};
    ASSERT_TRUE(ScaledScatterAdd(OpContext{}, p).ok());
    DeviceBuffer din(in), drows(rows), dw(w);
    p.in = din.as<float>();
    p.rows = drows.as<int32_t>();
    p.weights = dw.as<float>();
    p.out = dout.as<float>();
    ASSERT_TRUE(ScaledScatterAdd(CudaCtx(), p).ok());
  }
  EXPECT_EQ(dout.Download<float>(), want);
}

TEST(CudaOpsTest, RopeMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(34);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kRotateHalf}) {
    for (int64_t head_dim : {64, 128, 6}) {
      RopeFreqConfig fc;
      fc.head_dim = head_dim;
      fc.theta = 500000.0;
      fc.llama3.enabled = head_dim == 128;
      const std::vector<float> inv_freq = ComputeRopeInvFreq(fc).value();
      const int64_t tokens = 9, heads = 8, kv_heads = 2;
      const int64_t qs = heads * head_dim + 5, ks = kv_heads * head_dim;
      std::vector<float> q = RandomVector(tokens * qs, rng), k = RandomVector(tokens * ks, rng);
      const std::vector<int32_t> pos = {0, 1, 2, 15, 16, 1000, 8191, 100000, 131071};
      DeviceBuffer dq(q), dk(k), dpos(pos), dfreq(inv_freq);
      RopeParams p;
      p.num_tokens = tokens;
      p.num_heads = heads;
      p.num_kv_heads = kv_heads;
      p.head_dim = head_dim;
      p.q_token_stride = qs;
      p.k_token_stride = ks;
      p.style = style;
      RopeParams cpu = p;
      cpu.q = q.data();
      cpu.k = k.data();
      cpu.positions = pos.data();
      cpu.inv_freq = inv_freq.data();
      ASSERT_TRUE(Rope(OpContext{}, cpu).ok());
      RopeParams gpu = p;
      gpu.q = dq.as<float>();
      gpu.k = dk.as<float>();
      gpu.positions = dpos.as<int32_t>();
      gpu.inv_freq = dfreq.as<float>();
      ASSERT_TRUE(Rope(CudaCtx(), gpu).ok());
      const std::string what = "rope dim " + std::to_string(head_dim);
      ExpectClose(dq.Download<float>(), q, 1e-5, 1e-12, what + " q");
      ExpectClose(dk.Download<float>(), k, 1e-5, 1e-12, what + " k");
    }
  }
}

std::vector<uint16_t> To16(const std::vector<float>& f, DType dtype) {
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    out[i] = dtype == DType::kBF16 ? F32ToBf16(f[i]) : F32ToF16(f[i]);
  }
  return out;
}

TEST(CudaOpsTest, MatMulMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(35);
  struct Case {
    int64_t rows, in, out;
    bool bias, accumulate;
  };
  for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : {Case{1, 4096, 1000, false, false}, Case{37, 257, 129, true, false},
                          Case{5, 64, 3000, true, true}, Case{130, 512, 512, false, true}}) {
      const int64_t xs = c.in + 7, ys = c.out + 2;
      const std::vector<float> x = RandomVector(c.rows * xs, rng);
      const std::vector<float> wf = RandomVector(c.out * c.in, rng, 0.05f);
      const std::vector<float> bias = RandomVector(c.out, rng);
      const std::vector<float> y0 = RandomVector(c.rows * ys, rng);
      std::vector<uint8_t> w(c.out * c.in * DTypeSize(wt));
      if (wt == DType::kF32) {
        std::memcpy(w.data(), wf.data(), w.size());
      } else {
        const std::vector<uint16_t> w16 = To16(wf, wt);
        std::memcpy(w.data(), w16.data(), w.size());
      }
      MatMulParams p;
      p.num_rows = c.rows;
      p.in_features = c.in;
      p.out_features = c.out;
      p.x_row_stride = xs;
      p.y_row_stride = ys;
      p.w_dtype = wt;
      p.accumulate = c.accumulate;
      std::vector<float> want = y0;
      MatMulParams cpu = p;
      // bf16 weights run natively on the GPU with x rounded to bf16 (launch_config.h): the CPU
      // reference gets the same rounded x.
      std::vector<float> x_cpu = x;
      if (wt == DType::kBF16) {
        for (float& v : x_cpu) v = Bf16ToF32(F32ToBf16(v));
      }
      cpu.x = x_cpu.data();
      cpu.w = w.data();
      cpu.bias = c.bias ? bias.data() : nullptr;
      cpu.y = want.data();
      std::vector<uint8_t> cpu_ws(MatMulWorkspaceBytes(OpContext{}, cpu));
      cpu.workspace = cpu_ws.data();
      cpu.workspace_bytes = static_cast<int64_t>(cpu_ws.size());
      ASSERT_TRUE(MatMul(OpContext{}, cpu).ok());
      DeviceBuffer dx(x), dw(w), dbias(bias), dy(y0);
      MatMulParams gpu = p;
      gpu.x = dx.as<float>();
      gpu.w = dw.get();
      gpu.bias = c.bias ? dbias.as<float>() : nullptr;
      gpu.y = dy.as<float>();
      const int64_t ws_bytes = MatMulWorkspaceBytes(CudaCtx(), gpu);
      EXPECT_EQ(ws_bytes > 0, wt != DType::kF32);
      DeviceBuffer ws(static_cast<size_t>(ws_bytes));
      gpu.workspace = ws_bytes > 0 ? ws.get() : nullptr;
      gpu.workspace_bytes = ws_bytes;
      ASSERT_TRUE(MatMul(CudaCtx(), gpu).ok());
      // f32 sums of up to 4096 terms in different orders (cuBLAS vs the CPU kernel).
      ExpectClose(dy.Download<float>(), want, 1e-3, 1e-10,
                  "matmul rows " + std::to_string(c.rows) + " dtype " +
                      std::to_string(static_cast<int>(wt)));
    }
  }
}

// int8 weights (W8A8): bitwise the CPU's output (exact integer sums, the same float epilogue),
// for the GEMV and a prefill-sized GEMM, with bias and accumulate, a NaN row and a zero row.
TEST(CudaOpsTest, MatMulInt8IsBitwiseTheCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(61);
  for (int64_t rows : {int64_t{1}, int64_t{37}}) {
    for (bool accumulate : {false, true}) {
      MatMulParams p;
      p.num_rows = rows;
      p.in_features = 512;
      p.out_features = 300;
      p.x_row_stride = 516;
      p.y_row_stride = 304;
      p.accumulate = accumulate;
      p.w_dtype = DType::kI8;
      std::vector<float> x = RandomVector(rows * p.x_row_stride, rng);
      if (rows > 2) {
        x[1 * p.x_row_stride + 3] = std::numeric_limits<float>::quiet_NaN();
        std::fill(x.begin() + 2 * p.x_row_stride, x.begin() + 3 * p.x_row_stride, 0.0f);
      }
      const std::vector<float> wf = RandomVector(p.out_features * p.in_features, rng);
      std::vector<int8_t> wq(wf.size());
      std::vector<float> scales(p.out_features);
      QuantizeRowsInt8(wf.data(), p.out_features, p.in_features, wq.data(), scales.data());
      const std::vector<float> bias = RandomVector(p.out_features, rng);
      const std::vector<float> y0 = RandomVector(rows * p.y_row_stride, rng);
      std::vector<float> want = y0;
      MatMulParams cpu = p;
      cpu.x = x.data();
      cpu.w = wq.data();
      cpu.w_scales = scales.data();
      cpu.bias = bias.data();
      cpu.y = want.data();
      std::vector<uint8_t> cpu_ws(MatMulWorkspaceBytes(OpContext{}, cpu));
      cpu.workspace = cpu_ws.data();
      cpu.workspace_bytes = static_cast<int64_t>(cpu_ws.size());
      ASSERT_TRUE(MatMul(OpContext{}, cpu).ok());
      DeviceBuffer dx(x), dw(wq), ds(scales), db(bias), dy(y0);
      MatMulParams gpu = p;
      gpu.x = dx.as<float>();
      gpu.w = dw.get();
      gpu.w_scales = ds.as<float>();
      gpu.bias = db.as<float>();
      gpu.y = dy.as<float>();
      const int64_t ws_bytes = MatMulWorkspaceBytes(CudaCtx(), gpu);
      DeviceBuffer ws(static_cast<size_t>(ws_bytes));
      gpu.workspace = ws.get();
      gpu.workspace_bytes = ws_bytes;
      ASSERT_TRUE(MatMul(CudaCtx(), gpu).ok());
      const std::vector<float> got = dy.Download<float>();
      EXPECT_TRUE(cuda::testing::BitwiseOrBothNaN(got, want))
          << rows << " rows, accumulate " << accumulate;
    }
  }
}

TEST(CudaOpsTest, MatMulRejectsShortWorkspace) {
  PD_SKIP_WITHOUT_GPU();
  DeviceBuffer dx(64 * sizeof(float)), dw(64 * 2), dy(64 * sizeof(float));
  MatMulParams p;
  p.x = dx.as<float>();
  p.w = dw.get();
  p.y = dy.as<float>();
  p.num_rows = 1;
  p.in_features = 8;
  p.out_features = 8;
  p.x_row_stride = p.in_features;
  p.y_row_stride = p.out_features;
  p.w_dtype = DType::kBF16;
  EXPECT_EQ(MatMul(CudaCtx(), p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaOpsTest, CopyBlocksMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  const int64_t blocks = 16, block_bytes = 200 * 1024 + 8, stride = block_bytes + 8;  // tails
  std::vector<uint8_t> pool(blocks * stride);
  for (uint8_t& b : pool) {
    b = static_cast<uint8_t>(rng());
  }
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t copies = 6;
  // Gather pool blocks ids[0..6) into a contiguous staging buffer, on both backends.
  CopyBlocksParams p;
  p.num_copies = copies;
  p.block_bytes = block_bytes;
  p.src_block_stride_bytes = stride;
  p.dst_block_stride_bytes = block_bytes;
  p.src_num_blocks = blocks;
  p.dst_num_blocks = copies;
  std::vector<uint8_t> want(copies * block_bytes);
  CopyBlocksParams cpu = p;
  cpu.src = pool.data();
  cpu.dst = want.data();
  cpu.src_ids = ids.data();
  ASSERT_TRUE(CopyBlocks(OpContext{}, cpu).ok());
  DeviceBuffer dpool(pool), dids(ids), dstage(want.size());
  CopyBlocksParams gather = p;
  gather.src = dpool.get();
  gather.dst = dstage.get();
  gather.src_ids = dids.as<int32_t>();
  ASSERT_TRUE(CopyBlocks(CudaCtx(), gather).ok());
  EXPECT_EQ(dstage.Download<uint8_t>(), want);

  // Gather straight into pinned host memory (the tiering path), then scatter it back into
  // other blocks of the device pool: the destination blocks must equal the sources.
  uint8_t* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), want.size()), cudaSuccess);
  gather.dst = pinned;
  ASSERT_TRUE(CopyBlocks(CudaCtx(), gather).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(std::memcmp(pinned, want.data(), want.size()), 0);
  CopyBlocksParams scatter = p;
  scatter.src = pinned;
  scatter.dst = dpool.get();
  scatter.src_block_stride_bytes = block_bytes;
  scatter.dst_block_stride_bytes = stride;
  scatter.src_num_blocks = copies;
  scatter.dst_num_blocks = blocks;
  scatter.dst_ids = dids.as<int32_t>() + copies;  // ids[6..12): disjoint from the sources
  ASSERT_TRUE(CopyBlocks(CudaCtx(), scatter).ok());
  const std::vector<uint8_t> after = dpool.Download<uint8_t>();
  cudaFreeHost(pinned);
  for (int64_t i = 0; i < copies; ++i) {
    EXPECT_EQ(std::memcmp(after.data() + ids[copies + i] * stride, pool.data() + ids[i] * stride,
                          block_bytes),
              0)
        << i;
  }
  // Unaligned one-byte-granular copies take the byte path.
  CopyBlocksParams odd = p;
  odd.block_bytes = 333;
  odd.src_block_stride_bytes = 335;
  odd.dst_block_stride_bytes = 333;
  odd.src = dpool.as<uint8_t>() + 1;
  odd.src_num_blocks = 10;
  odd.dst = dstage.get();
  odd.src_ids = dids.as<int32_t>();
  odd.num_copies = 3;
  odd.dst_num_blocks = 3;
  std::vector<int32_t> small_ids(ids.begin(), ids.begin() + 3);
  for (int32_t& id : small_ids) {
    id %= 10;
  }
  DeviceBuffer dsmall(small_ids);
  odd.src_ids = dsmall.as<int32_t>();
  ASSERT_TRUE(CopyBlocks(CudaCtx(), odd).ok());
  const std::vector<uint8_t> staged = dstage.Download<uint8_t>();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(staged.data() + i * 333, after.data() + 1 + small_ids[i] * 335, 333), 0)
        << i;
  }
}

}  // namespace
}  // namespace pd::kernels
