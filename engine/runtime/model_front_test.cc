#include "engine/runtime/model_front.h"

#include <cstdint>
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
