// Mixture-of-experts layers on a GPU against the CPU (issue #34), label gpu: small random
// Mixtral, Qwen3-MoE and DeepSeek-V3 (MLA, shared experts, the selection bias) checkpoints from
// pd-make-model, their weights uploaded, the routing done on the host from the router logits
// brought down. The logits agree within f32 rounding (cuBLAS sums in another order) over a
// prefill and 32 greedy steps, the experts received the same tokens, and the greedy tokens
// agree away from near ties. Skips without CUDA or a device.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "engine/model/device_weights.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/device_memory.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kBlocks = 16;

struct Family {
  Architecture architecture;
  int32_t q_lora_rank;
};

int64_t Argmax(const float* logits, int64_t n) {
  return std::max_element(logits, logits + n) - logits;
}

TEST(MoeForwardCudaTest, LogitsRoutingAndGreedyTokensMatchTheCpu) {
  const absl::Status usable = kernels::CheckDeviceAvailable(kernels::Device::kCuda);
  if (!usable.ok()) {
    GTEST_SKIP() << "no CUDA device: " << usable.message();
  }
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<kernels::DeviceStream> stream =
      kernels::DeviceStream::Create(kernels::Device::kCuda);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const kernels::OpContext gpu = stream->context();
  for (const Family family : {Family{Architecture::kMixtral, 0}, Family{Architecture::kQwen3Moe, 0},
                              Family{Architecture::kDeepseekV3, 24}}) {
    MakeModelOptions o;
    o.out_dir = dir->File(absl::StrCat("model", static_cast<int>(family.architecture)));
    o.architecture = family.architecture;
    o.q_lora_rank = family.q_lora_rank;
    o.num_layers = 3;
    o.seed = 11;
    ASSERT_TRUE(MakeModel(o).ok());
    absl::StatusOr<HfModel> model = HfModel::Load(o.out_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<ModelWeights> host = WeightsFromHf(*model);
    ASSERT_TRUE(host.ok()) << host.status();
    absl::StatusOr<std::unique_ptr<DeviceWeights>> up = DeviceWeights::Upload(*host, gpu);
    ASSERT_TRUE(up.ok()) << up.status();
    const ModelConfig& c = host->config;
    for (const kernels::DType kv : {kernels::DType::kF32, kernels::DType::kBF16}) {
      SCOPED_TRACE(absl::StrCat(ArchitectureName(c.architecture), " kv ", kernels::DTypeName(kv)));
      const int64_t bytes = kBlocks * kernels::DenseKvBlockBytes(kv, c.n_layers, c.cache_kv_heads(),
                                                                 kBlockSize, c.cache_head_dim());
      std::vector<float> cpu_pool(bytes / 4 + 1, 0.0f);
      absl::StatusOr<kernels::DeviceBuffer> gpu_pool =
          kernels::DeviceBuffer::Allocate(kernels::Device::kCuda, bytes);
      ASSERT_TRUE(gpu_pool.ok()) << gpu_pool.status();
      absl::StatusOr<std::unique_ptr<LlamaForward>> cf =
          LlamaForward::Create(&*host, {cpu_pool.data(), kv, kBlocks, kBlockSize}, {}, {});
      absl::StatusOr<std::unique_ptr<LlamaForward>> gf = LlamaForward::Create(
          &(*up)->weights(), {gpu_pool->data(), kv, kBlocks, kBlockSize}, gpu, {});
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
      // 32 greedy steps, both engines fed the CPU's token: the GPU's argmax is the CPU's
      // wherever the CPU's best two logits are not a near tie (random weights give flat logits).
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
      EXPECT_EQ((*gf)->expert_tokens(), (*cf)->expert_tokens());
    }
  }
}

}  // namespace
}  // namespace pd::engine
