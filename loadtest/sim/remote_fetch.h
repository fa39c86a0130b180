// RemoteFetcher: the cluster-wide KV cache of pd-routesim (issue #19 items 1 and 2, modelled, not
// built): when a worker starts a prefill, the leading blocks of the prompt after its own cache
// hit that another worker's pool holds at that moment may be fetched from that worker over the
// KV transport instead of computed.
//
// Model:
//   holder      the other worker whose pool holds the longest run of the chain (ground truth of
//               the simulated pools, not the router's index); among equals, the one whose link
//               frees first
//   fetch time  latency + blocks · block_bytes / bandwidth, block_bytes = block_size ·
//               kv_bytes_per_token
//   contention  each worker's outgoing link is one FIFO server: a fetch from holder h starts
//               when h's link has finished the fetches granted before it, and holds the link
//               for its whole fetch time; a hot holder is not free bandwidth
//   decision    per request (issue #19 item 2): fetch when the fetch would end (link queue
//               included) sooner than the recompute of those blocks would take
//               (blocks · block_size / prefill_tokens_per_s); otherwise recompute them all
// The holder does not pin the blocks for the fetch (a real pd-tierd would); at the pools' sizes
// of the shared trace a block being read is almost never evicted meanwhile.
//
// Thread-compatible: owned and called by the simulator's single thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_cache_manager.h"

namespace pd::loadtest::sim {

// The fetch model's constants (pd-routesim flags; defaults there: a 1B-class model's KV over a
// 25 Gb/s link).
struct RemoteFetchConfig {
  bool enabled = true;                             // --remote_fetch
  int64_t kv_bytes_per_token = 32'768;             // --kv_bytes_per_token, > 0
  double bandwidth_gbps = 25;                      // --fetch_bandwidth_gbps, gigabits/s, > 0
  absl::Duration latency = absl::Milliseconds(1);  // --fetch_latency, per fetch, >= 0

  // InvalidArgument naming the flag.
  absl::Status Validate() const;

  // Seconds to move one block of `block_size` tokens (latency excluded).
  double BlockSeconds(int64_t block_size) const;
};

// What RemoteFetcher::Plan decided for one prefill.
struct FetchPlan {
  int holder = -1;               // the worker fetched from (or that held the blocks); -1 = none
  int64_t available_blocks = 0;  // blocks after the local hit that the holder had
  int64_t blocks = 0;            // blocks fetched: 0 or available_blocks
  int64_t wait_ns = 0;           // time in the holder's link queue (when fetched)
  int64_t end_ns = 0;            // when the fetched blocks are in place (when fetched)
};

class RemoteFetcher {
 public:
  // `pools[w]` is worker w's pool (not owned; each must outlive the fetcher).
  // `prefill_tokens_per_s` prices recomputation. The config must be valid.
  RemoteFetcher(const RemoteFetchConfig& config, std::vector<const kvcache::KvCacheManager*> pools,
                int64_t block_size, double prefill_tokens_per_s);

  RemoteFetcher(const RemoteFetcher&) = delete;
  RemoteFetcher& operator=(const RemoteFetcher&) = delete;

  // Worker `worker` starts, at `now_ns`, a prefill whose first `local_blocks` blocks of `chain`
  // are its own hit and of which at most `max_blocks` leading blocks may be reused (the rest
  // must be computed). Finds the holder, decides, and when it fetches books the holder's link.
  FetchPlan Plan(int worker, absl::Span<const BlockHash> chain, int64_t local_blocks,
                 int64_t max_blocks, int64_t now_ns);

  // Fetch time of `blocks` blocks on an idle link, in nanoseconds.
  int64_t FetchNs(int64_t blocks) const;

 private:
  const RemoteFetchConfig config_;
  const std::vector<const kvcache::KvCacheManager*> pools_;
  const int64_t block_size_;
  const double prefill_tokens_per_s_;
  std::vector<int64_t> link_free_ns_;  // per worker: when its outgoing link is free
};

}  // namespace pd::loadtest::sim
