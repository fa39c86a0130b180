#include "loadtest/load_test_config.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "loadtest/cli_args.h"
#include "loadtest/length_spec.h"
#include "loadtest/openai_stream.h"
#include "loadtest/progress.h"
#include "loadtest/trace.h"

namespace pd::loadtest {
namespace {

absl::Status Invalid(absl::string_view flag, absl::string_view rule, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", rule, ", got ", got));
}

// Checks the backend, endpoint and address of target `t` (0 or 1).
absl::Status ValidateTarget(const LoadTestConfig& c, int t) {
  const std::string backend = c.BackendOf(t);
  const char* backend_flag = t == 0 ? "backend" : "compare_backend";
  const char* target_flag = t == 0 ? "target" : "compare_target";
  const std::string& address = t == 0 ? c.target : c.compare_target;
  if (backend == "grpc") {
    if (absl::StartsWith(address, "http://") || absl::StartsWith(address, "https://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", target_flag, " '", address, "' is a URL but --", backend_flag,
          " is grpc (host:port): use --", backend_flag, "=openai for OpenAI-compatible servers"));
    }
    return absl::OkStatus();
  }
  if (backend != "openai") {
    return Invalid(backend_flag, "must be grpc or openai", absl::StrCat("'", backend, "'"));
  }
  PD_ASSIGN_OR_RETURN(
      const OpenAiEndpoint endpoint,
      ParseOpenAiEndpoint(t == 0 ? "endpoint" : "compare_endpoint", c.EndpointOf(t)));
  PD_RETURN_IF_ERROR(ParseOpenAiUrl(target_flag, address).status());
  if (endpoint == OpenAiEndpoint::kChat && c.tokenizer.empty()) {
    return absl::InvalidArgumentError(
        "the chat endpoint sends text: pass --tokenizer (the model's tokenizer.json, its "
        "directory, or a llama2.c tokenizer.bin with --vocab_size) to decode the workload's "
        "token ids");
  }
  if (!c.tls_cert.empty() || !c.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert / --tls_key (mTLS) apply to grpc targets only; an openai target takes "
        "--tls_ca for an https URL");
  }
  return absl::OkStatus();
}

}  // namespace

std::string LoadTestConfig::BackendOf(int t) const {
  return t == 1 && !compare_backend.empty() ? compare_backend : backend;
}

std::string LoadTestConfig::EndpointOf(int t) const {
  return t == 1 && !compare_endpoint.empty() ? compare_endpoint : endpoint;
}

std::string LoadTestConfig::WorkloadName() const {
  if (workload == "synthetic" || workload == "trace") {
    return workload;
  }
  if (workload == "shared_prefix" || workload == "shared-prefix") {
    return "shared_prefix";
  }
  if (workload == "multi_turn" || workload == "multi-turn") {
    return "multi_turn";
  }
  return "";
}

absl::StatusOr<std::vector<double>> LoadTestConfig::SweepRates() const {
  if (request_rates.empty()) {
    return std::vector<double>();
  }
  PD_ASSIGN_OR_RETURN(std::vector<double> rates, ParseDoubleList("request_rates", request_rates));
  for (double r : rates) {
    if (!(r > 0) || !std::isfinite(r)) {
      return Invalid("request_rates", "must list rates > 0", request_rates);
    }
  }
  return rates;
}

absl::StatusOr<ArrivalMode> LoadTestConfig::ResolveArrival() const {
  ArrivalMode mode;
  // A sweep runs at each listed rate: resolve as for an open loop.
  const bool open_loop = request_rate > 0 || !request_rates.empty();
  if (arrival == "auto") {
    if (open_loop) {
      mode = burstiness == 1.0 ? ArrivalMode::kPoisson : ArrivalMode::kGamma;
    } else if (WorkloadName() == "trace") {
      mode = ArrivalMode::kTrace;
    } else if (concurrency > 0) {
      mode = ArrivalMode::kClosed;
    } else {
      return absl::InvalidArgumentError(
          "choose an arrival process: --concurrency=N (closed loop) or --request_rate=R "
          "(open loop)");
    }
  } else {
    PD_ASSIGN_OR_RETURN(mode, ParseArrivalMode(arrival));
  }
  if (mode == ArrivalMode::kClosed && concurrency < 1) {
    return absl::InvalidArgumentError("--arrival=closed needs --concurrency >= 1");
  }
  if ((mode == ArrivalMode::kPoisson || mode == ArrivalMode::kGamma) && !open_loop) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arrival=", ArrivalModeName(mode), " needs --request_rate > 0"));
  }
  if (mode == ArrivalMode::kPoisson && burstiness != 1.0) {
    return absl::InvalidArgumentError(
        "--burstiness applies to --arrival=gamma (poisson is burstiness 1)");
  }
  if (mode == ArrivalMode::kTrace && WorkloadName() != "trace") {
    return absl::InvalidArgumentError("--arrival=trace needs --workload=trace");
  }
  return mode;
}

absl::Status LoadTestConfig::Validate() const {
  PD_RETURN_IF_ERROR(penalties.Validate());
  if (!json_schema.empty() && ignore_eos) {
    return absl::InvalidArgumentError(
        "--json_schema needs --ignore_eos=false: a constrained output ends when its document is "
        "complete");
  }
  if (target.empty()) {
    return absl::InvalidArgumentError("--target is empty (expected host:port)");
  }
  PD_RETURN_IF_ERROR(ValidateTarget(*this, 0));
  if (compare()) {
    PD_RETURN_IF_ERROR(ValidateTarget(*this, 1));
  } else if (!compare_backend.empty() || !compare_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--compare_backend and --compare_endpoint need --compare_target");
  }
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return Invalid("temperature", "must be >= 0 and finite", absl::StrCat(temperature));
  }
  if (connect_timeout <= absl::ZeroDuration()) {
    return Invalid("connect_timeout", "must be > 0", absl::FormatDuration(connect_timeout));
  }
  if (num_channels < 1 || num_channels > 64) {
    return Invalid("num_channels", "must be in [1, 64]", absl::StrCat(num_channels));
  }
  if (client_threads < 1 || client_threads > 64) {
    return Invalid("client_threads", "must be in [1, 64]", absl::StrCat(client_threads));
  }
  const std::string name = WorkloadName();
  if (name.empty()) {
    return Invalid("workload", "must be synthetic, shared_prefix, multi_turn or trace",
                   absl::StrCat("'", workload, "'"));
  }
  if (absl::StatusOr<LengthSpec> s = LengthSpec::Parse(input_len); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--input_len: ", s.status().message()));
  }
  if (absl::StatusOr<LengthSpec> s = LengthSpec::Parse(output_len); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--output_len: ", s.status().message()));
  }
  if (name == "shared_prefix") {
    if (num_prefixes < 1 || suffixes_per_prefix < 1) {
      return absl::InvalidArgumentError("--num_prefixes and --suffixes_per_prefix must be >= 1");
    }
    if (prefix_len < 1 || suffix_len < 0) {
      return absl::InvalidArgumentError("--prefix_len must be >= 1 and --suffix_len >= 0");
    }
  }
  if (name == "multi_turn") {
    if (absl::StatusOr<LengthSpec> s = LengthSpec::Parse(user_len); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--user_len: ", s.status().message()));
    }
    if (num_conversations < 1 || num_conversations > 1'000'000) {
      return Invalid("num_conversations", "must be in [1, 1000000]",
                     absl::StrCat(num_conversations));
    }
    if (num_turns < 1) {
      return Invalid("num_turns", "must be >= 1", absl::StrCat(num_turns));
    }
    if (system_prompt_len < 0) {
      return Invalid("system_prompt_len", "must be >= 0", absl::StrCat(system_prompt_len));
    }
    if (max_input_len < 0) {
      return Invalid("max_input_len", "must be >= 0", absl::StrCat(max_input_len));
    }
  }
  if (name == "trace") {
    if (trace.empty()) {
      return absl::InvalidArgumentError("--workload=trace needs --trace=PATH");
    }
    if (!(time_scale > 0) || !std::isfinite(time_scale)) {
      return Invalid("time_scale", "must be > 0", absl::StrCat(time_scale));
    }
    if (max_input_len < 0) {
      return Invalid("max_input_len", "must be >= 0", absl::StrCat(max_input_len));
    }
    if (trace_block_tokens < 1) {
      return Invalid("trace_block_tokens", "must be >= 1", absl::StrCat(trace_block_tokens));
    }
    PD_RETURN_IF_ERROR(ParseBadLinePolicy(on_bad_line).status());
  } else if (!trace.empty()) {
    return absl::InvalidArgumentError("--trace is only used with --workload=trace");
  }
  if (vocab_size > 0 && vocab_lo >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_lo (", vocab_lo, ") must be < --vocab_size (", vocab_size, ")"));
  }
  if (concurrency < 0) {
    return Invalid("concurrency", "must be >= 0", absl::StrCat(concurrency));
  }
  if (request_rate < 0 || !std::isfinite(request_rate)) {
    return Invalid("request_rate", "must be >= 0 and finite", absl::StrCat(request_rate));
  }
  if (!(burstiness > 0) || !std::isfinite(burstiness)) {
    return Invalid("burstiness", "must be > 0", absl::StrCat(burstiness));
  }
  PD_ASSIGN_OR_RETURN(const ArrivalMode mode, ResolveArrival());
  PD_ASSIGN_OR_RETURN(const std::vector<double> rates, SweepRates());
  if (!rates.empty()) {
    if (request_rate > 0) {
      return absl::InvalidArgumentError(
          "--request_rate and --request_rates are exclusive (a sweep sets the rate of each run)");
    }
    if (mode != ArrivalMode::kPoisson && mode != ArrivalMode::kGamma) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--request_rates needs an open-loop arrival (poisson or gamma), got --arrival=",
          ArrivalModeName(mode)));
    }
  }
  if ((compare() || !rates.empty()) && !output_csv.empty()) {
    return absl::InvalidArgumentError(
        "--output_csv takes one run's records: with --compare_target or --request_rates use "
        "--output_dir (one CSV per run)");
  }
  if (num_requests < 0) {
    return Invalid("num_requests", "must be >= 0", absl::StrCat(num_requests));
  }
  if (duration < absl::ZeroDuration()) {
    return Invalid("duration", "must be >= 0", absl::FormatDuration(duration));
  }
  if (name != "trace" && num_requests == 0 && duration == absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the run needs a bound: set --num_requests and/or --duration");
  }
  if (request_timeout < absl::ZeroDuration()) {
    return Invalid("request_timeout", "must be >= 0", absl::FormatDuration(request_timeout));
  }
  if (slo_ttft_ms < 0 || slo_tpot_ms < 0) {
    return absl::InvalidArgumentError("--slo_ttft_ms and --slo_tpot_ms must be >= 0 (0 = none)");
  }
  PD_RETURN_IF_ERROR(ParseProgressMode(progress).status());
  return absl::OkStatus();
}

}  // namespace pd::loadtest
