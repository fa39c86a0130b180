// Multi-head latent attention on a GPU against the CPU (issue #34, "CUDA against the CPU"),
// label gpu: small random DeepSeek checkpoints from pd-make-model with dense MLPs (expert
// layers: engine_moe_forward_cuda_test), their weights uploaded and their latent cache in device
// memory. The logits agree within f32 rounding (cuBLAS sums in another order) over a prefill and
// 32 greedy steps, and so do the greedy tokens, for f32, bf16 and int8 latent caches. Skips
// without CUDA or a device.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "engine/model/device_weights.h"
#include "engine/model/forward_compare_test_util.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

struct Family {
  Architecture architecture;
  int32_t q_lora_rank;
};

TEST(MlaForwardCudaTest, LogitsAndGreedyTokensMatchTheCpu) {
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
  for (const Family family :
       {Family{Architecture::kDeepseekV2, 0}, Family{Architecture::kDeepseekV3, 24}}) {
    MakeModelOptions o;
    o.out_dir = dir->File(absl::StrCat("model", family.q_lora_rank));
    o.architecture = family.architecture;
    o.q_lora_rank = family.q_lora_rank;
    o.num_layers = 2;
    o.first_k_dense_replace = 2;
    o.seed = 11;
    ASSERT_TRUE(MakeModel(o).ok());
    absl::StatusOr<HfModel> model = HfModel::Load(o.out_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<ModelWeights> host = WeightsFromHf(*model);
    ASSERT_TRUE(host.ok()) << host.status();
    absl::StatusOr<std::unique_ptr<DeviceWeights>> up = DeviceWeights::Upload(*host, gpu);
    ASSERT_TRUE(up.ok()) << up.status();
    const ModelConfig& c = host->config;
    for (const kernels::DType kv :
         {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kI8}) {
      SCOPED_TRACE(absl::StrCat(ArchitectureName(c.architecture), " kv ", kernels::DTypeName(kv)));
      testing::ExpectCudaMatchesCpu(*host, (*up)->weights(), gpu, kv,
                                    [](LlamaForward&, LlamaForward&) {});
    }
  }
}

}  // namespace
}  // namespace pd::engine
