// Test helpers that run one model through two forward passes and compare them step by step:
// the direct host path against the staged (CUDA-layout) path on the host, bitwise; and the CPU
// against CUDA, within f32 rounding. Used by the MLA and mixture-of-experts tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/device_memory.h"

namespace pd::engine::testing {

// What the two passes are given: a prompt (its first sequence) beside a 3-token one, then
// decode steps feeding both sequences fixed tokens (40 + i, 90 + i).
struct CompareSteps {
  std::vector<uint32_t> prompt;
  int64_t decode_steps = 6;
  int64_t block_size = 16;
  int64_t num_blocks = 8;
  // Both passes' options (the staged one with staged_metadata set) and context (its thread
  // team; kCpu).
  ForwardOptions options;
  kernels::OpContext ctx;
};

// Runs `direct` (host weights, the direct path) and `uploaded` (DeviceWeights on kCpu, staged
// metadata; with tensor parallelism the host weights, which each rank's shard is uploaded from)
// over `steps` with a `kv` cache each, and expects every step's logits and the final
// pools bitwise equal. `check` then sees both forward passes (direct first).
inline void ExpectStagedEqualsDirect(
    const ModelWeights& direct, const ModelWeights& uploaded, kernels::DType kv,
    const CompareSteps& steps, const std::function<void(LlamaForward&, LlamaForward&)>& check) {
  const ModelConfig& c = direct.config;
  const int64_t bs = steps.block_size, blocks = steps.num_blocks;
  const int64_t block =
      kernels::DenseKvBlockBytes(kv, c.n_layers, c.cache_kv_heads(), bs, c.cache_head_dim());
  std::vector<float> pool_a(blocks * block / 4 + 1, 0.0f), pool_b(pool_a.size(), 0.0f);
  ForwardOptions staged = steps.options;
  staged.staged_metadata = true;
  absl::StatusOr<std::unique_ptr<LlamaForward>> a_pass =
      LlamaForward::Create(&direct, {pool_a.data(), kv, blocks, bs}, steps.ctx, steps.options);
  absl::StatusOr<std::unique_ptr<LlamaForward>> b_pass =
      LlamaForward::Create(&uploaded, {pool_b.data(), kv, blocks, bs}, steps.ctx, staged);
  ASSERT_TRUE(a_pass.ok()) << a_pass.status();
  ASSERT_TRUE(b_pass.ok()) << b_pass.status();
  const int64_t vocab = (*a_pass)->vocab_size();
  const std::vector<uint32_t>& prompt = steps.prompt;
  const std::vector<uint32_t> other = {1, 265, 266};
  const int64_t prompt_blocks = (static_cast<int64_t>(prompt.size()) + steps.decode_steps) / bs + 1;
  std::vector<int32_t> t_a(prompt_blocks), t_b((3 + steps.decode_steps) / bs + 1);
  std::iota(t_a.begin(), t_a.end(), 0);
  std::iota(t_b.begin(), t_b.end(), static_cast<int32_t>(prompt_blocks));
  ASSERT_LE(static_cast<int64_t>(t_a.size() + t_b.size()), blocks);
  std::vector<float> a(2 * vocab), b(2 * vocab);
  ASSERT_TRUE((*a_pass)->Forward({{prompt, 0, t_a}, {other, 0, t_b}}, a.data()).ok());
  ASSERT_TRUE((*b_pass)->Forward({{prompt, 0, t_a}, {other, 0, t_b}}, b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "prefill";
  for (int64_t i = 0; i < steps.decode_steps; ++i) {
    const std::vector<uint32_t> x = {static_cast<uint32_t>(40 + i)};
    const std::vector<uint32_t> y = {static_cast<uint32_t>(90 + i)};
    const std::vector<ForwardSequence> step = {{x, static_cast<int64_t>(prompt.size()) + i, t_a},
                                               {y, static_cast<int64_t>(other.size()) + i, t_b}};
    ASSERT_TRUE((*a_pass)->Forward(step, a.data()).ok());
    ASSERT_TRUE((*b_pass)->Forward(step, b.data()).ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "decode step " << i;
  }
  EXPECT_EQ(std::memcmp(pool_a.data(), pool_b.data(), pool_a.size() * 4), 0);
  check(**a_pass, **b_pass);
}

inline int64_t Argmax(const float* logits, int64_t n) {
  return std::max_element(logits, logits + n) - logits;
}

// The CPU forward pass of `host` against the CUDA one of `device` (its DeviceWeights, on the
// stream of `gpu`), each with a `kv` cache of 16 blocks of 16: a prefill of two sequences and
// 32 greedy steps, both fed the CPU's tokens. Logits agree within f32 rounding (cuBLAS sums in
// another order), and the GPU's argmax is the CPU's wherever the CPU's best two logits are not
// a near tie (random weights give flat logits). `check` then sees both passes (CPU first).
inline void ExpectCudaMatchesCpu(const ModelWeights& host, const ModelWeights& device,
                                 const kernels::OpContext& gpu, kernels::DType kv,
                                 const std::function<void(LlamaForward&, LlamaForward&)>& check) {
  constexpr int64_t kBlockSize = 16, kBlocks = 16;
  const ModelConfig& c = host.config;
  const int64_t bytes = kBlocks * kernels::DenseKvBlockBytes(kv, c.n_layers, c.cache_kv_heads(),
                                                             kBlockSize, c.cache_head_dim());
  std::vector<float> cpu_pool(bytes / 4 + 1, 0.0f);
  absl::StatusOr<kernels::DeviceBuffer> gpu_pool =
      kernels::DeviceBuffer::Allocate(kernels::Device::kCuda, bytes);
  ASSERT_TRUE(gpu_pool.ok()) << gpu_pool.status();
  absl::StatusOr<std::unique_ptr<LlamaForward>> cf =
      LlamaForward::Create(&host, {cpu_pool.data(), kv, kBlocks, kBlockSize}, {}, {});
  absl::StatusOr<std::unique_ptr<LlamaForward>> gf =
      LlamaForward::Create(&device, {gpu_pool->data(), kv, kBlocks, kBlockSize}, gpu, {});
  ASSERT_TRUE(cf.ok()) << cf.status();
  ASSERT_TRUE(gf.ok()) << gf.status();
  const int64_t vocab = c.vocab_size;
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 21; ++i) prompt.push_back(100 + (i * 11) % 400);
  const std::vector<uint32_t> other = {1, 265, 266};
  std::vector<int32_t> t_a(5), t_b(4);
  std::iota(t_a.begin(), t_a.end(), 0);
  std::iota(t_b.begin(), t_b.end(), 5);
  std::vector<float> want(2 * vocab), got(2 * vocab);
  ASSERT_TRUE((*cf)->Forward({{prompt, 0, t_a}, {other, 0, t_b}}, want.data()).ok());
  ASSERT_TRUE((*gf)->Forward({{prompt, 0, t_a}, {other, 0, t_b}}, got.data()).ok());
  for (int64_t i = 0; i < 2 * vocab; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-3f + 1e-3f * std::abs(want[i])) << "logit " << i;
  }
  auto next_a = static_cast<uint32_t>(Argmax(want.data(), vocab));
  auto next_b = static_cast<uint32_t>(Argmax(want.data() + vocab, vocab));
  for (int64_t step = 0; step < 32; ++step) {
    const int64_t pa = static_cast<int64_t>(prompt.size()) + step;
    const int64_t pb = static_cast<int64_t>(other.size()) + step;
    const std::vector<uint32_t> xa = {next_a}, xb = {next_b};
    ASSERT_TRUE((*cf)->Forward({{xa, pa, t_a}, {xb, pb, t_b}}, want.data()).ok());
    ASSERT_TRUE((*gf)->Forward({{xa, pa, t_a}, {xb, pb, t_b}}, got.data()).ok());
    for (int64_t row = 0; row < 2; ++row) {
      const float* w = want.data() + row * vocab;
      const float* g = got.data() + row * vocab;
      for (int64_t i = 0; i < vocab; ++i) {
        ASSERT_NEAR(g[i], w[i], 1e-3f + 1e-3f * std::abs(w[i])) << "step " << step;
      }
      const int64_t best = Argmax(w, vocab);
      float second = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) {
        if (i != best) second = std::max(second, w[i]);
      }
      if (w[best] - second > 1e-2f) {
        EXPECT_EQ(Argmax(g, vocab), best) << "step " << step << " row " << row;
      }
    }
    next_a = static_cast<uint32_t>(Argmax(want.data(), vocab));
    next_b = static_cast<uint32_t>(Argmax(want.data() + vocab, vocab));
  }
  check(**cf, **gf);
}

}  // namespace pd::engine::testing
