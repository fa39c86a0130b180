// Tensor parallelism through a real cluster (issue #36): pd-workers with --tensor_parallel 2
// beside workers at TP 1, greedy output equal to the single-process engine at TP 1. The KV pool
// keeps the TP = 1 layout at every TP size, so a prefill worker and a decode worker of different
// TP sizes pair, and blocks a TP 2 worker wrote to the node's tier are restored by a TP 1 worker.
// With --tp_kv_pools=per_rank each rank keeps its heads in a pool of its own; blocks go to and
// from peers and tiers in the TP = 1 layout all the same (through the hand-off's staging area).
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
  // BlocksWrittenToTheTierAtTp2AreRestoredAtTp1's body, per pool kind.
  void WriteThenRestore(bool per_rank);
  std::optional<pd::testing::TempDir> dir_;
};

// Prefill at TP 1 and decode at TP 2 (f32 KV), then the reverse with an i8 KV cache, with shared
// pools; then per-rank pools on the TP 2 side (each rank's heads move through the staging area),
// both ways, and at TP 2 on both sides: every output equals the in-process TP 1 engine's of that
// dtype, the KV came over the transport (a remote prefill), and a second request with the same
// prefix hits the decode worker's cache.
TEST_F(TensorParallelE2eTest, DisaggregatedAcrossTpSizesEqualsTp1) {
  const std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day,";
  const std::vector<std::string> prompts = {"Once upon a time", prefix + " she",
                                            "Lily and Ben went to the park. They saw a big"};
  struct Case {
    int prefill_tp, decode_tp;
    kernels::DType kv;
    bool per_rank;  // the TP 2 side(s) with --tp_kv_pools=per_rank
  };
  for (const Case& k :
       {Case{1, 2, kernels::DType::kF32, false}, Case{2, 1, kernels::DType::kI8, false},
        Case{1, 2, kernels::DType::kBF16, true}, Case{2, 1, kernels::DType::kI4, true},
        Case{2, 2, kernels::DType::kI8, true}}) {
    Reference ref(k.kv);
    const std::string kv = std::string(kernels::DTypeName(k.kv));
    const std::string name = absl::StrCat("prefill TP ", k.prefill_tp, ", decode TP ", k.decode_tp,
                                          ", ", kv, " KV", k.per_rank ? ", per-rank pools" : "");
    Cluster c(Dir(absl::StrCat("p", k.prefill_tp, "d", k.decode_tp, kv, k.per_rank)), 1, 1,
              "round_robin", {"--kv_dtype=" + kv}, {"--kv_dtype=" + kv}, nullptr,
              [&](const std::string& id) {
                const int tp = id.rfind("prefill", 0) == 0 ? k.prefill_tp : k.decode_tp;
                std::vector<std::string> args = {absl::StrCat("--tensor_parallel=", tp)};
                if (k.per_rank && tp > 1) args.push_back("--tp_kv_pools=per_rank");
                return args;
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
    if (k.per_rank) {
      EXPECT_THAT(c.Logs(), HasSubstr("kv hand-off through a staging area")) << name;
    }
  }
}

// A TP 2 worker writes a conversation's blocks through to the node's tier as it computes them;
// a TP 1 worker with an empty pool restores them for the next turn, output exact. Then the same
// with per-rank pools: TP 2 gathers each block from its ranks, and a TP 4 worker scatters the
// restored blocks to its four ranks.
TEST_F(TensorParallelE2eTest, BlocksWrittenToTheTierAtTp2AreRestoredAtTp1) {
  for (const bool per_rank : {false, true}) {
    SCOPED_TRACE(per_rank ? "per-rank pools, restored at TP 4" : "shared pools");
    WriteThenRestore(per_rank);
  }
}

void TensorParallelE2eTest::WriteThenRestore(bool per_rank) {
  const std::string sub = per_rank ? "per_rank" : "shared";
  Tierd tierd(Dir("tierd_" + sub));
  const std::string tier = "--tierd_address=" + tierd.address();
  const std::vector<std::string> local = {"--disagg_threshold_tokens=100000"};
  std::vector<std::string> writer = {tier, "--tier_write_through", "--tensor_parallel=2"};
  std::vector<std::string> reader = {tier};
  if (per_rank) {
    writer.push_back("--tp_kv_pools=per_rank");
    reader.insert(reader.end(), {"--tensor_parallel=4", "--tp_kv_pools=per_rank"});
  }
  Cluster first(Dir("tp2_" + sub), 0, 1, "round_robin", writer, local);
  Cluster second(Dir("tp1_" + sub), 0, 1, "round_robin", reader, local);
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
