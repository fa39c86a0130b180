// The whole engine on a GPU against the CPU engine (issue #9 item 4), label gpu: stories260K
// greedy generations of several prompts batched together, and a prefix-cache hit on the CUDA
// engine, must give the CPU engine's tokens. Skips where the build has no CUDA or the machine
// no device. GPU logits are not bitwise the CPU's (cuBLAS sums in another order), so the tokens
// are compared, and the logits within a tolerance.
#include <cmath>
#include <memory>
#include <vector>

#include "engine/memory/device_kv_pool.h"
#include "engine/model/device_weights.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_test_util.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"

namespace pd::engine {
namespace {

bool CudaUsable() { return kernels::CheckDeviceAvailable(kernels::Device::kCuda).ok(); }

#define PD_SKIP_WITHOUT_CUDA()                                                       \
  if (!CudaUsable()) {                                                               \
    GTEST_SKIP() << "no CUDA device: "                                               \
                 << kernels::CheckDeviceAvailable(kernels::Device::kCuda).message(); \
  }

const std::vector<std::vector<uint32_t>> kPrompts = {
    {1},
    {1,   403, 407, 261, 378, 11,  300, 290, 350, 273, 270, 280,
     301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311},
    {1, 265, 266, 267},
    {1,   403, 407, 261, 378, 11,  300, 290, 350, 273, 270, 280, 301, 302, 303, 304, 305, 306, 307,
     308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321, 322, 323, 324, 325}};

TEST(ModelRuntimeCudaTest, GreedyOutputEqualsTheCpuEngine) {
  PD_SKIP_WITHOUT_CUDA();
  absl::StatusOr<std::unique_ptr<ModelRuntime>> cpu =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  absl::StatusOr<std::unique_ptr<ModelRuntime>> gpu =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCuda));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->kv_pool(), nullptr);
  EXPECT_EQ((*gpu)->kv_memory()->device(), kernels::Device::kCuda);
  std::vector<testing::Generated> want = testing::GreedyAll(cpu->get(), kPrompts, 60);
  std::vector<testing::Generated> got = testing::GreedyAll(gpu->get(), kPrompts, 60);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(want[i].status.ok()) << want[i].status;
    ASSERT_TRUE(got[i].status.ok()) << got[i].status;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
  }
}

// --kv_blocks 0 fills the GPU: far more blocks than the test default, and the same text.
TEST(ModelRuntimeCudaTest, AutoSizedPoolFillsTheGpuAndGivesTheSameText) {
  PD_SKIP_WITHOUT_CUDA();
  ModelRuntimeConfig config = testing::StoriesConfig(kernels::Device::kCuda);
  config.kv_blocks = 0;
  config.gpu_memory_fraction = 0.5;
  absl::StatusOr<std::unique_ptr<ModelRuntime>> gpu = ModelRuntime::Create(config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_GT((*gpu)->kv_blocks(), 10000);
  absl::StatusOr<std::unique_ptr<ModelRuntime>> cpu =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<testing::Generated> want = testing::GreedyAll(cpu->get(), kPrompts, 30);
  std::vector<testing::Generated> got = testing::GreedyAll(gpu->get(), kPrompts, 30);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
  }
}

TEST(ModelRuntimeCudaTest, PrefixCacheHitEqualsMissOnTheGpu) {
  PD_SKIP_WITHOUT_CUDA();
  absl::StatusOr<std::unique_ptr<ModelRuntime>> gpu =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCuda));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<std::vector<uint32_t>> one = {kPrompts[3]};
  std::vector<testing::Generated> miss = testing::GreedyAll(gpu->get(), one, 40, 1);
  std::vector<testing::Generated> hit = testing::GreedyAll(gpu->get(), one, 40, 100);
  ASSERT_TRUE(miss[0].status.ok() && hit[0].status.ok());
  EXPECT_EQ(miss[0].cached_tokens, 0u);
  EXPECT_GE(hit[0].cached_tokens, 32u);  // two full blocks of 16 reused
  EXPECT_EQ(hit[0].tokens, miss[0].tokens);
  // And the CPU engine agrees with both.
  absl::StatusOr<std::unique_ptr<ModelRuntime>> cpu =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(testing::GreedyAll(cpu->get(), one, 40)[0].tokens, miss[0].tokens);
}

// One Forward of a mixed batch (decode-like single tokens and prefills) on both devices:
// logits within f32 rounding of each other, and the KV written into the pools equal within
// the same tolerance (read back through DeviceKvPool).
TEST(ModelRuntimeCudaTest, ForwardLogitsMatchTheCpuWithinTolerance) {
  PD_SKIP_WITHOUT_CUDA();
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(testing::kStoriesModel);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelWeights host = WeightsFromLlama2c(*ckpt);
  absl::StatusOr<kernels::DeviceStream> stream =
      kernels::DeviceStream::Create(kernels::Device::kCuda);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const kernels::OpContext ctx = stream->context();
  absl::StatusOr<std::unique_ptr<DeviceWeights>> dw = DeviceWeights::Upload(host, ctx);
  ASSERT_TRUE(dw.ok()) << dw.status();
  const kvcache::KvLayout layout = KvLayoutForModel(host.config, 16);
  absl::StatusOr<std::unique_ptr<memory::DeviceKvPool>> dpool =
      memory::DeviceKvPool::Create(layout, 16, kernels::Device::kCuda);
  absl::StatusOr<std::unique_ptr<memory::DeviceKvPool>> hpool =
      memory::DeviceKvPool::Create(layout, 16, kernels::Device::kCpu);
  ASSERT_TRUE(dpool.ok() && hpool.ok());
  absl::StatusOr<std::unique_ptr<LlamaForward>> gf = LlamaForward::Create(
      &(*dw)->weights(), {(*dpool)->base(), kernels::DType::kF32, 16, 16}, ctx, {});
  absl::StatusOr<std::unique_ptr<LlamaForward>> cf = LlamaForward::Create(
      &host, {(*hpool)->base(), kernels::DType::kF32, 16, 16}, kernels::OpContext{}, {});
  ASSERT_TRUE(gf.ok()) << gf.status();
  ASSERT_TRUE(cf.ok()) << cf.status();
  const std::vector<int32_t> t0 = {3, 1}, t1 = {5}, t2 = {0, 2, 4};
  const std::vector<ForwardSequence> batch = {
      {kPrompts[1], 0, t0}, {kPrompts[0], 0, t1}, {kPrompts[3], 0, t2}};
  const int64_t vocab = host.config.vocab_size;
  std::vector<float> want(3 * vocab), got(3 * vocab);
  ASSERT_TRUE((*cf)->Forward(batch, want.data()).ok());
  ASSERT_TRUE((*gf)->Forward(batch, got.data()).ok());
  for (int64_t i = 0; i < 3 * vocab; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-3f + 1e-3f * std::abs(want[i])) << "logit " << i;
  }
  std::vector<uint8_t> a(layout.block_bytes()), b(layout.block_bytes());
  for (uint32_t blk = 0; blk < 6; ++blk) {
    ASSERT_TRUE((*hpool)->ReadBlock(BlockId(blk), a.data()).ok());
    ASSERT_TRUE((*dpool)->ReadBlock(BlockId(blk), b.data()).ok());
    const float* fa = reinterpret_cast<const float*>(a.data());
    const float* fb = reinterpret_cast<const float*>(b.data());
    for (size_t e = 0; e < a.size() / 4; ++e) {
      ASSERT_NEAR(fb[e], fa[e], 1e-3f + 1e-3f * std::abs(fa[e])) << "block " << blk << " " << e;
    }
  }
}

}  // namespace
}  // namespace pd::engine
