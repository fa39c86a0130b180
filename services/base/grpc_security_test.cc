// TLS, mTLS and call headers over real gRPC connections on 127.0.0.1, with certificates made at
// test time by the openssl CLI (common/testing/test_pki.h).
#include "services/base/grpc_security.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>

#include "common/log/log.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_pki.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pd/v1/generation.grpc.pb.h"
#include "services/base/auth.h"
#include "services/base/grpc_status.h"

namespace pd::services {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "cluster-token-for-tests-0123";
constexpr char kKey[] = "api-key-of-tenant-a-0123456789";

// ListModels answers with the caller's tenant as the model id, after the same checks the
// services make: the cluster token (when enabled), then the API key (when keys are set).
class EchoService final : public pdserve::v1::Generation::CallbackService {
 public:
  EchoService(ClusterTokenVerifier verifier, std::optional<ApiKeyStore> keys)
      : verifier_(std::move(verifier)), keys_(std::move(keys)) {}

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const pdserve::v1::ListModelsRequest* /*request*/,
                                       pdserve::v1::ListModelsResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::Status s = verifier_.Check(*context, "echo");
    std::string tenant = "anonymous";
    if (s.ok() && keys_.has_value()) {
      absl::StatusOr<std::string> t = keys_->Authenticate(*context);
      s = t.status();
      if (t.ok()) tenant = *t;
    }
    if (s.ok()) response->add_models()->set_id(tenant);
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }

 private:
  ClusterTokenVerifier verifier_;
  std::optional<ApiKeyStore> keys_;
};

class GrpcSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-tls-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
    absl::StatusOr<pd::testing::TestPki> pki = pd::testing::MakeTestPki(dir_->path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
  }

  // Starts a server on 127.0.0.1:0 with `tls`, the cluster token check and the API keys.
  void Serve(const TlsServerConfig& tls, ClusterTokenVerifier verifier = {},
             std::optional<ApiKeyStore> keys = std::nullopt) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = MakeServerCredentials(tls);
    ASSERT_TRUE(creds.ok()) << creds.status();
    service_ = std::make_unique<EchoService>(std::move(verifier), std::move(keys));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }

  // One ListModels call through a channel made by `security`.
  absl::StatusOr<std::string> Call(const std::shared_ptr<const ClientSecurity>& security) {
    std::shared_ptr<grpc::Channel> channel =
        security->CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::ChannelArguments());
    auto stub = pdserve::v1::Generation::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pdserve::v1::ListModelsResponse resp;
    grpc::Status s = stub->ListModels(&ctx, {}, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    return resp.models_size() == 1 ? resp.models(0).id() : "";
  }

  std::shared_ptr<const ClientSecurity> Client(const TlsClientConfig& tls,
                                               std::vector<CallHeader> headers = {}) {
    absl::StatusOr<std::shared_ptr<const ClientSecurity>> s =
        ClientSecurity::Create(tls, std::move(headers));
    CHECK(s.ok()) << s.status();
    return *s;
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::optional<pd::testing::TempDir> dir_;
  pd::testing::TestPki pki_;
  std::unique_ptr<EchoService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(GrpcSecurityTest, InsecureByDefault) {
  Serve(TlsServerConfig{});
  absl::StatusOr<std::string> r = Call(ClientSecurity::Insecure());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "anonymous");
  EXPECT_FALSE(ClientSecurity::Insecure()->tls());
}

TEST_F(GrpcSecurityTest, TlsServerRefusesPlaintextAndServesAVerifyingClient) {
  Serve({pki_.server_cert, pki_.server_key, ""});
  EXPECT_EQ(Call(ClientSecurity::Insecure()).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Call(Client({pki_.ca_cert, "", ""})).ok());
  // A client trusting another CA refuses the server.
  EXPECT_EQ(Call(Client({pki_.other_ca_cert, "", ""})).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(GrpcSecurityTest, MutualTlsNeedsAClientCertificateFromTheClusterCa) {
  Serve({pki_.server_cert, pki_.server_key, pki_.ca_cert});
  EXPECT_EQ(Call(Client({pki_.ca_cert, "", ""})).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(
      Call(Client({pki_.ca_cert, pki_.other_client_cert, pki_.other_client_key})).status().code(),
      absl::StatusCode::kUnavailable);
  absl::StatusOr<std::string> r = Call(Client({pki_.ca_cert, pki_.client_cert, pki_.client_key}));
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST_F(GrpcSecurityTest, ClusterTokenIsCheckedOverPlaintextAndTls) {
  for (bool tls : {false, true}) {
    SCOPED_TRACE(tls);
    Serve(tls ? TlsServerConfig{pki_.server_cert, pki_.server_key, ""} : TlsServerConfig{},
          ClusterTokenVerifier(kToken));
    const TlsClientConfig client = tls ? TlsClientConfig{pki_.ca_cert, "", ""} : TlsClientConfig{};
    absl::StatusOr<std::string> none = Call(Client(client));
    EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(none.status().message(), HasSubstr("cluster token"));
    EXPECT_EQ(
        Call(Client(client, {ClusterTokenHeader("cluster-token-for-tests-0124")})).status().code(),
        absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(Call(Client(client, {ClusterTokenHeader("")})).status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_TRUE(Call(Client(client, {ClusterTokenHeader(kToken)})).ok());
    server_->Shutdown();
    server_.reset();
  }
}

TEST_F(GrpcSecurityTest, ApiKeyFromBearerMetadataNamesTheTenant) {
  absl::StatusOr<ApiKeyStore> keys = ApiKeyStore::Parse(absl::StrCat("tenant-a:", kKey), "keys");
  ASSERT_TRUE(keys.ok());
  Serve(TlsServerConfig{}, ClusterTokenVerifier(), *keys);
  absl::StatusOr<std::string> r = Call(Client({}, {BearerHeader(kKey)}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "tenant-a");
  r = Call(Client({}, {{"authorization", absl::StrCat("bearer  ", kKey)}}));
  EXPECT_TRUE(r.ok()) << r.status();
  for (const std::vector<CallHeader>& h :
       std::vector<std::vector<CallHeader>>{{},
                                            {BearerHeader("wrong-key-0123456789abcdef")},
                                            {{"authorization", kKey}},
                                            {{"authorization", "Basic dTpw"}}}) {
    r = Call(Client({}, h));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("0123456789")));
  }
}

TEST_F(GrpcSecurityTest, BadTlsFilesAreStartupErrorsNamingTheFlag) {
  auto server_error = [](const TlsServerConfig& c) { return MakeServerCredentials(c).status(); };
  EXPECT_THAT(server_error({pki_.server_cert, "", ""}).message(), HasSubstr("--tls_key"));
  EXPECT_THAT(server_error({"", "", pki_.ca_cert}).message(), HasSubstr("--tls_ca"));
  absl::Status s = server_error({pki_.server_cert + ".nope", pki_.server_key, ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("--tls_cert"));
  s = server_error({pki_.server_cert, pki_.client_key, ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not belong"));
  s = server_error({pki_.server_key, pki_.server_key, ""});  // a key is no certificate
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = MakeChannelCredentials({"", pki_.client_cert, pki_.client_key}, "--client_tls_").status();
  EXPECT_THAT(s.message(), HasSubstr("--client_tls_ca"));
  s = MakeChannelCredentials({pki_.ca_cert, pki_.client_cert, pki_.server_key}, "--tls_").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tls_key"));
}

}  // namespace
}  // namespace pd::services
