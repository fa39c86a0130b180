// Benchmarks of the router's placement path: KvIndex::Match + WorkerScorer::Choose for a
// 128-block prompt against an index of ~1M distinct blocks over 64 workers, and KvIndex::Apply
// throughput.
//
// Workload (fixed seed): 1,000 shared prefixes ("system prompts", 4-64 blocks, popularity
// skewed towards low ids); chains of 8-256 blocks, 70% starting with a shared prefix, each
// stored by one of 64 workers (so popular prefixes are held by most workers); 60% of chains all
// in HBM, the rest with a tail spilled to DRAM and sometimes NVMe. Chains are added until 1M
// distinct blocks are indexed. Queries are 128-block prompts: 40% an indexed chain's first 128
// blocks, 20% an indexed chain's first part plus new blocks, 30% a shared prefix plus new
// blocks, 10% entirely new. Candidates: 48 decode-only and 16 prefill-only workers with random
// load reports.
//
//   BM_Route            per query: Match + Choose (cache_aware, default weights), timed one by
//                       one, and the ceiling in the same loop: the same query's chain looked up
//                       block by block in a plain absl::flat_hash_map<BlockHash, uint32_t>
//                       holding the same 1M keys, stopping at the first absent block, as
//                       Match's walk does (the memory-latency floor of any hash index).
//                       Counters: {match,choose,route,floor}_{p50,p99}_us, ratio_p50/_p99 =
//                       route / floor, lookups (mean blocks walked).
//   BM_RouteUnderWrites/N  the same route latency while N other threads apply KV events to
//                       the same index as fast as they can, each for its own worker (stored/
//                       removed runs of 256 blocks and a 4,096-block snapshot every 16 batches).
//                       Counters as BM_Route plus writer_events_per_s (all writers).
//   BM_ApplyBuild       Apply of every chain's batch into an empty index (the whole 1M-block
//                       build). Counters: events_per_s, blocks_per_s.
//   BM_ApplyChurn       steady state at the max_blocks bound: each Apply stores a new 16-block
//                       run (evicting as much) and removes an older one. Counters as above.
//
// Not a test (timings on a shared VM are noisy); results and the command go to
// docs/benchmarks.md:
//   build/services/router/bench/routing_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "services/router/kv_index.h"
#include "services/router/worker_scorer.h"

namespace pd::router {
namespace {

using pdserve::internal::v1::KvEvent;
using pdserve::internal::v1::KvEventBatch;
using pdserve::internal::v1::Tier;
using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 64;
constexpr int kDecodeWorkers = 48;
constexpr int64_t kTargetBlocks = 1'000'000;
constexpr int kFamilies = 1000;
constexpr int kQueryBlocks = 128;
constexpr int kNumQueries = 4096;
constexpr int64_t kBlockSize = 16;

std::string WorkerId(int w) { return absl::StrCat("worker-", w); }

BlockHash RandomHash(std::mt19937_64& rng) { return BlockHash{rng(), rng()}; }

std::string Bytes(const std::vector<BlockHash>& chain, size_t begin, size_t end) {
  return ConcatBlockHashes(absl::MakeConstSpan(chain).subspan(begin, end - begin));
}

struct Workload {
  std::vector<std::vector<BlockHash>> chains;
  std::vector<std::pair<int, KvEventBatch>> batches;  // (worker, batch) per chain
  int64_t events = 0;
  int64_t blocks_stored = 0;  // sum over stored runs
  std::unique_ptr<KvIndex> index;
  absl::flat_hash_map<BlockHash, uint32_t> plain;  // the ceiling's table: the same keys
  std::vector<std::vector<BlockHash>> queries;
  std::vector<WorkerCandidate> candidates;
  int64_t index_bytes = 0;  // resident memory the index build added
};

// Resident set size of this process (Linux), 0 when unknown.
int64_t RssBytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr) {
    return 0;
  }
  long pages = 0, resident = 0;
  const int n = fscanf(f, "%ld %ld", &pages, &resident);
  fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : 0;
}

Workload BuildWorkload() {
  Workload w;
  std::mt19937_64 rng(42);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<std::vector<BlockHash>> families(kFamilies);
  for (auto& f : families) {
    const int64_t len = uniform(4, 64);
    for (int64_t i = 0; i < len; ++i) {
      f.push_back(RandomHash(rng));
    }
  }
  while (static_cast<int64_t>(w.plain.size()) < kTargetBlocks) {
    const int64_t len = uniform(8, 256);
    std::vector<BlockHash> chain;
    if (uniform(0, 9) < 7) {
      // Skewed popularity: the smaller of two uniform draws.
      const int f =
          static_cast<int>(std::min(uniform(0, kFamilies - 1), uniform(0, kFamilies - 1)));
      const auto& prefix = families[f];
      const size_t take = std::min<size_t>(prefix.size(), static_cast<size_t>(len / 2));
      chain.assign(prefix.begin(), prefix.begin() + static_cast<ptrdiff_t>(take));
    }
    while (chain.size() < static_cast<size_t>(len)) {
      chain.push_back(RandomHash(rng));
    }
    for (const BlockHash& h : chain) {
      w.plain.emplace(h, 1);
    }

    const int worker = static_cast<int>(uniform(0, kWorkers - 1));
    size_t hbm_end = chain.size(), dram_end = chain.size();
    if (uniform(0, 9) >= 6) {
      hbm_end = static_cast<size_t>(uniform(1, len - 1));
      if (uniform(0, 1) == 1) {
        dram_end = static_cast<size_t>(uniform(static_cast<int64_t>(hbm_end), len));
      }
    }
    KvEventBatch batch;
    batch.set_worker_id(WorkerId(worker));
    auto add = [&](size_t begin, size_t end, Tier tier) {
      if (begin >= end) {
        return;
      }
      KvEvent* e = batch.add_events();
      e->set_sequence(static_cast<uint64_t>(batch.events_size()));
      auto* stored = e->mutable_stored();
      stored->set_block_hashes(Bytes(chain, begin, end));
      if (begin > 0) {
        stored->set_parent_hash(chain[begin - 1].ToBytes());
      }
      stored->set_tier(tier);
      stored->set_num_tokens(static_cast<uint32_t>((end - begin) * kBlockSize));
      ++w.events;
      w.blocks_stored += static_cast<int64_t>(end - begin);
    };
    add(0, hbm_end, pdserve::internal::v1::TIER_HBM);
    add(hbm_end, dram_end, pdserve::internal::v1::TIER_DRAM);
    add(dram_end, chain.size(), pdserve::internal::v1::TIER_NVME);
    w.batches.emplace_back(worker, std::move(batch));
    w.chains.push_back(std::move(chain));
  }

  const int64_t rss_before = RssBytes();
  w.index = *KvIndex::Create({});
  for (const auto& [worker, batch] : w.batches) {
    absl::Status status = w.index->Apply(WorkerId(worker), batch);
    if (!status.ok()) {
      fprintf(stderr, "apply: %s\n", status.ToString().c_str());
      abort();
    }
  }
  w.index_bytes = RssBytes() - rss_before;

  std::vector<size_t> long_chains;
  for (size_t i = 0; i < w.chains.size(); ++i) {
    if (w.chains[i].size() >= kQueryBlocks) {
      long_chains.push_back(i);
    }
  }
  for (int q = 0; q < kNumQueries; ++q) {
    std::vector<BlockHash> query;
    const int64_t kind = uniform(0, 9);
    if (kind < 4) {  // an indexed chain's first 128 blocks
      const auto& c =
          w.chains[long_chains[uniform(0, static_cast<int64_t>(long_chains.size()) - 1)]];
      query.assign(c.begin(), c.begin() + kQueryBlocks);
    } else if (kind < 6) {  // an indexed chain's first part, then new blocks
      const auto& c = w.chains[uniform(0, static_cast<int64_t>(w.chains.size()) - 1)];
      query.assign(c.begin(), c.begin() + uniform(1, static_cast<int64_t>(c.size()) - 1));
    } else if (kind < 9) {  // a shared prefix, then new blocks
      const int f =
          static_cast<int>(std::min(uniform(0, kFamilies - 1), uniform(0, kFamilies - 1)));
      query = families[f];
    }
    while (query.size() < kQueryBlocks) {
      query.push_back(RandomHash(rng));
    }
    query.resize(kQueryBlocks);
    w.queries.push_back(std::move(query));
  }

  for (int i = 0; i < kWorkers; ++i) {
    WorkerCandidate c;
    c.worker_id = WorkerId(i);
    c.address = absl::StrCat("10.0.0.", i, ":50051");
    c.healthy = true;
    c.can_decode = i < kDecodeWorkers;
    c.can_prefill = i >= kDecodeWorkers;
    c.total_kv_blocks = 50'000;
    c.active_kv_blocks = uniform(0, 20'000);
    c.free_kv_blocks = c.total_kv_blocks - c.active_kv_blocks;
    c.queued_prefill_tokens = uniform(0, 8192);
    c.running = static_cast<int32_t>(uniform(0, 64));
    c.waiting = static_cast<int32_t>(uniform(0, 8));
    c.inflight_assigned = uniform(0, 16);
    w.candidates.push_back(std::move(c));
  }
  return w;
}

Workload& SharedWorkload() {
  static Workload* workload = [] {
    auto start = Clock::now();
    auto* w = new Workload(BuildWorkload());
    KvIndexStats stats = w->index->Stats();
    fprintf(stderr,
            "workload: %zu chains, %zu distinct blocks indexed (%lld entries, %lld workers), "
            "%lld events, %.1f s to build; index resident memory %.1f MB (%.0f bytes/entry)\n",
            w->chains.size(), w->plain.size(), static_cast<long long>(stats.entries),
            static_cast<long long>(stats.workers), static_cast<long long>(w->events),
            std::chrono::duration<double>(Clock::now() - start).count(),
            static_cast<double>(w->index_bytes) / 1e6,
            static_cast<double>(w->index_bytes) / static_cast<double>(stats.entries));
    return w;
  }();
  return *workload;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// The timed loop shared by BM_Route and BM_RouteUnderWrites.
void RouteLoop(benchmark::State& state, Workload& w) {
  std::unique_ptr<WorkerScorer> scorer = *WorkerScorer::Create({});
  std::vector<double> match_us, choose_us, route_us, floor_us;
  int64_t lookups = 0;
  size_t q = 0;
  for (auto _ : state) {
    const std::vector<BlockHash>& query = w.queries[q++ % w.queries.size()];

    const auto t0 = Clock::now();
    int64_t walked = 0;
    for (const BlockHash& h : query) {
      auto it = w.plain.find(h);
      if (it == w.plain.end()) {
        break;
      }
      walked += it->second;
    }
    benchmark::DoNotOptimize(walked);
    const auto t1 = Clock::now();
    std::vector<WorkerOverlap> overlaps = w.index->Match(query);
    const auto t2 = Clock::now();
    absl::StatusOr<RoutingDecision> decision =
        scorer->Choose(w.candidates, overlaps, kQueryBlocks * kBlockSize, kBlockSize);
    const auto t3 = Clock::now();
    benchmark::DoNotOptimize(decision);
    if (!decision.ok()) {
      state.SkipWithError(decision.status().ToString().c_str());
      return;
    }
    lookups += walked;
    floor_us.push_back(Micros(t1 - t0));
    match_us.push_back(Micros(t2 - t1));
    choose_us.push_back(Micros(t3 - t2));
    route_us.push_back(Micros(t3 - t1));
  }
  auto report = [&](const char* name, const std::vector<double>& v) {
    state.counters[absl::StrCat(name, "_p50_us")] = Percentile(v, 0.50);
    state.counters[absl::StrCat(name, "_p99_us")] = Percentile(v, 0.99);
  };
  report("match", match_us);
  report("choose", choose_us);
  report("route", route_us);
  report("floor", floor_us);
  state.counters["ratio_p50"] = Percentile(route_us, 0.50) / Percentile(floor_us, 0.50);
  state.counters["ratio_p99"] = Percentile(route_us, 0.99) / Percentile(floor_us, 0.99);
  state.counters["lookups"] =
      static_cast<double>(lookups) / static_cast<double>(std::max<int64_t>(1, state.iterations()));
}

void BM_Route(benchmark::State& state) { RouteLoop(state, SharedWorkload()); }
BENCHMARK(BM_Route)->Unit(benchmark::kMicrosecond);

// Writer k of BM_RouteUnderWrites: its own worker id, so the routed workers' state is untouched.
void ChurnWriter(KvIndex* index, int k, const std::atomic<bool>* stop, int64_t* events) {
  const std::string worker_id = absl::StrCat("churn-writer-", k);
  std::mt19937_64 rng(7 + k);
  std::vector<BlockHash> chain(256);
  int64_t n = 0;
  uint64_t snapshot_sequence = 1;
  for (int64_t round = 0; !stop->load(std::memory_order_relaxed); ++round) {
    KvEventBatch batch;
    if (round % 16 == 15) {
      std::vector<BlockHash> big(4096);
      for (auto& h : big) {
        h = RandomHash(rng);
      }
      auto* run = batch.mutable_snapshot()->add_blocks();
      run->set_block_hashes(Bytes(big, 0, big.size()));
      run->set_tier(pdserve::internal::v1::TIER_HBM);
      batch.mutable_snapshot()->set_sequence(snapshot_sequence++);
      batch.mutable_snapshot()->set_complete(true);
    } else {
      for (auto& h : chain) {
        h = RandomHash(rng);
      }
      auto* stored = batch.add_events()->mutable_stored();
      stored->set_block_hashes(Bytes(chain, 0, chain.size()));
      stored->set_tier(pdserve::internal::v1::TIER_HBM);
      auto* removed = batch.add_events()->mutable_removed();
      removed->set_block_hashes(Bytes(chain, 0, chain.size() / 2));
      removed->set_tier(pdserve::internal::v1::TIER_HBM);
      n += 2;
    }
    if (!index->Apply(worker_id, batch).ok()) {
      abort();
    }
  }
  *events = n;
}

void BM_RouteUnderWrites(benchmark::State& state) {
  Workload& w = SharedWorkload();
  const int num_writers = static_cast<int>(state.range(0));
  std::atomic<bool> stop{false};
  std::vector<int64_t> events(num_writers, 0);
  const auto start = Clock::now();
  std::vector<std::thread> writers;
  for (int k = 0; k < num_writers; ++k) {
    writers.emplace_back(ChurnWriter, w.index.get(), k, &stop, &events[k]);
  }
  RouteLoop(state, w);
  stop = true;
  for (std::thread& t : writers) {
    t.join();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t total = 0;
  for (int k = 0; k < num_writers; ++k) {
    total += events[k];
    w.index->RemoveWorker(absl::StrCat("churn-writer-", k));
  }
  state.counters["writer_events_per_s"] = static_cast<double>(total) / seconds;
}
BENCHMARK(BM_RouteUnderWrites)->Arg(1)->Arg(4)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_ApplyBuild(benchmark::State& state) {
  Workload& w = SharedWorkload();
  double seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<KvIndex> index = *KvIndex::Create({});
    state.ResumeTiming();
    const auto start = Clock::now();
    for (const auto& [worker, batch] : w.batches) {
      benchmark::DoNotOptimize(index->Apply(WorkerId(worker), batch));
    }
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    state.PauseTiming();
    index.reset();
    state.ResumeTiming();
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["events_per_s"] = static_cast<double>(w.events) * iterations / seconds;
  state.counters["blocks_per_s"] = static_cast<double>(w.blocks_stored) * iterations / seconds;
}
BENCHMARK(BM_ApplyBuild)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_ApplyChurn(benchmark::State& state) {
  Workload& w = SharedWorkload();
  const int64_t entries = w.index->Stats().entries;
  std::unique_ptr<KvIndex> index = *KvIndex::Create(KvIndexConfig{entries});
  for (const auto& [worker, batch] : w.batches) {
    benchmark::DoNotOptimize(index->Apply(WorkerId(worker), batch));
  }
  // Prepared runs: batch i (for worker i % 64) stores run i and removes the first half of run
  // i - 64 (stored by the same worker), so the index grows by 8 entries a batch and evicts as
  // many.
  constexpr int kRuns = 4096;
  std::mt19937_64 rng(11);
  std::vector<std::string> runs(kRuns);
  for (auto& r : runs) {
    std::vector<BlockHash> chain(16);
    for (auto& h : chain) {
      h = RandomHash(rng);
    }
    r = Bytes(chain, 0, chain.size());
  }
  std::vector<KvEventBatch> batches(kRuns);
  for (int i = 0; i < kRuns; ++i) {
    auto* stored = batches[i].add_events()->mutable_stored();
    stored->set_block_hashes(runs[i]);
    stored->set_tier(pdserve::internal::v1::TIER_HBM);
    auto* removed = batches[i].add_events()->mutable_removed();
    removed->set_block_hashes(runs[(i + kRuns - kWorkers) % kRuns].substr(0, 8 * 16));
    removed->set_tier(pdserve::internal::v1::TIER_HBM);
  }
  int64_t i = 0;
  for (auto _ : state) {
    const int worker = static_cast<int>(i % kWorkers);
    benchmark::DoNotOptimize(index->Apply(WorkerId(worker), batches[i % kRuns]));
    ++i;
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(2 * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["blocks_per_s"] =
      benchmark::Counter(static_cast<double>(32 * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["evictions"] = static_cast<double>(index->Stats().evictions);
}
BENCHMARK(BM_ApplyChurn)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pd::router

BENCHMARK_MAIN();
