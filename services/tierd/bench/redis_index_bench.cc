// redis_index_bench: updates/s of pd-tierd's Redis prefix index (RedisIndex::Publish + Flush)
// divided by what `redis-benchmark -P 16` reaches for plain SET on the same server, measured in
// the same run (issue #6 benchmark "Redis index updates/s versus redis-benchmark -P 16 SET",
// target >= 0.5).
//
//   redis_index_bench [--updates=1000000] [--reps=3] [--batch=1024]
//                     [--redis_benchmark_requests=1000000] [--redis_server=PATH]
//                     [--redis_benchmark=PATH]
//
// It starts its own redis-server on a free 127.0.0.1 port (no persistence), then per repetition:
//   1. ceiling: `redis-benchmark -p PORT -P 16 -t set -n R -q` (its own requests/s), then
//      `redis-benchmark ... -r 100000000 SET pd:bench:blk:x:__rand_int__ dram EX 600` (what the
//      server does for one entry without our client: a new key with a TTL);
//   2. FLUSHALL, then `updates` Publish calls of distinct random hashes (alternating DRAM/NVMe)
//      followed by one Flush, timed together: each update becomes `SET blk:<node>:<hex> <tier>
//      EX 600` plus its member in the batch's SADD, sent in pipelines of `batch` updates
//      ("insert"); then the same hashes again with the other tier ("overwrite": a TTL refresh or
//      a DRAM -> NVMe move).
// redis-server's main-thread CPU time (INFO cpu) is read around each timed pass. The ratio is
// taken per repetition, then the median is printed. Exits non-zero on any error.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log/log.h"
#include "common/redis/redis_client.h"
#include "common/testing/redis_server.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "services/tierd/redis_index.h"

ABSL_FLAG(int64_t, updates, 1'000'000, "RedisIndex updates per repetition");
ABSL_FLAG(int, reps, 3, "repetitions (ceiling and RedisIndex back to back), >= 1");
ABSL_FLAG(int64_t, batch, 1024, "RedisIndexConfig.max_batch");
ABSL_FLAG(int64_t, redis_benchmark_requests, 1'000'000, "redis-benchmark -n");
ABSL_FLAG(std::string, redis_server, "", "redis-server binary (default: on PATH)");
ABSL_FLAG(std::string, redis_benchmark, "/usr/bin/redis-benchmark", "redis-benchmark binary");

namespace pd::tierd {
namespace {

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs redis-benchmark against `port` with `args` appended and returns its requests/s (of the
// one test it runs).
absl::StatusOr<double> RunRedisBenchmark(const testing::TempDir& dir, int port, int64_t requests,
                                         const std::string& name,
                                         const std::vector<std::string>& args) {
  const std::string log = dir.File(absl::StrCat("redis-benchmark-", name, ".log"));
  std::vector<std::string> argv = {absl::GetFlag(FLAGS_redis_benchmark),
                                   "-h",
                                   "127.0.0.1",
                                   "-p",
                                   absl::StrCat(port),
                                   "-P",
                                   "16",
                                   "-n",
                                   absl::StrCat(requests),
                                   "-q"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = testing::Subprocess::Spawn(argv, log);
  if (!child.ok()) {
    return child.status();
  }
  auto exit = child->Wait(absl::Minutes(10));
  if (!exit.ok()) {
    return exit.status();
  }
  const std::string out = child->ReadLog();
  if (!exit->Success()) {
    return absl::InternalError(absl::StrCat("redis-benchmark ", exit->ToString(), ": ", out));
  }
  // The final line reads "SET: 1219512.25 requests per second, p50=..." (the test's name, then
  // ": "); progress lines before it are separated by '\r'.
  const size_t end = out.rfind(" requests per second");
  const size_t start = end == std::string::npos ? end : out.rfind(": ", end);
  double rps = 0;
  if (end == std::string::npos || start == std::string::npos ||
      !absl::SimpleAtod(out.substr(start + 2, end - start - 2), &rps) || rps <= 0) {
    return absl::InternalError(absl::StrCat("cannot parse redis-benchmark output: ", out));
  }
  return rps;
}

// CPU seconds redis-server's main thread used so far (INFO cpu).
absl::StatusOr<double> ServerCpuSeconds(redis::RedisClient& admin) {
  auto info = admin.Command({"INFO", "cpu"});
  if (!info.ok()) {
    return info.status();
  }
  double total = 0;
  int found = 0;
  for (absl::string_view line : absl::StrSplit(info->str, "\r\n")) {
    for (absl::string_view field : {"used_cpu_user_main_thread:", "used_cpu_sys_main_thread:"}) {
      double value = 0;
      if (absl::ConsumePrefix(&line, field) && absl::SimpleAtod(line, &value)) {
        total += value;
        ++found;
      }
    }
  }
  if (found != 2) {
    return absl::InternalError(absl::StrCat("no main-thread cpu in INFO cpu: ", info->str));
  }
  return total;
}

struct IndexRun {
  double updates_per_s = 0;
  double flush_seconds = 0;       // the Flush call alone
  double server_cpu_seconds = 0;  // redis-server main thread during Publish + Flush
  uint64_t batches = 0;
};

// Publishes `hashes` (tier alternating, starting with DRAM when `flip` is false) and flushes,
// timed together.
absl::StatusOr<IndexRun> TimedPublish(RedisIndex& index, redis::RedisClient& admin,
                                      const std::vector<BlockHash>& hashes, bool flip) {
  auto cpu_before = ServerCpuSeconds(admin);
  if (!cpu_before.ok()) {
    return cpu_before.status();
  }
  const uint64_t batches_before = index.Stats().batches_total;
  const uint64_t published_before = index.Stats().published_total;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < hashes.size(); ++i) {
    index.Publish(hashes[i],
                  (i % 2 == 0) != flip ? tier_shm::TierKind::kDram : tier_shm::TierKind::kNvme);
  }
  const absl::Time flush_start = absl::Now();
  if (absl::Status s = index.Flush(); !s.ok()) {
    return s;
  }
  const absl::Time end = absl::Now();
  auto cpu_after = ServerCpuSeconds(admin);
  if (!cpu_after.ok()) {
    return cpu_after.status();
  }
  const RedisIndexStats stats = index.Stats();
  if (stats.published_total - published_before != hashes.size()) {
    return absl::InternalError(absl::StrCat("published ", stats.published_total - published_before,
                                            " of ", hashes.size(), " updates"));
  }
  IndexRun run;
  run.updates_per_s = static_cast<double>(hashes.size()) / absl::ToDoubleSeconds(end - start);
  run.flush_seconds = absl::ToDoubleSeconds(end - flush_start);
  run.batches = stats.batches_total - batches_before;
  run.server_cpu_seconds = *cpu_after - *cpu_before;
  return run;
}

// Into an empty Redis: `updates` new entries (insert), then the same hashes again with the other
// tier (overwrite: what a TTL refresh or a DRAM -> NVMe move costs).
absl::StatusOr<std::pair<IndexRun, IndexRun>> RunIndex(RedisIndex& index, redis::RedisClient& admin,
                                                       int64_t updates, std::mt19937_64& rng) {
  auto flushed = admin.Command({"FLUSHALL"});
  if (!flushed.ok()) {
    return flushed.status();
  }
  std::vector<BlockHash> hashes(static_cast<size_t>(updates));
  for (BlockHash& h : hashes) {
    h = BlockHash{rng(), rng()};
  }
  auto insert = TimedPublish(index, admin, hashes, /*flip=*/false);
  if (!insert.ok()) {
    return insert.status();
  }
  auto overwrite = TimedPublish(index, admin, hashes, /*flip=*/true);
  if (!overwrite.ok()) {
    return overwrite.status();
  }
  return std::make_pair(*insert, *overwrite);
}

absl::Status Main() {
  const int reps = absl::GetFlag(FLAGS_reps);
  const int64_t updates = absl::GetFlag(FLAGS_updates);
  if (reps < 1 || updates < 1) {
    return absl::InvalidArgumentError("--reps and --updates must be >= 1");
  }
  testing::RedisServer::Options options;
  options.binary = absl::GetFlag(FLAGS_redis_server);
  auto server = testing::RedisServer::Start(options);
  if (!server.ok()) {
    return server.status();
  }
  auto dir = testing::TempDir::Create("pd-redis-index-bench-");
  if (!dir.ok()) {
    return dir.status();
  }
  redis::RedisConfig redis;
  redis.port = (*server)->port();
  redis.key_prefix = "pd:bench:";
  redis.command_timeout = absl::Seconds(10);
  RedisIndexConfig config;
  config.node = "bench-node";
  config.max_batch = absl::GetFlag(FLAGS_batch);
  config.max_pending = std::max<int64_t>(updates, 1);
  config.flush_interval = absl::Hours(1);  // only the timed Flush sends
  auto index = RedisIndex::Create(
      redis, config, [] { return std::vector<std::pair<BlockHash, tier_shm::TierKind>>(); });
  if (!index.ok()) {
    return index.status();
  }
  if (absl::Status s = (*index)->Flush(); !s.ok()) {  // connect + initial resync, untimed
    return s;
  }
  auto admin = redis::RedisClient::Connect(redis);
  if (!admin.ok()) {
    return admin.status();
  }

  std::printf("redis_index_bench: port %d, %lld updates x %d reps, batch %lld, load %s\n",
              (*server)->port(), static_cast<long long>(updates), reps,
              static_cast<long long>(config.max_batch), LoadAverage().c_str());
  std::mt19937_64 rng(42);
  const int64_t requests = absl::GetFlag(FLAGS_redis_benchmark_requests);
  std::vector<double> ratios, over_ratios, ceilings, layout_ceilings, rates, over_rates;
  for (int rep = 0; rep < reps; ++rep) {
    // The ceiling: plain SET of one key.
    auto ceiling = RunRedisBenchmark(*dir, (*server)->port(), requests, absl::StrCat("set-", rep),
                                     {"-t", "set"});
    if (!ceiling.ok()) {
      return ceiling.status();
    }
    // What the server does per index update, without our client: SET of a new key with EX
    // (the SADD member is not included).
    if (auto flushed = (*admin)->Command({"FLUSHALL"}); !flushed.ok()) {
      return flushed.status();
    }
    auto layout = RunRedisBenchmark(
        *dir, (*server)->port(), requests, absl::StrCat("layout-", rep),
        {"-r", "100000000", "SET", "pd:bench:blk:x:__rand_int__", "dram", "EX", "600"});
    if (!layout.ok()) {
      return layout.status();
    }
    auto runs = RunIndex(**index, **admin, updates, rng);
    if (!runs.ok()) {
      return runs.status();
    }
    const IndexRun& run = runs->first;
    const IndexRun& over = runs->second;
    const double ratio = run.updates_per_s / *ceiling;
    const double over_ratio = over.updates_per_s / *ceiling;
    std::printf(
        "rep %d: redis-benchmark -P 16 SET %.0f/s; SET new key EX %.0f/s; RedisIndex insert %.0f "
        "updates/s (flush %.3f s, %llu batches, server cpu %.2f us/update), ratio %.3f; "
        "overwrite %.0f updates/s (server cpu %.2f us/update), ratio %.3f\n",
        rep, *ceiling, *layout, run.updates_per_s, run.flush_seconds,
        static_cast<unsigned long long>(run.batches),
        run.server_cpu_seconds * 1e6 / static_cast<double>(updates), ratio, over.updates_per_s,
        over.server_cpu_seconds * 1e6 / static_cast<double>(updates), over_ratio);
    std::fflush(stdout);
    ratios.push_back(ratio);
    over_ratios.push_back(over_ratio);
    ceilings.push_back(*ceiling);
    layout_ceilings.push_back(*layout);
    rates.push_back(run.updates_per_s);
    over_rates.push_back(over.updates_per_s);
  }
  std::printf(
      "median: redis-benchmark -P 16 SET %.0f/s, SET new key EX %.0f/s; RedisIndex insert %.0f "
      "updates/s, ratio %.3f (target >= 0.5), vs SET new key EX %.3f; overwrite %.0f updates/s, "
      "ratio %.3f; load %s\n",
      Median(ceilings), Median(layout_ceilings), Median(rates), Median(ratios),
      Median(rates) / Median(layout_ceilings), Median(over_rates), Median(over_ratios),
      LoadAverage().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pd::tierd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pd::InitLogging(argv[0]);
  absl::Status status = pd::tierd::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "redis_index_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
