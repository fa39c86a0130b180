// pd-client: streams a generation from a pdserve router (pdserve.v1.Generation) to stdout.
// Exit status: 0 ok, 1 RPC error (or router not ready), 2 bad usage, 130 interrupted.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "common/log/log.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "services/base/shutdown_signal.h"
#include "services/base/startup.h"
#include "services/base/tls_flags.h"
#include "services/client/args.h"
#include "services/client/client.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051", "router gRPC address (host:port)");
ABSL_FLAG(std::string, model, "", "model id; empty = the router's default model");
ABSL_FLAG(uint32_t, max_tokens, 0, "tokens to generate at most; 0 = until EOS or context end");
ABSL_FLAG(float, temperature, 0, "softmax temperature; 0 = greedy");
ABSL_FLAG(float, top_p, 0, "nucleus sampling mass in (0, 1]; 0 = off");
ABSL_FLAG(uint32_t, top_k, 0, "sample from the k most likely tokens; 0 = off");
ABSL_FLAG(std::string, seed, "", "sampling seed (uint64); empty = the server draws one");
ABSL_FLAG(std::vector<std::string>, stop, {},
          "stop string; repeat the flag or separate with commas (\\, is a literal comma)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past EOS");
ABSL_FLAG(float, presence_penalty, 0,
          "subtracted from the logit of every token generated so far, in [-2, 2]; 0 = off");
ABSL_FLAG(float, frequency_penalty, 0,
          "times its count, subtracted from the logit of each token generated so far, in "
          "[-2, 2]; 0 = off");
ABSL_FLAG(float, repetition_penalty, 0,
          "divides the positive logits (multiplies the others) of tokens in the prompt or the "
          "output, > 0; 0 or 1 = off");
ABSL_FLAG(float, min_p, 0,
          "drop tokens whose probability is below min_p times the most likely one's, in [0, 1]; "
          "0 = off");
ABSL_FLAG(std::string, logit_bias, "",
          "biases added to token logits, \"ID:BIAS,...\" with BIAS in [-100, 100]; empty = none");
ABSL_FLAG(std::string, cache_salt, "", "prefix-cache isolation salt; empty = none");
ABSL_FLAG(std::string, tenant, "", "tenant the request is accounted to; empty = default");
ABSL_FLAG(std::string, token_ids, "", "prompt as comma-separated token ids instead of text");
ABSL_FLAG(absl::Duration, timeout, absl::ZeroDuration(), "deadline of the call; 0 = none");
ABSL_FLAG(bool, echo, false, "print the prompt text before the generated text (text mode)");
ABSL_FLAG(bool, json, false, "print one JSON object per response message instead of text");
ABSL_FLAG(bool, stats, true, "print usage and timing stats on stderr after the stream");
ABSL_FLAG(absl::Duration, wait_ready, absl::ZeroDuration(),
          "first retry until the router is healthy and lists a model, for up to this long");
ABSL_FLAG(bool, list_models, false, "list the router's models and exit");
ABSL_FLAG(std::string, api_key_file, "",
          "file holding the API key, sent as 'authorization: Bearer <key>'; empty = none");
// --tls_ca, --tls_cert, --tls_key: services/base/tls_flags.h.

namespace {

constexpr char kUsage[] =
    "streams generated text from a pdserve router (pdserve.v1.Generation)\n"
    "  pd-client [flags] \"prompt\"       e.g. pd-client --max-tokens 64 \"Once upon a time\"\n"
    "  pd-client --token_ids=1 ...      pd-client --list_models      pd-client --wait_ready=30s\n"
    "Dashed flag names (--max-tokens) are accepted. Exit: 0 ok, 1 RPC error, 2 bad usage, "
    "130 interrupted.";

// Usage errors, before any thread starts.
[[noreturn]] void Fail(int code, const std::string& message) {
  std::fprintf(stderr, "pd-client: %s\n", message.c_str());
  std::exit(code);
}

// RPC errors: exit status 1, returned from main so that destructors run.
int Error(const std::string& message) {
  std::fprintf(stderr, "pd-client: %s\n", message.c_str());
  return 1;
}

std::optional<pd::client::FlagInfo> LookupFlag(absl::string_view name) {
  // absl handles its usage flags by name, outside the flag registry.
  for (absl::string_view usage :
       {"help", "helpfull", "helpshort", "helppackage", "version", "only_check_args"}) {
    if (name == usage) return pd::client::FlagInfo{true, nullptr};
  }
  if (name == "helpon" || name == "helpmatch") return pd::client::FlagInfo{false, nullptr};
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || flag->IsRetired()) {
    return std::nullopt;
  }
  return pd::client::FlagInfo{flag->IsOfType<bool>(), [flag](absl::string_view value) {
                                std::string error;  // absl parses it again, to the same value
                                return flag->ParseFrom(value, &error) ? std::string() : error;
                              }};
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<pd::client::PreparsedArgs> pre =
      pd::client::PreparseArgs(std::vector<std::string>(argv, argv + argc), LookupFlag);
  if (!pre.ok()) Fail(2, std::string(pre.status().message()) + " (see pd-client --help)");
  std::vector<char*> args;
  for (std::string& a : pre->argv) args.push_back(a.data());
  std::vector<char*> positional =
      pd::services::ParseFlagsAndInitLogging(static_cast<int>(args.size()), args.data(), kUsage);
  FLAGS_minloglevel = 1;  // a CLI: warnings and errors only
  pd::client::RequestOptions o;
  o.prompt_words.assign(positional.begin() + 1, positional.end());
  o.model = absl::GetFlag(FLAGS_model);
  o.token_ids = absl::GetFlag(FLAGS_token_ids);
  o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_p = absl::GetFlag(FLAGS_top_p);
  o.top_k = absl::GetFlag(FLAGS_top_k);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.stop = pre->stop;
  o.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  o.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  o.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  o.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  o.min_p = absl::GetFlag(FLAGS_min_p);
  o.logit_bias = absl::GetFlag(FLAGS_logit_bias);
  o.cache_salt = absl::GetFlag(FLAGS_cache_salt);
  o.tenant = absl::GetFlag(FLAGS_tenant);
  const bool list = absl::GetFlag(FLAGS_list_models), json = absl::GetFlag(FLAGS_json);
  pdserve::v1::GenerateRequest req;
  if (list) {
    if (!o.prompt_words.empty() || !o.token_ids.empty()) {
      Fail(2, "--list_models takes no prompt (see pd-client --help)");
    }
  } else {
    absl::StatusOr<pdserve::v1::GenerateRequest> built = pd::client::BuildRequest(o);
    if (!built.ok()) Fail(2, std::string(built.status().message()) + " (see pd-client --help)");
    req = *std::move(built);
  }

  std::vector<pd::services::CallHeader> headers;
  if (const std::string path = absl::GetFlag(FLAGS_api_key_file); !path.empty()) {
    absl::StatusOr<std::string> key = pd::services::ReadSecretFile(
        path, "--api_key_file", pd::services::ApiKeyStore::kMinKeyBytes);
    if (!key.ok()) Fail(2, std::string(key.status().message()));
    headers.push_back(pd::services::BearerHeader(*key));
  }
  absl::StatusOr<std::shared_ptr<const pd::services::ClientSecurity>> security =
      pd::services::ClientSecurity::Create(pd::services::ClientTlsFromFlags(), std::move(headers),
                                           "--tls_");
  if (!security.ok()) Fail(2, std::string(security.status().message()));

  pd::client::Interrupter interrupter;  // Ctrl-C: cancel the stream, or exit 130 at once
  const std::string router = absl::GetFlag(FLAGS_router);
  std::shared_ptr<grpc::Channel> channel = pd::client::Connect(router, **security);
  if (const absl::Duration wait = absl::GetFlag(FLAGS_wait_ready); wait > absl::ZeroDuration()) {
    if (absl::Status s = pd::client::WaitReady(channel, wait); !s.ok()) {
      return Error("router " + router + " " + std::string(s.message()));
    }
  }
  std::unique_ptr<pdserve::v1::Generation::Stub> api = pdserve::v1::Generation::NewStub(channel);
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (list) {
    auto models = pd::client::ListModels(
        api.get(), timeout > absl::ZeroDuration() ? timeout : absl::Seconds(30));
    if (!models.ok()) return Error("error: " + models.status().ToString());
    std::fputs(pd::client::FormatModels(*models, json).c_str(), stdout);
    return 0;
  }
  grpc::ClientContext ctx;
  if (timeout > absl::ZeroDuration()) ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  interrupter.SetActive(&ctx);
  if (absl::GetFlag(FLAGS_echo) && !json) std::fputs(req.text().c_str(), stdout);
  pd::client::StreamSummary summary = pd::client::StreamGenerate(
      api.get(), &ctx, req, [json](const pdserve::v1::GenerateResponse& r, absl::Duration t) {
        const std::string out = json ? pd::client::ResponseToJsonLine(r, t) + "\n" : r.text();
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);  // each delta as it arrives
      });
  interrupter.SetActive(nullptr);
  if (!json) std::fputs("\n", stdout);
  std::fflush(stdout);
  if (interrupter.interrupted() && summary.status.error_code() == grpc::StatusCode::CANCELLED) {
    std::fputs("pd-client: interrupted\n", stderr);
    return 130;
  }
  if (absl::GetFlag(FLAGS_stats) && summary.messages > 0) {
    std::fprintf(stderr, "%s\n", pd::client::FormatStats(summary).c_str());
  }
  if (!summary.status.ok()) {
    return Error("error: " + pd::client::FormatRpcError(summary.status));
  }
  return 0;
}
