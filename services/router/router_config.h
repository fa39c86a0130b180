// pd-router's configuration: plain values parsed from flags in main.cc, validated once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "engine/runtime/model_front.h"
#include "kernels/types.h"
#include "services/base/grpc_security.h"
#include "services/base/net_address.h"
#include "services/router/request_validation.h"

namespace pd::router {

struct RouterConfig {
  // Public gRPC API (pdserve.v1.Generation + grpc.health.v1). Port 0 = ephemeral (tests).
  services::HostPort grpc_address{"127.0.0.1", 50051};
  // Prometheus /metrics and /healthz over HTTP. Port 0 = ephemeral.
  services::HostPort metrics_address{"127.0.0.1", 9100};
  // The cluster's Redis prefix index; unset = run without Redis (no lower-tier credit). The
  // password comes from --redis_password_file, never from a flag value.
  std::optional<redis::RedisConfig> redis;
  // Bound of one lower-tier lookup in the Redis prefix index while placing a request (connect
  // and each socket read/write); slower or failed lookups place without lower-tier credit and
  // pause lookups for a second (services/router/tier_credit.h). In [1ms, 10s].
  absl::Duration redis_lookup_timeout = absl::Milliseconds(5);
  // Tokens per KV block; must equal the workers' block size.
  int block_size = 16;
  // The workers' KV cache dtype (--kv_dtype): part of the block-hash seed, and a worker whose
  // layout has another dtype stays out of the pool.
  kernels::DType kv_dtype = kernels::DType::kF32;
  // The workers' --weight_dtype: int8 changes the fingerprint they report (and the block-hash
  // seed), so the router must be told too.
  engine::WeightDType weight_dtype = engine::WeightDType::kAuto;
  // How long SIGTERM waits for in-flight streams before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(30);
  RequestLimits limits;

  // The model served: a Hugging Face directory or a llama2.c checkpoint (+ tokenizer). The
  // router tokenizes with it and checks that every worker reports its fingerprint.
  std::string model;
  std::string tokenizer;
  // Model id in ListModels and GenerateRequest.model; empty = DefaultModelId(model).
  std::string model_id;
  // gRPC addresses of decode-capable workers (role decode or both) and of prefill workers.
  std::vector<std::string> decode_workers;
  std::vector<std::string> prefill_workers;
  // Placement policy: "cache_aware", "round_robin" or "random".
  std::string policy = "cache_aware";
  // Prompts whose uncached part (after the decode worker's cache hits) is shorter than this many
  // tokens are prefilled on the decode worker itself (conditional disaggregation). 0 = always
  // use a prefill worker when one is up.
  int64_t disagg_threshold_tokens = 0;
  // Weights of the cache_aware cost model (services/router/worker_scorer.h), one flag each.
  double prefill_weight = 1.0;
  double dram_hit_weight = 0.1;
  double nvme_hit_weight = 0.3;
  double remote_hit_weight = 1.0;  // 1 = no credit for blocks on other nodes
  double decode_load_weight = 1.0;
  double inflight_weight = 8.0;
  double inflight_blocks_weight = 0.0;
  double backlog_prefill_weight = 4.0;
  double min_hit_fraction = 0.2;
  // Bound of the KV index in (worker, block, tier) entries (~110 bytes each); 0 = automatic:
  // AutoIndexBound (kv_index.h) of the workers' pools as they report them.
  int64_t index_max_blocks = 0;
  // Streams open at once; more are refused with RESOURCE_EXHAUSTED.
  int64_t max_inflight = 1024;
  // How often each worker's health and load are polled.
  absl::Duration health_interval = absl::Milliseconds(500);
  // Deadline of each health-check RPC.
  absl::Duration health_timeout = absl::Seconds(1);
  // Consecutive health checks a worker may miss by timing out (busy, not dead) and stay in the
  // pool; a refused connection or a wrong identity takes it out at once.
  int health_missed_checks = 3;

  // Security (docs/security.md). TLS of the public API (--tls_cert, --tls_key; --tls_ca makes
  // it mutual); unset = plaintext.
  services::TlsServerConfig tls;
  // TLS of the router's calls to the workers (--client_tls_ca, --client_tls_cert,
  // --client_tls_key); unset = plaintext.
  services::TlsClientConfig worker_tls;
  // File holding the cluster token sent on every call to a worker (--cluster_token_file);
  // "" = none. Read at Start; the token is never logged.
  std::string cluster_token_file;
  // "tenant:key" lines (services/base/auth.h ApiKeyStore); "" = the public API needs no key
  // and the client's tenant and cache_salt are taken as sent. With keys, every call needs
  // "authorization: Bearer <key>" (else UNAUTHENTICATED), the tenant is the key's, and the
  // prefix-cache salt is derived from it (DeriveTenantCacheSalt).
  std::string api_keys_file;
  // Generate streams one tenant may have open at once; more get RESOURCE_EXHAUSTED. 0 = no
  // per-tenant bound (max_inflight still applies).
  int64_t max_streams_per_tenant = 0;
  // Times one stream may move to another decode worker after its own failed or drained
  // mid-stream (docs/migration.md); past it the stream ends UNAVAILABLE. 0 = never move.
  int64_t max_migrations = 3;
  // Largest request message the public API accepts (gRPC receive limit), in bytes.
  int64_t max_message_bytes = 4 << 20;

  // InvalidArgument naming the flag (e.g. "--block_size") and the bad value.
  absl::Status Validate() const;
};

}  // namespace pd::router
