// TierdConfig: pd-tierd's settings, filled from flags by main.cc and validated before anything
// starts (docs/development.md, "Config and flags": absent values take these defaults, invalid
// ones stop startup).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "engine/runtime/model_front.h"
#include "kernels/types.h"
#include "services/base/grpc_security.h"
#include "services/base/net_address.h"

namespace pd::tierd {

struct TierdConfig {
  services::HostPort grpc_address{"127.0.0.1", 50071};    // TierService + health
  services::HostPort metrics_address{"127.0.0.1", 9102};  // Prometheus /metrics
  // This node's name, as the node's workers report it (WorkerInfo.node_name) and as Redis
  // entries name it. Empty = the host name.
  std::string node_name;

  // The model whose blocks this tierd keeps (a Hugging Face directory or a llama2.c checkpoint
  // with `tokenizer`): the KV layout and fingerprint come from it, exactly as the workers
  // compute them. Required.
  std::string model;
  std::string tokenizer;
  int64_t block_size = 16;                         // tokens per block; must match the workers
  kernels::DType kv_dtype = kernels::DType::kF32;  // KV cache dtype; must match the workers
  // The workers' --weight_dtype (int8 changes the fingerprint their blocks are kept under).
  engine::WeightDType weight_dtype = engine::WeightDType::kAuto;

  // DRAM tier: shared-memory pool of dram_mib MiB (rounded down to whole slots, >= 1 slot).
  int64_t dram_mib = 1024;
  std::string shm_name;  // empty = DramPoolConfig::DefaultShmName(node)
  double high_watermark = 0.90;
  double low_watermark = 0.75;
  absl::Duration lease = absl::Seconds(30);  // claims (reservations, pins) expire after it

  // NVMe tier: slab files in nvme_dir holding up to nvme_mib MiB; empty dir = no NVMe tier.
  std::string nvme_dir;
  int64_t nvme_mib = 0;
  bool nvme_verify_on_open = false;  // read and check every block at startup

  // Redis prefix index; unset = none (tiers still serve the node's workers).
  std::optional<redis::RedisConfig> redis;
  absl::Duration redis_entry_ttl = absl::Minutes(10);

  // The cluster-wide cache (services/tierd/peer_link.h, docs/tiers.md "Remote restore"): the
  // KV transport other nodes' tierds read this node's blocks with, and this node fetches
  // theirs with ("tcp" or "ucx"; empty = off). Needs redis (where the blocks and the peers are).
  std::string peer_transport;
  std::string peer_transport_host = "127.0.0.1";  // numeric IPv4 the transport listens on
  // This tierd's gRPC address as other nodes dial it; empty = --grpc_address as bound.
  std::string peer_advertise_address;
  int peer_max_reads = 4;               // PeerRead served at once
  int64_t peer_fetch_max_blocks = 256;  // blocks asked per fetch
  // "cost": fetch only while faster than the worker computing the blocks; "always": whenever
  // another node holds them (saves compute, may cost latency).
  std::string peer_fetch_policy = "cost";
  int64_t peer_fetch_chunk_blocks = 16;  // blocks per PeerRead (the abandonment granularity)
  // RPC + transfer of one fetch; below the workers' Promote deadline (TierClient rpc_timeout 2s).
  absl::Duration peer_fetch_timeout = absl::Seconds(1);

  // Background work: claim expiry, watermark spills, idle-session clean-up.
  absl::Duration maintenance_interval = absl::Milliseconds(200);
  // A session with no call for this long is dropped (its worker died without Detach).
  absl::Duration session_idle_timeout = absl::Minutes(10);
  absl::Duration drain_timeout = absl::Seconds(10);

  // Security (docs/security.md): TLS of the TierService (--tls_cert, --tls_key; --tls_ca =
  // callers need a client certificate) and the cluster token every call must carry
  // (--cluster_token_file). All unset = plaintext, open (local development).
  services::TlsServerConfig tls;
  std::string cluster_token_file;

  // InvalidArgument naming the flag and its value.
  absl::Status Validate() const;
};

}  // namespace pd::tierd
