// pd-router: the public gRPC front of a pdserve cluster.
#include <string>
#include <thread>
#include <vector>

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
#include "services/router/openai/http_front.h"
#include "services/router/prompt_encoder.h"
#include "services/router/router_server.h"

ABSL_FLAG(std::string, grpc_address, "127.0.0.1:50051", "public gRPC API listen address");
ABSL_FLAG(std::string, http_address, "",
          "OpenAI-compatible HTTP API listen address (docs/openai.md); empty = off");
ABSL_FLAG(int64_t, http_max_body_bytes, 4 << 20, "HTTP request bodies above this get 413");
ABSL_FLAG(int64_t, http_max_connections, 4096,
          "HTTP requests served at once (each holds a thread); more get 503. Connections "
          "still sending a request do not count");
ABSL_FLAG(int64_t, http_max_open_connections, 16384,
          "HTTP connections open in all; more are reset at accept");
ABSL_FLAG(int64_t, http_max_connections_per_client, 2048,
          "HTTP connections open per client IP address; more are reset at accept; 0 = no cap");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(5),
          "how long an HTTP connection may wait for a request's first byte (new or keep-alive)");
ABSL_FLAG(
    absl::Duration, http_header_timeout, absl::Seconds(10),
    "total time for an HTTP request's head, from its first byte (TLS: from accept); then 408");
ABSL_FLAG(absl::Duration, http_body_timeout, absl::Seconds(30),
          "total time for an HTTP request's body, from the end of its head; then 408");
ABSL_FLAG(std::string, tool_call_format, "",
          "how the model writes tool calls under tool_choice \"auto\": hermes, llama3, mistral "
          "or deepseek; empty = detected from the chat template (docs/structured-outputs.md)");
ABSL_FLAG(bool, constrain_auto_tool_calls, true,
          "tool_choice \"auto\": once the output writes <tool_call> (DeepSeek: "
          "<｜tool▁calls▁begin｜>; Llama 3: starts with '{'; Mistral: the special token "
          "[TOOL_CALLS]), the call is enforced by grammar (an offered function's name, "
          "arguments that follow its parameters, the closing marker); false: calls are only "
          "parsed");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "reasoning blocks (<think>...</think>) in chat output, returned as reasoning_content: "
          "auto (when the chat template writes them: Qwen3, QwQ, DeepSeek-R1) | think | none");
ABSL_FLAG(std::string, chat_template, "",
          "Jinja chat template file for /v1/chat/completions, replacing the model's "
          "(tokenizer_config.json chat_template); llama2.c models have none");
// Bounds of chat-template rendering (docs/openai.md): a model's template is not trusted.
ABSL_FLAG(absl::Duration, chat_template_max_duration, absl::Seconds(1),
          "wall-clock time one chat template render may take; more is a 400");
ABSL_FLAG(int64_t, chat_template_max_memory_bytes, int64_t{64} << 20,
          "bytes of strings and lists one chat template render may build (summed); more is a "
          "400");
ABSL_FLAG(int64_t, chat_template_max_iterations, 1'000'000,
          "loop iterations and macro calls of one chat template render; more is a 400");
ABSL_FLAG(int32_t, chat_template_max_in_flight, 8,
          "chat template renders running at once; more get 503 (retry)");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9100", "Prometheus /metrics listen address");
ABSL_FLAG(int, block_size, 16, "tokens per KV block (must match the workers)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "the workers' KV cache dtype: f32 | bf16 | f16 | i8 | fp8_e4m3 | i4 (block hashes include "
          "it; a worker of another dtype stays out of the pool)");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "the workers' --weight_dtype: auto | int8 (int8 workers report the model fingerprint "
          "with \"+w8\")");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30), "SIGTERM drain bound");
ABSL_FLAG(uint32_t, max_prompt_tokens, 131072, "largest accepted token-id prompt");
ABSL_FLAG(uint32_t, max_tokens_limit, 131072, "largest accepted sampling.max_tokens");
ABSL_FLAG(std::string, model, "",
          "the model the workers serve (Hugging Face directory, or llama2.c .bin with "
          "--tokenizer); used to tokenize and to check the workers' fingerprint");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.bin of a llama2.c checkpoint");
ABSL_FLAG(std::string, model_id, "",
          "model id in ListModels and the OpenAI API; empty = the model path's base name without "
          ".bin/.gguf/.safetensors");
ABSL_FLAG(std::vector<std::string>, decode_workers, {},
          "comma-separated gRPC addresses of decode workers (role decode or both)");
ABSL_FLAG(std::vector<std::string>, prefill_workers, {},
          "comma-separated gRPC addresses of prefill workers");
ABSL_FLAG(absl::Duration, redis_lookup_timeout, absl::Milliseconds(5),
          "bound of one lower-tier lookup in the Redis prefix index while placing (with "
          "--redis_address); a slower lookup places without DRAM/NVMe credit and pauses lookups "
          "for 1s");
ABSL_FLAG(std::string, policy, "cache_aware", "placement: cache_aware | round_robin | random");
ABSL_FLAG(int64_t, disagg_threshold_tokens, 0,
          "prompts with fewer uncached tokens (after the decode worker's cache hits) are "
          "prefilled on the decode worker; 0 = always use a prefill worker when one is up");
ABSL_FLAG(double, prefill_weight, 1.0,
          "cache_aware: cost of prefilling one uncached block, in KV blocks of decode load");
ABSL_FLAG(double, dram_hit_weight, 0.1,
          "cache_aware: fraction of a block's prefill cost paid to restore it from DRAM [0, 1]");
ABSL_FLAG(double, nvme_hit_weight, 0.3,
          "cache_aware: fraction of a block's prefill cost paid to restore it from NVMe [0, 1]");
ABSL_FLAG(double, remote_hit_weight, 1.0,
          "cache_aware: fraction of a block's prefill cost paid to fetch it from another node "
          "that holds it [0, 1]; 1 = no credit (workers do not fetch from other nodes yet)");
ABSL_FLAG(double, decode_load_weight, 1.0,
          "cache_aware: weight of a worker's referenced KV blocks against prefill work");
ABSL_FLAG(double, inflight_weight, 8.0,
          "cache_aware: blocks charged per stream this router has open on a worker");
ABSL_FLAG(double, inflight_blocks_weight, 0.0,
          "cache_aware: weight of the new prompt blocks this router placed on a worker since "
          "its last load report, added to its prefill backlog; 0 = not counted");
ABSL_FLAG(double, backlog_prefill_weight, 4.0,
          "cache_aware: added to --prefill_weight per block of prefill backlog on the workers "
          "that hold less of the prompt than the best");
ABSL_FLAG(double, min_hit_fraction, 0.2,
          "cache_aware: a cached prefix attracts a request only when it covers this fraction "
          "of the prompt [0, 1]");
ABSL_FLAG(int64_t, index_max_blocks, 0,
          "bound of the KV block index in (worker, block, tier) entries, ~110 bytes each; "
          "0 = automatic: 2 per KV block of the workers' pools (as they report them), at "
          "least 1,000,000");
ABSL_FLAG(int64_t, max_inflight, 1024, "open streams; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, health_interval, absl::Milliseconds(500),
          "worker health and load polling interval");
ABSL_FLAG(absl::Duration, health_timeout, absl::Seconds(1), "deadline of each health-check RPC");
ABSL_FLAG(int32_t, health_missed_checks, 3,
          "consecutive health checks a worker may miss by timing out (busy) before it leaves the "
          "pool; 1 = the first timeout takes it out. A refused connection takes it out at once");
// Security (docs/security.md).
// --tls_* and --client_tls_*: services/base/tls_flags.h.
ABSL_FLAG(std::string, cluster_token_file, "",
          "file holding the cluster token sent on every call to a worker; empty = none");
ABSL_FLAG(std::string, api_keys_file, "",
          "'tenant:key' lines; set = the public API needs 'authorization: Bearer <key>' and "
          "cache salts are derived from the key's tenant");
ABSL_FLAG(int64_t, max_streams_per_tenant, 0,
          "open Generate streams per tenant; more get RESOURCE_EXHAUSTED; 0 = unbounded");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20, "largest request message of the public API");
ABSL_FLAG(int64_t, max_migrations, 3,
          "times one stream may move to another decode worker when its own fails or drains "
          "mid-stream (docs/migration.md); 0 = never: the stream ends UNAVAILABLE");

namespace {

constexpr char kProgram[] = "pd-router";

absl::StatusOr<pd::router::RouterConfig> ConfigFromFlags() {
  pd::router::RouterConfig config;
  PD_ASSIGN_OR_RETURN(
      config.grpc_address,
      pd::services::ParseHostPort(absl::GetFlag(FLAGS_grpc_address), "--grpc_address"));
  PD_ASSIGN_OR_RETURN(
      config.metrics_address,
      pd::services::ParseHostPort(absl::GetFlag(FLAGS_metrics_address), "--metrics_address"));
  PD_ASSIGN_OR_RETURN(config.redis, pd::services::RedisConfigFromFlags());
  config.redis_lookup_timeout = absl::GetFlag(FLAGS_redis_lookup_timeout);
  config.block_size = absl::GetFlag(FLAGS_block_size);
  absl::StatusOr<pd::kernels::DType> kv_dtype =
      pd::kernels::DTypeFromName(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  }
  config.kv_dtype = *kv_dtype;
  PD_ASSIGN_OR_RETURN(config.weight_dtype,
                      pd::engine::ParseWeightDType(absl::GetFlag(FLAGS_weight_dtype)));
  config.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  config.limits.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  config.limits.max_tokens_limit = absl::GetFlag(FLAGS_max_tokens_limit);
  config.model = absl::GetFlag(FLAGS_model);
  config.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  config.model_id = absl::GetFlag(FLAGS_model_id);
  config.decode_workers = absl::GetFlag(FLAGS_decode_workers);
  config.prefill_workers = absl::GetFlag(FLAGS_prefill_workers);
  config.policy = absl::GetFlag(FLAGS_policy);
  config.disagg_threshold_tokens = absl::GetFlag(FLAGS_disagg_threshold_tokens);
  config.prefill_weight = absl::GetFlag(FLAGS_prefill_weight);
  config.dram_hit_weight = absl::GetFlag(FLAGS_dram_hit_weight);
  config.nvme_hit_weight = absl::GetFlag(FLAGS_nvme_hit_weight);
  config.remote_hit_weight = absl::GetFlag(FLAGS_remote_hit_weight);
  config.decode_load_weight = absl::GetFlag(FLAGS_decode_load_weight);
  config.inflight_weight = absl::GetFlag(FLAGS_inflight_weight);
  config.inflight_blocks_weight = absl::GetFlag(FLAGS_inflight_blocks_weight);
  config.backlog_prefill_weight = absl::GetFlag(FLAGS_backlog_prefill_weight);
  config.min_hit_fraction = absl::GetFlag(FLAGS_min_hit_fraction);
  config.index_max_blocks = absl::GetFlag(FLAGS_index_max_blocks);
  config.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  config.health_interval = absl::GetFlag(FLAGS_health_interval);
  config.health_timeout = absl::GetFlag(FLAGS_health_timeout);
  config.health_missed_checks = absl::GetFlag(FLAGS_health_missed_checks);
  config.tls = pd::services::ServerTlsFromFlags();
  config.worker_tls = pd::services::WorkerClientTlsFromFlags();
  config.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  config.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  config.max_streams_per_tenant = absl::GetFlag(FLAGS_max_streams_per_tenant);
  config.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  PD_RETURN_IF_ERROR(config.Validate());
  return config;
}

// Flags are validated by ChatTemplate::Create (ChatTemplateLimits::Validate).
pd::chat::ChatTemplateLimits ChatTemplateLimitsFromFlags() {
  pd::chat::ChatTemplateLimits limits;
  limits.render.max_duration = absl::GetFlag(FLAGS_chat_template_max_duration);
  limits.render.max_memory_bytes = absl::GetFlag(FLAGS_chat_template_max_memory_bytes);
  limits.render.max_iterations = absl::GetFlag(FLAGS_chat_template_max_iterations);
  limits.max_in_flight = absl::GetFlag(FLAGS_chat_template_max_in_flight);
  return limits;
}

// The HTTP front's config, or nullopt when --http_address is empty.
absl::StatusOr<std::optional<pd::router::openai::HttpFrontConfig>> HttpConfigFromFlags(
    const pd::router::RouterConfig& router) {
  if (absl::GetFlag(FLAGS_http_address).empty()) {
    if (!absl::GetFlag(FLAGS_chat_template).empty()) {
      return absl::InvalidArgumentError("--chat_template needs --http_address (the HTTP API)");
    }
    return std::nullopt;
  }
  pd::router::openai::HttpFrontConfig c;
  PD_ASSIGN_OR_RETURN(
      c.address, pd::services::ParseHostPort(absl::GetFlag(FLAGS_http_address), "--http_address"));
  c.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
  c.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  c.max_open_connections = absl::GetFlag(FLAGS_http_max_open_connections);
  c.max_connections_per_client = absl::GetFlag(FLAGS_http_max_connections_per_client);
  c.idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
  c.header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  c.body_timeout = absl::GetFlag(FLAGS_http_body_timeout);
  c.tls = router.tls;
  c.limits.max_tokens_limit = router.limits.max_tokens_limit;
  c.limits.max_prompt_tokens = router.limits.max_prompt_tokens;
  c.limits.max_stop_strings = router.limits.max_stop_strings;
  if (const std::string format = absl::GetFlag(FLAGS_tool_call_format); !format.empty()) {
    absl::StatusOr<pd::router::openai::ToolCallFormat> f =
        pd::router::openai::ParseToolCallFormat(format);
    if (!f.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tool_call_format: ", f.status().message()));
    }
    c.tool_call_format = *f;
  }
  c.reasoning_parser = absl::GetFlag(FLAGS_reasoning_parser);
  c.constrain_auto_tool_calls = absl::GetFlag(FLAGS_constrain_auto_tool_calls);
  PD_RETURN_IF_ERROR(c.Validate());
  if (absl::Status s = ChatTemplateLimitsFromFlags().Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat_template_max_*: ", s.message()));
  }
  return c;
}

// The chat template of /v1/chat/completions (null when the model has none), checked by one
// render of a sample conversation: a template that cannot render within its limits is refused
// now instead of every chat request paying for it.
absl::StatusOr<std::unique_ptr<pd::chat::ChatTemplate>> LoadChatTemplateFromFlags(
    const std::string& model) {
  const std::string& template_file = absl::GetFlag(FLAGS_chat_template);
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<pd::chat::ChatTemplate> chat_template,
      pd::router::LoadChatTemplate(model, template_file, ChatTemplateLimitsFromFlags()));
  if (chat_template != nullptr) {
    if (absl::Status s = chat_template->CheckRendersSample(); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(template_file.empty() ? model + " (chat template)"
                                                             : "--chat_template " + template_file,
                                       ": ", s.message()));
    }
  }
  return chat_template;
}

}  // namespace

int main(int argc, char** argv) {
  pd::services::ParseFlagsAndInitLogging(
      argc, argv, "pd-router: the public gRPC API (pdserve.v1.Generation) of a pdserve cluster");
  pd::services::ShutdownSignal shutdown;  // before any other thread starts
  absl::StatusOr<pd::router::RouterConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    pd::services::ExitWithStartupError(kProgram, config.status());
  }
  absl::StatusOr<std::optional<pd::router::openai::HttpFrontConfig>> http_config =
      HttpConfigFromFlags(*config);
  if (!http_config.ok()) {
    pd::services::ExitWithStartupError(kProgram, http_config.status());
  }
  std::unique_ptr<pd::chat::ChatTemplate> chat_template;
  if (http_config->has_value()) {
    absl::StatusOr<std::unique_ptr<pd::chat::ChatTemplate>> loaded =
        LoadChatTemplateFromFlags(config->model);
    if (!loaded.ok()) {
      pd::services::ExitWithStartupError(kProgram, loaded.status());
    }
    chat_template = *std::move(loaded);
  }
  pd::metrics::Registry registry;
  pd::services::AddProcessMetrics(&registry);
  absl::StatusOr<std::unique_ptr<pd::router::RouterServer>> server =
      pd::router::RouterServer::Start(*config, &registry, std::move(chat_template));
  if (!server.ok()) {
    pd::services::ExitWithStartupError(kProgram, server.status());
  }
  std::unique_ptr<pd::router::openai::HttpFront> http;
  if (http_config->has_value()) {
    absl::StatusOr<std::unique_ptr<pd::router::openai::HttpFront>> front =
        pd::router::openai::HttpFront::Start(**http_config, (*server)->generation(),
                                             &(*server)->model(), &registry);
    if (!front.ok()) {
      pd::services::ExitWithStartupError(kProgram, front.status());
    }
    http = *std::move(front);
  }
  const std::string describe = absl::StrCat(
      "gRPC on ", (*server)->address(),
      config->tls.enabled() ? (config->tls.client_ca_file.empty() ? " (tls)" : " (mtls)")
                            : " (plaintext)",
      http != nullptr ? absl::StrCat(", OpenAI HTTP API on port ", http->port()) : "",
      config->api_keys_file.empty() ? ", no api keys" : ", api keys required",
      config->cluster_token_file.empty() ? "" : ", cluster token on",
      config->redis ? absl::StrCat(", redis ", config->redis->host, ":", config->redis->port)
                    : std::string(", no redis"));
  // Once everything started (a startup error stays one line).
  if (config->cluster_token_file.empty()) {
    pd::services::WarnUnauthenticatedInternalRpcs(
        kProgram,
        "its calls to the workers carry no token, so they cannot tell it from any other caller "
        "(workers started with a token refuse it)");
  }
  return pd::services::ServeUntilShutdown(
      kProgram, shutdown, &registry, config->metrics_address, config->drain_timeout, describe,
      [&](absl::Duration timeout) {
        // Both fronts drain at once: new requests are refused on both from the start.
        const absl::Time deadline = absl::Now() + timeout;
        std::thread http_drain;
        if (http != nullptr) http_drain = std::thread([&] { http->Drain(deadline); });
        (*server)->Drain(timeout);
        if (http_drain.joinable()) http_drain.join();
      });
}
