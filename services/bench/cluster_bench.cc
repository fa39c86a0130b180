// TTFT of one request through the cluster (pd-router -> decode pd-worker, with or without a
// prefill pd-worker and the KV transfer) versus the single-process engine on the same prompt,
// all on this machine, measured in the same run.
//
//   BM_EngineTtft        in-process ModelRuntime: submit -> first token.
//   BM_ClusterTtft/0     router + one `both` worker (aggregated: prefill on the decode worker).
//   BM_ClusterTtft/1     router + prefill worker + decode worker (KV written into the decode
//                        worker's pool over --transport).
//
// Every iteration uses a fresh cache salt, so nothing is a prefix-cache hit. Counters:
// ttft_ms (mean of the iterations), overhead_ms (cluster minus the engine's mean from
// BM_EngineTtft of the same run), kv_transfer_ms (prefill worker's transfer time, from the
// response timings), ratio (engine TTFT / cluster TTFT: 1.0 = no overhead).
//
// Usage: cluster_bench [--model=PATH --tokenizer=PATH] [--prompt_tokens=N] [--transport=ucx]
//                      [benchmark flags]. Default model: ../shared stories260K.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/log/log.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "engine/runtime/model_runtime.h"
#include "pd/v1/generation.grpc.pb.h"

ABSL_FLAG(std::string, model, PD_SHARED_DIR "/models/stories260K/stories260K.bin",
          "model path (Hugging Face directory or llama2.c .bin)");
ABSL_FLAG(std::string, tokenizer, PD_SHARED_DIR "/models/stories260K/tok512.bin",
          "tokenizer.bin for llama2.c models; empty for Hugging Face directories");
ABSL_FLAG(int, prompt_tokens, 256, "prompt length in tokens");
ABSL_FLAG(std::string, transport, "ucx", "KV transport between the workers");
ABSL_FLAG(int, threads, 1, "kernel threads of the engine and of each worker");

namespace {

using pd::testing::Subprocess;

double g_engine_ttft_ms = 0;

std::vector<uint32_t> Prompt() {
  std::vector<uint32_t> p(absl::GetFlag(FLAGS_prompt_tokens));
  for (size_t i = 0; i < p.size(); ++i) p[i] = 3 + (i * 7919) % 200;  // deterministic ids
  return p;
}

void BM_EngineTtft(benchmark::State& state) {
  pd::engine::ModelRuntimeConfig c;
  c.model = absl::GetFlag(FLAGS_model);
  c.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  c.kv_blocks = 1024;
  c.threads = absl::GetFlag(FLAGS_threads);
  auto rt = pd::engine::ModelRuntime::Create(c);
  CHECK(rt.ok()) << rt.status();
  const std::vector<uint32_t> prompt = Prompt();
  uint64_t id = 1;
  double total_ms = 0;
  for (auto _ : state) {
    pd::engine::GenerationRequest r;
    r.id = pd::RequestId(id);
    r.prompt = prompt;
    r.sampling.max_tokens = 1;
    r.cache_salt = absl::StrCat("iteration-", id++);
    absl::Time first = absl::InfiniteFuture();
    r.on_output = [&](pd::engine::GenerationOutput o) {
      if (!o.new_tokens.empty() && first == absl::InfiniteFuture()) first = absl::Now();
    };
    const absl::Time start = absl::Now();
    CHECK((*rt)->scheduler()->Submit(std::move(r)).ok());
    while (!(*rt)->scheduler()->idle()) (*rt)->scheduler()->Step();
    const double ms = absl::ToDoubleMilliseconds(first - start);
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  g_engine_ttft_ms = total_ms / state.iterations();
  state.counters["ttft_ms"] = g_engine_ttft_ms;
}

class Cluster {
 public:
  explicit Cluster(bool disaggregated) {
    std::vector<std::string> decode, prefill;
    if (disaggregated) {
      prefill.push_back(Worker("prefill"));
      decode.push_back(Worker("decode"));
    } else {
      decode.push_back(Worker("both"));
    }
    const int port = Port(), metrics = Port();
    std::vector<std::string> args = {PD_BINARY_DIR "/services/router/pd-router",
                                     absl::StrCat("--grpc_address=127.0.0.1:", port),
                                     absl::StrCat("--metrics_address=127.0.0.1:", metrics),
                                     "--model=" + absl::GetFlag(FLAGS_model),
                                     "--tokenizer=" + absl::GetFlag(FLAGS_tokenizer),
                                     "--decode_workers=" + decode[0],
                                     "--health_interval=100ms"};
    if (!prefill.empty()) args.push_back("--prefill_workers=" + prefill[0]);
    Spawn(args, "router");
    httplib::Client http("127.0.0.1", metrics);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      auto res = http.Get("/metrics");
      if (res && res->body.find(absl::StrCat("pd_router_workers_healthy ", decode.size() +
                                                                                prefill.size())) !=
                     std::string::npos) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    stub_ = pdserve::v1::Generation::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  // TTFT in ms and the reported kv transfer time in ms.
  std::pair<double, double> Once(uint64_t i, const std::vector<uint32_t>& prompt) {
    pdserve::v1::GenerateRequest req;
    req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    req.mutable_sampling()->set_max_tokens(1);
    req.set_cache_salt(absl::StrCat("iteration-", i));
    grpc::ClientContext ctx;
    const absl::Time start = absl::Now();
    auto reader = stub_->Generate(&ctx, req);
    pdserve::v1::GenerateResponse resp;
    absl::Time first = absl::InfiniteFuture();
    double kv_ms = 0;
    while (reader->Read(&resp)) {
      if (resp.token_ids_size() > 0 && first == absl::InfiniteFuture()) first = absl::Now();
      if (resp.has_timings()) kv_ms = resp.timings().kv_transfer_us() / 1e3;
    }
    grpc::Status s = reader->Finish();
    CHECK(s.ok()) << s.error_message();
    return {absl::ToDoubleMilliseconds(first - start), kv_ms};
  }

 private:
  static int Port() {
    auto p = pd::testing::PickFreeLoopbackPort();
    CHECK(p.ok());
    return *p;
  }
  std::string Worker(const std::string& role) {
    const int port = Port();
    Spawn({PD_BINARY_DIR "/services/worker/pd-worker", "--role=" + role,
           "--model=" + absl::GetFlag(FLAGS_model), "--tokenizer=" + absl::GetFlag(FLAGS_tokenizer),
           absl::StrCat("--grpc_address=127.0.0.1:", port),
           absl::StrCat("--metrics_address=127.0.0.1:", Port()), "--kv_blocks=1024",
           absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
           "--transport=" + absl::GetFlag(FLAGS_transport)},
          role);
    return absl::StrCat("127.0.0.1:", port);
  }
  void Spawn(std::vector<std::string> args, const std::string& name) {
    auto p = Subprocess::Spawn(std::move(args), absl::StrCat("/tmp/cluster_bench-", name, ".log"));
    CHECK(p.ok()) << p.status();
    processes_.push_back(*std::move(p));
  }

  std::vector<Subprocess> processes_;
  std::unique_ptr<pdserve::v1::Generation::Stub> stub_;
};

void BM_ClusterTtft(benchmark::State& state) {
  Cluster cluster(state.range(0) == 1);
  const std::vector<uint32_t> prompt = Prompt();
  cluster.Once(0, prompt);  // warm-up: channels, connections, the transport endpoint
  uint64_t i = 1;
  double ttft = 0, kv = 0;
  for (auto _ : state) {
    auto [t, k] = cluster.Once(i++, prompt);
    ttft += t;
    kv += k;
    state.SetIterationTime(t / 1e3);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["ttft_ms"] = ttft / n;
  state.counters["kv_transfer_ms"] = kv / n;
  state.counters["overhead_ms"] = ttft / n - g_engine_ttft_ms;
  state.counters["ratio"] = g_engine_ttft_ms / (ttft / n);
}

BENCHMARK(BM_EngineTtft)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK(BM_ClusterTtft)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("disaggregated")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
