#include "engine/runtime/model_front.h"

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/testing/temp_dir.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_test_util.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

// The router hashes prompts with ModelFront's fingerprint and tokenizer; the workers with
// ModelRuntime's. Both must agree bit for bit, or no prefix ever matches across them.
void ExpectSameAsRuntime(const ModelFront& front, const ModelRuntime& rt) {
  EXPECT_EQ(front.config(), rt.model_config());
  EXPECT_EQ(front.fingerprint(), rt.fingerprint());
  EXPECT_FALSE(front.fingerprint().empty());
  for (const char* text : {"Once upon a time", "", "a b  c\n\td"}) {
    absl::StatusOr<std::vector<uint32_t>> a =
        front.tokenizer().Encode(text, front.add_bos(), false);
    absl::StatusOr<std::vector<uint32_t>> b = rt.tokenizer().Encode(text, front.add_bos(), false);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*a, *b) << "text '" << text << "'";
  }
}

TEST(ModelFrontTest, Llama2cCheckpointMatchesTheWorkersRuntime) {
  absl::StatusOr<std::unique_ptr<ModelFront>> front =
      ModelFront::Load(testing::kStoriesModel, testing::kStoriesTokenizer);
  ASSERT_TRUE(front.ok()) << front.status();
  absl::StatusOr<std::unique_ptr<ModelRuntime>> rt =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  ASSERT_TRUE(rt.ok()) << rt.status();
  ExpectSameAsRuntime(**front, **rt);
  EXPECT_TRUE((*front)->add_bos());
}

TEST(ModelFrontTest, HuggingFaceDirectoryMatchesTheWorkersRuntime) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  MakeModelOptions o;
  o.out_dir = dir->File("tiny");
  o.preset = "tiny";
  o.seed = 7;
  o.dtype = kernels::DType::kBF16;  // norms converted to f32 by the workers, not by ModelFront
  absl::StatusOr<MakeModelResult> made = MakeModel(o);
  ASSERT_TRUE(made.ok()) << made.status();

  absl::StatusOr<std::unique_ptr<ModelFront>> front = ModelFront::Load(o.out_dir, "");
  ASSERT_TRUE(front.ok()) << front.status();
  ModelRuntimeConfig c;
  c.model = o.out_dir;
  c.kv_blocks = 16;
  c.threads = 1;
  absl::StatusOr<std::unique_ptr<ModelRuntime>> rt = ModelRuntime::Create(c);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ExpectSameAsRuntime(**front, **rt);
  EXPECT_EQ((*front)->config(), made->config);
}

// BOS as Hugging Face's tokenizer adds it: from tokenizer_config.json's add_bos_token, else
// from tokenizer.json's post-processor; never from config.json's bos_token_id alone (Qwen names
// one there that its tokenizer never adds).
TEST(ModelFrontTest, BosComesFromTheTokenizerNotTheConfig) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  MakeModelOptions o;
  o.out_dir = dir->File("tiny");
  o.preset = "tiny";
  ASSERT_TRUE(MakeModel(o).ok());
  auto add_bos = [&] {
    absl::StatusOr<std::unique_ptr<ModelFront>> front = ModelFront::Load(o.out_dir, "");
    EXPECT_TRUE(front.ok()) << front.status();
    return front.ok() && (*front)->add_bos();
  };
  auto rewrite = [](const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(path) << j.dump();
  };
  EXPECT_TRUE(add_bos());  // pd-make-model's post-processor: "<s> $A"
  const std::string config = o.out_dir + "/tokenizer_config.json";
  rewrite(config, [](nlohmann::json& j) { j["add_bos_token"] = false; });
  EXPECT_FALSE(add_bos());
  rewrite(config, [](nlohmann::json& j) { j.erase("add_bos_token"); });
  // A Qwen-style tokenizer: no post-processor, while config.json keeps its bos_token_id.
  rewrite(o.out_dir + "/tokenizer.json",
          [](nlohmann::json& j) { j["post_processor"] = nullptr; });
  EXPECT_FALSE(add_bos());
  rewrite(config, [](nlohmann::json& j) { j["add_bos_token"] = true; });
  EXPECT_TRUE(add_bos());
}

TEST(ModelFrontTest, MissingModelIsNotFound) {
  absl::StatusOr<std::unique_ptr<ModelFront>> front =
      ModelFront::Load("/nonexistent/pd-model", testing::kStoriesTokenizer);
  EXPECT_EQ(front.status().code(), absl::StatusCode::kNotFound) << front.status();
  EXPECT_EQ(ModelFront::Load("", "").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelFrontTest, Llama2cCheckpointWithoutTokenizerIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<ModelFront>> front = ModelFront::Load(testing::kStoriesModel, "");
  EXPECT_EQ(front.status().code(), absl::StatusCode::kInvalidArgument) << front.status();
  EXPECT_NE(front.status().message().find("--tokenizer"), std::string::npos) << front.status();
}

}  // namespace
}  // namespace pd::engine
