// Real-process cluster fixtures for e2e tests: the single-process reference engine, and a
// pd-router with prefill and decode pd-workers as child processes on loopback (stories260K).
// Test-only, header-only; every method may fail the calling test via CHECK.
#pragma once

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/log/log.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "engine/runtime/model_runtime.h"
#include "pd/v1/generation.grpc.pb.h"

namespace pd::e2e {

using ::pd::testing::Subprocess;

inline constexpr char kRouter[] = PD_BINARY_DIR "/services/router/pd-router";
inline constexpr char kWorker[] = PD_BINARY_DIR "/services/worker/pd-worker";
inline constexpr char kTierd[] = PD_BINARY_DIR "/services/tierd/pd-tierd";
inline constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
inline constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

// The value of the sample `series` (metric name with its labels, exactly as exposed) in
// Prometheus text; `absent` when there is no such sample (or the process is down).
inline double Metric(const std::string& text, const std::string& series, double absent = 0) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return absent;
}

inline int FreePort() {
  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  CHECK(port.ok()) << port.status();
  return *port;
}

// The tool schema of the tool-calling e2e tests: a city and a unit.
inline constexpr char kWeatherSchema[] =
    R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},)"
    R"("unit":{"enum":["celsius","fahrenheit"]}},"required":["city","unit"],)"
    R"("additionalProperties":false})";

// In a router flag, stands for the router's HTTP port: Cluster picks a free one on every start
// attempt (a port picked once, outside the retry loop, made the retries futile: a CI run where
// another test held it failed three attempts on the same port). Cluster::http_port() says which.
inline constexpr char kHttpPort[] = "{http_port}";

// A server child process that listens on a gRPC port and serves /healthz on a metrics port.
struct ServingProcess {
  Subprocess process;
  std::vector<std::string> args;
  int grpc_port = 0;
  int metrics_port = 0;
};

// Spawns make_args(grpc_port, metrics_port) on free loopback ports and waits until its /healthz
// answers and its log says it serves on them. Ports are picked free but can be taken by another
// test before the child binds them (ctest runs tests in parallel): a child that exits reporting
// a bind failure is started again on fresh ports, up to 3 times. CHECK-fails when it does not
// come up within `timeout`.
inline ServingProcess SpawnServing(
    const std::function<std::vector<std::string>(int grpc_port, int metrics_port)>& make_args,
    const std::string& log_path, absl::Duration timeout = absl::Seconds(30)) {
  for (int attempt = 1;; ++attempt) {
    const int port = FreePort();
    const int mport = FreePort();
    std::vector<std::string> args = make_args(port, mport);
    absl::StatusOr<Subprocess> p = Subprocess::Spawn(args, log_path);
    CHECK(p.ok()) << p.status();
    const absl::Time deadline = absl::Now() + timeout;
    bool exited = false;
    while (absl::Now() < deadline) {
      httplib::Client http("127.0.0.1", mport);
      http.set_connection_timeout(1);
      // The answer must be this child's: another test's server may have taken the port (its
      // /healthz says 200 while this child failed to bind). The child logs "<program>
      // serving: ...; metrics on <host>:<mport>" once both its servers listen (services/base/
      // serve.cc).
      if (auto res = http.Get("/healthz"); res && res->status == 200 && !p->Poll().has_value()) {
        const std::string log = p->ReadLog();
        if (absl::StrContains(log, " serving: ") &&
            absl::StrContains(log, "; metrics on ") &&
            absl::StrContains(log, absl::StrCat(":", mport, "\n"))) {
          return ServingProcess{*std::move(p), std::move(args), port, mport};
        }
      }
      if (p->Poll().has_value()) {
        exited = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    const std::string log = p->ReadLog();
    const bool port_race = absl::StrContains(log, "cannot start server") ||
                           absl::StrContains(log, "address already in use") ||
                           absl::StrContains(log, "Address already in use");
    CHECK(exited && port_race && attempt < 3)
        << args[0] << " did not come up (attempt " << attempt << "):\n"
        << p->LogTail(30);
    LOG(WARNING) << args[0] << " lost a port race; starting it again on other ports";
  }
}

// What one Generate call returned.
struct Generated {
  grpc::Status status;
  std::vector<uint32_t> tokens;
  std::string text;
  pdserve::v1::GenerateResponse last;
  int messages = 0;
};

// The H2O / SnapKV KV policy of a Reference (SchedulerConfig::kv_policy; empty = off).
struct CompressSettings {
  std::string policy;
  int64_t budget_tokens = 0;
  int64_t recent_tokens = 0;
};

// The single-process engine: the reference every cluster path must match.
class Reference {
 public:
  // `sink_tokens` / `window_tokens`: the sink + window KV policy (0 = off).
  // `weight_dtype`: --weight_dtype (kAuto = as stored, kInt8 = quantized at load).
  explicit Reference(kernels::DType kv_dtype = kernels::DType::kF32, int64_t sink_tokens = 0,
                     int64_t window_tokens = 0,
                     engine::WeightDType weight_dtype = engine::WeightDType::kAuto,
                     const CompressSettings& compress = {}) {
    engine::ModelRuntimeConfig c;
    c.model = kModel;
    c.tokenizer = kTokenizer;
    c.kv_blocks = 256;
    c.threads = 1;
    c.kv_dtype = kv_dtype;
    c.scheduler.kv_sink_tokens = sink_tokens;
    c.scheduler.kv_window_tokens = window_tokens;
    c.scheduler.kv_policy = compress.policy;
    c.scheduler.kv_budget_tokens = compress.budget_tokens;
    c.scheduler.kv_recent_tokens = compress.recent_tokens;
    c.weight_dtype = weight_dtype;
    absl::StatusOr<std::unique_ptr<engine::ModelRuntime>> rt = engine::ModelRuntime::Create(c);
    CHECK(rt.ok()) << rt.status();
    rt_ = *std::move(rt);
  }

  std::vector<uint32_t> Encode(const std::string& text) {
    absl::StatusOr<std::vector<uint32_t>> ids = rt_->tokenizer().Encode(text, true, false);
    CHECK(ids.ok()) << ids.status();
    return *ids;
  }

  // Greedy tokens and text of `prompt`; with `logprobs`, also each token's entry with
  // `top_logprobs` alternatives.
  std::pair<std::vector<uint32_t>, std::string> Greedy(
      const std::string& prompt, uint32_t max_tokens,
      std::vector<engine::TokenLogprob>* logprobs = nullptr, int32_t top_logprobs = 0,
      bool ignore_eos = false) {
    return GreedyIds(Encode(prompt), max_tokens, logprobs, top_logprobs, ignore_eos);
  }

  // The same for a prompt given as token ids.
  std::pair<std::vector<uint32_t>, std::string> GreedyIds(
      std::vector<uint32_t> prompt, uint32_t max_tokens,
      std::vector<engine::TokenLogprob>* logprobs = nullptr, int32_t top_logprobs = 0,
      bool ignore_eos = false) {
    std::vector<uint32_t> tokens;
    std::string text;
    engine::GenerationRequest r;
    r.id = RequestId(next_++);
    r.prompt = std::move(prompt);
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = ignore_eos;
    if (logprobs != nullptr) r.sampling.logprobs = top_logprobs;
    r.on_output = [&](engine::GenerationOutput o) {
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      text += o.text;
      if (logprobs != nullptr) {
        logprobs->insert(logprobs->end(), o.logprobs.begin(), o.logprobs.end());
      }
    };
    CHECK(rt_->scheduler()->Submit(std::move(r)).ok());
    while (!rt_->scheduler()->idle()) rt_->scheduler()->Step();
    return {tokens, text};
  }

 private:
  std::unique_ptr<engine::ModelRuntime> rt_;
  uint64_t next_ = 1;
};

// The model a Cluster serves: a llama2.c checkpoint with its tokenizer (stories260K, the default)
// or a Hugging Face directory (tokenizer empty), e.g. one pd-make-model wrote.
struct ModelFiles {
  std::string model = kModel;
  std::string tokenizer = kTokenizer;

  std::vector<std::string> Flags() const {
    std::vector<std::string> flags = {"--model=" + model};
    if (!tokenizer.empty()) flags.push_back("--tokenizer=" + tokenizer);
    return flags;
  }
};

class Cluster {
 public:
  // `prefill` prefill workers and `decode` decode workers, all on loopback.
  // `worker_env(worker id)` gives environment assignments ("NAME=value") for that worker, e.g.
  // CUDA_VISIBLE_DEVICES per worker (started through /usr/bin/env). `worker_extra(worker id)`
  // gives flags for that worker alone, after `worker_flags` (they override).
  Cluster(const std::string& dir, int prefill, int decode, std::string policy = "round_robin",
          std::vector<std::string> worker_flags = {}, std::vector<std::string> router_flags = {},
          std::function<std::vector<std::string>(const std::string&)> worker_env = nullptr,
          std::function<std::vector<std::string>(const std::string&)> worker_extra = nullptr,
          ModelFiles model = {})
      : dir_(dir),
        model_(std::move(model)),
        worker_flags_(std::move(worker_flags)),
        worker_env_(std::move(worker_env)),
        worker_extra_(std::move(worker_extra)) {
    std::vector<std::string> d_addrs, p_addrs;
    for (int i = 0; i < prefill; ++i) {
      p_addrs.push_back(StartWorker("prefill", absl::StrCat("prefill-", i)));
    }
    for (int i = 0; i < decode; ++i) {
      d_addrs.push_back(StartWorker("decode", absl::StrCat("decode-", i)));
    }
    // Create the channel once the router listens (SpawnServing waits for it): a channel that
    // saw "connection refused" backs off for seconds before trying again.
    ServingProcess r = SpawnServing(
        [&](int port, int mport) {
          std::vector<std::string> args = {
              kRouter,
              "--drain_timeout=10s",
              absl::StrCat("--grpc_address=127.0.0.1:", port),
              absl::StrCat("--metrics_address=127.0.0.1:", mport),
              absl::StrCat("--decode_workers=", absl::StrJoin(d_addrs, ",")),
              absl::StrCat("--prefill_workers=", absl::StrJoin(p_addrs, ",")),
              absl::StrCat("--policy=", policy),
              "--health_interval=200ms"};
          for (std::string& f : model_.Flags()) args.push_back(std::move(f));
          bool wants_http = false;
          for (const std::string& f : router_flags) wants_http |= absl::StrContains(f, kHttpPort);
          router_http_port_ = wants_http ? FreePort() : 0;
          for (const std::string& f : router_flags) {
            args.push_back(absl::StrReplaceAll(f, {{kHttpPort, absl::StrCat(router_http_port_)}}));
          }
          return args;
        },
        dir_ + "/router.log");
    router_port_ = r.grpc_port;
    router_metrics_port_ = r.metrics_port;
    router_args_ = std::move(r.args);
    router_.emplace(std::move(r.process));
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", router_port_),
                                   grpc::InsecureChannelCredentials());
    api_ = pdserve::v1::Generation::NewStub(channel_);
  }

  // Waits until the router lists the model (a decode worker joined) and every worker answers.
  bool WaitReady(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      pdserve::v1::ListModelsResponse models;
      if (!api_key_.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key_);
      if (api_->ListModels(&ctx, {}, &models).ok() && models.models_size() == 1 &&
          AllWorkersJoined()) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  bool AllWorkersJoined() {
    const std::string m = RouterMetrics();
    return absl::StrContains(m, "pd_router_workers_healthy " + std::to_string(workers_.size()));
  }

  Generated Generate(pdserve::v1::GenerateRequest req, absl::Duration timeout = absl::Seconds(60),
                     grpc::ClientContext* ctx_in = nullptr) {
    grpc::ClientContext local;
    grpc::ClientContext& ctx = ctx_in ? *ctx_in : local;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!api_key_.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key_);
    Generated g;
    auto reader = api_->Generate(&ctx, req);
    pdserve::v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      g.tokens.insert(g.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
      g.text += resp.text();
      ++g.messages;
      g.last = resp;
    }
    g.status = reader->Finish();
    return g;
  }

  // A request of n > 1 choices: what each choice (GenerateResponse.index) returned, `last`
  // being its first message with a finish reason (or its last one); every entry's status is
  // the call's. Messages whose index is n or more are counted in *bad_index.
  std::vector<Generated> GenerateChoices(pdserve::v1::GenerateRequest req, uint32_t n,
                                         absl::Duration timeout = absl::Seconds(60),
                                         int* bad_index = nullptr) {
    req.set_n(n);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!api_key_.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key_);
    std::vector<Generated> out(n);
    auto reader = api_->Generate(&ctx, req);
    pdserve::v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.index() >= n) {
        if (bad_index != nullptr) ++*bad_index;
        continue;
      }
      Generated& g = out[resp.index()];
      g.tokens.insert(g.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
      g.text += resp.text();
      ++g.messages;
      if (g.last.finish_reason() == pdserve::v1::FINISH_REASON_UNSPECIFIED) g.last = resp;
    }
    const grpc::Status status = reader->Finish();
    for (Generated& g : out) g.status = status;
    return out;
  }

  Generated GenerateText(const std::string& text, uint32_t max_tokens) {
    pdserve::v1::GenerateRequest req;
    req.set_text(text);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    return Generate(req);
  }

  // Sent as "authorization: Bearer <key>" on the fixture's own calls (routers with API keys).
  void set_api_key(std::string key) { api_key_ = std::move(key); }

  // The router's HTTP port, when a router flag named kHttpPort (else 0).
  int http_port() const { return router_http_port_; }

  std::string RouterMetrics() { return HttpGet(router_metrics_port_, "/metrics"); }
  std::string WorkerMetrics(int i) { return HttpGet(workers_[i].metrics_port, "/metrics"); }

  static std::string HttpGet(int port, const std::string& path) {
    httplib::Client http("127.0.0.1", port);
    http.set_connection_timeout(2);
    auto res = http.Get(path.c_str());
    return res ? res->body : "";
  }

  struct Worker {
    std::string role, id;
    int grpc_port = 0, metrics_port = 0;
    std::vector<std::string> args;
    std::optional<Subprocess> process;
  };
  std::vector<Worker>& workers() { return workers_; }
  Subprocess& router() { return *router_; }
  pdserve::v1::Generation::Stub* api() { return api_.get(); }
  std::string Logs() {
    std::string out = absl::StrCat("--- router\n", router_->LogTail(30));
    for (auto& w : workers_) {
      if (w.process) absl::StrAppend(&out, "--- ", w.id, "\n", w.process->LogTail(30));
    }
    return out;
  }

  void RestartWorker(int i) {
    Worker& w = workers_[i];
    absl::StatusOr<Subprocess> p = Subprocess::Spawn(w.args, dir_ + "/" + w.id + ".log");
    CHECK(p.ok()) << p.status();
    w.process.emplace(*std::move(p));
  }

 private:
  std::string StartWorker(const std::string& role, const std::string& id) {
    ServingProcess s = SpawnServing(
        [&](int port, int mport) {
          std::vector<std::string> args;
          if (worker_env_) {
            args.push_back("/usr/bin/env");
            for (const std::string& kv : worker_env_(id)) args.push_back(kv);
          }
          std::vector<std::string> worker = {kWorker,
                                             "--role=" + role,
                                             absl::StrCat("--grpc_address=127.0.0.1:", port),
                                             absl::StrCat("--metrics_address=127.0.0.1:", mport),
                                             "--worker_id=" + id,
                                             "--kv_blocks=256",
                                             "--threads=1",
                                             "--drain_timeout=2s"};
          for (std::string& f : model_.Flags()) worker.push_back(std::move(f));
          args.insert(args.end(), worker.begin(), worker.end());
          args.insert(args.end(), worker_flags_.begin(), worker_flags_.end());
          if (worker_extra_) {
            for (const std::string& f : worker_extra_(id)) args.push_back(f);
          }
          return args;
        },
        dir_ + "/" + id + ".log");
    Worker w;
    w.role = role;
    w.id = id;
    w.grpc_port = s.grpc_port;
    w.metrics_port = s.metrics_port;
    w.args = std::move(s.args);
    w.process.emplace(std::move(s.process));
    workers_.push_back(std::move(w));
    return absl::StrCat("127.0.0.1:", workers_.back().grpc_port);
  }

  std::string dir_;
  ModelFiles model_;
  std::vector<std::string> worker_flags_;
  std::function<std::vector<std::string>(const std::string&)> worker_env_;
  std::function<std::vector<std::string>(const std::string&)> worker_extra_;
  std::vector<Worker> workers_;
  int router_port_ = 0, router_metrics_port_ = 0, router_http_port_ = 0;
  std::vector<std::string> router_args_;
  std::optional<Subprocess> router_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pdserve::v1::Generation::Stub> api_;
  std::string api_key_;
};

// Runs `argv` (a node client against a cluster, a python check) to its end within `timeout`,
// its output going to `log_path`: the output when it exits 0; otherwise an error carrying how
// it ended and the output.
inline absl::StatusOr<std::string> RunToEnd(std::vector<std::string> argv,
                                            const std::string& log_path, absl::Duration timeout) {
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(std::move(argv), log_path);
  if (!p.ok()) return p.status();
  absl::StatusOr<pd::testing::ExitInfo> exit = p->Wait(timeout);
  std::string log = p->ReadLog();
  if (!exit.ok() || !exit->Success()) {
    return absl::InternalError(
        absl::StrCat(exit.ok() ? exit->ToString() : exit.status().ToString(), "; output:\n", log));
  }
  return log;
}

// A pd-tierd child process on loopback.
class Tierd {
 public:
  // pd-tierd with a 1 MiB DRAM tier (51 stories260K blocks) and 16 MiB of NVMe in DIR/nvme;
  // `extra` flags come last (they override). `name` names its log (DIR/NAME.log), and a second
  // tierd of one test needs its own --node_name, --shm_name and --nvme_dir in `extra`.
  explicit Tierd(const std::string& dir, std::vector<std::string> extra = {},
                 std::string name = "tierd")
      : dir_(dir), name_(std::move(name)) {
    ServingProcess s = SpawnServing(
        [&](int port, int mport) {
          std::vector<std::string> args = {kTierd,
                                           absl::StrCat("--grpc_address=127.0.0.1:", port),
                                           absl::StrCat("--metrics_address=127.0.0.1:", mport),
                                           "--node_name=e2e-node",
                                           absl::StrCat("--shm_name=/pd-e2e-tier-", ::getpid()),
                                           absl::StrCat("--model=", kModel),
                                           absl::StrCat("--tokenizer=", kTokenizer),
                                           "--dram_mib=1",
                                           "--high_watermark=0.8",
                                           "--low_watermark=0.5",
                                           "--nvme_dir=" + dir + "/nvme",
                                           "--nvme_mib=16",
                                           "--drain_timeout=1s"};
          args.insert(args.end(), extra.begin(), extra.end());
          return args;
        },
        dir_ + "/" + name_ + ".log");
    port_ = s.grpc_port;
    metrics_port_ = s.metrics_port;
    args_ = std::move(s.args);
    process_.emplace(std::move(s.process));
  }

  // Starts it again after Kill, on the same ports (the workers point at them).
  void Start() {
    absl::StatusOr<Subprocess> p = Subprocess::Spawn(args_, dir_ + "/" + name_ + ".log");
    CHECK(p.ok()) << p.status();
    process_.emplace(*std::move(p));
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (Metrics().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    CHECK(!Metrics().empty()) << process_->LogTail();
  }

  Subprocess& process() { return *process_; }

  void Kill() {
    (void)process_->Signal(SIGKILL);
    (void)process_->Wait(absl::Seconds(10));
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Metrics() const { return Cluster::HttpGet(metrics_port_, "/metrics"); }
  std::string nvme_dir() const { return dir_ + "/nvme"; }
  std::string Log() const { return process_->LogTail(40); }

 private:
  std::string dir_;
  std::string name_;
  int port_ = 0, metrics_port_ = 0;
  std::vector<std::string> args_;
  std::optional<Subprocess> process_;
};

}  // namespace pd::e2e
