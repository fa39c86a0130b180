// Mixture-of-experts layers on the CUDA forward pass's path, run on the host: the weights
// uploaded (DeviceWeights on kCpu is a host copy in one allocation, the layout CUDA gets) and
// the metadata staged, so the router logits come down, the routing goes up and each expert's
// tokens are gathered and scattered by the device kernels' CPU backends. Logits, the KV pool
// and the routed-token counts are bitwise those of the direct path, for every family
// pd-make-model writes (Mixtral, Qwen3-MoE, DeepSeek-V2 and V3 with MLA and shared experts) and
// f32 and int8 weights. The CUDA kernels themselves are checked against the CPU by gpu tests
// (CudaOpsTest.ScaledScatterAddIsBitwiseTheCpu, engine_moe_forward_cuda_test).
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/base/status_macros.h"
#include "common/testing/temp_dir.h"
#include "engine/model/device_weights.h"
#include "engine/model/forward_compare_test_util.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

struct Family {
  Architecture arch;
  int32_t q_lora_rank;
  const char* name;  // the test's name
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

class MoeForwardTest : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-moe-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }

  // A small random checkpoint of the family: 3 layers (DeepSeek's first dense), 8 experts,
  // 2 per token.
  absl::StatusOr<ModelWeights> Make() {
    MakeModelOptions o;
    o.out_dir = dir_->File("model");
    o.preset = "tiny";
    o.architecture = GetParam().arch;
    o.num_layers = 3;
    o.vocab_size = 301;
    o.num_heads = 8;
    o.num_kv_heads = 4;
    o.head_dim = 16;
    o.q_lora_rank = GetParam().q_lora_rank;
    if (GetParam().arch != Architecture::kMixtral) o.moe_intermediate_size = 40;
    o.seed = 13;
    PD_RETURN_IF_ERROR(MakeModel(o).status());
    PD_ASSIGN_OR_RETURN(HfModel model, HfModel::Load(o.out_dir));
    model_ = std::make_unique<HfModel>(std::move(model));
    return WeightsFromHf(*model_);
  }

  std::optional<pd::testing::TempDir> dir_;
  std::unique_ptr<HfModel> model_;
};

TEST_P(MoeForwardTest, UploadedWeightsOnTheStagedPathGiveBitwiseEqualLogits) {
  absl::StatusOr<ModelWeights> weights = Make();
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_TRUE(weights->config.has_moe_layers());
  absl::StatusOr<ModelWeights> weights8 = QuantizeWeightsInt8(*weights);
  ASSERT_TRUE(weights8.ok()) << weights8.status();
  for (const ModelWeights* host : {&*weights, &*weights8}) {
    SCOPED_TRACE(kernels::DTypeName(host->dtype));
    absl::StatusOr<std::unique_ptr<DeviceWeights>> up =
        DeviceWeights::Upload(*host, kernels::OpContext{});
    ASSERT_TRUE(up.ok()) << up.status();
    const ModelWeights& copy = (*up)->weights();
    const ModelConfig& c = host->config;
    const int last = c.n_layers - 1;
    ASSERT_TRUE(c.moe_layer(last));
    ASSERT_EQ(copy.layers[last].experts.size(), host->layers[last].experts.size());
    EXPECT_NE(copy.layers[last].router, host->layers[last].router);
    EXPECT_NE(copy.layers[last].experts.back().w_down, host->layers[last].experts.back().w_down);
    EXPECT_EQ(copy.layers[last].experts.back().w_down_scales != nullptr,
              host->dtype == kernels::DType::kI8);
    EXPECT_EQ(copy.layers[last].w_shared_gate != nullptr, c.n_shared_experts > 0);
    if (host->layers[last].router_bias != nullptr) {  // V3: a host copy, the same values
      ASSERT_NE(copy.layers[last].router_bias, host->layers[last].router_bias);
      EXPECT_EQ(std::memcmp(copy.layers[last].router_bias, host->layers[last].router_bias,
                            c.n_experts * sizeof(float)),
                0);
    }
    testing::CompareSteps steps;
    for (uint32_t i = 0; i < 21; ++i) steps.prompt.push_back(3 + (i * 11) % 290);
    steps.decode_steps = 5;
    testing::ExpectStagedEqualsDirect(
        *host, copy, kernels::DType::kF32, steps, [&](LlamaForward& direct, LlamaForward& device) {
          EXPECT_EQ(device.expert_tokens(), direct.expert_tokens());
          int64_t routed = 0;
          for (int64_t n : device.expert_tokens()) routed += n;
          // Every token of every step went to top_k experts in each expert layer.
          const int64_t tokens = 21 + 3 + 2 * steps.decode_steps;
          EXPECT_EQ(routed, tokens * c.n_experts_per_tok * (c.n_layers - c.first_dense_layers));
          // The routing syncs with the host mid-step: decode steps are never graphs.
          EXPECT_EQ(device.graph_stats().captures, 0);
        });
  }
  ModelWeights broken;  // an expert without its down projection
  broken.config = weights->config;
  broken.dtype = weights->dtype;
  broken.embedding_dtype = weights->embedding_dtype;
  broken.embedding = weights->embedding;
  broken.classifier = weights->classifier;
  broken.final_norm = weights->final_norm;
  broken.layers = weights->layers;
  broken.layers.back().experts[5].w_down = nullptr;
  const absl::Status missing = DeviceWeights::Upload(broken, kernels::OpContext{}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_NE(missing.message().find("w_down of expert 5 of layer 2"), std::string::npos) << missing;
}

INSTANTIATE_TEST_SUITE_P(Families, MoeForwardTest,
                         ::testing::Values(Family{Architecture::kMixtral, 0, "Mixtral"},
                                           Family{Architecture::kQwen3Moe, 0, "Qwen3Moe"},
                                           Family{Architecture::kDeepseekV2, 0, "DeepseekV2"},
                                           Family{Architecture::kDeepseekV3, 24, "DeepseekV3"}),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace pd::engine
