// restore_bench: is a tier hit worth it? Time to first token of a prompt whose first N blocks
// (default 32) are (a) recomputed by the engine, (b) restored from the node's DRAM tier, or
// (c) restored from its NVMe tier, all in one process and one run (issue #6 benchmarks); with
// --peer_transport, also (d) restored on a second node whose tierd fetches the blocks from the
// first one's DRAM over that KV transport (remote restore, issue #19; a redis-server is started
// on loopback for the directory). UCX over TCP: --peer_transport=ucx with UCX_TLS=tcp set.
//
//   restore_bench --model=PATH [--tokenizer=PATH] [--blocks=32] [--reps=5]
//                 [--dir=/var/tmp/pd-restore-bench] [--threads=0] [--peer_transport=tcp|ucx]
//
// Everything real except the process boundary: pd-tierd's TierdServer (gRPC on loopback, shm
// DRAM pool, O_DIRECT NVMe slabs in --dir), the worker's TierClient (Promote RPC, verified copy
// into the pool) and the engine (ModelRuntime + scheduler). Per repetition and path, the pool's
// prefix cache is emptied, a request for the N*block_size+1-token prompt (max_tokens 1) is
// submitted and the scheduler stepped until its output; TTFT is submit -> first token, i.e.
// Promote + copy + commit (+ NVMe read) + computing the one remaining token for (b) and (c).
// For (c) every block is moved DRAM -> NVMe before the repetition (O_DIRECT reads: no page
// cache). For (d) the second node's copy is dropped before each repetition, so every one
// fetches. Prints one JSON object: medians in ms and recompute/restore ratios.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/hash/block_hash.h"
#include "common/log/log.h"
#include "common/metrics/metrics.h"
#include "common/redis/redis_client.h"
#include "common/testing/redis_server.h"
#include "engine/runtime/model_runtime.h"
#include "services/base/kv_layout_proto.h"
#include "services/tier_client/tier_client.h"
#include "services/tierd/tierd_server.h"

ABSL_FLAG(std::string, model, "", "HF model directory or llama2.c checkpoint (required)");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.bin of a llama2.c checkpoint");
ABSL_FLAG(int64_t, blocks, 32, "prefix blocks restored or recomputed");
ABSL_FLAG(int, reps, 5, "repetitions per path (the median is reported)");
ABSL_FLAG(std::string, dir, "/var/tmp/pd-restore-bench", "NVMe tier directory (removed at exit)");
ABSL_FLAG(int, threads, 0, "engine threads; 0 = all cores");
ABSL_FLAG(std::string, peer_transport, "",
          "tcp or ucx: also measure a restore fetched from another node's tierd; empty = skip");

namespace pd {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Run {
  double ttft_ms = 0;
  double restore_ms = 0;
  uint32_t restored_tokens = 0;
};

int Main() {
  const int64_t n = absl::GetFlag(FLAGS_blocks);
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::remove_all(dir);

  engine::ModelRuntimeConfig rc;
  rc.model = absl::GetFlag(FLAGS_model);
  rc.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  rc.kv_blocks = 2 * n + 8;
  rc.threads = absl::GetFlag(FLAGS_threads);
  rc.scheduler.max_batch_tokens = static_cast<int64_t>(n * 16 + 16);
  auto rt = engine::ModelRuntime::Create(rc);
  CHECK(rt.ok()) << rt.status();
  engine::ModelRuntime& runtime = **rt;
  const kvcache::KvLayout layout = runtime.kv_layout();
  const int64_t bs = layout.block_size;
  CHECK_LT(n * bs + 1, runtime.model_config().seq_len)
      << "--blocks too large for the model's context";

  tierd::TierdConfig tc;
  tc.grpc_address = {"127.0.0.1", 0};
  tc.node_name = "bench";
  tc.shm_name = absl::StrCat("/pd-restore-bench-", ::getpid());
  tc.model = rc.model;
  tc.tokenizer = rc.tokenizer;
  tc.dram_mib =
      std::max<int64_t>(16, (4 * n * tier_shm::SlotBytesFor(layout.block_bytes()) >> 20) + 1);
  tc.nvme_dir = dir;
  tc.nvme_mib = tc.dram_mib;
  tc.high_watermark = 1.0;  // the benchmark moves blocks itself
  tc.low_watermark = 0.99;
  const std::string peer = absl::GetFlag(FLAGS_peer_transport);
  std::unique_ptr<testing::RedisServer> redis;
  if (!peer.empty()) {
    auto r = testing::RedisServer::Start({});
    CHECK(r.ok()) << r.status();
    redis = *std::move(r);
    tc.redis.emplace();
    tc.redis->host = redis->host();
    tc.redis->port = redis->port();
    tc.peer_transport = peer;
    tc.peer_fetch_timeout = absl::Seconds(60);
  }
  metrics::Registry registry;
  auto server = tierd::TierdServer::Start(tc, &registry);
  CHECK(server.ok()) << server.status();
  // The second node: DRAM only, its own worker client.
  std::unique_ptr<tierd::TierdServer> server_b;
  std::unique_ptr<tier_client::TierClient> client_b;
  metrics::Registry registry_b;
  if (!peer.empty()) {
    tierd::TierdConfig tb = tc;
    tb.node_name = "bench-b";
    tb.shm_name = absl::StrCat("/pd-restore-bench-b-", ::getpid());
    tb.nvme_dir.clear();
    tb.nvme_mib = 0;
    auto b = tierd::TierdServer::Start(tb, &registry_b);
    CHECK(b.ok()) << b.status();
    server_b = *std::move(b);
  }
  tier_client::TierClientConfig cc;
  cc.tierd_address = (*server)->address();
  cc.worker_id = "bench";
  cc.layout = services::LayoutToProto(layout, runtime.fingerprint());
  auto client = tier_client::TierClient::Start(cc);
  CHECK(client.ok()) << client.status();
  CHECK((*client)->WaitAttached(absl::Seconds(10)));
  if (server_b != nullptr) {
    tier_client::TierClientConfig cb = cc;
    cb.tierd_address = server_b->address();
    cb.worker_id = "bench-b";
    cb.rpc_timeout = absl::Seconds(120);  // a 4k-token fetch of a 1b model moves 256 MiB
    auto c = tier_client::TierClient::Start(cb);
    CHECK(c.ok()) << c.status();
    client_b = *std::move(c);
    CHECK(client_b->WaitAttached(absl::Seconds(10)));
  }

  // A prompt of n full blocks plus one token, random ids (BOS first).
  std::mt19937 rng(7);
  std::vector<uint32_t> prompt(static_cast<size_t>(n * bs + 1));
  std::uniform_int_distribution<uint32_t> tok(
      3, static_cast<uint32_t>(runtime.model_config().vocab_size - 1));
  for (uint32_t& t : prompt) t = tok(rng);
  prompt[0] = 1;
  auto seed = ComputeHashSeed({runtime.fingerprint(), "f32", static_cast<uint32_t>(bs), ""});
  CHECK(seed.ok());
  const std::vector<BlockHash> chain = ComputeBlockHashes(*seed, prompt, static_cast<uint32_t>(bs));

  engine::Scheduler* sched = runtime.scheduler();
  uint64_t next_id = 1;
  auto run = [&](engine::TierPrefix prefix) {
    runtime.kv_cache()->ResetPrefixCache();
    Run r;
    bool done = false;
    engine::GenerationRequest req;
    req.id = RequestId(next_id++);
    req.prompt = prompt;
    req.sampling.max_tokens = 1;
    req.tier_prefix = std::move(prefix);
    const absl::Time start = absl::Now();
    req.on_output = [&](engine::GenerationOutput out) {
      if (!out.new_tokens.empty() && r.ttft_ms == 0) {
        r.ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      }
      if (out.finish_reason != engine::FinishReason::kNone) {
        r.restore_ms = absl::ToDoubleMilliseconds(out.timings.restore);
        r.restored_tokens = out.restored_tokens;
        done = true;
      }
    };
    CHECK(sched->Submit(std::move(req)).ok());
    while (!done) sched->Step();
    return r;
  };
  // What the worker does: Prepare (Promote) then attach the run as the request's tier prefix.
  double promote_ms = 0;  // of the last restored()
  auto restored = [&](tier_client::TierClient* from) {
    const absl::Time start = absl::Now();
    std::shared_ptr<const tier_client::PromotedRun> promoted;
    absl::Notification got;
    from->Prepare(
        chain,
        [&](std::shared_ptr<const tier_client::PromotedRun> p) {
          promoted = std::move(p);
          got.Notify();
        },
        /*recompute_seconds_per_block=*/0);
    got.WaitForNotification();
    promote_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    CHECK(promoted != nullptr && static_cast<int64_t>(promoted->size()) == n)
        << "tiers hold " << (promoted ? promoted->size() : 0) << " of " << n << " blocks";
    engine::TierPrefix tp;
    tp.chain = chain;
    memory::HostKvPool* pool = runtime.kv_pool();
    tp.copy_in = [promoted, pool](int64_t i, BlockId dst) {
      return promoted->CopyOut(static_cast<size_t>(i), pool->BlockData(dst));
    };
    tp.release = [from, promoted] { from->Release(*promoted); };
    Run r = run(std::move(tp));
    CHECK_EQ(r.restored_tokens, static_cast<uint32_t>(n * bs));
    r.ttft_ms += promote_ms;  // the request waits for Promote before it is submitted
    return r;
  };

  std::vector<double> cold, dram, dram_copy, nvme, nvme_copy;
  run({});  // warm-up (page faults of the pool, thread start)
  for (int i = 0; i < reps; ++i) cold.push_back(run({}).ttft_ms);

  // Offer the computed blocks to the DRAM tier, as the eviction hook would.
  for (int64_t b = 0; b < n; ++b) {
    const BlockId id = runtime.kv_cache()->pool().Lookup(chain[static_cast<size_t>(b)]);
    CHECK(id != BlockId::Invalid());
    (*client)->Offer(
        chain[static_cast<size_t>(b)],
        absl::MakeConstSpan(runtime.kv_pool()->BlockData(id), runtime.kv_pool()->block_bytes()));
  }
  (*client)->FlushOffersForTest();
  for (int i = 0; i < reps; ++i) {
    Run r = restored(client->get());
    dram.push_back(r.ttft_ms);
    dram_copy.push_back(r.restore_ms);
  }
  std::vector<double> remote, remote_promote;
  if (server_b != nullptr) {
    // Node b learns from Redis that node a holds the chain.
    (*server)->FlushIndexForTest();
    auto rc_client = redis::RedisClient::Connect(*tc.redis);
    CHECK(rc_client.ok()) << rc_client.status();
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (absl::Now() < until) {
      auto tiers = tierd::RedisIndex::Lookup(**rc_client, tc.node_name, chain);
      if (tiers.ok() && static_cast<int64_t>(tiers->size()) == n) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (int i = 0; i < reps; ++i) {
      // Node b drops its copy from the previous repetition (no NVMe there): every one fetches.
      while (server_b->store()->Stats().dram.pinned_blocks > 0) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      server_b->store()->Evict(server_b->store()->dram()->num_slots());
      Run r = restored(client_b.get());
      remote.push_back(r.ttft_ms);
      remote_promote.push_back(promote_ms);
    }
    CHECK_EQ(server_b->peer()->Stats().fetched_blocks_total, static_cast<uint64_t>(n * reps))
        << "node b did not fetch every block from node a";
  }
  for (int i = 0; i < reps; ++i) {
    // The previous restore's pins are released by the client thread: wait for them.
    while ((*server)->store()->Stats().dram.pinned_blocks > 0)
      absl::SleepFor(absl::Milliseconds(1));
    const tierd::SpillResult moved = (*server)->store()->Evict(n);  // DRAM -> NVMe
    CHECK_EQ(moved.written + moved.already_on_nvme, n) << "blocks not on NVMe";
    Run r = restored(client->get());
    nvme.push_back(r.ttft_ms);
    nvme_copy.push_back(r.restore_ms);
  }
  const double c = Median(cold), d = Median(dram), v = Median(nvme);
  std::string remote_json;
  if (!remote.empty()) {
    const double m = Median(remote);
    remote_json = absl::StrFormat(
        ",\n \"peer_transport\": \"%s\", \"remote_restore_ttft_ms\": %.3f, "
        "\"remote_promote_ms\": %.3f, \"recompute_over_remote\": %.2f",
        peer, m, Median(remote_promote), c / m);
  }
  std::printf(
      "{\"model\": \"%s\", \"blocks\": %lld, \"block_bytes\": %lld, \"prompt_tokens\": %zu, "
      "\"reps\": %d,\n \"recompute_ttft_ms\": %.3f, \"dram_restore_ttft_ms\": %.3f, "
      "\"dram_copy_ms\": %.3f, \"nvme_restore_ttft_ms\": %.3f, \"nvme_copy_ms\": %.3f,\n "
      "\"recompute_over_dram\": %.2f, \"recompute_over_nvme\": %.2f%s}\n",
      std::filesystem::path(rc.model).filename().c_str(), static_cast<long long>(n),
      static_cast<long long>(layout.block_bytes()), prompt.size(), reps, c, d, Median(dram_copy), v,
      Median(nvme_copy), c / d, c / v, remote_json.c_str());
  client_b.reset();
  server_b.reset();
  client->reset();
  server->reset();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace pd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_model).empty()) {
    std::fprintf(stderr, "restore_bench: --model is required\n");
    return 2;
  }
  return pd::Main();
}
