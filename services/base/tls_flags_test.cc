#include "services/base/tls_flags.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

namespace pd::services {
namespace {

TEST(TlsFlagsTest, UnsetFlagsArePlaintext) {
  EXPECT_FALSE(ServerTlsFromFlags().enabled());
  EXPECT_FALSE(ClientTlsFromFlags().enabled());
  EXPECT_FALSE(WorkerClientTlsFromFlags().enabled());
}

TEST(TlsFlagsTest, EachGroupReadsItsFlags) {
  absl::SetFlag(&FLAGS_tls_cert, "cert.pem");
  absl::SetFlag(&FLAGS_tls_key, "key.pem");
  absl::SetFlag(&FLAGS_tls_ca, "ca.pem");
  absl::SetFlag(&FLAGS_client_tls_ca, "workers-ca.pem");
  absl::SetFlag(&FLAGS_client_tls_cert, "router.pem");
  absl::SetFlag(&FLAGS_client_tls_key, "router-key.pem");

  const TlsServerConfig server = ServerTlsFromFlags();
  EXPECT_EQ(server.cert_file, "cert.pem");
  EXPECT_EQ(server.key_file, "key.pem");
  EXPECT_EQ(server.client_ca_file, "ca.pem");

  const TlsClientConfig client = ClientTlsFromFlags();
  EXPECT_EQ(client.ca_file, "ca.pem");
  EXPECT_EQ(client.cert_file, "cert.pem");
  EXPECT_EQ(client.key_file, "key.pem");

  const TlsClientConfig workers = WorkerClientTlsFromFlags();
  EXPECT_EQ(workers.ca_file, "workers-ca.pem");
  EXPECT_EQ(workers.cert_file, "router.pem");
  EXPECT_EQ(workers.key_file, "router-key.pem");

  for (auto* flag : {&FLAGS_tls_cert, &FLAGS_tls_key, &FLAGS_tls_ca, &FLAGS_client_tls_ca,
                     &FLAGS_client_tls_cert, &FLAGS_client_tls_key}) {
    absl::SetFlag(flag, "");
  }
}

}  // namespace
}  // namespace pd::services
