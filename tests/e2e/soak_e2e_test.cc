// Soak test with faults (issue #10 item 4): the whole cluster as real processes (redis-server,
// two nodes' pd-tierd, a prefill and two decode pd-workers, pd-router) under a bounded
// shared-prefix load, while a chaos thread SIGKILLs and restarts the prefill worker, one decode
// worker, node a's tierd and redis-server at random times (fixed seed). decode-1 is on node b:
// its tierd fetches from node a's what node b lacks (remote restore, issue #19), through kills
// of node a's tierd. Checks:
//   - every request completes with the fault-free (single-process engine) output, or fails with
//     a retryable status (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED) before its first token: no
//     stream that started is lost (it moves to another decode worker, docs/migration.md);
//   - no process died except those the chaos killed, and every killed one came back;
//   - the router's and the never-killed decode worker's heap return to their baseline (no leak);
//   - once the load stops, every worker's KV blocks are free, neither tierd holds claims, no
//     block stays pinned for a peer read, and node b fetched blocks from node a.
// Label `slow`; PD_SOAK_SECONDS (default 150) runs it longer by hand. The summary line
// ("soak summary: ...") is what docs/benchmarks.md quotes.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/testing/redis_server.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Generated;
using ::pd::e2e::Metric;
using ::pd::e2e::Reference;
using ::pd::e2e::Tierd;

int SoakSeconds() {
  int s = 150;
  if (const char* env = std::getenv("PD_SOAK_SECONDS"); env != nullptr) {
    (void)absl::SimpleAtoi(env, &s);
  }
  return std::max(s, 20);
}

// 4 shared prefixes x 6 suffixes.
std::vector<std::string> Prompts() {
  const char* prefixes[] = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends.",
      "Tom had a big red ball. Every day he went to the garden to play with it and his dog Max.",
      "The sun was shining and the birds were singing. Sam and his mom went to the store to buy",
      "One day, a little bird flew down from the tall tree. It was looking for something to eat"};
  const char* suffixes[] = {" One day,", " Then", " Suddenly,", " She said,", " He was", " They"};
  std::vector<std::string> out;
  for (const char* p : prefixes) {
    for (const char* s : suffixes) out.push_back(absl::StrCat(p, s));
  }
  return out;
}

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         code == grpc::StatusCode::ABORTED;
}

TEST(SoakE2eTest, ClusterSurvivesKillsOfEveryComponentWithExactOutputs) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-soak-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const std::string dir = tmp->path();
  auto redis = pd::testing::RedisServer::Start({});
  ASSERT_TRUE(redis.ok()) << redis.status();
  const std::string redis_addr = absl::StrCat("127.0.0.1:", (*redis)->port());
  // Both nodes fetch from each other whatever the cost (stories260K recomputes faster).
  const std::vector<std::string> peers = {"--peer_transport=tcp", "--peer_fetch_policy=always"};
  Tierd tierd(dir,
              {"--redis_address=" + redis_addr, "--lease=5s", "--dram_mib=2", peers[0], peers[1]});
  Tierd tierd_b(dir,
                {"--redis_address=" + redis_addr, "--lease=5s", "--dram_mib=2", peers[0], peers[1],
                 "--node_name=e2e-node-b", absl::StrCat("--shm_name=/pd-e2e-tier-b-", ::getpid()),
                 "--nvme_dir=" + dir + "/nvme-b"},
                "tierd-b");
  Cluster c(dir, 1, 2, "cache_aware", {"--kv_blocks=48", "--prefill_timeout=5s"},
            {"--redis_address=" + redis_addr}, nullptr, [&](const std::string& id) {
              if (id == "decode-1") {
                return std::vector<std::string>{"--tierd_address=" + tierd_b.address(),
                                                "--node_name=e2e-node-b"};
              }
              // Node a's pools are small: they keep evicting, so node a's tierd holds the prompts.
              return std::vector<std::string>{"--tierd_address=" + tierd.address(),
                                              "--node_name=e2e-node", "--kv_blocks=8"};
            });
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs();

  const std::vector<std::string> prompts = Prompts();
  std::vector<std::vector<uint32_t>> want;
  {
    Reference ref;
    for (const std::string& p : prompts) want.push_back(ref.Greedy(p, 24).first);
  }
  // Warm up (node a's tierd fills with the prompts' evicted blocks), then restart decode-1 with
  // an empty pool: what it is sent next, node b's tierd fetches from node a's. Then the memory
  // baselines (router, decode-1 which the chaos never kills).
  auto warm_up = [&] {
    for (size_t k = 0; k < prompts.size(); ++k) {
      Generated g = c.GenerateText(prompts[k], 24);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message() << c.Logs();
      ASSERT_EQ(g.tokens, want[k]);
    }
  };
  warm_up();
  ASSERT_TRUE(c.workers()[2].process->Signal(SIGTERM).ok());
  (void)c.workers()[2].process->Wait(absl::Seconds(10));
  c.RestartWorker(2);
  // Up when its metrics answer; then the router must see it healthy again.
  const absl::Time up_by = absl::Now() + absl::Seconds(60);
  while (c.WorkerMetrics(2).empty() && absl::Now() < up_by) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs();
  for (int i = 0; i < 2; ++i) {
    for (size_t k = 0; k < prompts.size(); ++k) {
      Generated g = c.GenerateText(prompts[k], 24);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message() << c.Logs();
      ASSERT_EQ(g.tokens, want[k]);
    }
  }
  const double router_heap0 = Metric(c.RouterMetrics(), "pd_process_heap_inuse_bytes");
  const double decode1_heap0 = Metric(c.WorkerMetrics(2), "pd_process_heap_inuse_bytes");
  ASSERT_GT(decode1_heap0, 0) << "decode-1 metrics: " << c.WorkerMetrics(2).substr(0, 300)
                              << c.workers()[2].process->LogTail(30);

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::map<std::string, int> outcomes;  // "OK", "mismatch", or the status code name
  std::vector<std::string> bad;         // non-retryable failures and mismatches
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      while (!stop.load()) {
        const size_t k = rng() % prompts.size();
        Generated g = c.GenerateText(prompts[k], 24);
        std::lock_guard<std::mutex> lock(mu);
        if (g.status.ok()) {
          if (g.tokens == want[k]) {
            ++outcomes["OK"];
          } else {
            ++outcomes["mismatch"];
            bad.push_back(absl::StrCat("prompt ", k, ": output differs"));
          }
        } else if (!g.tokens.empty()) {
          // A stream that delivered tokens moves when its worker dies (docs/migration.md):
          // failing it after that is a lost stream, whatever its status.
          ++outcomes["lost"];
          bad.push_back(absl::StrCat("prompt ", k, ": stream lost after ", g.tokens.size(),
                                     " tokens: code ", g.status.error_code(), " ",
                                     g.status.error_message()));
        } else {
          ++outcomes[absl::StrCat("code ", g.status.error_code())];
          if (!Retryable(g.status.error_code())) {
            bad.push_back(absl::StrCat("prompt ", k, ": code ", g.status.error_code(), " ",
                                       g.status.error_message()));
          }
        }
      }
    });
  }

  // Chaos: kill one of {prefill-0, decode-0, tierd, redis} every 4-10 s, restart it 0.5-2 s later.
  std::mt19937 chaos(20261124);
  std::map<std::string, int> kills;
  const absl::Time end = absl::Now() + absl::Seconds(SoakSeconds());
  while (absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(4000 + chaos() % 6000));
    const int victim = static_cast<int>(chaos() % 4);
    const absl::Duration down = absl::Milliseconds(500 + chaos() % 1500);
    switch (victim) {
      case 0:
      case 1: {
        auto& w = c.workers()[victim];  // 0 = prefill-0, 1 = decode-0
        ASSERT_TRUE(w.process->Signal(SIGKILL).ok());
        (void)w.process->Wait(absl::Seconds(10));
        absl::SleepFor(down);
        c.RestartWorker(victim);
        ++kills[w.id];
        break;
      }
      case 2:
        tierd.Kill();
        absl::SleepFor(down);
        tierd.Start();
        ++kills["tierd"];
        break;
      case 3:
        ASSERT_TRUE((*redis)->Stop().ok());  // SIGTERM, then SIGKILL: the data is gone either way
        absl::SleepFor(down);
        ASSERT_TRUE((*redis)->Restart().ok());
        ++kills["redis"];
        break;
    }
  }
  stop = true;
  for (std::thread& t : clients) t.join();

  // Every process is up; the killed ones came back (workers rejoin the router).
  ASSERT_TRUE(c.router().Poll() == std::nullopt) << c.Logs();
  for (auto& w : c.workers()) {
    EXPECT_TRUE(w.process->Poll() == std::nullopt) << w.id << " is down\n" << c.Logs();
  }
  EXPECT_TRUE(tierd.process().Poll() == std::nullopt) << tierd.Log();
  EXPECT_TRUE(tierd_b.process().Poll() == std::nullopt) << tierd_b.Log();
  EXPECT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  // After the faults, the cluster still serves exact outputs.
  for (size_t k = 0; k < prompts.size(); ++k) {
    Generated g = c.GenerateText(prompts[k], 24);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, want[k]) << "prompt " << k;
  }

  // Blocks all freed (cached blocks stay as prefix-cache hits, none is in use), no claims left.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  auto drained = [&] {
    for (int i = 0; i < 3; ++i) {
      if (Metric(c.WorkerMetrics(i), "pd_worker_kv_blocks{state=\"used\"}", -1) != 0) {
        return false;
      }
    }
    // Slots workers keep reserved for in-place offers are bounded (16 per attached worker).
    // Peer reads pin nothing once they are over, on every path (done, failed, peer killed).
    for (const Tierd* t : {&tierd, &tierd_b}) {
      const std::string m = t->Metrics();
      if (Metric(m, "pd_tierd_claimed_blocks", -1) != 0 ||
          Metric(m, "pd_tierd_unbound_reserved_blocks", -1) > 3 * 16 ||
          Metric(m, "pd_tierd_peer_pinned_blocks", -1) != 0 ||
          Metric(m, "pd_tierd_peer_reads_in_flight", -1) != 0) {
        return false;
      }
    }
    return true;
  };
  while (!drained() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(drained()) << c.WorkerMetrics(0) << tierd.Metrics() << tierd_b.Metrics();
  // Node b's worker was served blocks node a held.
  const double fetched = Metric(tierd_b.Metrics(), "pd_tierd_peer_fetched_blocks_total", 0);
  EXPECT_GT(fetched, 0) << "node a stored "
                        << Metric(tierd.Metrics(), "pd_tierd_stored_blocks_total{tier=\"dram\"}")
                        << " blocks; node b promotes "
                        << Metric(tierd_b.Metrics(), "pd_tierd_promotes_total") << ", hits "
                        << Metric(tierd_b.Metrics(), "pd_tierd_promote_hit_blocks_total")
                        << ", decisions "
                        << Metric(tierd_b.Metrics(), "pd_tierd_peer_decisions_total{decision=\"fetch\"}");

  // Memory back to baseline: heap within 8 MiB (the index and caches are bounded and were warm).
  const double router_heap = Metric(c.RouterMetrics(), "pd_process_heap_inuse_bytes");
  const double decode1_heap = Metric(c.WorkerMetrics(2), "pd_process_heap_inuse_bytes");
  EXPECT_LT(router_heap - router_heap0, 8 << 20) << router_heap0 << " -> " << router_heap;
  EXPECT_LT(decode1_heap - decode1_heap0, 8 << 20) << decode1_heap0 << " -> " << decode1_heap;

  int total = 0;
  std::vector<std::string> parts;
  for (const auto& [k, v] : outcomes) {
    total += v;
    parts.push_back(absl::StrCat(k, "=", v));
  }
  std::vector<std::string> killed;
  for (const auto& [k, v] : kills) killed.push_back(absl::StrCat(k, "=", v));
  std::printf(
      "soak summary: %d s, %d requests (%s); kills: %s; heap router %.1f -> %.1f MiB, decode-1 "
      "%.1f -> %.1f MiB; node b fetched %.0f blocks from node a\n",
      SoakSeconds(), total, absl::StrJoin(parts, " ").c_str(), absl::StrJoin(killed, " ").c_str(),
      router_heap0 / (1 << 20), router_heap / (1 << 20), decode1_heap0 / (1 << 20),
      decode1_heap / (1 << 20), fetched);
  EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "\n") << "\n" << c.Logs();
  EXPECT_GT(outcomes["OK"], total / 2) << "most requests must succeed";
  EXPECT_GE(static_cast<int>(kills.size()), 2) << "the chaos must have hit several components";
}

}  // namespace
}  // namespace pd
