// The disaggregated cluster on GPUs (issue #9): a prefill worker on GPU 0 and a decode worker on
// GPU 1 (CUDA_VISIBLE_DEVICES per process), both `--device cuda`, the KV blocks moving between
// their device pools over the nccl transport; every greedy output must equal the CPU engine's,
// on a cache miss and on a hit. Label gpu: skips without two CUDA devices or an NCCL build.
// Never run on a GPU yet (docs/gpu.md).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "tests/e2e/cluster_fixture.h"
#include "transport/registry.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Generated;
using ::pd::e2e::Reference;
using ::testing::HasSubstr;

TEST(GpuClusterE2eTest, DisaggregatedOverNcclEqualsTheCpuEngine) {
  if (!transport::IsTransportBuilt("nccl")) {
    GTEST_SKIP() << "nccl transport not built (PD_ENABLE_NCCL)";
  }
  if (kernels::DeviceCount(kernels::Device::kCuda) < 2) {
    GTEST_SKIP() << "needs two CUDA devices (NCCL does not put two ranks on one GPU)";
  }
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-gpu-cluster-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Reference ref;  // the CPU engine
  Cluster c(
      dir->path(), 1, 1, "round_robin", {"--device=cuda", "--transport=nccl"}, {},
      [](const std::string& id) -> std::vector<std::string> {
        return {absl::StrCat("CUDA_VISIBLE_DEVICES=", id.rfind("prefill", 0) == 0 ? 0 : 1)};
      });
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs();
  const std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day,";
  for (const std::string& prompt : {prefix + " she", prefix + " she", prefix + " a big dog"}) {
    auto [tokens, text] = ref.Greedy(prompt, 32);
    Generated g = c.GenerateText(prompt, 32);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << c.Logs();
    EXPECT_EQ(g.tokens, tokens) << prompt;
    EXPECT_EQ(g.text, text) << prompt;
  }
  // The prompt's KV came from the prefill worker's GPU over NCCL.
  EXPECT_THAT(c.WorkerMetrics(1), HasSubstr("pd_worker_prefills_total{where=\"remote\"}"));
}

}  // namespace
}  // namespace pd
