// pd-worker: runs a model and serves the internal worker RPCs (prefill, decode or both).
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "common/metrics/metrics.h"
#include "kernels/type_names.h"
#include "services/base/process_metrics.h"
#include "services/base/serve.h"
#include "services/base/shutdown_signal.h"
#include "services/base/startup.h"
#include "services/base/tls_flags.h"
#include "services/worker/worker_server.h"
#include "transport/registry.h"

ABSL_FLAG(std::string, role, "both", "prefill | decode | both (aggregated)");
ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory, or a llama2.c checkpoint (.bin) with --tokenizer");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer file: tokenizer.bin for llama2.c checkpoints; default for Hugging Face "
          "directories is DIR/tokenizer.json");
ABSL_FLAG(std::string, grpc_address, "127.0.0.1:50061", "internal gRPC listen address");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9101", "Prometheus /metrics listen address");
ABSL_FLAG(std::string, worker_id, "", "cluster-unique worker id; empty = the gRPC address");
ABSL_FLAG(std::string, node_name, "",
          "node name (workers of a node share a tierd); empty = hostname");
ABSL_FLAG(int64_t, kv_blocks, 1024,
          "KV pool size in blocks; 0 with --device cuda = as many as fit "
          "--gpu_memory_fraction of the GPU after the weights and the forward pass's scratch");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "with --kv_blocks 0 on cuda: share of the GPU's total memory this worker may use, in "
          "(0, 1]");
ABSL_FLAG(int64_t, block_size, 16, "tokens per KV block (must match the router and peers)");
ABSL_FLAG(int, threads, 0, "CPU threads for the kernels; 0 = all cores");
ABSL_FLAG(int, tensor_parallel, 1,
          "split the model over N ranks (CPU: threads sharing the KV pool, --threads divided "
          "between them; N must divide the query heads and the MLP width; the KV layout stays "
          "TP 1's, so peers of any TP size pair); 1 = off");
ABSL_FLAG(std::string, tp_kv_pools, "shared",
          "with --tensor_parallel above 1: shared (the ranks share one KV pool) | per_rank (each "
          "rank keeps its KV heads in a pool of its own, as ranks on separate GPUs must; blocks "
          "move to and from peers through a staging area, --kv_staging_blocks)");
ABSL_FLAG(int64_t, kv_staging_blocks, 0,
          "--tp_kv_pools=per_rank: blocks of the KV hand-off's staging area (0 = a quarter of "
          "--kv_blocks, at least one full-context sequence's, at most --kv_blocks)");
ABSL_FLAG(std::string, device, "cpu",
          "where the weights, KV pool and forward pass live: cpu | cuda (CUDA device 0 of "
          "CUDA_VISIBLE_DEVICES)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "KV cache dtype: f32 | bf16 | f16 | i8 | fp8_e4m3 | i4 (the same on every worker, the "
          "router and pd-tierd of a cluster: the KV layout and the block hashes include it)");
ABSL_FLAG(int64_t, kv_sink_tokens, 0,
          "sink + window KV policy (StreamingLLM): keep the first N tokens of every sequence "
          "(rounded up to whole blocks) as attention sinks; needs --kv_window_tokens");
ABSL_FLAG(int64_t, kv_window_tokens, 0,
          "sink + window KV policy: keep the most recent N tokens (rounded up to whole blocks) "
          "besides the sinks and drop the blocks in between, so a sequence generates past the "
          "model's context in flat memory (max_tokens then bounds it); 0 = off");
ABSL_FLAG(std::string, kv_policy, "",
          "KV eviction by attention score: h2o (keep the heaviest-hit tokens and the recent "
          "ones) | snapkv (compress the prompt once, by the votes of its last tokens); with "
          "--kv_budget_tokens and --kv_recent_tokens; not for MLA models; empty = off");
ABSL_FLAG(int64_t, kv_budget_tokens, 0,
          "--kv_policy: cached tokens a sequence keeps (rounded up to whole blocks)");
ABSL_FLAG(int64_t, kv_recent_tokens, 0,
          "--kv_policy: of the budget, the most recent tokens always kept (h2o) or the prompt's "
          "last tokens that vote (snapkv's observation window)");
ABSL_FLAG(double, mask_grace_ms, 2.0,
          "structured output: how long a step may wait for a late token mask once its layers are "
          "done (or a quarter of the step's time so far, if longer); a sequence whose mask is "
          "later sits the step out instead of holding the batch (docs/structured-outputs.md)");
ABSL_FLAG(std::string, speculative, "off",
          "speculative decoding: off | ngram (each decode proposes up to --spec_max_tokens "
          "tokens from its own prompt and output, verified in the same step; output identical) "
          "| draft (a smaller model with the same tokenizer proposes them: --draft_model)");
ABSL_FLAG(std::string, draft_model, "",
          "--speculative=draft: the draft model (a Hugging Face directory or a llama2.c "
          "checkpoint) sharing --model's tokenizer; run on the same device, with a KV pool of "
          "its own");
ABSL_FLAG(std::string, draft_weight_dtype, "auto",
          "--speculative=draft: the draft's linear weights, auto | int8 (quantized at load: an "
          "int8 copy of --model makes a draft)");
ABSL_FLAG(int64_t, draft_kv_blocks, 0,
          "--speculative=draft: blocks of the draft's KV pool (0 = as many as --kv_blocks)");
ABSL_FLAG(int64_t, spec_max_tokens, 4, "speculative decoding: most tokens proposed per step (1-16)");
ABSL_FLAG(bool, spec_adaptive, true,
          "speculative decoding: propose only when the measured step costs say it pays (fit "
          "of step time against rows, and the acceptance); false: always");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "linear weights: auto (as stored) | int8 (quantized at load, W8A8; the model "
          "fingerprint gets \"+w8\", so prefill and decode workers must agree)");
ABSL_FLAG(bool, huge_page_weights, true,
          "cpu: copy the model's matrices out of the mapped checkpoint into transparent huge "
          "pages at load (same bytes, faster decode; the checkpoint's pages become reclaimable "
          "cache); false decodes from the mapping");
ABSL_FLAG(int64_t, max_batch_tokens, 0,
          "token budget of one engine step; 0 = by --device: 256 on cpu, 2048 on cuda");
ABSL_FLAG(int64_t, max_running, 0,
          "largest running batch (sequences); 0 = by --device: 32 on cpu, 256 on cuda");
ABSL_FLAG(int64_t, max_waiting, 1024, "admission queue bound; beyond it RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, transport, pd::transport::IsTransportBuilt("ucx") ? "ucx" : "tcp",
          "KV transport for the prefill -> decode handoff: ucx | tcp (host pools) | nccl "
          "(GPU pools, --device cuda; the two workers on different GPUs)");
ABSL_FLAG(std::string, transport_host, "127.0.0.1",
          "numeric IPv4 address the KV transport listens on");
ABSL_FLAG(std::string, tierd_address, "",
          "the node's pd-tierd host:port (DRAM/NVMe tiers); empty = none");
ABSL_FLAG(int64_t, tier_offer_slots, -1,
          "DRAM slots kept reserved so evicted blocks are copied straight into tierd's shared "
          "memory; -1 = 16 with --device cuda, 0 on the CPU");
ABSL_FLAG(bool, tier_write_through, false,
          "offer each block to tierd as soon as it is computed, not only at eviction, so the "
          "tiers (and other nodes, by remote restore) hold hot prefixes too; needs "
          "--tierd_address");
ABSL_FLAG(absl::Duration, prefill_timeout, absl::Seconds(30),
          "decode side: bound on one remote prefill; past it decode prefills locally");
ABSL_FLAG(absl::Duration, step_delay, absl::ZeroDuration(),
          "testing: sleep after every engine step (slows generation down on purpose)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30), "SIGTERM drain bound");
ABSL_FLAG(bool, drain_by_migration, true,
          "on SIGTERM end in-flight generations at once so the router moves them to another "
          "decode worker (docs/migration.md); false = let them run to their end, up to "
          "--drain_timeout");
// Security (docs/security.md).
// --tls_* and --client_tls_*: services/base/tls_flags.h.
ABSL_FLAG(std::string, cluster_token_file, "",
          "file holding the cluster token: internal calls without it are refused, and calls "
          "to other workers carry it; empty = no token");

namespace {

constexpr char kProgram[] = "pd-worker";

absl::StatusOr<pd::worker::WorkerConfig> ConfigFromFlags() {
  pd::worker::WorkerConfig c;
  PD_ASSIGN_OR_RETURN(c.role, pd::worker::ParseRole(absl::GetFlag(FLAGS_role)));
  c.runtime.model = absl::GetFlag(FLAGS_model);
  if (c.runtime.model.empty()) {
    return absl::InvalidArgumentError("--model is required");
  }
  c.runtime.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  c.runtime.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  c.runtime.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  c.runtime.block_size = absl::GetFlag(FLAGS_block_size);
  c.runtime.threads = absl::GetFlag(FLAGS_threads);
  c.runtime.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  PD_ASSIGN_OR_RETURN(c.runtime.tp_rank_pools,
                      pd::engine::ParseTpKvPools(absl::GetFlag(FLAGS_tp_kv_pools)));
  c.kv_staging_blocks = absl::GetFlag(FLAGS_kv_staging_blocks);
  PD_ASSIGN_OR_RETURN(c.runtime.device, pd::engine::ParseDevice(absl::GetFlag(FLAGS_device)));
  absl::StatusOr<pd::kernels::DType> kv_dtype =
      pd::kernels::DTypeFromName(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  }
  c.runtime.kv_dtype = *kv_dtype;
  PD_ASSIGN_OR_RETURN(c.runtime.weight_dtype,
                      pd::engine::ParseWeightDType(absl::GetFlag(FLAGS_weight_dtype)));
  c.runtime.huge_page_weights = absl::GetFlag(FLAGS_huge_page_weights);
  const pd::engine::DeviceBatchLimits limits = pd::engine::BatchLimitsFor(c.runtime.device);
  const int64_t max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  const int64_t max_running = absl::GetFlag(FLAGS_max_running);
  if (max_batch_tokens < 0 || max_running < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_batch_tokens and --max_running must be >= 0 (0 = by --device), got ",
                     max_batch_tokens, " and ", max_running));
  }
  c.runtime.scheduler.max_batch_tokens =
      max_batch_tokens > 0 ? max_batch_tokens : limits.max_batch_tokens;
  c.runtime.scheduler.max_running = max_running > 0 ? max_running : limits.max_running;
  c.runtime.scheduler.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  c.runtime.scheduler.kv_sink_tokens = absl::GetFlag(FLAGS_kv_sink_tokens);
  c.runtime.scheduler.kv_window_tokens = absl::GetFlag(FLAGS_kv_window_tokens);
  c.runtime.scheduler.kv_policy = absl::GetFlag(FLAGS_kv_policy);
  c.runtime.scheduler.kv_budget_tokens = absl::GetFlag(FLAGS_kv_budget_tokens);
  c.runtime.scheduler.kv_recent_tokens = absl::GetFlag(FLAGS_kv_recent_tokens);
  const double mask_grace_ms = absl::GetFlag(FLAGS_mask_grace_ms);
  if (!(mask_grace_ms >= 0 && mask_grace_ms <= 60000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mask_grace_ms must be between 0 and 60000, got ", mask_grace_ms));
  }
  c.runtime.scheduler.mask_grace_us = static_cast<int64_t>(mask_grace_ms * 1000);
  c.runtime.scheduler.speculative = absl::GetFlag(FLAGS_speculative);
  c.runtime.scheduler.spec_max_tokens = absl::GetFlag(FLAGS_spec_max_tokens);
  c.runtime.scheduler.spec_adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  c.runtime.draft_model = absl::GetFlag(FLAGS_draft_model);
  absl::StatusOr<pd::engine::WeightDType> draft_dtype =
      pd::engine::ParseWeightDType(absl::GetFlag(FLAGS_draft_weight_dtype));
  if (!draft_dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft_weight_dtype: ", draft_dtype.status().message()));
  }
  c.runtime.draft_weight_dtype = *draft_dtype;
  c.runtime.draft_kv_blocks = absl::GetFlag(FLAGS_draft_kv_blocks);
  PD_ASSIGN_OR_RETURN(c.grpc_address, pd::services::ParseHostPort(absl::GetFlag(FLAGS_grpc_address),
                                                                  "--grpc_address"));
  PD_ASSIGN_OR_RETURN(
      c.metrics_address,
      pd::services::ParseHostPort(absl::GetFlag(FLAGS_metrics_address), "--metrics_address"));
  c.worker_id = absl::GetFlag(FLAGS_worker_id);
  c.node_name = absl::GetFlag(FLAGS_node_name);
  c.transport = absl::GetFlag(FLAGS_transport);
  c.transport_host = absl::GetFlag(FLAGS_transport_host);
  c.tierd_address = absl::GetFlag(FLAGS_tierd_address);
  c.tier_offer_slots = absl::GetFlag(FLAGS_tier_offer_slots);
  c.tier_write_through = absl::GetFlag(FLAGS_tier_write_through);
  c.prefill_timeout = absl::GetFlag(FLAGS_prefill_timeout);
  c.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  c.drain_by_migration = absl::GetFlag(FLAGS_drain_by_migration);
  c.step_delay = absl::GetFlag(FLAGS_step_delay);
  c.tls = pd::services::ServerTlsFromFlags();
  c.peer_tls = pd::services::WorkerClientTlsFromFlags();
  c.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  PD_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  pd::services::ParseFlagsAndInitLogging(
      argc, argv,
      "pd-worker: runs a model and serves prefill and/or decode for a pdserve cluster\n"
      "  pd-worker --model DIR [--role prefill|decode|both] [--grpc_address HOST:PORT]");
  pd::services::ShutdownSignal shutdown;  // before any other thread starts
  absl::StatusOr<pd::worker::WorkerConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    pd::services::ExitWithStartupError(kProgram, config.status());
  }
  pd::metrics::Registry registry;
  pd::services::AddProcessMetrics(&registry);
  absl::StatusOr<std::unique_ptr<pd::worker::WorkerServer>> server =
      pd::worker::WorkerServer::Start(*config, &registry);
  if (!server.ok()) {
    pd::services::ExitWithStartupError(kProgram, server.status());
  }
  return pd::services::ServeUntilShutdown(
      kProgram, shutdown, &registry, config->metrics_address, config->drain_timeout,
      (*server)->Describe(), [&](absl::Duration timeout) { (*server)->Drain(timeout); });
}
