// offer_bench: what an eviction costs the worker's scheduler thread when it offers the block to
// the node's DRAM tier — the time inside TierClient::Offer (the hook runs inside an
// allocation) — with evicted blocks copied straight into reserved DRAM slots (unbound slots, the
// worker's default) against the staging path (--unbound_slots=0), and how many of the blocks
// tierd stored. Ceiling: a memcpy of the same block from a pool-sized source in the same run.
//
//   offer_bench --model=PATH [--tokenizer=PATH] [--blocks=4000] [--interval_us=100]
//               [--unbound_slots=16]
//
// Real pieces: pd-tierd's TierdServer (gRPC on loopback, shm DRAM pool, no NVMe) and the
// worker's TierClient; the eviction source is a host buffer with the model's block layout.
// Offers are paced --interval_us apart (evictions arrive as the pool turns over, not in one
// burst). Prints one JSON object per mode.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/hash/block_hash.h"
#include "common/log/log.h"
#include "common/metrics/metrics.h"
#include "engine/runtime/model_front.h"
#include "engine/runtime/model_runtime.h"
#include "services/base/kv_layout_proto.h"
#include "services/tier_client/tier_client.h"
#include "services/tier_shm/dram_slots.h"
#include "services/tierd/tierd_server.h"

ABSL_FLAG(std::string, model, "", "HF model directory or llama2.c checkpoint (required)");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.bin of a llama2.c checkpoint");
ABSL_FLAG(int64_t, blocks, 4000, "blocks offered per mode");
ABSL_FLAG(int64_t, interval_us, 100, "pause between offers (eviction pace)");
ABSL_FLAG(int64_t, unbound_slots, 16, "reserved slots of the in-place mode");
ABSL_FLAG(int64_t, dram_blocks, 1000,
          "DRAM tier size in blocks; fewer than --blocks, so slots are reused (a warm pool, as "
          "in steady state) once it has filled");

namespace pd {
namespace {

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1)))];
}

int Main() {
  const int64_t n = absl::GetFlag(FLAGS_blocks);
  const auto interval = absl::Microseconds(absl::GetFlag(FLAGS_interval_us));
  auto front = engine::ModelFront::Load(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_tokenizer));
  CHECK(front.ok()) << front.status();
  const kvcache::KvLayout layout = engine::KvLayoutForModel((*front)->config(), 16);
  const auto block_bytes = static_cast<size_t>(layout.block_bytes());
  // A pool-sized source (out of cache like an evicted block), walked block by block.
  const int64_t source_blocks = std::max<int64_t>(64, (int64_t{256} << 20) / layout.block_bytes());
  std::vector<uint8_t> source(static_cast<size_t>(source_blocks) * block_bytes);
  for (size_t i = 0; i < source.size(); i += 4096) source[i] = static_cast<uint8_t>(i >> 12);

  for (const int64_t unbound : {absl::GetFlag(FLAGS_unbound_slots), int64_t{0}}) {
    tierd::TierdConfig tc;
    tc.grpc_address = {"127.0.0.1", 0};
    tc.node_name = "offer-bench";
    tc.shm_name = absl::StrCat("/pd-offer-bench-", ::getpid(), "-", unbound);
    tc.model = absl::GetFlag(FLAGS_model);
    tc.tokenizer = absl::GetFlag(FLAGS_tokenizer);
    tc.dram_mib = std::max<int64_t>(
        1, (absl::GetFlag(FLAGS_dram_blocks) * tier_shm::SlotBytesFor(layout.block_bytes())) >> 20);
    metrics::Registry registry;
    auto server = tierd::TierdServer::Start(tc, &registry);
    CHECK(server.ok()) << server.status();
    tier_client::TierClientConfig cc;
    cc.tierd_address = (*server)->address();
    cc.worker_id = "bench";
    cc.layout = services::LayoutToProto(layout, (*front)->fingerprint());
    cc.unbound_slots = unbound;
    auto client = tier_client::TierClient::Start(cc);
    CHECK(client.ok()) << client.status();
    CHECK((*client)->WaitAttached(absl::Seconds(10)));
    absl::SleepFor(absl::Milliseconds(200));  // the first reservations

    std::vector<double> hook_us, memcpy_us;
    std::vector<uint8_t> dst(block_bytes);
    const absl::Time start = absl::Now();
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* src = source.data() + static_cast<size_t>(i % source_blocks) * block_bytes;
      const BlockHash hash{static_cast<uint64_t>(i) + 1, static_cast<uint64_t>(unbound) + 7};
      absl::Time t0 = absl::Now();
      (*client)->Offer(hash, absl::MakeConstSpan(src, block_bytes));
      hook_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      const uint8_t* other =
          source.data() + static_cast<size_t>((i + source_blocks / 2) % source_blocks) * block_bytes;
      t0 = absl::Now();
      std::memcpy(dst.data(), other, block_bytes);
      memcpy_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      absl::SleepFor(interval);
    }
    (*client)->FlushOffersForTest();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const tier_client::TierLinkStats st = (*client)->Stats();
    const double hook_p50 = Percentile(hook_us, 0.5);
    const double memcpy_p50 = Percentile(memcpy_us, 0.5);
    // The second half: every DRAM slot has been written before (its pages are mapped).
    const std::vector<double> warm(hook_us.begin() + static_cast<int64_t>(hook_us.size()) / 2,
                                   hook_us.end());
    const double warm_p50 = Percentile(warm, 0.5);
    std::printf(
        "{\"mode\":\"%s\",\"unbound_slots\":%lld,\"block_bytes\":%zu,\"blocks\":%lld,"
        "\"hook_us_p50\":%.2f,\"hook_us_p99\":%.2f,\"warm_hook_us_p50\":%.2f,\"warm_hook_us_p99\":%.2f,"
        "\"memcpy_us_p50\":%.2f,\"warm_hook_over_memcpy_p50\":%.2f,\"in_place\":%llu,"
        "\"stored\":%llu,\"dropped\":%llu,\"seconds\":%.2f}\n",
        unbound > 0 ? "in_place" : "staging", static_cast<long long>(unbound), block_bytes,
        static_cast<long long>(n), hook_p50, Percentile(hook_us, 0.99), warm_p50, Percentile(warm, 0.99), memcpy_p50,
        warm_p50 / memcpy_p50, static_cast<unsigned long long>(st.offered_in_place_blocks_total),
        static_cast<unsigned long long>(st.offer_stored_blocks_total),
        static_cast<unsigned long long>(st.offer_dropped_blocks_total), seconds);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_model).empty()) {
    std::fprintf(stderr, "offer_bench: --model is required (see --help)\n");
    return 2;
  }
  return pd::Main();
}
