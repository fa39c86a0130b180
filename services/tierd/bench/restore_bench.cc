// restore_bench: is a tier hit worth it? Time to first token of a prompt whose first N blocks
// (default 32) are (a) recomputed by the engine, (b) restored from the node's DRAM tier, or
// (c) restored from its NVMe tier, all in one process and one run (issue #6 benchmarks).
//
//   restore_bench --model=PATH [--tokenizer=PATH] [--blocks=32] [--reps=5]
//                 [--dir=/var/tmp/pd-restore-bench] [--threads=0]
//
// Everything real except the process boundary: pd-tierd's TierdServer (gRPC on loopback, shm
// DRAM pool, O_DIRECT NVMe slabs in --dir), the worker's TierClient (Promote RPC, verified copy
// into the pool) and the engine (ModelRuntime + scheduler). Per repetition and path, the pool's
// prefix cache is emptied, a request for the N*block_size+1-token prompt (max_tokens 1) is
// submitted and the scheduler stepped until its output; TTFT is submit -> first token, i.e.
// Promote + copy + commit (+ NVMe read) + computing the one remaining token for (b) and (c).
// For (c) every block is moved DRAM -> NVMe before the repetition (O_DIRECT reads: no page
// cache). Prints one JSON object: medians in ms and recompute/restore ratios.
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
  tc.dram_mib = std::max<int64_t>(
      16, (4 * n * tierd::SlotBytesFor(layout.block_bytes()) >> 20) + 1);
  tc.nvme_dir = dir;
  tc.nvme_mib = tc.dram_mib;
  tc.high_watermark = 1.0;  // the benchmark moves blocks itself
  tc.low_watermark = 0.99;
  metrics::Registry registry;
  auto server = tierd::TierdServer::Start(tc, &registry);
  CHECK(server.ok()) << server.status();
  tierd::TierClientConfig cc;
  cc.tierd_address = (*server)->address();
  cc.worker_id = "bench";
  cc.layout = services::LayoutToProto(layout, runtime.fingerprint());
  auto client = tierd::TierClient::Start(cc);
  CHECK(client.ok()) << client.status();
  CHECK((*client)->WaitAttached(absl::Seconds(10)));

  // A prompt of n full blocks plus one token, random ids (BOS first).
  std::mt19937 rng(7);
  std::vector<uint32_t> prompt(static_cast<size_t>(n * bs + 1));
  std::uniform_int_distribution<uint32_t> tok(3, static_cast<uint32_t>(
                                                     runtime.model_config().vocab_size - 1));
  for (uint32_t& t : prompt) t = tok(rng);
  prompt[0] = 1;
  auto seed = ComputeHashSeed({runtime.fingerprint(), "f32", static_cast<uint32_t>(bs), ""});
  CHECK(seed.ok());
  const std::vector<BlockHash> chain =
      ComputeBlockHashes(*seed, prompt, static_cast<uint32_t>(bs));

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
  auto restored = [&]() {
    const absl::Time start = absl::Now();
    std::shared_ptr<const tierd::PromotedRun> promoted;
    absl::Notification got;
    (*client)->Prepare(chain, [&](std::shared_ptr<const tierd::PromotedRun> p) {
      promoted = std::move(p);
      got.Notify();
    });
    got.WaitForNotification();
    const double promote_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    CHECK(promoted != nullptr && static_cast<int64_t>(promoted->size()) == n)
        << "tiers hold " << (promoted ? promoted->size() : 0) << " of " << n << " blocks";
    engine::TierPrefix tp;
    tp.chain = chain;
    memory::HostKvPool* pool = runtime.kv_pool();
    tp.copy_in = [promoted, pool](int64_t i, BlockId dst) {
      return promoted->CopyOut(static_cast<size_t>(i), pool->BlockData(dst));
    };
    tp.release = [c = client->get(), promoted] { c->Release(*promoted); };
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
    (*client)->Offer(chain[static_cast<size_t>(b)],
                     absl::MakeConstSpan(runtime.kv_pool()->BlockData(id),
                                         runtime.kv_pool()->block_bytes()));
  }
  (*client)->FlushOffersForTest();
  for (int i = 0; i < reps; ++i) {
    Run r = restored();
    dram.push_back(r.ttft_ms);
    dram_copy.push_back(r.restore_ms);
  }
  for (int i = 0; i < reps; ++i) {
    // The previous restore's pins are released by the client thread: wait for them.
    while ((*server)->store()->Stats().dram.pinned_blocks > 0) absl::SleepFor(absl::Milliseconds(1));
    const tierd::SpillResult moved = (*server)->store()->Evict(n);  // DRAM -> NVMe
    CHECK_EQ(moved.written + moved.already_on_nvme, n) << "blocks not on NVMe";
    Run r = restored();
    nvme.push_back(r.ttft_ms);
    nvme_copy.push_back(r.restore_ms);
  }
  const double c = Median(cold), d = Median(dram), v = Median(nvme);
  std::printf(
      "{\"model\": \"%s\", \"blocks\": %lld, \"block_bytes\": %lld, \"prompt_tokens\": %zu, "
      "\"reps\": %d,\n \"recompute_ttft_ms\": %.3f, \"dram_restore_ttft_ms\": %.3f, "
      "\"dram_copy_ms\": %.3f, \"nvme_restore_ttft_ms\": %.3f, \"nvme_copy_ms\": %.3f,\n "
      "\"recompute_over_dram\": %.2f, \"recompute_over_nvme\": %.2f}\n",
      std::filesystem::path(rc.model).filename().c_str(), static_cast<long long>(n),
      static_cast<long long>(layout.block_bytes()), prompt.size(), reps, c, d,
      Median(dram_copy), v, Median(nvme_copy), c / d, c / v);
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
