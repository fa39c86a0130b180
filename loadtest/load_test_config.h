// LoadTestConfig: every setting of a pd-loadtest run, as plain values (main.cc fills it from
// flags; tests fill it directly). Defaults are the flags' defaults; docs/loadtest.md lists them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loadtest/arrival.h"
#include "loadtest/sampling_penalties.h"

namespace pd::loadtest {

struct LoadTestConfig {
  // Target. backend "grpc": `target` is host:port of a pdserve.v1.Generation server; "openai":
  // the base URL of an OpenAI-compatible server (http://HOST:PORT, with or without /v1), sent
  // to `endpoint`: "completions" (token-id prompts) or "chat" (prompts decoded to text with
  // `tokenizer`, one user message).
  std::string backend = "grpc";
  std::string endpoint = "completions";
  std::string target = "127.0.0.1:50051";
  std::string model;                                  // "" = the target's default model
  absl::Duration connect_timeout = absl::Seconds(5);  // readiness check bound
  int num_channels = 2;                               // HTTP/2 connections, [1, 64]
  int client_threads = 2;                             // completion-queue polling threads, [1, 64]
  // Compare mode: host:port of a second target; "" = off. The workload is sent to both,
  // interleaved request by request (LoadRunner), and the report gives B/A ratios.
  std::string compare_target;
  std::string compare_backend;   // "" = backend
  std::string compare_endpoint;  // "" = endpoint
  // Compare mode: give each target's requests its own cache_salt (cache_salt + "/a", "/b"), so
  // that two routers in front of the same workers never hit each other's prefixes.
  bool compare_salt = true;

  // Workload: "synthetic", "shared_prefix" (or "shared-prefix"), "multi_turn" (or
  // "multi-turn") or "trace".
  std::string workload = "synthetic";
  std::string input_len = "128";      // LengthSpec (synthetic)
  std::string output_len = "128";     // LengthSpec (synthetic, shared_prefix, multi_turn)
  int64_t num_prefixes = 8;           // shared_prefix: P
  int64_t suffixes_per_prefix = 16;   // shared_prefix: S
  int64_t prefix_len = 512;           // shared_prefix: tokens per prefix
  int64_t suffix_len = 64;            // shared_prefix: tokens per suffix
  int64_t num_conversations = 16;     // multi_turn: conversations in progress at once
  int64_t num_turns = 8;              // multi_turn: turns per conversation
  int64_t system_prompt_len = 64;     // multi_turn: tokens shared by every conversation
  std::string user_len = "64";        // multi_turn: LengthSpec of a user message
  std::string trace;                  // trace: path of the JSONL file
  double time_scale = 1.0;            // trace: timestamp multiplier (0.5 = twice as fast)
  int64_t max_input_len = 0;          // trace, multi_turn: prompt cap in tokens; 0 = none
  int64_t trace_block_tokens = 512;   // trace: tokens per hash id
  std::string on_bad_line = "abort";  // trace: "abort" or "skip"
  uint32_t vocab_size = 0;  // token ids < this; 0 = the model's vocab_size from ListModels
  uint32_t vocab_lo = 3;    // smallest token id used (skips llama2.c's UNK/BOS/EOS)
  // The model's tokenizer: a tokenizer.json, a Hugging Face model directory holding one, or a
  // llama2.c tokenizer.bin (with vocab_size). Needed by the chat endpoint (text prompts); also
  // gives the vocabulary size an OpenAI server does not report. "" = none.
  std::string tokenizer;

  // Arrival: "auto", "closed", "poisson", "gamma" or "trace". auto = poisson (gamma when
  // burstiness != 1) if request_rate > 0, else trace timestamps for a trace, else closed.
  std::string arrival = "auto";
  int64_t concurrency = 0;  // closed: in flight; otherwise a cap (0 = none)
  double request_rate = 0;  // open loop: requests per second
  // Rate sweep: "1,2,4,8" runs the whole load once per rate (open loop), one after the other;
  // "" = one run at request_rate. Exclusive with request_rate; with compare_target each rate
  // runs both targets interleaved.
  std::string request_rates;
  double burstiness = 1.0;                             // gamma shape
  uint64_t seed = 0;                                   // workload and arrival randomness
  int64_t num_requests = 0;                            // 0 = no bound
  absl::Duration duration = absl::ZeroDuration();      // 0 = no bound
  absl::Duration request_timeout = absl::Minutes(10);  // per request; 0 = none
  bool ignore_eos = true;
  double temperature = 0;  // sampling temperature of every request; 0 = greedy
  SamplingPenalties penalties;  // of every request; zero = unset
  std::string cache_salt;  // "" = unset
  // Structured output: every request's output is constrained to this JSON Schema (its text;
  // "" = none). Needs ignore_eos false: a constrained output ends when its document does.
  std::string json_schema;
  std::string json_schema_file;  // where it came from (for the report)
  // Security of the connections to the target(s) (docs/security.md): a file holding the API
  // key sent as "authorization: Bearer <key>" ("" = none), and TLS: the CA of the target's
  // certificate ("" = plaintext) and a client certificate and key for targets requiring mTLS.
  std::string api_key_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;

  // Metrics and outputs.
  double slo_ttft_ms = 0;   // 0 = no TTFT SLO
  double slo_tpot_ms = 0;   // 0 = no TPOT SLO
  std::string output_json;  // "" = not written
  std::string output_csv;   // "" = not written (single runs only)
  // Directory for every report of the run (created if missing): summary.json, the records'
  // CSV(s) and, with `plot`, gnuplot scripts, their data and the images. "" = none.
  std::string output_dir;
  bool plot = true;                 // with output_dir: write plots
  std::string gnuplot = "gnuplot";  // program rendering them (PATH lookup); "" = scripts only
  std::string progress = "auto";    // auto | bar | lines | off

  // InvalidArgument naming the flag for any invalid or inconsistent value (unknown names,
  // malformed length specs, missing bounds, an arrival the workload cannot use, ...).
  absl::Status Validate() const;

  // The canonical workload name ("shared_prefix" for "shared-prefix", "multi_turn" for
  // "multi-turn"); "" when unknown.
  std::string WorkloadName() const;
  // The arrival process after resolving "auto". InvalidArgument as Validate.
  absl::StatusOr<ArrivalMode> ResolveArrival() const;
  // The sweep's rates (empty without --request_rates). InvalidArgument for a malformed list or
  // a rate <= 0.
  absl::StatusOr<std::vector<double>> SweepRates() const;
  bool compare() const { return !compare_target.empty(); }
  // The backend / endpoint of target 0 (--target) or 1 (--compare_target), defaults applied.
  std::string BackendOf(int target) const;
  std::string EndpointOf(int target) const;
};

}  // namespace pd::loadtest
