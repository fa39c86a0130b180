// Tensor parallelism through a real cluster (issue #36): pd-workers with --tensor_parallel 2
// beside workers at TP 1, greedy output equal to the single-process engine at TP 1. The KV pool
// keeps the TP = 1 layout at every TP size, so a prefill worker and a decode worker of different
// TP sizes pair, and blocks a TP 2 worker wrote to the node's tier are restored by a TP 1 worker.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/type_names.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Generated;
using ::pd::e2e::Metric;
using ::pd::e2e::Reference;
using ::pd::e2e::Tierd;
using ::testing::HasSubstr;

class TensorParallelE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-tp-e2e-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }
  std::string Dir(const std::string& sub) {
    const std::string d = dir_->path() + "/" + sub;
    std::filesystem::create_directories(d);
    return d;
  }
  std::optional<pd::testing::TempDir> dir_;
};

// Prefill at TP 1 and decode at TP 2 (f32 KV), then the reverse with an i8 KV cache: every
// output equals the in-process TP 1 engine's of that dtype, the KV came over the transport (a
// remote prefill), and a second request with the same prefix hits the decode worker's cache.
TEST_F(TensorParallelE2eTest, DisaggregatedAcrossTpSizesEqualsTp1) {
  const std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day,";
  const std::vector<std::string> prompts = {"Once upon a time", prefix + " she",
                                            "Lily and Ben went to the park. They saw a big"};
  struct Case {
    int prefill_tp, decode_tp;
    kernels::DType kv;
  };
  for (const Case& k : {Case{1, 2, kernels::DType::kF32}, Case{2, 1, kernels::DType::kI8}}) {
    Reference ref(k.kv);
    const std::string kv = std::string(kernels::DTypeName(k.kv));
    const std::string name =
        absl::StrCat("prefill TP ", k.prefill_tp, ", decode TP ", k.decode_tp, ", ", kv, " KV");
    Cluster c(Dir(absl::StrCat("p", k.prefill_tp, "d", k.decode_tp)), 1, 1, "round_robin",
              {"--kv_dtype=" + kv}, {"--kv_dtype=" + kv}, nullptr, [&](const std::string& id) {
                const int tp = id.rfind("prefill", 0) == 0 ? k.prefill_tp : k.decode_tp;
                return std::vector<std::string>{absl::StrCat("--tensor_parallel=", tp)};
              });
    ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
    for (const std::string& prompt : prompts) {
      auto [tokens, text] = ref.Greedy(prompt, 40);
      Generated g = c.GenerateText(prompt, 40);
      ASSERT_TRUE(g.status.ok()) << name << ": " << g.status.error_message() << "\n" << c.Logs();
      EXPECT_EQ(g.tokens, tokens) << name << ": " << prompt;
      EXPECT_EQ(g.text, text) << name << ": " << prompt;
    }
    Generated again = c.GenerateText(prefix + " she", 40);
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.tokens, ref.Greedy(prefix + " she", 40).first) << name;
    EXPECT_GT(again.last.usage().cached_tokens(), 0u) << name << again.last.DebugString();
    const std::string dm = c.WorkerMetrics(1);
    EXPECT_GE(Metric(dm, "pd_worker_prefills_total{where=\"remote\"}"), 1) << name << dm;
    // The TP 2 worker's metrics name its ranks.
    const std::string tm = c.WorkerMetrics(k.decode_tp == 2 ? 1 : 0);
    EXPECT_EQ(Metric(tm, "pd_worker_tensor_parallel_ranks"), 2) << name << tm;
    EXPECT_THAT(tm, HasSubstr("pd_worker_tp_collective_wait_seconds_total{rank=\"1\"}")) << tm;
    EXPECT_THAT(c.Logs(), HasSubstr("tensor parallel x2")) << name;
  }
}

// A TP 2 worker writes a conversation's blocks through to the node's tier as it computes them;
// a TP 1 worker with an empty pool restores them for the next turn, output exact.
TEST_F(TensorParallelE2eTest, BlocksWrittenToTheTierAtTp2AreRestoredAtTp1) {
  Tierd tierd(Dir("tierd"));
  const std::string tier = "--tierd_address=" + tierd.address();
  const std::vector<std::string> local = {"--disagg_threshold_tokens=100000"};
  Cluster first(Dir("tp2"), 0, 1, "round_robin",
                {tier, "--tier_write_through", "--tensor_parallel=2"}, local);
  Cluster second(Dir("tp1"), 0, 1, "round_robin", {tier}, local);
  ASSERT_TRUE(first.WaitReady(absl::Seconds(30))) << first.Logs();
  ASSERT_TRUE(second.WaitReady(absl::Seconds(30))) << second.Logs();
  Reference ref;
  std::vector<uint32_t> prompt = ref.Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree. She ran to the ball "
      "and picked it up. Then they");
  pdserve::v1::GenerateRequest req;
  for (uint32_t t : prompt) req.mutable_token_ids()->add_ids(t);
  req.mutable_sampling()->set_max_tokens(40);
  req.mutable_sampling()->set_ignore_eos(true);
  Generated g = first.Generate(req);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << first.Logs();
  EXPECT_EQ(g.tokens, ref.GreedyIds(prompt, 40, nullptr, 0, true).first);
  const int64_t computed = static_cast<int64_t>(prompt.size() + g.tokens.size()) - 1;
  prompt.insert(prompt.end(), g.tokens.begin(), g.tokens.end());
  const std::vector<uint32_t> user = ref.Encode(" The next day, they went to the park again.");
  prompt.insert(prompt.end(), user.begin() + 1, user.end());  // without BOS
  const int64_t want_blocks = computed / 16;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Metric(tierd.Metrics(), "pd_tierd_stored_blocks_total{tier=\"dram\"}") < want_blocks &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  pdserve::v1::GenerateRequest turn2;
  for (uint32_t t : prompt) turn2.mutable_token_ids()->add_ids(t);
  turn2.mutable_sampling()->set_max_tokens(16);
  Generated h = second.Generate(turn2);
  ASSERT_TRUE(h.status.ok()) << h.status.error_message() << second.Logs();
  EXPECT_EQ(h.tokens, ref.GreedyIds(prompt, 16).first);
  EXPECT_EQ(h.last.usage().tier_cached_tokens(), static_cast<uint64_t>(want_blocks * 16))
      << h.last.DebugString() << tierd.Log();
}

}  // namespace
}  // namespace pd
