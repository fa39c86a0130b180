#include "services/client/client.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/base/grpc_status.h"

namespace pd::client {
namespace {

std::string Ms(absl::Duration d) {
  return absl::StrFormat("%.1fms", absl::ToDoubleMilliseconds(d));
}

std::string UsMs(uint64_t us) { return absl::StrFormat("%.1fms", static_cast<double>(us) / 1e3); }

// One health Check; OK only for SERVING.
absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout) {
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Wait for the connection within the attempt instead of failing at once while connecting.
  ctx.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status status = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("health: ", FormatRpcError(status)));
  }
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        "health: ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ChannelArguments FastReconnectChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  return args;
}

std::shared_ptr<grpc::Channel> Connect(const std::string& address) {
  return Connect(address, *services::ClientSecurity::Insecure());
}

std::shared_ptr<grpc::Channel> Connect(const std::string& address,
                                       const services::ClientSecurity& security) {
  return security.CreateChannel(address, FastReconnectChannelArgs());
}

absl::Status WaitReady(const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout,
                       absl::Duration attempt_timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_ptr<pdserve::v1::Generation::Stub> api = pdserve::v1::Generation::NewStub(channel);
  absl::Status last = absl::UnavailableError("not tried");
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    const absl::Duration attempt = std::max(std::min(attempt_timeout, left), absl::Milliseconds(1));
    last = CheckHealth(channel, attempt);
    if (last.ok()) {
      absl::StatusOr<pdserve::v1::ListModelsResponse> models = ListModels(api.get(), attempt);
      if (!models.ok()) {
        last = absl::UnavailableError(absl::StrCat("ListModels: ", models.status().ToString()));
      } else if (models->models_size() == 0) {
        last = absl::UnavailableError("no model listed yet (no decode worker up)");
      } else {
        return absl::OkStatus();
      }
    }
    if (absl::Now() + absl::Milliseconds(100) >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("not ready after ", absl::FormatDuration(timeout), ": ", last.message()));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<pdserve::v1::ListModelsResponse> ListModels(
    pdserve::v1::Generation::StubInterface* stub, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  pdserve::v1::ListModelsResponse resp;
  grpc::Status status = stub->ListModels(&ctx, pdserve::v1::ListModelsRequest(), &resp);
  if (!status.ok()) {
    return services::FromGrpcStatus(status);
  }
  return resp;
}

std::string FormatModels(const pdserve::v1::ListModelsResponse& models, bool json) {
  std::string out;
  for (const pdserve::v1::ModelInfo& m : models.models()) {
    if (json) {
      nlohmann::json j = {{"id", m.id()},
                          {"block_size", m.block_size()},
                          {"max_context_tokens", m.max_context_tokens()},
                          {"vocab_size", m.vocab_size()},
                          {"fingerprint", m.fingerprint()}};
      absl::StrAppend(&out, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "\n");
    } else {
      absl::StrAppend(&out, m.id(), " block_size=", m.block_size(),
                      " max_context_tokens=", m.max_context_tokens(),
                      " vocab_size=", m.vocab_size(), " fingerprint=", m.fingerprint(), "\n");
    }
  }
  return out;
}

StreamSummary StreamGenerate(pdserve::v1::Generation::StubInterface* stub,
                             grpc::ClientContext* context,
                             const pdserve::v1::GenerateRequest& request,
                             const ResponseSink& sink) {
  StreamSummary summary;
  const absl::Time start = absl::Now();
  std::unique_ptr<grpc::ClientReaderInterface<pdserve::v1::GenerateResponse>> reader =
      stub->Generate(context, request);
  pdserve::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    const absl::Duration elapsed = absl::Now() - start;
    ++summary.messages;
    summary.tokens += static_cast<uint64_t>(resp.token_ids_size());
    if (!summary.ttft.has_value() && resp.token_ids_size() > 0) {
      summary.ttft = elapsed;
    }
    if (summary.request_id.empty()) {
      summary.request_id = resp.request_id();
    }
    if (sink) {
      sink(resp, elapsed);
    }
    summary.last = std::move(resp);
    resp.Clear();
  }
  summary.status = reader->Finish();
  summary.total = absl::Now() - start;
  return summary;
}

std::string FinishReasonName(pdserve::v1::FinishReason reason) {
  if (reason == pdserve::v1::FINISH_REASON_UNSPECIFIED) {
    return "";
  }
  return std::string(absl::StripPrefix(pdserve::v1::FinishReason_Name(reason), "FINISH_REASON_"));
}

std::string ResponseToJsonLine(const pdserve::v1::GenerateResponse& response,
                               absl::Duration elapsed) {
  nlohmann::json j;
  j["token_ids"] = std::vector<uint32_t>(response.token_ids().begin(), response.token_ids().end());
  j["text"] = response.text();
  j["elapsed_ms"] = absl::ToDoubleMilliseconds(elapsed);
  if (response.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED) {
    j["finish_reason"] = FinishReasonName(response.finish_reason());
  }
  if (!response.request_id().empty()) {
    j["request_id"] = response.request_id();
  }
  if (response.has_usage()) {
    const pdserve::v1::Usage& u = response.usage();
    j["usage"] = {{"prompt_tokens", u.prompt_tokens()},
                  {"cached_tokens", u.cached_tokens()},
                  {"completion_tokens", u.completion_tokens()}};
  }
  if (response.has_timings()) {
    const pdserve::v1::Timings& t = response.timings();
    j["timings"] = {{"queue_us", t.queue_us()},
                    {"prefill_us", t.prefill_us()},
                    {"first_token_us", t.first_token_us()},
                    {"kv_transfer_us", t.kv_transfer_us()},
                    {"kv_restore_us", t.kv_restore_us()},
                    {"total_us", t.total_us()}};
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string FormatStats(const StreamSummary& summary) {
  const pdserve::v1::GenerateResponse& last = summary.last;
  std::string out;
  if (last.has_usage()) {
    absl::StrAppend(&out, "prompt_tokens=", last.usage().prompt_tokens(),
                    " cached_tokens=", last.usage().cached_tokens(),
                    " generated_tokens=", last.usage().completion_tokens());
  } else {
    absl::StrAppend(&out, "generated_tokens=", summary.tokens);
  }
  absl::StrAppend(&out, " ttft=", summary.ttft ? Ms(*summary.ttft) : "-",
                  " total=", Ms(summary.total));
  const std::string reason = FinishReasonName(last.finish_reason());
  absl::StrAppend(&out, " finish_reason=", reason.empty() ? "-" : reason);
  if (!summary.request_id.empty()) {
    absl::StrAppend(&out, " request_id=", summary.request_id);
  }
  if (last.has_timings()) {
    const pdserve::v1::Timings& t = last.timings();
    absl::StrAppend(&out, " (server: queue=", UsMs(t.queue_us()), " prefill=", UsMs(t.prefill_us()),
                    " first_token=", UsMs(t.first_token_us()),
                    " kv_transfer=", UsMs(t.kv_transfer_us()), " total=", UsMs(t.total_us()), ")");
  }
  return out;
}

Interrupter::Interrupter() : watcher_([this] { Watch(); }) {}

Interrupter::~Interrupter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  signal_.Trigger();
  watcher_.join();
}

void Interrupter::SetActive(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  active_ = context;
}

bool Interrupter::interrupted() const {
  absl::MutexLock lock(&mu_);
  return interrupted_;
}

void Interrupter::Watch() {
  signal_.Wait();
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return;
  }
  interrupted_ = true;
  if (active_ == nullptr) {
    // Nothing to cancel (connecting, waiting for the router): leave without running static
    // destructors under the gRPC threads' feet.
    std::fputs("pd-client: interrupted\n", stderr);
    std::fflush(stderr);
    std::_Exit(130);
  }
  active_->TryCancel();
}

std::string FormatRpcError(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(services::FromGrpcStatus(status).code()), ": ",
                      status.error_message());
}

}  // namespace pd::client
