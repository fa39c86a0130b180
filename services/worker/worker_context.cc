#include "services/worker/worker_context.h"

#include <string>
#include <vector>

#include "common/base/status_macros.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
  return b;
}

}  // namespace

absl::StatusOr<WorkerMetrics> WorkerMetrics::Register(metrics::Registry* r) {
  WorkerMetrics m;
  PD_ASSIGN_OR_RETURN(
      m.requests, r->AddCounter("pd_worker_requests_total",
                                "Internal RPCs by method and final gRPC code", {"rpc", "code"}));
  PD_ASSIGN_OR_RETURN(m.ttft, r->AddHistogram("pd_worker_ttft_seconds",
                                              "Decode worker: request received to first token", {},
                                              LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.tpot, r->AddHistogram("pd_worker_tpot_seconds",
                                              "Decode worker: mean time per output token after "
                                              "the first, per request",
                                              {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(
      m.queue, r->AddHistogram("pd_worker_queue_seconds", "Request received to first scheduled", {},
                               LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(
      m.e2e, r->AddHistogram("pd_worker_e2e_seconds", "Decode worker: request received to finished",
                             {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(
      m.prefills,
      r->AddCounter("pd_worker_prefills_total",
                    "Prefills of decode requests by where they ran "
                    "(local, remote, fallback = remote failed, resumed = a migrated stream)",
                    {"where"}));
  PD_ASSIGN_OR_RETURN(m.kv_transfer_bytes,
                      r->AddCounter("pd_worker_kv_transfer_bytes_total",
                                    "KV bytes moved by the prefill/decode handoff (in = received "
                                    "by decode, out = sent by prefill)",
                                    {"direction"}));
  PD_ASSIGN_OR_RETURN(m.kv_transfer_seconds,
                      r->AddHistogram("pd_worker_kv_transfer_seconds",
                                      "Prefill side: posting a KV transfer to its completion",
                                      {"direction"}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.tokens, r->AddCounter("pd_worker_tokens_total",
                                              "Tokens of finished decode requests by kind "
                                              "(prompt, cached, generated)",
                                              {"kind"}));
  return m;
}

pdserve::internal::v1::WorkerInfo WorkerContext::Info() const {
  iv1::WorkerInfo info;
  info.set_worker_id(worker_id);
  switch (config.role) {
    case WorkerRole::kPrefill:
      info.set_role(iv1::WORKER_ROLE_PREFILL);
      break;
    case WorkerRole::kDecode:
      info.set_role(iv1::WORKER_ROLE_DECODE);
      break;
    case WorkerRole::kBoth:
      info.set_role(iv1::WORKER_ROLE_BOTH);
      break;
  }
  info.set_grpc_address(grpc_address);
  info.set_node_name(node_name);
  info.set_model_fingerprint(runtime->fingerprint());
  *info.mutable_layout() = layout;
  if (handoff != nullptr) {
    info.add_transports(std::string(handoff->backend()));
  }
  return info;
}

pdserve::internal::v1::WorkerLoad WorkerContext::Load() const {
  const engine::SchedulerStats s = loop->Stats();
  iv1::WorkerLoad load;
  load.set_worker_id(worker_id);
  load.set_queued_prefill_tokens(static_cast<uint64_t>(s.pending_prefill_tokens));
  load.set_active_kv_blocks(static_cast<uint64_t>(s.kv.num_blocks_used));
  load.set_free_kv_blocks(static_cast<uint64_t>(s.kv.num_blocks_free + s.kv.num_blocks_cached));
  load.set_total_kv_blocks(static_cast<uint64_t>(s.kv.num_blocks_total));
  load.set_num_running_requests(static_cast<uint32_t>(s.running));
  load.set_num_waiting_requests(static_cast<uint32_t>(s.waiting));
  return load;
}

pd::RequestId WorkerContext::NewRequestId() { return pd::RequestId(next_request_id_++); }

void WorkerMetrics::CountRequest(absl::string_view rpc, absl::StatusCode code) const {
  requests->WithLabels({std::string(rpc), absl::StatusCodeToString(code)}).Increment();
}

}  // namespace pd::worker
