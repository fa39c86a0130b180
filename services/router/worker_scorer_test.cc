#include "services/router/worker_scorer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::router {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBlockSize = 16;

WorkerCandidate Worker(std::string id, bool prefill, bool decode) {
  WorkerCandidate c;
  c.worker_id = id;
  c.address = absl::StrCat(id, ":1");
  c.healthy = true;
  c.can_prefill = prefill;
  c.can_decode = decode;
  c.free_kv_blocks = 10'000;
  c.total_kv_blocks = 10'000;
  return c;
}

std::vector<WorkerCandidate> Workers(int n, bool prefill = false, bool decode = true) {
  std::vector<WorkerCandidate> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(Worker(absl::StrCat("w", i), prefill, decode));
  }
  return out;
}

std::unique_ptr<WorkerScorer> NewScorer(ScorerConfig config = {}) {
  absl::StatusOr<std::unique_ptr<WorkerScorer>> scorer = WorkerScorer::Create(config);
  EXPECT_TRUE(scorer.ok()) << scorer.status();
  return *std::move(scorer);
}

RoutingDecision MustChoose(WorkerScorer& scorer, const std::vector<WorkerCandidate>& workers,
                           const std::vector<WorkerOverlap>& overlaps, int64_t prompt_tokens) {
  absl::StatusOr<RoutingDecision> d = scorer.Choose(workers, overlaps, prompt_tokens, kBlockSize);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : RoutingDecision{};
}

TEST(ScorerConfigTest, ParsePolicy) {
  EXPECT_EQ(*ParsePolicy("cache_aware"), ScorerPolicy::kCacheAware);
  EXPECT_EQ(*ParsePolicy("round_robin"), ScorerPolicy::kRoundRobin);
  EXPECT_EQ(*ParsePolicy("random"), ScorerPolicy::kRandom);
  for (ScorerPolicy p :
       {ScorerPolicy::kCacheAware, ScorerPolicy::kRoundRobin, ScorerPolicy::kRandom}) {
    EXPECT_EQ(*ParsePolicy(PolicyName(p)), p);
  }
  absl::StatusOr<ScorerPolicy> bad = ParsePolicy("least_loaded");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("least_loaded"));
  EXPECT_THAT(bad.status().message(), HasSubstr("cache_aware, round_robin, random"));
}

TEST(ScorerConfigTest, ValidateNamesTheField) {
  EXPECT_TRUE(ScorerConfig{}.Validate().ok());
  struct Case {
    std::string field;
    void (*mutate)(ScorerConfig&);
  };
  const Case cases[] = {
      {"prefill_weight", [](ScorerConfig& c) { c.prefill_weight = -1; }},
      {"dram_hit_weight", [](ScorerConfig& c) { c.dram_hit_weight = 1.5; }},
      {"nvme_hit_weight", [](ScorerConfig& c) { c.nvme_hit_weight = -0.1; }},
      {"remote_hit_weight", [](ScorerConfig& c) { c.remote_hit_weight = 1.01; }},
      {"decode_load_weight", [](ScorerConfig& c) { c.decode_load_weight = std::nan(""); }},
      {"inflight_weight", [](ScorerConfig& c) { c.inflight_weight = -3; }},
      {"inflight_blocks_weight", [](ScorerConfig& c) { c.inflight_blocks_weight = -1; }},
      {"backlog_prefill_weight", [](ScorerConfig& c) { c.backlog_prefill_weight = -0.5; }},
      {"min_hit_fraction", [](ScorerConfig& c) { c.min_hit_fraction = 1.2; }},
      {"disagg_threshold_tokens", [](ScorerConfig& c) { c.disagg_threshold_tokens = -1; }},
      {"policy", [](ScorerConfig& c) { c.policy = static_cast<ScorerPolicy>(42); }},
  };
  for (const Case& c : cases) {
    ScorerConfig config;
    c.mutate(config);
    absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
    EXPECT_FALSE(WorkerScorer::Create(config).ok());
  }
}

TEST(WorkerScorerTest, ErrorsForNoDecodeWorkerAndBadSizes) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(2);
  workers[0].healthy = false;
  workers[1].can_decode = false;
  absl::StatusOr<RoutingDecision> d = scorer->Choose(workers, {}, 100, kBlockSize);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(scorer->Choose({}, {}, 100, kBlockSize).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(scorer->Choose(Workers(1), {}, 0, kBlockSize).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scorer->Choose(Workers(1), {}, 10, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerScorerTest, PrefersTheWorkerHoldingThePrefix) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(3);
  std::vector<WorkerOverlap> overlaps = {{"w1", 3, 0, 0}, {"w2", 6, 0, 0}};
  for (int i = 0; i < 10; ++i) {
    RoutingDecision d = MustChoose(*scorer, workers, overlaps, 8 * kBlockSize);
    EXPECT_EQ(d.decode_index, 2);
    EXPECT_EQ(d.decode_overlap_blocks, 6);
    EXPECT_EQ(d.reason, "cache_hit");
    EXPECT_EQ(d.prefill_index, -1);
    EXPECT_EQ(d.prefill_reason, "no_prefill_worker");
  }
}

TEST(WorkerScorerTest, HbmHitBeatsDramHitBeatsNvmeHit) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(3);
  std::vector<WorkerOverlap> overlaps = {{"w0", 0, 0, 8}, {"w1", 0, 8, 0}, {"w2", 8, 0, 0}};
  EXPECT_EQ(MustChoose(*scorer, workers, overlaps, 8 * kBlockSize).decode_index, 2);
  overlaps.pop_back();
  EXPECT_EQ(MustChoose(*scorer, workers, overlaps, 8 * kBlockSize).decode_index, 1);
  overlaps.pop_back();
  EXPECT_EQ(MustChoose(*scorer, workers, overlaps, 8 * kBlockSize).decode_index, 0);
}

TEST(WorkerScorerTest, LoadOutweighsASmallCacheHit) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(2);
  workers[0].active_kv_blocks = 1000;
  RoutingDecision d = MustChoose(*scorer, workers, {{"w0", 4, 0, 0}}, 8 * kBlockSize);
  EXPECT_EQ(d.decode_index, 1);
  EXPECT_EQ(d.reason, "load");
  EXPECT_EQ(d.decode_overlap_blocks, 0);
}

TEST(WorkerScorerTest, UnhealthyAndNonDecodeWorkersAreSkipped) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(3);
  workers[0].healthy = false;
  workers[1].can_decode = false;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(MustChoose(*scorer, workers, {{"w0", 8, 0, 0}, {"w1", 8, 0, 0}}, 128).decode_index,
              2);
  }
}

TEST(WorkerScorerTest, AWorkerThatDoesNotFitIsChosenLast) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(2);
  workers[0].free_kv_blocks = 2;  // the prompt needs 8 new blocks
  RoutingDecision d = MustChoose(*scorer, workers, {{"w0", 0, 0, 0}}, 8 * kBlockSize);
  EXPECT_EQ(d.decode_index, 1);
  // With its cache hits it needs only 2 new blocks and fits again.
  d = MustChoose(*scorer, workers, {{"w0", 6, 0, 0}}, 8 * kBlockSize);
  EXPECT_EQ(d.decode_index, 0);
}

TEST(WorkerScorerTest, DisaggregatesAboveTheThresholdOnly) {
  ScorerConfig config;
  config.disagg_threshold_tokens = 64;
  auto scorer = NewScorer(config);
  std::vector<WorkerCandidate> workers = {Worker("d", false, true), Worker("p0", true, false),
                                          Worker("p1", true, false)};
  workers[1].queued_prefill_tokens = 4096;  // p0 is busy
  // 200 tokens, none cached: prefill on p1.
  RoutingDecision d = MustChoose(*scorer, workers, {}, 200);
  EXPECT_EQ(d.decode_index, 0);
  EXPECT_EQ(d.prefill_index, 2);
  EXPECT_EQ(d.prefill_reason, "remote_prefill");
  // 200 tokens, 10 blocks (160 tokens) cached on d: 40 uncached < 64, d prefills.
  d = MustChoose(*scorer, workers, {{"d", 8, 2, 0}}, 200);
  EXPECT_EQ(d.prefill_index, -1);
  EXPECT_EQ(d.prefill_reason, "below_disagg_threshold");
  EXPECT_EQ(d.decode_overlap_blocks, 10);
  // Threshold 0: always disaggregate, even a one-token prompt.
  config.disagg_threshold_tokens = 0;
  scorer = NewScorer(config);
  d = MustChoose(*scorer, workers, {{"d", 8, 2, 0}}, 1);
  EXPECT_EQ(d.prefill_index, 2);
}

TEST(WorkerScorerTest, PrefillWorkerIsChosenByItsCacheAndQueue) {
  ScorerConfig config;
  config.disagg_threshold_tokens = 0;
  auto scorer = NewScorer(config);
  std::vector<WorkerCandidate> workers = {Worker("d", false, true), Worker("p0", true, false),
                                          Worker("p1", true, false)};
  RoutingDecision d = MustChoose(*scorer, workers, {{"p1", 20, 0, 0}}, 32 * kBlockSize);
  EXPECT_EQ(d.prefill_index, 2);
  EXPECT_EQ(d.prefill_overlap_blocks, 20);
  // A long prefill queue on p1 outweighs its 20 cached blocks.
  workers[2].queued_prefill_tokens = 40 * kBlockSize;
  d = MustChoose(*scorer, workers, {{"p1", 20, 0, 0}}, 32 * kBlockSize);
  EXPECT_EQ(d.prefill_index, 1);
  EXPECT_EQ(d.prefill_overlap_blocks, 0);
}

TEST(WorkerScorerTest, ABothWorkerNeverPrefillsForItself) {
  ScorerConfig config;
  config.disagg_threshold_tokens = 0;
  auto scorer = NewScorer(config);
  // One aggregated worker alone: local prefill.
  std::vector<WorkerCandidate> workers = {Worker("both", true, true)};
  RoutingDecision d = MustChoose(*scorer, workers, {}, 512);
  EXPECT_EQ(d.decode_index, 0);
  EXPECT_EQ(d.prefill_index, -1);
  EXPECT_EQ(d.prefill_reason, "no_prefill_worker");
  // Two: each decodes and the other prefills.
  workers.push_back(Worker("both2", true, true));
  d = MustChoose(*scorer, workers, {{"both", 10, 0, 0}}, 512);
  EXPECT_EQ(d.decode_index, 0);
  EXPECT_EQ(d.prefill_index, 1);
}

TEST(WorkerScorerTest, RoundRobinCyclesThroughHealthyDecodeWorkers) {
  ScorerConfig config;
  config.policy = ScorerPolicy::kRoundRobin;
  config.disagg_threshold_tokens = 0;
  auto scorer = NewScorer(config);
  std::vector<WorkerCandidate> workers = {Worker("d0", false, true), Worker("p0", true, false),
                                          Worker("d1", false, true), Worker("p1", true, false),
                                          Worker("d2", false, true)};
  workers[4].healthy = false;
  std::vector<int> decode, prefill;
  for (int i = 0; i < 4; ++i) {
    RoutingDecision d = MustChoose(*scorer, workers, {{"d1", 100, 0, 0}}, 64);
    EXPECT_EQ(d.reason, "round_robin");
    decode.push_back(d.decode_index);
    prefill.push_back(d.prefill_index);
  }
  EXPECT_EQ(decode, (std::vector<int>{0, 2, 0, 2}));
  EXPECT_EQ(prefill, (std::vector<int>{1, 3, 1, 3}));
}

TEST(WorkerScorerTest, RandomSpreadsOverHealthyDecodeWorkers) {
  ScorerConfig config;
  config.policy = ScorerPolicy::kRandom;
  auto scorer = NewScorer(config);
  std::vector<WorkerCandidate> workers = Workers(4);
  workers[3].healthy = false;
  std::vector<int> count(4, 0);
  for (int i = 0; i < 3000; ++i) {
    RoutingDecision d = MustChoose(*scorer, workers, {}, 64);
    EXPECT_EQ(d.reason, "random");
    ++count[d.decode_index];
  }
  EXPECT_EQ(count[3], 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(count[i], 800) << i;
  }
}

TEST(WorkerScorerTest, DistinctPrefixesSpreadEvenlyWithInflightFeedback) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(4);
  absl::BitGen rng;
  std::vector<int64_t> assigned(4, 0);
  std::vector<std::vector<int>> running(4);  // remaining lifetimes of in-flight requests
  for (int request = 0; request < 10'000; ++request) {
    // Requests finish after a random number of further arrivals.
    for (int w = 0; w < 4; ++w) {
      auto& r = running[w];
      for (int& left : r) {
        --left;
      }
      r.erase(std::remove_if(r.begin(), r.end(), [](int left) { return left <= 0; }), r.end());
      workers[w].inflight_assigned = static_cast<int64_t>(r.size());
    }
    // Distinct chains: nobody holds anything, so the index reports no overlap.
    const int64_t prompt_tokens = absl::Uniform<int64_t>(rng, 16, 4096);
    RoutingDecision d = MustChoose(*scorer, workers, {}, prompt_tokens);
    ++assigned[d.decode_index];
    running[d.decode_index].push_back(absl::Uniform(rng, 1, 40));
  }
  const double mean = 10'000 / 4.0;
  const double max = static_cast<double>(*std::max_element(assigned.begin(), assigned.end()));
  EXPECT_LE(max / mean, 1.1) << assigned[0] << " " << assigned[1] << " " << assigned[2] << " "
                             << assigned[3];
}

TEST(WorkerScorerTest, EqualScoresRotateWithoutLoadFeedback) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(4);
  std::vector<int> count(4, 0);
  for (int i = 0; i < 400; ++i) {
    ++count[MustChoose(*scorer, workers, {}, 256).decode_index];
  }
  EXPECT_EQ(count, (std::vector<int>{100, 100, 100, 100}));
}

// One hot prefix (e.g. a shared system prompt), requests arriving faster than they finish, and
// the real index fed with the KV events a worker would publish after prefilling it: the first
// holder attracts the prefix until its load outweighs the hit, then other workers take it (and
// cache it), so no single worker gets everything.
TEST(WorkerScorerTest, HotPrefixSpillsOverWhenItsHolderGetsLoaded) {
  auto scorer = NewScorer();
  absl::StatusOr<std::unique_ptr<KvIndex>> index = KvIndex::Create({});
  ASSERT_TRUE(index.ok());
  std::vector<WorkerCandidate> workers = Workers(4);
  std::vector<BlockHash> chain;
  for (uint64_t i = 0; i < 64; ++i) {
    chain.push_back(BlockHash{42, i});
  }
  const std::string chain_bytes = ConcatBlockHashes(chain);
  std::vector<int> assigned(4, 0);
  int cache_hits = 0;
  for (int request = 0; request < 400; ++request) {
    RoutingDecision d = MustChoose(*scorer, workers, (*index)->Match(chain), 64 * kBlockSize + 5);
    ++assigned[d.decode_index];
    cache_hits += d.reason == "cache_hit";
    WorkerCandidate& w = workers[d.decode_index];
    ++w.inflight_assigned;
    w.active_kv_blocks += 65 - d.decode_overlap_blocks;
    pdserve::internal::v1::KvEventBatch batch;
    auto* stored = batch.add_events()->mutable_stored();
    stored->set_block_hashes(chain_bytes);
    stored->set_tier(pdserve::internal::v1::TIER_HBM);
    ASSERT_TRUE((*index)->Apply(w.worker_id, batch).ok());
  }
  // The prefix got cached by every worker, and then load decided.
  EXPECT_EQ((*index)->Match(chain).size(), 4u);
  for (int w = 0; w < 4; ++w) {
    EXPECT_GT(assigned[w], 40) << w;
    EXPECT_LT(assigned[w], 160) << w;
  }
  EXPECT_GT(cache_hits, 0);
}

TEST(WorkerScorerTest, ConcurrentChoose) {
  for (ScorerPolicy policy :
       {ScorerPolicy::kCacheAware, ScorerPolicy::kRoundRobin, ScorerPolicy::kRandom}) {
    ScorerConfig config;
    config.policy = policy;
    config.disagg_threshold_tokens = 0;
    auto scorer = NewScorer(config);
    std::vector<WorkerCandidate> workers = Workers(4, /*prefill=*/true);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 500; ++i) {
          absl::StatusOr<RoutingDecision> d =
              scorer->Choose(workers, {{"w1", 3, 1, 0}}, 300, kBlockSize);
          ASSERT_TRUE(d.ok());
          ASSERT_NE(d->decode_index, d->prefill_index);
        }
      });
    }
    for (std::thread& t : threads) {
      t.join();
    }
  }
}

// KV memory costs in proportion to how full the pool is: 500 referenced blocks in a pool of
// 100,000 do not outweigh a 6-block hit, the same blocks in a pool of 2,500 do.
TEST(WorkerScorerTest, KvLoadCountsAsThePoolFills) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(2);
  workers[0].active_kv_blocks = 500;
  workers[0].total_kv_blocks = 100'000;
  workers[0].free_kv_blocks = 99'500;
  RoutingDecision d = MustChoose(*scorer, workers, {{"w0", 6, 0, 0}}, 8 * kBlockSize);
  EXPECT_EQ(d.decode_index, 0);
  EXPECT_EQ(d.reason, "cache_hit");
  workers[0].total_kv_blocks = 2'500;
  workers[0].free_kv_blocks = 2'000;
  d = MustChoose(*scorer, workers, {{"w0", 6, 0, 0}}, 8 * kBlockSize);
  EXPECT_EQ(d.decode_index, 1);
  EXPECT_EQ(d.reason, "load");
}

// A hit below min_hit_fraction of the prompt (a 1-block system prompt of a 24-block prompt)
// does not pull requests to the workers holding it: an idle cold worker gets the request, so
// that at light load every worker warms up instead of the first holders taking everything.
TEST(WorkerScorerTest, AShortHitDoesNotAttract) {
  std::vector<WorkerCandidate> workers = Workers(4);
  for (int w : {0, 1}) {
    workers[w].active_kv_blocks = 24;  // one request decoding
    workers[w].running = 1;
  }
  const std::vector<WorkerOverlap> overlaps = {{"w0", 1, 0, 0}, {"w1", 1, 0, 0}};
  auto scorer = NewScorer();
  for (int i = 0; i < 4; ++i) {
    RoutingDecision d = MustChoose(*scorer, workers, overlaps, 24 * kBlockSize);
    EXPECT_GE(d.decode_index, 2) << i;
    EXPECT_EQ(d.reason, "load");
  }
  ScorerConfig every_hit;
  every_hit.min_hit_fraction = 0;
  auto attracted = NewScorer(every_hit);
  for (int i = 0; i < 4; ++i) {
    RoutingDecision d = MustChoose(*attracted, workers, overlaps, 24 * kBlockSize);
    EXPECT_LE(d.decode_index, 1) << i;
    EXPECT_EQ(d.reason, "cache_hit");
  }
}

// The holder of half the prompt has 40 blocks queued, the others 20 each: moving the request
// saves 20 blocks of waiting but adds 12 blocks of work to a busy worker. With the backlog
// weight the request stays on its holder; with a flat prefill weight it moves.
TEST(WorkerScorerTest, BusyOtherWorkersKeepARequestOnItsHolder) {
  std::vector<WorkerCandidate> workers = Workers(3);
  workers[0].queued_prefill_tokens = 40 * kBlockSize;
  workers[1].queued_prefill_tokens = 20 * kBlockSize;
  workers[2].queued_prefill_tokens = 20 * kBlockSize;
  const std::vector<WorkerOverlap> overlaps = {{"w0", 12, 0, 0}};
  auto scorer = NewScorer();
  EXPECT_EQ(MustChoose(*scorer, workers, overlaps, 24 * kBlockSize).decode_index, 0);
  ScorerConfig flat;
  flat.backlog_prefill_weight = 0;
  auto flat_scorer = NewScorer(flat);
  EXPECT_NE(MustChoose(*flat_scorer, workers, overlaps, 24 * kBlockSize).decode_index, 0);
}

// The backlog that raises the price of a miss is the backlog of the workers that would
// recompute, not the holders': holders of a hot prefix with 40 blocks queued each hand the
// request to an idle worker, which is what lets a hot prefix spread.
TEST(WorkerScorerTest, BusyHoldersSpillToAnIdleWorker) {
  std::vector<WorkerCandidate> workers = Workers(3);
  workers[0].queued_prefill_tokens = 40 * kBlockSize;
  workers[1].queued_prefill_tokens = 40 * kBlockSize;
  const std::vector<WorkerOverlap> overlaps = {{"w0", 12, 0, 0}, {"w1", 12, 0, 0}};
  auto scorer = NewScorer();
  RoutingDecision d = MustChoose(*scorer, workers, overlaps, 24 * kBlockSize);
  EXPECT_EQ(d.decode_index, 2);
  EXPECT_EQ(d.reason, "load");
  // Once the idle worker is as busy, the holders keep it.
  workers[2].queued_prefill_tokens = 40 * kBlockSize;
  d = MustChoose(*scorer, workers, overlaps, 24 * kBlockSize);
  EXPECT_LE(d.decode_index, 1);
  EXPECT_EQ(d.reason, "cache_hit");
}

// The holder of half a 24-block prompt has 8 blocks queued, the others none. Without remote
// credit the holder wins (12 + 8 blocks of work against 24 to recompute); when the other
// workers could fetch those 12 blocks at a tenth of their prefill cost, an idle worker's
// 24 - 10.8 beats the holder's 20, which is what a cluster-wide cache is for. An idle holder
// still keeps its requests: it saves even the fetch.
TEST(WorkerScorerTest, RemoteCreditMovesARequestFromABusyHolderToAnIdleWorker) {
  std::vector<WorkerCandidate> workers = Workers(3);
  workers[0].queued_prefill_tokens = 8 * kBlockSize;
  const std::vector<WorkerOverlap> overlaps = {{"w0", 12, 0, 0}};
  auto no_credit = NewScorer();  // remote_hit_weight = 1: the old model
  RoutingDecision d = MustChoose(*no_credit, workers, overlaps, 24 * kBlockSize);
  EXPECT_EQ(d.decode_index, 0);
  EXPECT_EQ(d.reason, "cache_hit");
  ScorerConfig remote;
  remote.remote_hit_weight = 0.1;
  auto credit = NewScorer(remote);
  d = MustChoose(*credit, workers, overlaps, 24 * kBlockSize);
  EXPECT_NE(d.decode_index, 0);
  EXPECT_EQ(d.reason, "load");
  EXPECT_EQ(d.decode_overlap_blocks, 0);  // its own overlap: the fetch is the worker's business
  workers[0].queued_prefill_tokens = 0;
  EXPECT_EQ(MustChoose(*credit, workers, overlaps, 24 * kBlockSize).decode_index, 0);
  // The holder's backlog must exceed the fetch's price (alpha · 0.1 · 12 = 1.2 blocks here).
  workers[0].queued_prefill_tokens = 1 * kBlockSize;
  EXPECT_EQ(MustChoose(*credit, workers, overlaps, 24 * kBlockSize).decode_index, 0);
  workers[0].queued_prefill_tokens = 2 * kBlockSize;
  EXPECT_NE(MustChoose(*credit, workers, overlaps, 24 * kBlockSize).decode_index, 0);
}

// m(w) is the longest other continuation: with free remote hits (weight 0) the worker holding 4
// blocks is credited the 8 more that the 12-block holder has, the one holding none all 12, the
// holder nothing; every worker is then worth 12 blocks, so the shortest queue wins. At weight
// 0.5 the 4-block holder is worth 4 + 4 = 8 blocks and the empty worker 6: with equal queues
// the partial holder wins over the empty one, and the full holder over both.
TEST(WorkerScorerTest, RemoteCreditIsTheLongestOtherContinuation) {
  std::vector<WorkerCandidate> workers = Workers(3);
  workers[0].queued_prefill_tokens = 3 * kBlockSize;
  workers[1].queued_prefill_tokens = 2 * kBlockSize;
  workers[2].queued_prefill_tokens = 1 * kBlockSize;
  const std::vector<WorkerOverlap> overlaps = {{"w0", 12, 0, 0}, {"w1", 4, 0, 0}};
  ScorerConfig free_fetch;
  free_fetch.remote_hit_weight = 0;
  auto scorer = NewScorer(free_fetch);
  EXPECT_EQ(MustChoose(*scorer, workers, overlaps, 24 * kBlockSize).decode_index, 2);
  ScorerConfig half;
  half.remote_hit_weight = 0.5;
  auto half_scorer = NewScorer(half);
  for (WorkerCandidate& w : workers) {
    w.queued_prefill_tokens = 0;
  }
  EXPECT_EQ(MustChoose(*half_scorer, workers, overlaps, 24 * kBlockSize).decode_index, 0);
  workers[0].queued_prefill_tokens = 40 * kBlockSize;
  EXPECT_EQ(MustChoose(*half_scorer, workers, overlaps, 24 * kBlockSize).decode_index, 1);
}

// The BusyOtherWorkersKeepARequestOnItsHolder case with remote credit at 0.1: the others would
// fetch the 12 blocks, not recompute them, so the backlog price of the move shrinks with the
// weight (alpha = 1 + 4 · 0.1 · 20 = 9): 9 · 13.2 + 20 beats the holder's 9 · 12 + 40 and the
// request leaves the busy holder. Unscaled (alpha = 81) the 1.2 blocks of fetch would cost 97
// blocks and it would stay.
TEST(WorkerScorerTest, RemoteCreditScalesTheBacklogPriceOfAMove) {
  std::vector<WorkerCandidate> workers = Workers(3);
  workers[0].queued_prefill_tokens = 40 * kBlockSize;
  workers[1].queued_prefill_tokens = 20 * kBlockSize;
  workers[2].queued_prefill_tokens = 20 * kBlockSize;
  const std::vector<WorkerOverlap> overlaps = {{"w0", 12, 0, 0}};
  ScorerConfig remote;
  remote.remote_hit_weight = 0.1;
  auto scorer = NewScorer(remote);
  EXPECT_NE(MustChoose(*scorer, workers, overlaps, 24 * kBlockSize).decode_index, 0);
  // Once the others are busier still (60 blocks each): alpha = 1 + 4 · 0.1 · 60 = 25, and
  // 25 · 13.2 + 60 = 390 against the holder's 25 · 12 + 40 = 340: it stays.
  workers[1].queued_prefill_tokens = 60 * kBlockSize;
  workers[2].queued_prefill_tokens = 60 * kBlockSize;
  EXPECT_EQ(MustChoose(*scorer, workers, overlaps, 24 * kBlockSize).decode_index, 0);
}

// The prompts placed since the last report, at their real size: w0 got one 30-block prompt, w1
// two 2-block ones. Charged 8 blocks per stream, w0 (8) looks less busy than w1 (16); counted
// by their blocks as well, w1 (16 + 4) is less busy than w0 (8 + 30).
TEST(WorkerScorerTest, InflightNewBlocksCountAsBacklog) {
  std::vector<WorkerCandidate> workers = Workers(2);
  workers[0].inflight_assigned = 1;
  workers[0].inflight_new_blocks = 30;
  workers[1].inflight_assigned = 2;
  workers[1].inflight_new_blocks = 4;
  auto counted_by_stream = NewScorer();
  EXPECT_EQ(MustChoose(*counted_by_stream, workers, {}, 24 * kBlockSize).decode_index, 0);
  ScorerConfig blocks;
  blocks.inflight_blocks_weight = 1;
  auto counted_by_blocks = NewScorer(blocks);
  EXPECT_EQ(MustChoose(*counted_by_blocks, workers, {}, 24 * kBlockSize).decode_index, 1);
}

TEST(WorkerScorerTest, OverlapsAreClampedToThePrompt) {
  auto scorer = NewScorer();
  std::vector<WorkerCandidate> workers = Workers(1);
  // A chain longer than the prompt's full blocks (caller passed a longer chain): clamped to 4.
  RoutingDecision d = MustChoose(*scorer, workers, {{"w0", 3, 5, 2}, {"ghost", 9, 0, 0}}, 70);
  EXPECT_EQ(d.decode_overlap_blocks, 4);
}

}  // namespace
}  // namespace pd::router
