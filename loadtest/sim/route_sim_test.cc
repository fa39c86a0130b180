// The router simulator on hand-made traces: hit ratios computable by hand, determinism, the
// policies' order on shared prefixes, capacity eviction reaching the index, the time model, and
// remote fetches (their cost rule and link contention).
#include "loadtest/sim/route_sim.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loadtest/sim/route_sim_report.h"

namespace pd::loadtest::sim {
namespace {

using ::testing::HasSubstr;

TraceRecord Record(double t_s, int64_t input, int64_t output, std::vector<uint64_t> ids) {
  TraceRecord r;
  r.timestamp_ms = t_s * 1000;
  r.arrival_offset = absl::Seconds(t_s);
  r.input_length = input;
  r.output_length = output;
  r.hash_ids = std::move(ids);
  return r;
}

// Without remote fetch: the figures of these tests are those of the simulator before it had
// remote fetches, so they also pin that --remote_fetch=false reproduces it.
RouteSimConfig Config(SimPolicy policy, int workers) {
  RouteSimConfig c;
  c.policy = policy;
  c.num_workers = workers;
  c.capacity_blocks = 100;
  c.remote.enabled = false;
  return c;
}

// With remote fetch at the defaults (25 Gb/s, 1 ms, 32 KiB per token: a 512-token block of
// 16 MiB moves in 5.37 ms, against 64 ms to compute it at 8,000 tokens/s).
RouteSimConfig RemoteConfig(SimPolicy policy, int workers) {
  RouteSimConfig c = Config(policy, workers);
  c.remote.enabled = true;
  return c;
}

// Fetch time of `blocks` 512-token blocks at the default fetch model, in ns.
int64_t DefaultFetchNs(int64_t blocks) {
  const double bits = static_cast<double>(blocks) * 512 * 32768 * 8;
  return 1'000'000 + static_cast<int64_t>(std::ceil(bits / 25e9 * 1e9));
}

RouteSimResult RunOk(const Trace& trace, const RouteSimConfig& c) {
  absl::StatusOr<RouteSimResult> r = RunRouteSim(trace, c);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : RouteSimResult{};
}

// P prefixes of `prefix_ids` ids, each request a prefix plus `suffix_ids` ids of its own, at
// `gap_s` intervals, prefixes drawn at random (seeded).
Trace SharedPrefixTrace(int prefixes, int prefix_ids, int suffix_ids, int requests, double gap_s,
                        uint64_t seed) {
  std::mt19937_64 rng(seed);
  Trace t;
  uint64_t next_id = 1'000'000;
  for (int i = 0; i < requests; ++i) {
    const uint64_t p = std::uniform_int_distribution<uint64_t>(0, prefixes - 1)(rng);
    std::vector<uint64_t> ids;
    for (int k = 0; k < prefix_ids; ++k) {
      ids.push_back(p * 1000 + static_cast<uint64_t>(k));
    }
    for (int k = 0; k < suffix_ids; ++k) {
      ids.push_back(next_id++);
    }
    const int64_t input = static_cast<int64_t>(ids.size()) * 512 - 100;  // last block partial
    t.records.push_back(Record(i * gap_s, input, 20, std::move(ids)));
  }
  return t;
}

// Five requests 10 s apart (everything finished and reported in between), block size 512 =
// one block per id, so hits are whole ids:
//   r0 [1,2,3] 1300 tokens: full blocks 1,2         -> 0
//   r1 [1,2,4] 1300:        full 1,2, both seen      -> 1024 (pooled; cache_aware follows them)
//   r2 [5,6,7] 1300:        new                      -> 0
//   r3 [5,6,8,9] 1800:      full 5,6,8; 5,6 seen     -> 1024
//   r4 [1,10] 600:          full 1, seen             -> 512
// Prompt tokens 6300, cached 2560 with a shared cache or perfect affinity. Round-robin over 2
// workers puts r0,r2,r4 on one worker and r1,r3 on the other: only r4 hits (block 1 of r0).
Trace TinyTrace() {
  Trace t;
  t.records.push_back(Record(0, 1300, 2, {1, 2, 3}));
  t.records.push_back(Record(10, 1300, 2, {1, 2, 4}));
  t.records.push_back(Record(20, 1300, 2, {5, 6, 7}));
  t.records.push_back(Record(30, 1800, 2, {5, 6, 8, 9}));
  t.records.push_back(Record(40, 600, 2, {1, 10}));
  return t;
}

TEST(RouteSimTest, TinyTraceHitRatiosByHand) {
  const Trace trace = TinyTrace();
  const RouteSimResult pooled = RunOk(trace, Config(SimPolicy::kPooled, 2));
  const RouteSimResult aware = RunOk(trace, Config(SimPolicy::kCacheAware, 2));
  const RouteSimResult rr = RunOk(trace, Config(SimPolicy::kRoundRobin, 2));
  for (const RouteSimResult* r : {&pooled, &aware, &rr}) {
    EXPECT_EQ(r->requests, 5);
    EXPECT_EQ(r->prompt_tokens, 6300);
  }
  EXPECT_EQ(pooled.cached_tokens, 2560);
  EXPECT_EQ(aware.cached_tokens, 2560);
  EXPECT_EQ(rr.cached_tokens, 512);
  EXPECT_DOUBLE_EQ(aware.hit_ratio, 2560.0 / 6300);
  EXPECT_DOUBLE_EQ(rr.hit_ratio, 512.0 / 6300);
  // Per request, as in the comment above.
  const std::vector<int64_t> expected = {0, 1024, 0, 1024, 512};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(pooled.outcomes[i].cached_tokens, expected[i]) << i;
    EXPECT_EQ(aware.outcomes[i].cached_tokens, expected[i]) << i;
  }
  EXPECT_EQ(aware.outcomes[1].worker, aware.outcomes[0].worker);
  EXPECT_EQ(aware.outcomes[3].worker, aware.outcomes[2].worker);
  EXPECT_EQ(aware.outcomes[4].worker, aware.outcomes[0].worker);
  EXPECT_EQ(aware.index_rejected_batches, 0);
  EXPECT_EQ(aware.affinity_missed_requests, 0);
  // Round-robin gave up r1's 2 blocks and r3's 2 blocks.
  EXPECT_EQ(rr.affinity_missed_requests, 2);
  EXPECT_EQ(rr.affinity_missed_blocks, 4);
}

TEST(RouteSimTest, SmallerBlocksSplitEachTraceId) {
  // Block size 256: two blocks per id. r1 of the tiny trace shares ids 1,2 = 4 blocks; r4 (600
  // tokens) has 2 full blocks, both of id 1.
  RouteSimConfig c = Config(SimPolicy::kPooled, 2);
  c.block_size = 256;
  c.capacity_blocks = 200;
  const RouteSimResult r = RunOk(TinyTrace(), c);
  EXPECT_EQ(r.outcomes[1].cached_tokens, 1024);
  EXPECT_EQ(r.outcomes[4].cached_tokens, 512);

  const std::vector<uint64_t> ids = {7, 8};
  const std::vector<BlockHash> a = TraceChain(ids, 1000, 512, 256);
  ASSERT_EQ(a.size(), 3u);  // 1000 tokens: 3 full blocks of 256
  const std::vector<BlockHash> b = TraceChain(std::vector<uint64_t>{7, 9}, 1024, 512, 256);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);  // id 8 vs 9
  EXPECT_NE(a[0], a[1]);  // the two halves of one id differ
}

TEST(RouteSimTest, DeterministicForASeed) {
  const Trace trace = SharedPrefixTrace(6, 4, 2, 300, 0.05, 7);
  for (SimPolicy policy :
       {SimPolicy::kCacheAware, SimPolicy::kRoundRobin, SimPolicy::kRandom, SimPolicy::kPooled}) {
    RouteSimConfig c = Config(policy, 4);
    c.seed = 42;
    c.arrival_jitter = absl::Seconds(1);
    const RouteSimResult a = RunOk(trace, c);
    const RouteSimResult b = RunOk(trace, c);
    ASSERT_EQ(a.outcomes.size(), b.outcomes.size());
    for (size_t i = 0; i < a.outcomes.size(); ++i) {
      EXPECT_EQ(a.outcomes[i].worker, b.outcomes[i].worker) << SimPolicyName(policy) << " " << i;
      EXPECT_EQ(a.outcomes[i].cached_tokens, b.outcomes[i].cached_tokens);
      EXPECT_EQ(a.outcomes[i].ttft_ns, b.outcomes[i].ttft_ns);
      EXPECT_EQ(a.outcomes[i].end_ns, b.outcomes[i].end_ns);
    }
    EXPECT_EQ(a.hit_ratio, b.hit_ratio);
  }
  // Another seed moves random placements.
  RouteSimConfig c = Config(SimPolicy::kRandom, 4);
  c.seed = 1;
  const RouteSimResult one = RunOk(trace, c);
  c.seed = 2;
  const RouteSimResult two = RunOk(trace, c);
  int differ = 0;
  for (size_t i = 0; i < one.outcomes.size(); ++i) {
    differ += one.outcomes[i].worker != two.outcomes[i].worker ? 1 : 0;
  }
  EXPECT_GT(differ, 0);
}

TEST(RouteSimTest, RoundRobinHitsLessThanCacheAwareOnSharedPrefixes) {
  const Trace trace = SharedPrefixTrace(16, 8, 2, 400, 0.2, 3);
  const RouteSimResult aware = RunOk(trace, Config(SimPolicy::kCacheAware, 8));
  const RouteSimResult rr = RunOk(trace, Config(SimPolicy::kRoundRobin, 8));
  const RouteSimResult pooled = RunOk(trace, Config(SimPolicy::kPooled, 8));
  EXPECT_GT(aware.hit_ratio, rr.hit_ratio + 0.1)
      << "cache_aware " << aware.hit_ratio << " round_robin " << rr.hit_ratio;
  EXPECT_LE(aware.hit_ratio, pooled.hit_ratio + 1e-12);
  EXPECT_GT(aware.reasons.at("cache_hit"), 0);
  EXPECT_EQ(rr.reasons.at("round_robin"), 400);
  EXPECT_DOUBLE_EQ(rr.request_imbalance, 1.0);  // 400 requests over 8 workers, in turn
}

TEST(RouteSimTest, CapacityEvictionEmitsRemovedEventsAndBoundsTheIndex) {
  // Every prompt new (6 ids, 5 full blocks), 20-block pools: workers must evict.
  Trace trace;
  for (int i = 0; i < 200; ++i) {
    std::vector<uint64_t> ids;
    for (int k = 0; k < 6; ++k) {
      ids.push_back(static_cast<uint64_t>(i) * 10 + static_cast<uint64_t>(k));
    }
    trace.records.push_back(Record(i * 0.5, 3000, 4, std::move(ids)));
  }
  for (SimPolicy policy : {SimPolicy::kCacheAware, SimPolicy::kRoundRobin}) {
    RouteSimConfig c = Config(policy, 2);
    c.capacity_blocks = 20;
    const RouteSimResult r = RunOk(trace, c);
    EXPECT_EQ(r.requests, 200);
    EXPECT_EQ(r.cached_tokens, 0);
    int64_t stored = 0;
    int64_t removed = 0;
    for (const SimWorkerResult& w : r.workers) {
      stored += w.stats.stored_blocks;
      removed += w.stats.removed_blocks;
      // What a pool still holds is bounded by its size.
      EXPECT_LE(w.stats.stored_blocks - w.stats.removed_blocks, 20);
    }
    EXPECT_EQ(stored, 200 * 5);
    EXPECT_GT(removed, 0);
    // The index follows the removals: never more entries than the pools hold, and its own
    // bound never had to evict.
    EXPECT_LE(r.index_max_entries, 2 * 20);
    EXPECT_EQ(r.index.entries, stored - removed);
    EXPECT_EQ(r.index.evictions, 0);
    EXPECT_EQ(r.index_rejected_batches, 0);
    EXPECT_GT(r.index.events_applied, 0);
  }
}

TEST(RouteSimTest, TimeModelByHand) {
  // One request of 1024 tokens and 3 output tokens on an idle worker: prefill 20 ms + 1024 /
  // 8000 s = 148 ms (the first token), then 2 decode steps of 30 + 0.3 ms at batch 1.
  Trace trace;
  trace.records.push_back(Record(1, 1024, 3, {1, 2}));
  RouteSimConfig c = Config(SimPolicy::kCacheAware, 1);
  const RouteSimResult r = RunOk(trace, c);
  ASSERT_EQ(r.outcomes.size(), 1u);
  EXPECT_EQ(r.outcomes[0].ttft_ns, 148'000'000);
  EXPECT_EQ(r.outcomes[0].end_ns, 1'000'000'000 + 148'000'000 + 60'600'000);
  EXPECT_EQ(r.workers[0].stats.prefill_tokens, 1024);
  // Two requests decoding together: each step costs 30 + 2 x 0.3 ms.
  trace.records.push_back(Record(1, 1024, 3, {3, 4}));
  const RouteSimResult two = RunOk(trace, c);
  // The second waits for the first prefill (148 ms), then its own (148 ms).
  EXPECT_EQ(two.outcomes[1].ttft_ns, 296'000'000);
  // The first decodes alone (30.3 ms/step) for 148 ms, i.e. 148/30.3 = 4.88 steps: more than
  // the 2 it needs, so it ended at 148 + 60.6 ms.
  EXPECT_EQ(two.outcomes[0].end_ns, 1'000'000'000 + 208'600'000);
}

TEST(RouteSimTest, RejectsWhatCanNeverFit) {
  Trace trace;
  trace.records.push_back(Record(0, 512 * 30, 10, std::vector<uint64_t>(30, 5)));
  RouteSimConfig c = Config(SimPolicy::kRoundRobin, 2);
  c.capacity_blocks = 20;
  const RouteSimResult r = RunOk(trace, c);
  EXPECT_EQ(r.rejected, 1);
  EXPECT_EQ(r.requests, 0);
  // The pooled pool is 2 x 20 blocks: it fits.
  c.policy = SimPolicy::kPooled;
  EXPECT_EQ(RunOk(trace, c).requests, 1);
}

TEST(RouteSimTest, ConfigErrors) {
  RouteSimConfig c;
  c.block_size = 300;  // does not divide 512
  EXPECT_THAT(c.Validate().message(), HasSubstr("--block_size"));
  c = RouteSimConfig();
  c.num_workers = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("--workers"));
  c = RouteSimConfig();
  c.scorer.prefill_weight = -1;
  EXPECT_FALSE(c.Validate().ok());
  c = RouteSimConfig();
  c.time.prefill_tokens_per_s = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("--prefill_tokens_per_s"));
  c = RouteSimConfig();
  c.remote.kv_bytes_per_token = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("--kv_bytes_per_token"));
  c = RouteSimConfig();
  c.remote.bandwidth_gbps = -1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("--fetch_bandwidth_gbps"));
  c.remote.bandwidth_gbps = std::nan("");
  EXPECT_THAT(c.Validate().message(), HasSubstr("--fetch_bandwidth_gbps"));
  c = RouteSimConfig();
  c.remote.latency = absl::Milliseconds(-1);
  EXPECT_THAT(c.Validate().message(), HasSubstr("--fetch_latency"));
  c = RouteSimConfig();
  c.scorer.remote_hit_weight = 2;
  EXPECT_THAT(c.Validate().message(), HasSubstr("remote_hit_weight"));
  EXPECT_FALSE(ParseSimPolicy("least_loaded").ok());
  EXPECT_EQ(*ParseSimPolicy("pooled"), SimPolicy::kPooled);
}

TEST(RouteSimTest, ReportHasEveryPolicyAndTheRatioToPooled) {
  const Trace trace = TinyTrace();
  std::vector<RouteSimResult> results = {RunOk(trace, Config(SimPolicy::kCacheAware, 2)),
                                         RunOk(trace, Config(SimPolicy::kPooled, 2))};
  RouteSimRunInfo info;
  info.trace = "tiny.jsonl";
  const nlohmann::json j = nlohmann::json::parse(RouteSimJson(results, info));
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["policy"], "cache_aware");
  EXPECT_DOUBLE_EQ(j["results"][0]["hit_ratio_vs_pooled"].get<double>(), 1.0);
  EXPECT_EQ(j["results"][0]["workers"].size(), 2u);
  EXPECT_TRUE(j["results"][0].contains("index"));
  EXPECT_FALSE(j["results"][1].contains("index"));
  EXPECT_EQ(j["config"]["trace"], "tiny.jsonl");
  const std::string table = RouteSimTable(results);
  EXPECT_THAT(table, HasSubstr("cache_aware"));
  EXPECT_THAT(table, HasSubstr("pooled"));
  // Remote fetch columns and fields (zero here: Config() turns fetching off).
  EXPECT_THAT(table, HasSubstr("hit_local"));
  EXPECT_THAT(table, HasSubstr("hit_l+r"));
  EXPECT_THAT(table, HasSubstr("recompute"));
  for (const char* field : {"hit_ratio_with_remote", "fetched_tokens", "fetched_blocks", "fetches",
                            "mean_fetch_ms", "fetch_share_of_ttft", "recompute_chosen"}) {
    EXPECT_TRUE(j["results"][0].contains(field)) << field;
  }
  EXPECT_EQ(j["results"][0]["hit_ratio_with_remote"], j["results"][0]["hit_ratio"]);
  EXPECT_TRUE(j["config"].contains("fetch_bandwidth_gbps"));
  EXPECT_TRUE(j["config"].contains("remote_hit_weight"));
}

// Every request starts with the same one-block system prompt and continues with 19 blocks of
// its own, 2 s apart (each finished before the next). With the default min_hit_fraction the
// one-block hit does not pull requests to the workers holding it and all 8 workers get work;
// with every hit attracting, the first holder takes everything (the trap at many idle-ish
// workers) — the hit ratio is the same, only the spread differs.
TEST(RouteSimTest, AShortCommonPrefixDoesNotLeaveWorkersIdle) {
  Trace t;
  uint64_t next_id = 1'000;
  for (int i = 0; i < 80; ++i) {
    std::vector<uint64_t> ids = {7};
    for (int k = 0; k < 19; ++k) {
      ids.push_back(next_id++);
    }
    t.records.push_back(Record(i * 2.0, 20 * 512, 4, std::move(ids)));
  }
  auto used = [](const RouteSimResult& r) {
    int n = 0;
    for (const SimWorkerResult& w : r.workers) {
      n += w.stats.requests > 0 ? 1 : 0;
    }
    return n;
  };
  RouteSimConfig c = Config(SimPolicy::kCacheAware, 8);
  const RouteSimResult spread = RunOk(t, c);
  EXPECT_EQ(used(spread), 8);
  EXPECT_LE(spread.request_imbalance, 1.2);
  c.scorer.min_hit_fraction = 0;
  const RouteSimResult trapped = RunOk(t, c);
  EXPECT_EQ(used(trapped), 1);
  EXPECT_EQ(spread.requests, 80);
  // Both hit block 7 on every request after a worker's first: 72 vs 79 hits of 512 tokens.
  EXPECT_EQ(spread.cached_tokens, 72 * 512);
  EXPECT_EQ(trapped.cached_tokens, 79 * 512);
}

// Round-robin over 2 workers: r0 [1,2,3] on w0; 10 s later r1 [1,2,4] on w1, which holds
// nothing but w0 holds blocks 1 and 2: w1 fetches them (11.7 ms) instead of computing them
// (128 ms), and computes only its last 276 tokens. r2 on w0; r3 [1,2,6] on w1 then hits the
// fetched blocks locally: they became w1's cached blocks.
TEST(RouteSimTest, AFetchHappensIsCountedAndTheBlocksStay) {
  Trace trace;
  trace.records.push_back(Record(0, 1300, 2, {1, 2, 3}));
  trace.records.push_back(Record(10, 1300, 2, {1, 2, 4}));
  trace.records.push_back(Record(20, 600, 2, {9, 10}));
  trace.records.push_back(Record(30, 1300, 2, {1, 2, 6}));
  const RouteSimResult r = RunOk(trace, RemoteConfig(SimPolicy::kRoundRobin, 2));
  ASSERT_EQ(r.requests, 4);
  EXPECT_EQ(r.outcomes[1].worker, 1);
  EXPECT_EQ(r.outcomes[1].cached_tokens, 0);
  EXPECT_EQ(r.outcomes[1].fetched_tokens, 1024);
  EXPECT_EQ(r.outcomes[1].fetch_ns, DefaultFetchNs(2));
  // TTFT: the fetch, then the overhead and 276 tokens at 8,000/s.
  EXPECT_EQ(r.outcomes[1].ttft_ns, DefaultFetchNs(2) + 20'000'000 + 34'500'000);
  EXPECT_EQ(r.outcomes[3].worker, 1);
  EXPECT_EQ(r.outcomes[3].cached_tokens, 1024);
  EXPECT_EQ(r.outcomes[3].fetched_tokens, 0);
  EXPECT_EQ(r.fetched_tokens, 1024);
  EXPECT_EQ(r.fetched_blocks, 2);
  EXPECT_EQ(r.fetches, 1);
  EXPECT_EQ(r.recompute_chosen, 0);
  EXPECT_EQ(r.workers[1].stats.fetched_tokens, 1024);
  EXPECT_EQ(r.workers[1].stats.prefill_tokens, 276 + 276);
  EXPECT_DOUBLE_EQ(r.hit_ratio, 1024.0 / 4500);
  EXPECT_DOUBLE_EQ(r.hit_ratio_with_remote, 2048.0 / 4500);
  EXPECT_DOUBLE_EQ(r.mean_fetch_ms, static_cast<double>(DefaultFetchNs(2)) / 1e6);
  EXPECT_GT(r.fetch_share_of_ttft, 0);
  // The fetched blocks were published as w1's (r1's 1 and 2; r3 adds none: its id 6 is its
  // partial last block).
  EXPECT_EQ(r.workers[1].stats.stored_blocks, 2);
  // Pooled fetches nothing: its hits are free already.
  const RouteSimResult pooled = RunOk(trace, RemoteConfig(SimPolicy::kPooled, 2));
  EXPECT_EQ(pooled.fetched_tokens, 0);
  EXPECT_EQ(pooled.recompute_chosen, 0);
}

// The cost rule: the same two requests with a link that moves a 16 MiB block in 1.3 s (0.1
// Gb/s) recompute (128 ms) and count the request that did; at 25 Gb/s they fetch. A fetch
// latency above the recompute time also makes them recompute.
TEST(RouteSimTest, SlowLinksRecomputeFastLinksFetch) {
  Trace trace;
  trace.records.push_back(Record(0, 1300, 2, {1, 2, 3}));
  trace.records.push_back(Record(10, 1300, 2, {1, 2, 4}));
  RouteSimConfig c = RemoteConfig(SimPolicy::kRoundRobin, 2);
  const RouteSimResult fast = RunOk(trace, c);
  EXPECT_EQ(fast.fetched_blocks, 2);
  EXPECT_EQ(fast.recompute_chosen, 0);
  c.remote.bandwidth_gbps = 0.1;
  const RouteSimResult slow = RunOk(trace, c);
  EXPECT_EQ(slow.fetched_blocks, 0);
  EXPECT_EQ(slow.recompute_chosen, 1);
  EXPECT_TRUE(slow.outcomes[1].recompute_chosen);
  EXPECT_EQ(slow.outcomes[1].ttft_ns, 20'000'000 + 162'500'000);  // 1300 tokens computed
  c.remote.bandwidth_gbps = 25;
  c.remote.latency = absl::Milliseconds(200);
  EXPECT_EQ(RunOk(trace, c).recompute_chosen, 1);
}

// A fetch that never pays off leaves every outcome as without remote fetch.
TEST(RouteSimTest, AnUnusedRemoteFetchChangesNothing) {
  const Trace trace = SharedPrefixTrace(6, 4, 2, 200, 0.05, 11);
  for (SimPolicy policy : {SimPolicy::kCacheAware, SimPolicy::kRoundRobin}) {
    const RouteSimResult off = RunOk(trace, Config(policy, 4));
    RouteSimConfig c = RemoteConfig(policy, 4);
    c.remote.bandwidth_gbps = 1e-6;
    const RouteSimResult never = RunOk(trace, c);
    EXPECT_EQ(never.fetched_tokens, 0);
    if (policy == SimPolicy::kRoundRobin) {
      EXPECT_GT(never.recompute_chosen, 0);
    }
    ASSERT_EQ(off.outcomes.size(), never.outcomes.size());
    for (size_t i = 0; i < off.outcomes.size(); ++i) {
      EXPECT_EQ(off.outcomes[i].worker, never.outcomes[i].worker) << i;
      EXPECT_EQ(off.outcomes[i].cached_tokens, never.outcomes[i].cached_tokens) << i;
      EXPECT_EQ(off.outcomes[i].ttft_ns, never.outcomes[i].ttft_ns) << i;
    }
  }
}

// Contention: w0 holds an 8-block prefix; two requests for it arrive together on idle w1 and
// w2 and both fetch from w0. The second waits for the first on w0's link: its fetch takes
// twice as long.
TEST(RouteSimTest, TwoFetchesFromOneHolderShareItsLink) {
  Trace trace;
  trace.records.push_back(Record(0, 9 * 512, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9}));
  trace.records.push_back(Record(10, 9 * 512, 2, {1, 2, 3, 4, 5, 6, 7, 8, 10}));
  trace.records.push_back(Record(10, 9 * 512, 2, {1, 2, 3, 4, 5, 6, 7, 8, 11}));
  const RouteSimResult r = RunOk(trace, RemoteConfig(SimPolicy::kRoundRobin, 3));
  ASSERT_EQ(r.outcomes[1].worker, 1);
  ASSERT_EQ(r.outcomes[2].worker, 2);
  EXPECT_EQ(r.outcomes[1].fetched_tokens, 8 * 512);
  EXPECT_EQ(r.outcomes[2].fetched_tokens, 8 * 512);
  EXPECT_EQ(r.outcomes[1].fetch_ns, DefaultFetchNs(8));
  EXPECT_EQ(r.outcomes[2].fetch_ns, 2 * DefaultFetchNs(8));
  EXPECT_EQ(r.outcomes[2].ttft_ns - r.outcomes[1].ttft_ns, DefaultFetchNs(8));
}

TEST(RouteSimTest, RemoteHitWeightFollowsTheFetchModel) {
  RouteSimConfig c;
  // 32 KiB x 8 bits x 8,000 tokens/s over 25 Gb/s: 0.0839.
  EXPECT_NEAR(RemoteHitWeightFromModel(c), 32768.0 * 8 * 8000 / 25e9, 1e-12);
  c.remote.bandwidth_gbps = 0.01;
  EXPECT_EQ(RemoteHitWeightFromModel(c), 1.0);  // slower than recomputing: no credit
  c.remote.enabled = false;
  EXPECT_EQ(RemoteHitWeightFromModel(c), 1.0);
}

}  // namespace
}  // namespace pd::loadtest::sim
