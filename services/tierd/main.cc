// pd-tierd: a node's lower KV tiers (DRAM in shared memory, NVMe slab files) for its workers.
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "common/metrics/metrics.h"
#include "kernels/type_names.h"
#include "services/base/net_address.h"
#include "services/base/process_metrics.h"
#include "services/base/redis_flags.h"
#include "services/base/serve.h"
#include "services/base/shutdown_signal.h"
#include "services/base/startup.h"
#include "services/base/tls_flags.h"
#include "services/tierd/tierd_server.h"

ABSL_FLAG(std::string, grpc_address, "127.0.0.1:50071", "TierService listen address (node-local)");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9102", "Prometheus /metrics listen address");
ABSL_FLAG(std::string, node_name, "",
          "node name, as the node's workers report it; empty = hostname");
ABSL_FLAG(std::string, model, "",
          "the workers' model (HF directory or llama2.c .bin with --tokenizer): KV layout source");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.bin of a llama2.c checkpoint");
ABSL_FLAG(int64_t, block_size, 16, "tokens per KV block (must match the workers)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "KV cache dtype: f32 | bf16 | f16 | i8 | fp8_e4m3 | i4 (must match the workers)");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "the workers' --weight_dtype: auto | int8 (int8 workers report the model fingerprint "
          "with \"+w8\")");
ABSL_FLAG(int64_t, dram_mib, 1024, "DRAM tier size in MiB (POSIX shared memory)");
ABSL_FLAG(std::string, shm_name, "",
          "shared-memory object of the DRAM tier; empty = /pdserve-NODE-g2");
ABSL_FLAG(double, high_watermark, 0.90, "DRAM occupancy above which cold blocks spill to NVMe");
ABSL_FLAG(double, low_watermark, 0.75, "DRAM occupancy a spill round brings it down to");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(30), "lifetime of a worker's slot claim");
ABSL_FLAG(std::string, nvme_dir, "",
          "directory of the NVMe tier's slab files; empty = no NVMe tier");
ABSL_FLAG(int64_t, nvme_mib, 0, "NVMe tier size in MiB (with --nvme_dir)");
ABSL_FLAG(bool, nvme_verify_on_open, false, "read and verify every NVMe block at startup");
ABSL_FLAG(absl::Duration, redis_entry_ttl, absl::Minutes(10), "TTL of a block's Redis entry");
ABSL_FLAG(std::string, peer_transport, "",
          "cluster-wide cache: KV transport other nodes' tierds read this node's blocks with, "
          "and this node fetches theirs with (tcp or ucx; empty = off; needs --redis_address)");
ABSL_FLAG(std::string, peer_transport_host, "127.0.0.1",
          "numeric IPv4 address the peer transport listens on (this node's cluster address)");
ABSL_FLAG(std::string, peer_advertise_address, "",
          "host:port other nodes dial for PeerRead; empty = --grpc_address as bound");
ABSL_FLAG(int32_t, peer_max_reads, 4, "PeerRead calls served at once (more are refused)");
ABSL_FLAG(int64_t, peer_fetch_max_blocks, 256, "blocks asked of a peer per fetch");
ABSL_FLAG(std::string, peer_fetch_policy, "cost",
          "cost: fetch from other nodes only while faster than the worker computing the blocks; "
          "always: whenever another node holds them (saves compute, may cost latency)");
ABSL_FLAG(int64_t, peer_fetch_chunk_blocks, 16,
          "blocks per PeerRead of a fetch: a fetch that falls behind the worker's recompute time "
          "is abandoned at a chunk boundary");
ABSL_FLAG(absl::Duration, peer_fetch_timeout, absl::Seconds(1),
          "bound of one fetch from a peer (RPC + transfer); past it the worker recomputes");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10), "SIGTERM drain bound");
// --tls_cert, --tls_key, --tls_ca: services/base/tls_flags.h.
ABSL_FLAG(std::string, cluster_token_file, "",
          "file with the cluster token; set = every call must carry it (docs/security.md)");

namespace {

constexpr char kProgram[] = "pd-tierd";

absl::StatusOr<pd::tierd::TierdConfig> ConfigFromFlags() {
  pd::tierd::TierdConfig c;
  PD_ASSIGN_OR_RETURN(c.grpc_address, pd::services::ParseHostPort(absl::GetFlag(FLAGS_grpc_address),
                                                                  "--grpc_address"));
  PD_ASSIGN_OR_RETURN(
      c.metrics_address,
      pd::services::ParseHostPort(absl::GetFlag(FLAGS_metrics_address), "--metrics_address"));
  c.node_name = absl::GetFlag(FLAGS_node_name);
  c.model = absl::GetFlag(FLAGS_model);
  c.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  c.block_size = absl::GetFlag(FLAGS_block_size);
  absl::StatusOr<pd::kernels::DType> kv_dtype =
      pd::kernels::DTypeFromName(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  }
  c.kv_dtype = *kv_dtype;
  PD_ASSIGN_OR_RETURN(c.weight_dtype,
                      pd::engine::ParseWeightDType(absl::GetFlag(FLAGS_weight_dtype)));
  c.dram_mib = absl::GetFlag(FLAGS_dram_mib);
  c.shm_name = absl::GetFlag(FLAGS_shm_name);
  c.high_watermark = absl::GetFlag(FLAGS_high_watermark);
  c.low_watermark = absl::GetFlag(FLAGS_low_watermark);
  c.lease = absl::GetFlag(FLAGS_lease);
  c.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
  c.nvme_mib = absl::GetFlag(FLAGS_nvme_mib);
  c.nvme_verify_on_open = absl::GetFlag(FLAGS_nvme_verify_on_open);
  PD_ASSIGN_OR_RETURN(c.redis, pd::services::RedisConfigFromFlags());
  c.redis_entry_ttl = absl::GetFlag(FLAGS_redis_entry_ttl);
  c.peer_transport = absl::GetFlag(FLAGS_peer_transport);
  c.peer_transport_host = absl::GetFlag(FLAGS_peer_transport_host);
  c.peer_advertise_address = absl::GetFlag(FLAGS_peer_advertise_address);
  c.peer_max_reads = absl::GetFlag(FLAGS_peer_max_reads);
  c.peer_fetch_max_blocks = absl::GetFlag(FLAGS_peer_fetch_max_blocks);
  c.peer_fetch_chunk_blocks = absl::GetFlag(FLAGS_peer_fetch_chunk_blocks);
  c.peer_fetch_policy = absl::GetFlag(FLAGS_peer_fetch_policy);
  c.peer_fetch_timeout = absl::GetFlag(FLAGS_peer_fetch_timeout);
  c.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  c.tls = pd::services::ServerTlsFromFlags();
  c.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  PD_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  pd::services::ParseFlagsAndInitLogging(
      argc, argv,
      "pd-tierd: keeps a node's evicted KV blocks in DRAM and on NVMe for its workers\n"
      "  pd-tierd --model PATH [--dram_mib N] [--nvme_dir DIR --nvme_mib N] "
      "[--redis_address HOST:PORT [--peer_transport tcp|ucx]]");
  pd::services::ShutdownSignal shutdown;  // before any other thread starts
  absl::StatusOr<pd::tierd::TierdConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    pd::services::ExitWithStartupError(kProgram, config.status());
  }
  pd::metrics::Registry registry;
  pd::services::AddProcessMetrics(&registry);
  absl::StatusOr<std::unique_ptr<pd::tierd::TierdServer>> server =
      pd::tierd::TierdServer::Start(*config, &registry);
  if (!server.ok()) {
    pd::services::ExitWithStartupError(kProgram, server.status());
  }
  return pd::services::ServeUntilShutdown(
      kProgram, shutdown, &registry, config->metrics_address, config->drain_timeout,
      (*server)->Describe(), [&](absl::Duration timeout) { (*server)->Drain(timeout); });
}
