// pd-tierd as a real process beside a real cluster (pd-router, pd-workers) on loopback, with
// stories260K: a worker with a small pool serves many distinct long prompts, so blocks spill to
// the node's DRAM tier and on to NVMe; asking again restores them instead of recomputing, the
// engine computes only the uncached suffix, and every output equals the cold run's. tierd
// restarts (its NVMe blocks still hit), damaged slab bytes (recomputed, still exact) and a
// dead tierd (requests still succeed) are covered too.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::FreePort;
using ::pd::e2e::Generated;
using ::pd::e2e::Metric;
using ::pd::e2e::Reference;
using ::pd::e2e::Tierd;
using ::pd::testing::Subprocess;

// Twelve prompts of ~140 tokens (8+ full blocks each) with distinct first blocks.
std::vector<std::string> Prompts() {
  std::vector<std::string> out;
  for (int k = 0; k < 12; ++k) {
    out.push_back(absl::StrCat(
        "Tale number ", k,
        ". Once upon a time, there was a little girl named Lily. She loved to "
        "play outside in the park with her friends. One day, she saw a big red ball under a "
        "tree. She ran to the ball and picked it up. It was shiny and round. Lily wanted to "
        "show it to her mom, so she went home. Her mom smiled and said it was a very nice "
        "ball. Then they"));
  }
  return out;
}

// Sends small requests until the (restarted) tierd sees the worker attached again; the worker
// notices a restart at its next call and re-attaches within a second.
bool WaitForSession(Cluster& c, const Tierd& tierd) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Metric(tierd.Metrics(), "pd_tierd_sessions") < 1 && absl::Now() < deadline) {
    c.GenerateText("Waiting for the worker to come back", 2);
    absl::SleepFor(absl::Milliseconds(100));
  }
  return Metric(tierd.Metrics(), "pd_tierd_sessions") >= 1;
}

class TierE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-tier-e2e-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }
  std::optional<pd::testing::TempDir> dir_;
};

// Runs every prompt once through the router on the decode worker alone; checks each output
// against `want` and that the worker computed exactly the uncached suffix of the prompt.
// Returns the tier-cached tokens summed over the pass.
uint64_t Pass(Cluster& c, const std::vector<std::string>& prompts,
              const std::vector<std::vector<uint32_t>>& want, int decode_index,
              bool reverse = false) {
  uint64_t tier_cached = 0;
  for (size_t n = 0; n < prompts.size(); ++n) {
    const size_t i = reverse ? prompts.size() - 1 - n : n;
    const double before = Metric(c.WorkerMetrics(decode_index), "pd_worker_prefill_tokens_total");
    Generated g = c.GenerateText(prompts[i], 16);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << c.Logs();
    EXPECT_EQ(g.tokens, want[i]) << "prompt " << i;
    const pdserve::v1::Usage& u = g.last.usage();
    EXPECT_LE(u.tier_cached_tokens(), u.cached_tokens());
    const double computed =
        Metric(c.WorkerMetrics(decode_index), "pd_worker_prefill_tokens_total") - before;
    EXPECT_EQ(computed, static_cast<double>(u.prompt_tokens() - u.cached_tokens()))
        << "prompt " << i << ": " << g.last.DebugString();
    tier_cached += u.tier_cached_tokens();
  }
  return tier_cached;
}

TEST_F(TierE2eTest, EvictedBlocksComeBackFromDramAndNvmeWithExactOutput) {
  const std::string dir = dir_->path();
  Tierd tierd(dir);
  // The router keeps every request on the decode worker (prefill there), whose pool of 24
  // blocks holds under three prompts. Evicted blocks go straight into reserved DRAM slots (the
  // GPU default, forced on here; the other tests use the CPU default, staging).
  Cluster c(dir, 1, 1, "round_robin",
            {"--kv_blocks=24", "--tierd_address=" + tierd.address(), "--tier_offer_slots=16"},
            {"--disagg_threshold_tokens=100000"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  const std::vector<std::string> prompts = Prompts();
  Reference ref;
  std::vector<std::vector<uint32_t>> want;
  for (const std::string& p : prompts) want.push_back(ref.Greedy(p, 16).first);

  EXPECT_EQ(Pass(c, prompts, want, 1), 0u) << "a cold pass has no tier hits";
  // Evicted blocks were offered to DRAM; DRAM overflowed (blocks seen once are dropped, not
  // written to disk). Second pass, newest prompts first: the most recently evicted blocks hit
  // in DRAM; blocks evicted a second time reach NVMe. Third pass, oldest first: NVMe hits.
  EXPECT_GT(Pass(c, prompts, want, 1, /*reverse=*/true), 0u) << c.Logs() << tierd.Log();
  EXPECT_GT(Pass(c, prompts, want, 1), 0u);
  const std::string wm = c.WorkerMetrics(1);
  EXPECT_GT(Metric(wm, "pd_worker_tier_promoted_blocks_total{tier=\"dram\"}"), 0) << wm;
  EXPECT_GT(Metric(wm, "pd_worker_tier_promoted_blocks_total{tier=\"nvme\"}"), 0) << wm;
  EXPECT_GT(Metric(wm, "pd_worker_tier_restored_blocks_total"), 0) << wm;
  // Evicted blocks went straight into reserved DRAM slots (one copy), not only through staging.
  EXPECT_GT(Metric(wm, "pd_worker_tier_offered_in_place_blocks_total"), 0) << wm;
  const std::string tm = tierd.Metrics();
  EXPECT_GT(Metric(tm, "pd_tierd_spill_blocks_total"), 0) << tm;
  EXPECT_GT(Metric(tm, "pd_tierd_hit_blocks_total{tier=\"nvme\"}"), 0) << tm;
  // Every re-offer of a block (after each eviction, restored or recomputed) carried the bytes
  // tierd held: honest workers never look like a planted block (docs/tiers.md "Exactness").
  EXPECT_EQ(Metric(tm, "pd_tierd_conflicting_commits_total", -1), 0) << tm;

  // tierd restarts (SIGKILL: DRAM is lost, NVMe is replayed): the worker re-attaches and NVMe
  // blocks still hit.
  tierd.Kill();
  Generated during = c.GenerateText("While tierd is down, a dog", 8);
  EXPECT_TRUE(during.status.ok()) << during.status.error_message();
  tierd.Start();
  ASSERT_TRUE(WaitForSession(c, tierd)) << tierd.Log() << c.Logs();
  EXPECT_GT(Metric(tierd.Metrics(), "pd_tierd_nvme_replayed_blocks"), 0) << tierd.Metrics();
  Pass(c, prompts, want, 1);
  EXPECT_GT(Metric(tierd.Metrics(), "pd_tierd_hit_blocks_total{tier=\"nvme\"}"), 0)
      << tierd.Metrics() << tierd.Log();

  // Damage one byte of every block on disk: each NVMe read fails its checksum, the block is
  // dropped and recomputed, and the output stays exact.
  tierd.Kill();
  int damaged = 0;
  for (int slab = 0; slab < 8; ++slab) {
    const std::string path = absl::StrFormat("%s/slab-%03d.dat", tierd.nvme_dir(), slab);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    if (!f) continue;
    f.seekg(0, std::ios::end);
    const int64_t size = f.tellg();
    for (int64_t off = 100; off < size; off += 20480) {
      f.seekg(off);
      char b = 0;
      f.read(&b, 1);
      b = static_cast<char>(b ^ 0x5a);
      f.seekp(off);
      f.write(&b, 1);
      ++damaged;
    }
  }
  ASSERT_GT(damaged, 0);
  tierd.Start();
  ASSERT_TRUE(WaitForSession(c, tierd)) << tierd.Log() << c.Logs();
  Pass(c, prompts, want, 1);
  Pass(c, prompts, want, 1);
  EXPECT_GT(Metric(tierd.Metrics(), "pd_tierd_checksum_failures_total{tier=\"nvme\"}"), 0)
      << tierd.Metrics();
}

// Quantized caches (i8: 1-byte codes and per-row scales in each block; i4: half-byte codes)
// through the tiers: the blocks pd-tierd keeps and gives back are the worker's bytes, scales
// included, so restored prompts give the in-process engine's output with the same dtype (1 MiB
// of DRAM holds over 100 such blocks).
TEST_F(TierE2eTest, QuantizedBlocksComeBackFromTheTiersWithExactOutput) {
  for (const kernels::DType dtype : {kernels::DType::kI8, kernels::DType::kI4}) {
    const std::string name(kernels::DTypeName(dtype));
    SCOPED_TRACE(name);
    const std::string dir = absl::StrCat(dir_->path(), "/", name);
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    const std::string flag = "--kv_dtype=" + name;
    Tierd tierd(dir, {flag});
    Cluster c(dir, 1, 1, "round_robin",
              {"--kv_blocks=24", "--tierd_address=" + tierd.address(), flag},
              {"--disagg_threshold_tokens=100000", flag});
    ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs() << tierd.Log();
    const std::vector<std::string> prompts = Prompts();
    Reference ref(dtype);
    std::vector<std::vector<uint32_t>> want;
    for (const std::string& p : prompts) want.push_back(ref.Greedy(p, 16).first);
    EXPECT_EQ(Pass(c, prompts, want, 1), 0u) << "a cold pass has no tier hits";
    EXPECT_GT(Pass(c, prompts, want, 1, /*reverse=*/true), 0u) << c.Logs() << tierd.Log();
    const std::string wm = c.WorkerMetrics(1);
    EXPECT_GT(Metric(wm, "pd_worker_tier_restored_blocks_total"), 0) << wm;
  }
}

// Disaggregated: the prefill and the decode worker share the node's tiers; outputs stay exact
// and lower-tier hits show in usage.
TEST_F(TierE2eTest, DisaggregatedWorkersShareTheNodesTiers) {
  const std::string dir = dir_->path();
  Tierd tierd(dir);
  Cluster c(dir, 1, 1, "round_robin", {"--kv_blocks=24", "--tierd_address=" + tierd.address()});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  const std::vector<std::string> prompts = Prompts();
  Reference ref;
  uint64_t tier_cached = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (const std::string& p : prompts) {
      Generated g = c.GenerateText(p, 16);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << c.Logs();
      EXPECT_EQ(g.tokens, ref.Greedy(p, 16).first);
      tier_cached += g.last.usage().tier_cached_tokens();
    }
  }
  EXPECT_GT(tier_cached, 0u) << c.Logs() << tierd.Log();
}

// Write-through (issue #19 item 3): a conversation's turn 1 runs on one worker whose pool never
// evicts; with --tier_write_through its prompt and reply blocks reach the node's tierd as they
// are computed, so turn 2 (turn 1's prompt + reply + a new message, as token ids) on a second
// worker with an empty pool is restored from the tier up to the reply's last full block, with
// the exact greedy output. Without the flag the same turn 2 finds nothing in the tier.
TEST_F(TierE2eTest, WriteThroughServesTheNextTurnFromTheTierOnAnotherWorker) {
  const std::string dir = dir_->path();
  Tierd tierd(dir);
  const std::string tier = "--tierd_address=" + tierd.address();
  const std::vector<std::string> local = {"--disagg_threshold_tokens=100000"};
  for (const char* sub : {"/w", "/p", "/s"}) std::filesystem::create_directories(dir + sub);
  Cluster first(dir + "/w", 0, 1, "round_robin", {tier, "--tier_write_through"}, local);
  Cluster plain(dir + "/p", 0, 1, "round_robin", {tier}, local);
  Cluster second(dir + "/s", 0, 1, "round_robin", {tier}, local);
  ASSERT_TRUE(first.WaitReady(absl::Seconds(30))) << first.Logs();
  ASSERT_TRUE(plain.WaitReady(absl::Seconds(30))) << plain.Logs();
  ASSERT_TRUE(second.WaitReady(absl::Seconds(30))) << second.Logs();
  Reference ref;
  constexpr int64_t kBlock = 16;

  // turn1(c, n): turn 1 of conversation n on cluster c; returns turn 2's prompt and how many of
  // its tokens have computed KV (turn 1's prompt + reply, less the last sampled token).
  const auto turn1 = [&](Cluster& c, int n) -> std::pair<std::vector<uint32_t>, int64_t> {
    std::vector<uint32_t> prompt = ref.Encode(Prompts()[n]);
    pdserve::v1::GenerateRequest req;
    for (uint32_t t : prompt) req.mutable_token_ids()->add_ids(t);
    req.mutable_sampling()->set_max_tokens(40);
    req.mutable_sampling()->set_ignore_eos(true);
    Generated g = c.Generate(req);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message() << c.Logs();
    EXPECT_EQ(g.tokens, ref.GreedyIds(prompt, 40, nullptr, 0, true).first);
    const int64_t computed = static_cast<int64_t>(prompt.size() + g.tokens.size()) - 1;
    prompt.insert(prompt.end(), g.tokens.begin(), g.tokens.end());
    const std::vector<uint32_t> user = ref.Encode(" The next day, they went to the park again.");
    prompt.insert(prompt.end(), user.begin() + 1, user.end());  // without BOS
    return {prompt, computed};
  };
  const auto turn2 = [&](const std::vector<uint32_t>& prompt) {
    pdserve::v1::GenerateRequest req;
    for (uint32_t t : prompt) req.mutable_token_ids()->add_ids(t);
    req.mutable_sampling()->set_max_tokens(16);
    Generated g = second.Generate(req);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message() << second.Logs();
    EXPECT_EQ(g.tokens, ref.GreedyIds(prompt, 16).first);
    return g.last.usage();
  };
  const auto stored = [&] {
    return Metric(tierd.Metrics(), "pd_tierd_stored_blocks_total{tier=\"dram\"}");
  };

  auto [with_prompt, with_computed] = turn1(first, 0);
  const int64_t want_blocks = with_computed / kBlock;
  // Offers travel in the background: wait until tierd holds them all.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (stored() < want_blocks && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_GE(stored(), want_blocks) << tierd.Metrics() << first.Logs();
  EXPECT_EQ(
      Metric(first.WorkerMetrics(0), "pd_worker_tier_offered_blocks_total{outcome=\"dropped\"}"),
      0);
  const pdserve::v1::Usage with = turn2(with_prompt);
  EXPECT_EQ(with.tier_cached_tokens(), want_blocks * kBlock)
      << "turn 2 restores turn 1's prompt and reply up to its last full block";
  EXPECT_EQ(with.cached_tokens(), with.tier_cached_tokens());

  const double before = stored();
  auto [plain_prompt, plain_computed] = turn1(plain, 1);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(stored(), before) << "without write-through nothing is offered before eviction";
  EXPECT_EQ(turn2(plain_prompt).tier_cached_tokens(), 0u);
  // Blocks computed in decode steps (the reply) and offered at once never conflicted with what
  // the tier held.
  EXPECT_EQ(Metric(tierd.Metrics(), "pd_tierd_conflicting_commits_total", -1), 0);
}

// Without tierd the workers serve as before (the flag points at nothing).
TEST_F(TierE2eTest, DeadTierdNeverFailsARequest) {
  const std::string dir = dir_->path();
  Cluster c(dir, 1, 1, "round_robin",
            {"--kv_blocks=24", absl::StrCat("--tierd_address=127.0.0.1:", FreePort())});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  Reference ref;
  for (const std::string& p : Prompts()) {
    Generated g = c.GenerateText(p, 8);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, ref.Greedy(p, 8).first);
    EXPECT_EQ(g.last.usage().tier_cached_tokens(), 0u);
  }
  EXPECT_EQ(Metric(c.WorkerMetrics(1), "pd_worker_tierd_attached"), 0);
}

}  // namespace
}  // namespace pd
