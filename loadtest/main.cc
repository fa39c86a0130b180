// pd-loadtest: load generator for pdserve.v1.Generation servers (pd-router) and
// OpenAI-compatible HTTP servers (--backend=openai). See
// docs/loadtest.md for the workloads, arrival processes, metric definitions and reports.
//
// Exit status: 0 after a complete run (failed requests are reported, not fatal); 1 for a bad
// flag, bad input (trace), an unreachable target or an unwritable report; 130 after Ctrl-C
// (SIGINT) or SIGTERM, once the partial report is written.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "loadtest/load_run.h"
#include "services/base/shutdown_signal.h"
#include "services/base/startup.h"
#include "services/base/tls_flags.h"

ABSL_FLAG(std::string, backend, "grpc",
          "grpc (pdserve.v1.Generation) | openai (OpenAI-compatible HTTP server)");
ABSL_FLAG(std::string, endpoint, "completions",
          "openai: completions (token-id prompts) | chat (text prompts; needs --tokenizer)");
ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "grpc: host:port of the Generation server (pd-router); openai: base URL "
          "http://HOST:PORT[/v1]");
ABSL_FLAG(std::string, model, "", "model id; empty = the target's default model");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(5), "readiness check bound");
ABSL_FLAG(int, num_channels, 2, "gRPC connections to the target, [1, 64]");
ABSL_FLAG(int, client_threads, 2, "threads polling the streams' completion queues, [1, 64]");
ABSL_FLAG(std::string, compare_target, "",
          "compare mode: host:port of a second target (B); every request goes to both, "
          "interleaved, and the report gives B/A ratios");
ABSL_FLAG(std::string, compare_backend, "", "compare mode: backend of B; empty = --backend");
ABSL_FLAG(std::string, compare_endpoint, "", "compare mode: endpoint of B; empty = --endpoint");
ABSL_FLAG(bool, compare_salt, true,
          "compare mode: separate cache_salt per target (cache_salt + /a, /b)");
ABSL_FLAG(std::string, workload, "synthetic", "synthetic | shared_prefix | multi_turn | trace");
ABSL_FLAG(std::string, input_len, "128",
          "synthetic prompt length: N, uniform:A,B, normal:MEAN,SD[,MIN,MAX]");
ABSL_FLAG(std::string, output_len, "128",
          "output length (synthetic, shared_prefix, multi_turn replies); same syntax");
ABSL_FLAG(int64_t, num_prefixes, 8, "shared_prefix: number of distinct prefixes P");
ABSL_FLAG(int64_t, suffixes_per_prefix, 16, "shared_prefix: suffixes per prefix S");
ABSL_FLAG(int64_t, prefix_len, 512, "shared_prefix: prefix length in tokens");
ABSL_FLAG(int64_t, suffix_len, 64, "shared_prefix: suffix length in tokens");
ABSL_FLAG(int64_t, num_conversations, 16, "multi_turn: conversations in progress at once");
ABSL_FLAG(int64_t, num_turns, 8, "multi_turn: turns per conversation");
ABSL_FLAG(int64_t, system_prompt_len, 64, "multi_turn: system prompt tokens (every conversation)");
ABSL_FLAG(std::string, user_len, "64", "multi_turn: user message length; --input_len syntax");
ABSL_FLAG(std::string, trace, "", "trace: Mooncake-format JSONL file");
ABSL_FLAG(double, time_scale, 1.0, "trace: timestamp multiplier (0.5 = twice as fast)");
ABSL_FLAG(int64_t, max_input_len, 0,
          "trace: cap prompts at this many tokens; multi_turn: end a conversation before its "
          "prompt exceeds this; 0 = no cap");
ABSL_FLAG(int64_t, trace_block_tokens, 512, "trace: tokens per hash id");
ABSL_FLAG(std::string, on_bad_line, "abort", "trace: malformed line -> abort | skip");
ABSL_FLAG(uint32_t, vocab_size, 0, "token ids < this; 0 = ask the target (ListModels)");
ABSL_FLAG(uint32_t, vocab_lo, 3, "smallest token id in synthesized prompts");
ABSL_FLAG(std::string, tokenizer, "",
          "the model's tokenizer.json (or its directory, or a llama2.c tokenizer.bin with "
          "--vocab_size): decodes prompts for --endpoint=chat and gives the vocabulary size");
ABSL_FLAG(std::string, arrival, "auto", "auto | closed | poisson | gamma | trace");
ABSL_FLAG(int64_t, concurrency, 0, "closed loop: requests in flight; otherwise a cap (0 = none)");
ABSL_FLAG(double, request_rate, 0, "open loop: mean requests per second");
ABSL_FLAG(std::string, request_rates, "",
          "rate sweep: comma-separated rates (e.g. 1,2,4,8), one open-loop run per rate");
ABSL_FLAG(double, burstiness, 1.0, "gamma arrivals: shape (< 1 burstier, 1 = Poisson)");
ABSL_FLAG(uint64_t, seed, 0, "seed of workload and arrival randomness");
ABSL_FLAG(int64_t, num_requests, 0, "stop after this many requests; 0 = no bound");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(), "stop issuing after this; 0 = none");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(10), "per-request deadline; 0 = none");
ABSL_FLAG(bool, ignore_eos, true, "ask the server to generate exactly the output length");
ABSL_FLAG(double, temperature, 0, "sampling temperature of every request; 0 = greedy");
ABSL_FLAG(double, presence_penalty, 0, "presence_penalty of every request, [-2, 2]; 0 = unset");
ABSL_FLAG(double, frequency_penalty, 0,
          "frequency_penalty of every request, [-2, 2]; 0 = unset");
ABSL_FLAG(double, repetition_penalty, 0,
          "repetition_penalty (vLLM's) of every request, > 0 (1 = off); 0 = unset");
ABSL_FLAG(double, min_p, 0, "min_p of every request, [0, 1]; 0 = unset");
ABSL_FLAG(std::string, cache_salt, "", "cache_salt of every request; empty = unset");
ABSL_FLAG(std::string, json_schema, "",
          "file holding a JSON Schema: every request's output is constrained to it (OpenAI: "
          "response_format json_schema; gRPC: SamplingParams.constraint); needs "
          "--ignore_eos=false");
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput SLO on TTFT in ms; 0 = none");
ABSL_FLAG(double, slo_tpot_ms, 0, "goodput SLO on TPOT in ms; 0 = none");
ABSL_FLAG(std::string, output_json, "", "write the JSON summary here");
ABSL_FLAG(std::string, output_csv, "", "write per-request records (CSV) here (single runs)");
ABSL_FLAG(std::string, output_dir, "",
          "write summary.json, records CSV(s) and plots into this directory");
ABSL_FLAG(bool, plot, true, "with --output_dir: write gnuplot scripts, data and images");
ABSL_FLAG(std::string, gnuplot, "gnuplot",
          "gnuplot program that renders the plots; empty = write the scripts only");
ABSL_FLAG(std::string, progress, "auto", "auto | bar | lines | off (on stderr)");
ABSL_FLAG(std::string, api_key_file, "",
          "file holding the API key, sent as 'authorization: Bearer <key>'; empty = none");
// --tls_ca, --tls_cert, --tls_key: services/base/tls_flags.h.

namespace {

constexpr char kProgram[] = "pd-loadtest";

pd::loadtest::LoadTestConfig ConfigFromFlags() {
  pd::loadtest::LoadTestConfig c;
  c.backend = absl::GetFlag(FLAGS_backend);
  c.endpoint = absl::GetFlag(FLAGS_endpoint);
  c.target = absl::GetFlag(FLAGS_target);
  c.model = absl::GetFlag(FLAGS_model);
  c.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  c.num_channels = absl::GetFlag(FLAGS_num_channels);
  c.client_threads = absl::GetFlag(FLAGS_client_threads);
  c.compare_target = absl::GetFlag(FLAGS_compare_target);
  c.compare_backend = absl::GetFlag(FLAGS_compare_backend);
  c.compare_endpoint = absl::GetFlag(FLAGS_compare_endpoint);
  c.compare_salt = absl::GetFlag(FLAGS_compare_salt);
  c.workload = absl::GetFlag(FLAGS_workload);
  c.input_len = absl::GetFlag(FLAGS_input_len);
  c.output_len = absl::GetFlag(FLAGS_output_len);
  c.num_prefixes = absl::GetFlag(FLAGS_num_prefixes);
  c.suffixes_per_prefix = absl::GetFlag(FLAGS_suffixes_per_prefix);
  c.prefix_len = absl::GetFlag(FLAGS_prefix_len);
  c.suffix_len = absl::GetFlag(FLAGS_suffix_len);
  c.num_conversations = absl::GetFlag(FLAGS_num_conversations);
  c.num_turns = absl::GetFlag(FLAGS_num_turns);
  c.system_prompt_len = absl::GetFlag(FLAGS_system_prompt_len);
  c.user_len = absl::GetFlag(FLAGS_user_len);
  c.trace = absl::GetFlag(FLAGS_trace);
  c.time_scale = absl::GetFlag(FLAGS_time_scale);
  c.max_input_len = absl::GetFlag(FLAGS_max_input_len);
  c.trace_block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
  c.on_bad_line = absl::GetFlag(FLAGS_on_bad_line);
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.vocab_lo = absl::GetFlag(FLAGS_vocab_lo);
  c.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  c.arrival = absl::GetFlag(FLAGS_arrival);
  c.concurrency = absl::GetFlag(FLAGS_concurrency);
  c.request_rate = absl::GetFlag(FLAGS_request_rate);
  c.request_rates = absl::GetFlag(FLAGS_request_rates);
  c.burstiness = absl::GetFlag(FLAGS_burstiness);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.num_requests = absl::GetFlag(FLAGS_num_requests);
  c.duration = absl::GetFlag(FLAGS_duration);
  c.request_timeout = absl::GetFlag(FLAGS_request_timeout);
  c.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  c.temperature = absl::GetFlag(FLAGS_temperature);
  c.penalties.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  c.penalties.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  c.penalties.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  c.penalties.min_p = absl::GetFlag(FLAGS_min_p);
  c.cache_salt = absl::GetFlag(FLAGS_cache_salt);
  c.json_schema_file = absl::GetFlag(FLAGS_json_schema);
  c.slo_ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms);
  c.slo_tpot_ms = absl::GetFlag(FLAGS_slo_tpot_ms);
  c.output_json = absl::GetFlag(FLAGS_output_json);
  c.output_csv = absl::GetFlag(FLAGS_output_csv);
  c.output_dir = absl::GetFlag(FLAGS_output_dir);
  c.plot = absl::GetFlag(FLAGS_plot);
  c.gnuplot = absl::GetFlag(FLAGS_gnuplot);
  c.progress = absl::GetFlag(FLAGS_progress);
  c.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  const pd::services::TlsClientConfig tls = pd::services::ClientTlsFromFlags();
  c.tls_ca = tls.ca_file;
  c.tls_cert = tls.cert_file;
  c.tls_key = tls.key_file;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  pd::services::ParseDashedFlagsAndInitLogging(
      argc, argv,
      "pd-loadtest [--backend=grpc|openai [--endpoint=completions|chat]] "
      "--target=HOST:PORT|URL --workload=synthetic|shared_prefix|multi_turn|trace "
      "(--concurrency=N | --request_rate=R | --request_rates=R1,R2,...) [--num_requests=N] "
      "[--duration=D] [--compare_target=HOST:PORT] [--output_dir=DIR] ... "
      "(dashed names like --slo-ttft-ms work too; see docs/loadtest.md)");
  pd::services::ShutdownSignal signal;  // Ctrl-C / SIGTERM: stop, report, exit 130
  pd::loadtest::LoadTestConfig config = ConfigFromFlags();
  if (!config.json_schema_file.empty()) {
    std::ifstream in(config.json_schema_file);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) {
      pd::services::ExitWithStartupError(
          kProgram, absl::InvalidArgumentError(absl::StrCat(
                        "--json_schema: cannot read ", config.json_schema_file)));
    }
    const auto schema = nlohmann::json::parse(text.str(), nullptr, false);
    if (schema.is_discarded() || !schema.is_object()) {
      pd::services::ExitWithStartupError(
          kProgram, absl::InvalidArgumentError(absl::StrCat(
                        "--json_schema: ", config.json_schema_file, " is not a JSON object")));
    }
    config.json_schema = schema.dump();
  }
  auto load_test = pd::loadtest::LoadRun::Create(config);
  if (!load_test.ok()) {
    pd::services::ExitWithStartupError(kProgram, load_test.status());
  }
  if (signal.triggered()) {
    return 130;
  }
  std::thread watcher([&] {
    signal.Wait();
    (*load_test)->Stop();
  });
  pd::loadtest::LoadRunOutcome outcome = (*load_test)->Run();
  const bool interrupted = signal.signal_number() != 0;
  signal.Trigger();  // releases the watcher when no signal came
  watcher.join();
  std::fputs(outcome.table.c_str(), stdout);
  std::fflush(stdout);
  if (!outcome.report_status.ok()) {
    pd::services::ExitWithStartupError(kProgram, outcome.report_status);
  }
  return interrupted ? 130 : 0;
}
