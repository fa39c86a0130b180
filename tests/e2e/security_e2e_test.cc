// Edge security with real processes on loopback (docs/security.md): one secured cluster —
// pd-router with TLS and API keys, a decode and a prefill pd-worker with mutual TLS and the
// cluster token — with certificates made by the openssl CLI; one cluster per test process
// (ctest runs each case in its own process, about 1.5 s each).
//
//   - the public API answers UNAUTHENTICATED without a key or with a bad one, PERMISSION_DENIED
//     to a key claiming another tenant, RESOURCE_EXHAUSTED to a message over the size limit;
//   - plaintext clients cannot connect to the router or a worker;
//   - internal RPCs (DecodeService, PrefillService, KvEventService) refuse callers without the
//     cluster token, and callers without a client certificate cannot connect;
//   - tenant B's prompt gets no cached tokens from tenant A's identical prompt (even when B
//     sends A's derived salt as its own), A's repeat does, and the output is the same;
//   - a tenant's concurrent streams are bounded;
//   - the cluster's own traffic (health, KV events, remote prefill) flows over mTLS + token,
//     also after a worker restarts;
//   - the OpenAI HTTP API is HTTPS with the same certificate and keys (a plaintext client gets
//     no answer), and idle TLS keep-alive connections cost the router no CPU.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log/log.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_pki.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pd/v1/generation.grpc.pb.h"
#include "pd/v1/kv_events.grpc.pb.h"
#include "pd/v1/worker.grpc.pb.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::testing::Subprocess;
using ::testing::HasSubstr;
namespace v1 = ::pdserve::v1;
namespace iv1 = ::pdserve::internal::v1;

constexpr char kRouter[] = PD_BINARY_DIR "/services/router/pd-router";
constexpr char kWorker[] = PD_BINARY_DIR "/services/worker/pd-worker";
constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

constexpr char kToken[] = "e2e-cluster-token-0123456789abcdef";
constexpr char kKeyA[] = "e2e-key-of-tenant-a-0123456789";
constexpr char kKeyB[] = "e2e-key-of-tenant-b-0123456789";
constexpr int kMaxStreamsPerTenant = 1;
constexpr int kMaxMessageBytes = 64 << 10;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  CHECK(out.good()) << path;
}

struct Generated {
  grpc::Status status;
  std::vector<uint32_t> tokens;
  v1::GenerateResponse last;
};

class SecureCluster {
 public:
  explicit SecureCluster(const std::string& dir) : dir_(dir) {
    absl::StatusOr<pd::testing::TestPki> pki = pd::testing::MakeTestPki(dir);
    CHECK(pki.ok()) << pki.status();
    pki_ = *pki;
    WriteFile(dir + "/cluster-token", absl::StrCat(kToken, "\n"));
    WriteFile(dir + "/api-keys",
              absl::StrCat("# e2e keys\ntenant-a:", kKeyA, "\ntenant-b:", kKeyB, "\n"));
    const std::vector<std::string> security = {
        "--tls_cert=" + pki_.server_cert,      "--tls_key=" + pki_.server_key,
        "--client_tls_ca=" + pki_.ca_cert,     "--client_tls_cert=" + pki_.client_cert,
        "--client_tls_key=" + pki_.client_key, "--cluster_token_file=" + dir + "/cluster-token"};
    prefill_port_ = StartWorker("prefill", security);
    decode_port_ = StartWorker("decode", security);
    // The public API is TLS without client certificates: clients authenticate with keys.
    e2e::ServingProcess r = e2e::SpawnServing(
        [&](int port, int mport) {
          http_port_ = e2e::FreePort();  // picked again on every attempt, like the others
          std::vector<std::string> args = {
              kRouter, absl::StrCat("--grpc_address=127.0.0.1:", port),
              absl::StrCat("--metrics_address=127.0.0.1:", mport), absl::StrCat("--model=", kModel),
              absl::StrCat("--tokenizer=", kTokenizer),
              absl::StrCat("--decode_workers=127.0.0.1:", decode_port_),
              absl::StrCat("--prefill_workers=127.0.0.1:", prefill_port_),
              "--health_interval=200ms", "--drain_timeout=2s",
              "--api_keys_file=" + dir + "/api-keys",
              absl::StrCat("--max_streams_per_tenant=", kMaxStreamsPerTenant),
              absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
              absl::StrCat("--http_address=127.0.0.1:", http_port_),
              // Idle HTTPS connections are measured for seconds (the default closes them at 5 s).
              "--http_idle_timeout=30s"};
          args.insert(args.end(), security.begin(), security.end());
          return args;
        },
        dir + "/router.log");
    router_port_ = r.grpc_port;
    router_metrics_port_ = r.metrics_port;
    router_.emplace(std::move(r.process));
  }

  // A channel to the router over TLS carrying `headers`.
  std::unique_ptr<v1::Generation::Stub> Api(std::vector<services::CallHeader> headers) {
    return v1::Generation::NewStub(
        Security({pki_.ca_cert, "", ""}, std::move(headers))
            ->CreateChannel(absl::StrCat("127.0.0.1:", router_port_), grpc::ChannelArguments()));
  }

  std::shared_ptr<grpc::Channel> WorkerChannel(int port, const services::TlsClientConfig& tls,
                                               std::vector<services::CallHeader> headers) {
    return Security(tls, std::move(headers))
        ->CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::ChannelArguments());
  }

  // Waits until tenant A's key lists the model (the router reached the decode worker).
  bool WaitReady(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    // Channels are made once the router listens: a channel that saw "connection refused"
    // backs off for seconds before it tries again.
    while (!Listening(router_port_) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    auto api = Api({services::BearerHeader(kKeyA)});
    while (absl::Now() < deadline) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      v1::ListModelsResponse models;
      grpc::Status s = api->ListModels(&ctx, {}, &models);
      if (s.ok() && models.models_size() == 1) {
        return true;
      }
      VLOG(1) << "not ready: " << s.error_message();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  static Generated Generate(v1::Generation::Stub* api, const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    Generated g;
    auto reader = api->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      g.tokens.insert(g.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
      g.last = resp;
    }
    g.status = reader->Finish();
    return g;
  }

  std::string Logs() {
    std::string out = absl::StrCat("--- router\n", router_->LogTail(30));
    for (Worker& w : workers_) absl::StrAppend(&out, "--- ", w.role, "\n", w.process.LogTail(20));
    return out;
  }

  // Prometheus text of the router / the decode worker ("" when unreachable).
  std::string RouterMetrics() const { return HttpGet(router_metrics_port_, "/metrics"); }
  std::string DecodeMetrics() const { return HttpGet(decode_metrics_port_, "/metrics"); }

  const pd::testing::TestPki& pki() const { return pki_; }
  int router_port() const { return router_port_; }
  int http_port() const { return http_port_; }
  int decode_port() const { return decode_port_; }
  int prefill_port() const { return prefill_port_; }

 private:
  static std::string HttpGet(int port, const std::string& path) {
    httplib::Client http("127.0.0.1", port);
    http.set_connection_timeout(2);
    auto res = http.Get(path.c_str());
    return res ? res->body : "";
  }

  // True when a TCP connection to 127.0.0.1:`port` is accepted.
  static bool Listening(int port) {
    absl::StatusOr<int> fd = pd::testing::ConnectLoopback(port);
    if (fd.ok()) ::close(*fd);
    return fd.ok();
  }

  static std::shared_ptr<const services::ClientSecurity> Security(
      const services::TlsClientConfig& tls, std::vector<services::CallHeader> headers) {
    absl::StatusOr<std::shared_ptr<const services::ClientSecurity>> s =
        services::ClientSecurity::Create(tls, std::move(headers));
    CHECK(s.ok()) << s.status();
    return *s;
  }

  int StartWorker(const std::string& role, const std::vector<std::string>& security) {
    e2e::ServingProcess s = e2e::SpawnServing(
        [&](int port, int mport) {
          std::vector<std::string> args = {
              kWorker, "--role=" + role, absl::StrCat("--model=", kModel),
              absl::StrCat("--tokenizer=", kTokenizer),
              absl::StrCat("--grpc_address=127.0.0.1:", port),
              absl::StrCat("--metrics_address=127.0.0.1:", mport), "--worker_id=" + role,
              "--kv_blocks=256", "--threads=1", "--drain_timeout=2s",
              // Workers require client certificates (mutual TLS).
              "--tls_ca=" + pki_.ca_cert};
          if (role == "decode") {
            // Slow steps keep a long stream open while the per-tenant bound is checked.
            args.push_back("--step_delay=10ms");
          }
          args.insert(args.end(), security.begin(), security.end());
          return args;
        },
        dir_ + "/" + role + ".log");
    if (role == "decode") decode_metrics_port_ = s.metrics_port;
    workers_.push_back({role, std::move(s.args), std::move(s.process)});
    return s.grpc_port;
  }

 public:
  // SIGKILLs the worker of `role` and starts it again on the same ports.
  void RestartWorker(const std::string& role) {
    for (Worker& w : workers_) {
      if (w.role != role) continue;
      CHECK(w.process.Signal(SIGKILL).ok());
      CHECK(w.process.Wait(absl::Seconds(10)).ok());
      absl::StatusOr<Subprocess> p = Subprocess::Spawn(w.args, dir_ + "/" + role + ".log");
      CHECK(p.ok()) << p.status();
      w.process = *std::move(p);
    }
  }

 private:
  struct Worker {
    std::string role;
    std::vector<std::string> args;
    Subprocess process;
  };

  std::string dir_;
  pd::testing::TestPki pki_;
  std::vector<Worker> workers_;
  std::optional<Subprocess> router_;
  int router_port_ = 0, decode_port_ = 0, prefill_port_ = 0;
  int router_metrics_port_ = 0, decode_metrics_port_ = 0;
  int http_port_ = 0;
};

class SecurityE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-security-");
    CHECK(dir.ok()) << dir.status();
    dir_ = new pd::testing::TempDir(*std::move(dir));
    cluster_ = new SecureCluster(dir_->path());
    ready_ = cluster_->WaitReady(absl::Seconds(60));
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << cluster_->Logs(); }

  static v1::GenerateRequest Request(const std::string& text, uint32_t max_tokens) {
    v1::GenerateRequest req;
    req.set_text(text);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    return req;
  }

  static pd::testing::TempDir* dir_;
  static SecureCluster* cluster_;
  static bool ready_;
};

pd::testing::TempDir* SecurityE2eTest::dir_ = nullptr;
SecureCluster* SecurityE2eTest::cluster_ = nullptr;
bool SecurityE2eTest::ready_ = false;

TEST_F(SecurityE2eTest, PublicApiNeedsAValidKeyOfItsOwnTenantAndBoundsMessages) {
  for (const std::vector<services::CallHeader>& headers :
       std::vector<std::vector<services::CallHeader>>{
           {},
           {services::BearerHeader("e2e-key-of-tenant-c-0123456789")},
           {services::BearerHeader(std::string(kKeyA) + "x")},
           {{"authorization", kKeyA}}}) {
    auto api = cluster_->Api(headers);
    Generated g = SecureCluster::Generate(api.get(), Request("Once upon a time", 4));
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << g.status.error_message();
    EXPECT_TRUE(g.tokens.empty());
    EXPECT_THAT(g.status.error_message(), ::testing::Not(HasSubstr("0123456789")));
    grpc::ClientContext ctx;
    v1::ListModelsResponse models;
    EXPECT_EQ(api->ListModels(&ctx, {}, &models).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // A valid key cannot claim another tenant.
  auto api = cluster_->Api({services::BearerHeader(kKeyB)});
  v1::GenerateRequest req = Request("Once upon a time", 4);
  req.set_tenant("tenant-a");
  EXPECT_EQ(SecureCluster::Generate(api.get(), req).status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Messages above --max_message_bytes are refused by gRPC itself.
  Generated big =
      SecureCluster::Generate(api.get(), Request(std::string(kMaxMessageBytes + 1, 'a'), 4));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << big.status.error_message();
}

TEST_F(SecurityE2eTest, PlaintextClientsCannotConnect) {
  for (int port : {cluster_->router_port(), cluster_->decode_port()}) {
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    auto api = v1::Generation::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kKeyA));
    v1::ListModelsResponse models;
    EXPECT_EQ(api->ListModels(&ctx, {}, &models).error_code(), grpc::StatusCode::UNAVAILABLE)
        << port;
  }
}

TEST_F(SecurityE2eTest, InternalRpcsRefuseCallersWithoutTheClusterToken) {
  const pd::testing::TestPki& pki = cluster_->pki();
  const services::TlsClientConfig mtls{pki.ca_cert, pki.client_cert, pki.client_key};
  auto deadline = [] { return absl::ToChronoTime(absl::Now() + absl::Seconds(10)); };
  for (const std::vector<services::CallHeader>& headers :
       std::vector<std::vector<services::CallHeader>>{
           {}, {services::ClusterTokenHeader("e2e-cluster-token-0123456789abcdeX")}}) {
    auto decode = iv1::DecodeService::NewStub(
        cluster_->WorkerChannel(cluster_->decode_port(), mtls, headers));
    auto prefill = iv1::PrefillService::NewStub(
        cluster_->WorkerChannel(cluster_->prefill_port(), mtls, headers));
    auto events = iv1::KvEventService::NewStub(
        cluster_->WorkerChannel(cluster_->decode_port(), mtls, headers));
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      iv1::WorkerInfo info;
      grpc::Status s = decode->GetInfo(&ctx, {}, &info);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("cluster token"));
      EXPECT_TRUE(info.worker_id().empty());
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      iv1::WorkerLoad load;
      EXPECT_EQ(prefill->GetLoad(&ctx, {}, &load).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      iv1::PrefillResponse resp;
      EXPECT_EQ(prefill->Prefill(&ctx, {}, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      iv1::DecodeRequest req;
      req.set_request_id("intruder");
      req.add_token_ids(1);
      auto reader = decode->Generate(&ctx, req);
      iv1::DecodeResponse resp;
      EXPECT_FALSE(reader->Read(&resp));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      auto reader = events->Subscribe(&ctx, {});
      iv1::KvEventBatch batch;
      EXPECT_FALSE(reader->Read(&batch));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  // With the token the same call is served (so the refusals above were about the token) ...
  auto decode = iv1::DecodeService::NewStub(cluster_->WorkerChannel(
      cluster_->decode_port(), mtls, {services::ClusterTokenHeader(kToken)}));
  grpc::ClientContext ok_ctx;
  ok_ctx.set_deadline(deadline());
  iv1::WorkerInfo info;
  grpc::Status s = decode->GetInfo(&ok_ctx, {}, &info);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.worker_id(), "decode");
  // ... but not without a client certificate from the cluster CA, token or not.
  for (const services::TlsClientConfig& tls :
       {services::TlsClientConfig{pki.ca_cert, "", ""},
        services::TlsClientConfig{pki.ca_cert, pki.other_client_cert, pki.other_client_key}}) {
    auto no_cert = iv1::DecodeService::NewStub(cluster_->WorkerChannel(
        cluster_->decode_port(), tls, {services::ClusterTokenHeader(kToken)}));
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    EXPECT_EQ(no_cert->GetInfo(&ctx, {}, &info).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
}

TEST_F(SecurityE2eTest, TenantsNeverShareCachedBlocksButATenantReusesItsOwn) {
  auto tenant_a = cluster_->Api({services::BearerHeader(kKeyA)});
  auto tenant_b = cluster_->Api({services::BearerHeader(kKeyB)});
  // A prompt of several full blocks (16 tokens each), unique to this test.
  const v1::GenerateRequest req = Request(
      "Once upon a time, there was a little dog named Max. Max liked to run in the big green "
      "field near the river with his friend Tom. One day, they found",
      12);
  Generated a1 = SecureCluster::Generate(tenant_a.get(), req);
  ASSERT_TRUE(a1.status.ok()) << a1.status.error_message() << "\n" << cluster_->Logs();
  ASSERT_GE(a1.last.usage().prompt_tokens(), 32u);
  EXPECT_EQ(a1.last.usage().cached_tokens(), 0u);
  // B's identical prompt: nothing of A's cache.
  Generated b1 = SecureCluster::Generate(tenant_b.get(), req);
  ASSERT_TRUE(b1.status.ok()) << b1.status.error_message();
  EXPECT_EQ(b1.last.usage().cached_tokens(), 0u) << b1.last.DebugString();
  // Not even when B sends, as its own salt, the salt the router derives for A.
  v1::GenerateRequest forged = req;
  forged.set_cache_salt(services::DeriveTenantCacheSalt("tenant-a", std::nullopt));
  Generated b2 = SecureCluster::Generate(tenant_b.get(), forged);
  ASSERT_TRUE(b2.status.ok()) << b2.status.error_message();
  EXPECT_EQ(b2.last.usage().cached_tokens(), 0u) << b2.last.DebugString();
  // A's repeat reuses A's blocks.
  Generated a2 = SecureCluster::Generate(tenant_a.get(), req);
  ASSERT_TRUE(a2.status.ok()) << a2.status.error_message();
  EXPECT_GT(a2.last.usage().cached_tokens(), 0u) << a2.last.DebugString();
  EXPECT_EQ(a2.last.usage().cached_tokens() % 16, 0u);
  // Greedy output is the same whoever asks and whatever the cache held.
  EXPECT_EQ(b1.tokens, a1.tokens);
  EXPECT_EQ(b2.tokens, a1.tokens);
  EXPECT_EQ(a2.tokens, a1.tokens);
  EXPECT_EQ(a1.tokens.size(), 12u);
}

TEST_F(SecurityE2eTest, ATenantsConcurrentStreamsAreBounded) {
  auto tenant_a = cluster_->Api({services::BearerHeader(kKeyA)});
  auto tenant_b = cluster_->Api({services::BearerHeader(kKeyB)});
  // A long stream of A, held open until cancelled (the decode worker sleeps 10 ms per step).
  v1::GenerateRequest long_req = Request("The cat sat on the mat and", 400);
  long_req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext long_ctx;
  long_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto long_reader = tenant_a->Generate(&long_ctx, long_req);
  v1::GenerateResponse first;
  ASSERT_TRUE(long_reader->Read(&first)) << cluster_->Logs();  // the stream is open now
  // A second stream of A is refused; B is not affected.
  Generated a2 = SecureCluster::Generate(tenant_a.get(), Request("One day", 2));
  EXPECT_EQ(a2.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << a2.status.error_message();
  EXPECT_THAT(a2.status.error_message(), HasSubstr("tenant-a"));
  Generated b = SecureCluster::Generate(tenant_b.get(), Request("One day", 2));
  EXPECT_TRUE(b.status.ok()) << b.status.error_message();
  long_ctx.TryCancel();
  v1::GenerateResponse ignored;
  while (long_reader->Read(&ignored)) {
  }
  EXPECT_EQ(long_reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Once the router saw the cancellation, A may open a stream again.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  grpc::Status again;
  do {
    again = SecureCluster::Generate(tenant_a.get(), Request("One day", 2)).status;
    if (again.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < deadline);
  EXPECT_TRUE(again.ok()) << again.error_message();
}

TEST_F(SecurityE2eTest, ClusterTrafficFlowsOverMutualTlsWithTheToken) {
  // The router's health checks and KV event streams reached both workers ...
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string m;
  do {
    m = cluster_->RouterMetrics();
    if (absl::StrContains(m, "pd_router_workers_healthy 2") &&
        absl::StrContains(m, "pd_router_kv_event_streams_connected 2")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < deadline);
  EXPECT_THAT(m, HasSubstr("pd_router_workers_healthy 2"));
  EXPECT_THAT(m, HasSubstr("pd_router_kv_event_streams_connected 2"));
  // ... and the decode worker had its prompts prefilled by the prefill worker.
  auto api = cluster_->Api({services::BearerHeader(kKeyA)});
  Generated g = SecureCluster::Generate(api.get(), Request("Lily and Ben went to the park.", 4));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_THAT(cluster_->DecodeMetrics(), HasSubstr("pd_worker_prefills_total{where=\"remote\"}"));
  EXPECT_THAT(cluster_->DecodeMetrics(),
              ::testing::Not(HasSubstr("pd_worker_prefills_total{where=\"fallback\"}")));
}

TEST_F(SecurityE2eTest, ARestartedWorkerRejoinsOverMutualTls) {
  // Channels that saw the worker go away reconnect with TLS and the token (runs last: it
  // changes the cluster; each case has its own cluster under ctest).
  cluster_->RestartWorker("decode");
  auto api = cluster_->Api({services::BearerHeader(kKeyA)});
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  Generated g;
  do {
    g = SecureCluster::Generate(api.get(), Request("One day, a little bird", 4));
    if (g.status.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << cluster_->Logs();
  EXPECT_EQ(g.tokens.size(), 4u);
  EXPECT_THAT(cluster_->DecodeMetrics(), HasSubstr("pd_worker_prefills_total{where=\"remote\"}"));
}

// An HTTPS client of the router's OpenAI API that checks the router's certificate.
std::unique_ptr<httplib::SSLClient> HttpsClient(const SecureCluster& cluster) {
  auto client = std::make_unique<httplib::SSLClient>("127.0.0.1", cluster.http_port());
  client->set_ca_cert_path(cluster.pki().ca_cert.c_str());
  client->enable_server_certificate_verification(true);
  client->set_keep_alive(true);
  client->set_read_timeout(60, 0);
  return client;
}

TEST_F(SecurityE2eTest, HttpApiIsHttpsWithKeysAndIdleTlsConnectionsCostNoCpu) {
  const std::string body =
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":4,)"
      R"("temperature":0,"ignore_eos":true)";
  const httplib::Headers key_a = {{"Authorization", absl::StrCat("Bearer ", kKeyA)}};
  // One keep-alive connection: a completion, a stream, a refused key, and /health again.
  std::unique_ptr<httplib::SSLClient> https = HttpsClient(*cluster_);
  httplib::Result done = https->Post("/v1/completions", key_a, body + "}", "application/json");
  ASSERT_TRUE(done) << httplib::to_string(done.error()) << cluster_->Logs();
  EXPECT_EQ(done->status, 200) << done->body;
  EXPECT_THAT(done->body, HasSubstr(R"("completion_tokens":4)"));
  httplib::Result streamed =
      https->Post("/v1/completions", key_a, body + R"(,"stream":true})", "application/json");
  ASSERT_TRUE(streamed) << httplib::to_string(streamed.error());
  EXPECT_EQ(streamed->status, 200);
  EXPECT_TRUE(absl::EndsWith(streamed->body, "data: [DONE]\n\n")) << streamed->body;
  httplib::Result refused =
      https->Post("/v1/completions", {{"Authorization", "Bearer e2e-key-of-tenant-c-0123456789"}},
                  body + "}", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401) << refused->body;
  httplib::Result health = https->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  // A plaintext request on the HTTPS port gets no HTTP answer.
  httplib::Client plain("127.0.0.1", cluster_->http_port());
  plain.set_connection_timeout(5);
  plain.set_read_timeout(5);
  httplib::Result in_clear = plain.Get("/health");
  EXPECT_FALSE(in_clear && in_clear->status == 200);

  // Connections idle after their handshake and a request sleep in the kernel (httplib's own
  // TLS wait woke each one every 11 ms).
  constexpr int kIdle = 100;
  std::vector<std::unique_ptr<httplib::SSLClient>> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(HttpsClient(*cluster_));
    httplib::Result r = idle.back()->Get("/health");
    ASSERT_TRUE(r) << i << ": " << httplib::to_string(r.error());
    ASSERT_EQ(r->status, 200);
  }
  const double before = e2e::Metric(cluster_->RouterMetrics(), "pd_process_cpu_seconds_total");
  absl::SleepFor(absl::Seconds(2));
  const std::string after = cluster_->RouterMetrics();
  const double cpu = e2e::Metric(after, "pd_process_cpu_seconds_total") - before;
  std::cout << "router CPU over 2 s with " << kIdle << " idle TLS connections: " << cpu << " s\n";
  EXPECT_LT(cpu, 0.2);
  EXPECT_GE(e2e::Metric(after, "pd_router_http_connections"), kIdle);
}

}  // namespace
}  // namespace pd
