// GPU tests of the CUDA sampler (label gpu): tokens against the CPU op on the same logits and
// (seed, step, temperature, min_p, top_k, top_p), and the logit edits bitwise against the CPU's.
// Skip without a CUDA device.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/sampling.h"

namespace pd::kernels {
namespace {

using cuda::testing::CudaCtx;
using cuda::testing::DeviceBuffer;
using testing::RandomVector;

struct Rows {
  int64_t num_seqs = 0;
  int64_t vocab = 0;
  int64_t stride = 0;
  std::vector<float> logits, temperature, top_p;
  std::vector<float> min_p;  // empty = none
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seeds, steps;
};

// CPU tokens and GPU tokens for the same rows.
void RunBoth(const Rows& r, bool all_greedy, std::vector<int32_t>* cpu_tokens,
             std::vector<int32_t>* gpu_tokens) {
  SamplingParams p;
  p.num_seqs = r.num_seqs;
  p.vocab_size = r.vocab;
  p.logits_stride = r.stride;
  SamplingParams cpu = p;
  cpu_tokens->assign(r.num_seqs, -1);
  cpu.logits = r.logits.data();
  cpu.out_tokens = cpu_tokens->data();
  if (!all_greedy) {
    cpu.temperature = r.temperature.data();
    cpu.top_k = r.top_k.data();
    cpu.top_p = r.top_p.data();
    cpu.seeds = r.seeds.data();
    cpu.steps = r.steps.data();
    cpu.min_p = r.min_p.empty() ? nullptr : r.min_p.data();
  }
  std::vector<uint8_t> ws(SamplingWorkspaceBytes(OpContext{}, cpu));
  cpu.workspace = ws.data();
  cpu.workspace_bytes = static_cast<int64_t>(ws.size());
  ASSERT_TRUE(Sample(OpContext{}, cpu).ok());

  DeviceBuffer logits(r.logits), out(r.num_seqs * sizeof(int32_t));
  DeviceBuffer temp(r.temperature), top_k(r.top_k), top_p(r.top_p), seeds(r.seeds), steps(r.steps);
  DeviceBuffer min_p(r.min_p);
  SamplingParams gpu = p;
  gpu.logits = logits.as<float>();
  gpu.out_tokens = out.as<int32_t>();
  if (!all_greedy) {
    gpu.temperature = temp.as<float>();
    gpu.top_k = top_k.as<int32_t>();
    gpu.top_p = top_p.as<float>();
    gpu.seeds = seeds.as<uint64_t>();
    gpu.steps = steps.as<uint64_t>();
    gpu.min_p = r.min_p.empty() ? nullptr : min_p.as<float>();
  }
  EXPECT_EQ(SamplingWorkspaceBytes(CudaCtx(), gpu), 0);
  ASSERT_TRUE(Sample(CudaCtx(), gpu).ok());
  *gpu_tokens = out.Download<int32_t>();
}

Rows MakeRows(int64_t num_seqs, int64_t vocab, std::mt19937& rng) {
  Rows r;
  r.num_seqs = num_seqs;
  r.vocab = vocab;
  r.stride = vocab + 3;
  r.logits = RandomVector(num_seqs * r.stride, rng, 3.0f);
  for (int64_t s = 0; s < num_seqs; ++s) {
    r.temperature.push_back(s % 7 == 0 ? 0.0f : 0.3f + 0.2f * static_cast<float>(s % 5));
    r.top_k.push_back(static_cast<int32_t>(std::vector<int>{0, 1, 5, 50, -1}[s % 5]));
    r.top_p.push_back(std::vector<float>{1.0f, 0.9f, 0.5f, 1e-4f}[s % 4]);
    r.seeds.push_back(1000 + s);
    r.steps.push_back(static_cast<uint64_t>(s * 3));
  }
  return r;
}

// 1 (and the row's settings and both tokens' logits, printed) when the devices disagree on
// row s, else 0.
int ReportMismatch(const Rows& r, int64_t s, int32_t cpu, int32_t gpu) {
  if (cpu == gpu) {
    return 0;
  }
  std::printf(
      "vocab %lld row %lld (T %g, top_k %d, top_p %g): gpu %d (logit %g), cpu %d (logit %g)\n",
      static_cast<long long>(r.vocab), static_cast<long long>(s), r.temperature[s], r.top_k[s],
      r.top_p[s], gpu, r.logits[s * r.stride + gpu], cpu, r.logits[s * r.stride + cpu]);
  return 1;
}

TEST(CudaSamplingTest, GreedyMatchesCpuExactly) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  Rows r = MakeRows(6, 50000, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  r.logits[0 * r.stride + 123] = 100.0f;  // ties: the lowest id wins
  r.logits[0 * r.stride + 40000] = 100.0f;
  r.logits[1 * r.stride + 7] = nan;  // NaN never wins
  r.logits[1 * r.stride + 9] = inf;
  for (int64_t i = 0; i < r.vocab; ++i) {
    r.logits[2 * r.stride + i] = nan;   // all NaN: token 0
    r.logits[3 * r.stride + i] = -inf;  // all -inf: the first
  }
  r.logits[3 * r.stride + 5] = nan;
  std::vector<int32_t> cpu, gpu;
  RunBoth(r, /*all_greedy=*/true, &cpu, &gpu);
  EXPECT_EQ(gpu, cpu);
  for (int64_t s = 0; s < r.num_seqs; ++s) {
    if (gpu[s] == cpu[s]) continue;
    // Name the logits, and run the row alone: a row-only bug or a batch one.
    Rows alone = r;
    alone.num_seqs = 1;
    alone.logits.assign(r.logits.begin() + s * r.stride, r.logits.begin() + (s + 1) * r.stride);
    std::vector<int32_t> cpu1, gpu1;
    RunBoth(alone, /*all_greedy=*/true, &cpu1, &gpu1);
    ADD_FAILURE() << "row " << s << ": gpu " << gpu[s] << " (logit "
                  << r.logits[s * r.stride + gpu[s]] << "), cpu " << cpu[s] << " (logit "
                  << r.logits[s * r.stride + cpu[s]] << "); alone: gpu " << gpu1[0] << ", cpu "
                  << cpu1[0];
  }
  EXPECT_EQ(gpu[0], 123);
  EXPECT_EQ(gpu[1], 9);
  EXPECT_EQ(gpu[2], 0);
  EXPECT_EQ(gpu[3], 0);
}

// One long row (many ids per thread) with its maximum placed at ids that fall on every kind
// of thread and warp position: greedy must return it, and the row must read back unchanged.
TEST(CudaSamplingTest, GreedyFindsTheMaximumAnywhereInALongRow) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  constexpr int64_t kVocab = 50000;
  const std::vector<float> base = RandomVector(kVocab, rng, 3.0f);
  for (int64_t at :
       {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{32}, int64_t{877}, int64_t{985}, int64_t{1023},
        int64_t{1024}, int64_t{27609}, int64_t{42861}, int64_t{49999}}) {
    Rows r;
    r.num_seqs = 1;
    r.vocab = kVocab;
    r.stride = kVocab;
    r.logits = base;
    r.logits[at] = 20.0f;
    DeviceBuffer back(r.logits);
    const std::vector<float> read = back.Download<float>();
    EXPECT_EQ(std::memcmp(read.data(), r.logits.data(), kVocab * 4), 0)
        << "read back, max at " << at;
    std::vector<int32_t> cpu, gpu;
    RunBoth(r, /*all_greedy=*/true, &cpu, &gpu);
    EXPECT_EQ(cpu[0], at);
    EXPECT_EQ(gpu[0], at) << "max at " << at;
  }
}

TEST(CudaSamplingTest, SampledTokensMatchCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(42);
  for (int64_t vocab : {int64_t{3}, int64_t{255}, int64_t{1000}, int64_t{32000}, int64_t{128256}}) {
    Rows r = MakeRows(64, vocab, rng);
    r.logits[5 * r.stride + 1] = std::numeric_limits<float>::quiet_NaN();
    r.logits[6 * r.stride + 0] = r.logits[6 * r.stride + 2];  // a tie, broken by id
    std::vector<int32_t> cpu, gpu;
    RunBoth(r, /*all_greedy=*/false, &cpu, &gpu);
    // The CPU sums double weights, CUDA 36-bit fixed-point ones from an f32 exp, so a draw
    // landing within ~1e-7 of a cumulative boundary may pick the neighbour; with these seeds
    // that is rare. Allow 1 in 64.
    int mismatches = 0;
    for (int64_t s = 0; s < r.num_seqs; ++s) {
      ASSERT_GE(gpu[s], 0);
      ASSERT_LT(gpu[s], vocab);
      EXPECT_FALSE(std::isnan(r.logits[s * r.stride + gpu[s]])) << s;
      mismatches += ReportMismatch(r, s, cpu[s], gpu[s]);
    }
    EXPECT_LE(mismatches, 1) << "vocab " << vocab;
  }
}

// top_k = 1 and a tiny top_p keep exactly the best candidate: sampling becomes greedy.
TEST(CudaSamplingTest, NarrowCutsAreGreedy) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  Rows r = MakeRows(16, 4096, rng);
  for (int64_t s = 0; s < r.num_seqs; ++s) {
    r.temperature[s] = 1.0f;
    r.top_k[s] = s % 2 == 0 ? 1 : 0;
    r.top_p[s] = s % 2 == 0 ? 1.0f : 1e-9f;
  }
  std::vector<int32_t> cpu, gpu, greedy_cpu, greedy_gpu;
  RunBoth(r, /*all_greedy=*/false, &cpu, &gpu);
  RunBoth(r, /*all_greedy=*/true, &greedy_cpu, &greedy_gpu);
  EXPECT_EQ(gpu, greedy_cpu);
  EXPECT_EQ(cpu, greedy_cpu);
}

// Temperatures below kMinSamplingTemperature (subnormals included) are greedy on the GPU as on
// the CPU; rows with ties at the top show it (sampling would draw either tied id).
TEST(CudaSamplingTest, TemperaturesBelowTheThresholdAreGreedy) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(45);
  Rows r = MakeRows(8, 4096, rng);
  const float temps[] = {
      0.0f,   -0.0f, std::numeric_limits<float>::denorm_min(),     1e-42f, 1e-39f,
      1e-38f, 1e-6f, std::nextafter(kMinSamplingTemperature, 0.0f)};
  for (int64_t s = 0; s < r.num_seqs; ++s) {
    r.logits[s * r.stride + 10] = 50.0f;  // a tie at the top: greedy takes id 10
    r.logits[s * r.stride + 20] = 50.0f;
    r.temperature[s] = temps[s];
    r.top_k[s] = 0;
    r.top_p[s] = 1.0f;
  }
  std::vector<int32_t> cpu, gpu;
  RunBoth(r, /*all_greedy=*/false, &cpu, &gpu);
  EXPECT_EQ(cpu, std::vector<int32_t>(8, 10));
  EXPECT_EQ(gpu, std::vector<int32_t>(8, 10));
}

// Integer sums make the kernel deterministic: the same rows give the same tokens every run.
TEST(CudaSamplingTest, RepeatsExactly) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(44);
  Rows r = MakeRows(32, 128256, rng);
  std::vector<int32_t> cpu, first, again;
  RunBoth(r, /*all_greedy=*/false, &cpu, &first);
  for (int run = 0; run < 3; ++run) {
    RunBoth(r, /*all_greedy=*/false, &cpu, &again);
    EXPECT_EQ(again, first) << "run " << run;
  }
}

// min-p on the GPU keeps the CPU's tokens: alone, with top-k and top-p after it, and at 1
// (only the maximum).
TEST(CudaSamplingTest, MinPMatchesCpu) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(46);
  for (int64_t vocab : {int64_t{300}, int64_t{32000}, int64_t{128256}}) {
    Rows r = MakeRows(64, vocab, rng);
    for (int64_t s = 0; s < r.num_seqs; ++s) {
      r.min_p.push_back(std::vector<float>{0.0f, 0.01f, 0.1f, 0.5f, 1.0f}[s % 5]);
    }
    std::vector<int32_t> cpu, gpu;
    RunBoth(r, /*all_greedy=*/false, &cpu, &gpu);
    int mismatches = 0;
    for (int64_t s = 0; s < r.num_seqs; ++s) {
      mismatches += ReportMismatch(r, s, cpu[s], gpu[s]);
    }
    EXPECT_LE(mismatches, 1) << "vocab " << vocab;  // boundary draws, as SampledTokensMatchCpu
  }
}

// The edits' arithmetic is bitwise the CPU's (no FMA contraction, IEEE division), on rows with
// NaN (masked) and infinite logits too.
TEST(CudaSamplingTest, LogitEditsMatchCpuBitwise) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(47);
  constexpr int64_t kSeqs = 8, kVocab = 5000, kStride = 5003;
  std::vector<float> logits = RandomVector(kSeqs * kStride, rng, 4.0f);
  logits[3] = std::numeric_limits<float>::quiet_NaN();
  logits[kStride + 4] = std::numeric_limits<float>::infinity();
  std::vector<LogitEdit> edits;
  std::vector<int32_t> rows;
  std::uniform_real_distribution<float> pen(-2.0f, 2.0f), rep(0.1f, 3.0f), bias(-100.0f, 100.0f);
  for (int64_t s = 0; s < kSeqs; ++s) {
    for (int32_t t = static_cast<int32_t>(s); t < kVocab; t += 3 + static_cast<int32_t>(s)) {
      LogitEdit e;
      e.token = t;
      e.bias = t % 5 == 0 ? bias(rng) : 0.0f;
      e.repetition = t % 2 == 0 ? rep(rng) : 1.0f;
      e.frequency = pen(rng) * static_cast<float>(t % 7);
      e.presence = pen(rng);
      edits.push_back(e);
      rows.push_back(static_cast<int32_t>(s));
    }
  }
  edits.push_back({3, 1.0f, 2.0f, 0.5f, 0.5f});  // the NaN stays NaN
  rows.push_back(0);
  edits.push_back({4, -100.0f, 1.5f, 0.0f, 0.0f});  // +inf - 100 / 1.5 = +inf
  rows.push_back(1);
  LogitEditParams p;
  p.num_edits = static_cast<int64_t>(edits.size());
  p.num_seqs = kSeqs;
  p.vocab_size = kVocab;
  p.logits_stride = kStride;
  std::vector<float> cpu = logits;
  LogitEditParams c = p;
  c.logits = cpu.data();
  c.edits = edits.data();
  c.rows = rows.data();
  ASSERT_TRUE(ApplyLogitEdits(OpContext{}, c).ok());
  DeviceBuffer d_logits(logits), d_edits(edits), d_rows(rows);
  LogitEditParams g = p;
  g.logits = d_logits.as<float>();
  g.edits = d_edits.as<LogitEdit>();
  g.rows = d_rows.as<int32_t>();
  ASSERT_TRUE(ApplyLogitEdits(CudaCtx(), g).ok());
  const std::vector<float> gpu = d_logits.Download<float>();
  EXPECT_TRUE(cuda::testing::BitwiseOrBothNaN(gpu, cpu));
  EXPECT_TRUE(std::isnan(gpu[3]));
}

}  // namespace
}  // namespace pd::kernels
