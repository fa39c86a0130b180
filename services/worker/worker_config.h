// pd-worker's configuration: plain values parsed from flags in main.cc, validated once.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/runtime/model_runtime.h"
#include "services/base/grpc_security.h"
#include "services/base/net_address.h"

namespace pd::worker {

enum class WorkerRole : uint8_t { kPrefill, kDecode, kBoth };

// "prefill" | "decode" | "both"; InvalidArgument naming --role otherwise.
absl::StatusOr<WorkerRole> ParseRole(absl::string_view name);
absl::string_view RoleName(WorkerRole role);

struct WorkerConfig {
  WorkerRole role = WorkerRole::kBoth;
  engine::ModelRuntimeConfig runtime;
  // Internal gRPC services (DecodeService / PrefillService, KvEventService, health).
  services::HostPort grpc_address{"127.0.0.1", 50061};
  // Prometheus /metrics and /healthz. Port 0 = ephemeral.
  services::HostPort metrics_address{"127.0.0.1", 9101};
  // Cluster-unique id; empty = the gRPC address.
  std::string worker_id;
  // Node name (workers of a node share a tierd); empty = the host name.
  std::string node_name;
  // KvTransport backend for the prefill -> decode handoff ("ucx", "tcp").
  std::string transport = "ucx";
  // Address the transport listens on (tcp, ucx): numeric IPv4 of this host.
  std::string transport_host = "127.0.0.1";
  // The node's pd-tierd ("host:port"); empty = no lower tiers. Evicted blocks are offered to it
  // and prompts are restored from it before prefill. tierd being down never fails a request.
  std::string tierd_address;
  // DRAM slots kept reserved so an evicted block is copied once, straight into tierd's shared
  // memory (tierd.proto unbound slots); -1 = automatic: 16 with --device cuda (cudaMemcpyAsync
  // into the page-locked slot), 0 on the CPU (a copy to a hot staging buffer costs the
  // scheduler thread less than one into a cold DRAM slot; offer_bench). At most 4096.
  int64_t tier_offer_slots = -1;
  // Write-through: offer every block to tierd as soon as it is committed to the prefix cache
  // (prompt blocks after prefill, generated ones as they fill), not only when the pool evicts
  // it, so the node's tiers (and through remote restore, every node) hold the hot prefixes too.
  // Costs one block copy per computed block on the scheduler thread. Needs tierd_address.
  bool tier_write_through = false;
  // --kv_staging_blocks: with per-rank KV pools (runtime.tp_rank_pools), the blocks of the KV
  // hand-off's staging area (disagg::KvHandoff::RegisterStagedPool), through which every block
  // sent or received passes; a transfer that does not fit in what is free fails (the decode
  // side then prefills locally). 0 = automatic: StagingBlocksFor.
  int64_t kv_staging_blocks = 0;
  // Upper bound of one remote prefill (RPC + transfer) as seen by the decode side; the
  // request's own deadline applies when earlier. Past it, decode prefills locally.
  absl::Duration prefill_timeout = absl::Seconds(30);
  // Testing: sleep after every engine step (EngineLoop::Options::step_delay).
  absl::Duration step_delay = absl::ZeroDuration();
  // How long SIGTERM waits for in-flight streams before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(30);
  // SIGTERM ends every in-flight generation at once with UNAVAILABLE "worker draining", so the
  // router moves each stream to another decode worker (docs/migration.md) and scale-down takes
  // seconds; false = the streams run to their end (bounded by drain_timeout). Prefill jobs
  // served for other workers finish either way.
  bool drain_by_migration = true;
  // Security (docs/security.md): TLS of the internal gRPC server (--tls_cert, --tls_key;
  // --tls_ca = callers need a client certificate), TLS of calls to other workers
  // (--client_tls_*), and the cluster token file every internal call must carry; all unset =
  // plaintext and no token (local development).
  services::TlsServerConfig tls;
  services::TlsClientConfig peer_tls;
  std::string cluster_token_file;

  // InvalidArgument naming the flag.
  absl::Status Validate() const;
};

// The automatic staging area (kv_staging_blocks 0): a quarter of the pool, at least the blocks
// of one sequence of `context_tokens`, at most the pool.
int64_t StagingBlocksFor(int64_t kv_blocks, int64_t block_size, int64_t context_tokens);

}  // namespace pd::worker
