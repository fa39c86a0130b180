// TLS for pdserve's gRPC servers and clients, and the metadata (API key, cluster token) that
// outgoing calls carry. docs/security.md has the flags and a production example.
//
//   PD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
//                       MakeServerCredentials(config.tls));        // insecure when unset
//   builder.AddListeningPort(address, creds, &port);
//
//   PD_ASSIGN_OR_RETURN(std::shared_ptr<const ClientSecurity> security,
//                       ClientSecurity::Create(config.client_tls, {ClusterTokenHeader(token)}));
//   std::shared_ptr<grpc::Channel> channel = security->CreateChannel(address, args);
//
// Files are read once, when the credentials are made (a restart picks up rotated files).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace pd::services {

// Server side. TLS is on when cert_file is set; mTLS (clients must present a certificate
// signed by client_ca_file) when client_ca_file is set too.
struct TlsServerConfig {
  std::string cert_file;       // PEM certificate chain of this server (--tls_cert)
  std::string key_file;        // PEM private key of cert_file (--tls_key)
  std::string client_ca_file;  // PEM CA bundle for client certificates (--tls_ca); "" = no mTLS

  bool enabled() const { return !cert_file.empty(); }
  // InvalidArgument naming the flags when key and cert are not both set, or a CA is given
  // without them. Files are checked by MakeServerCredentials.
  absl::Status Validate() const;
};

// Client side (outgoing calls). TLS is on when ca_file is set (server certificates are verified
// against it; their names must match the address dialled, e.g. IP SAN 127.0.0.1); cert_file and
// key_file are this process's client certificate for servers that require mTLS.
struct TlsClientConfig {
  std::string ca_file;    // PEM CA bundle that signed the servers' certificates
  std::string cert_file;  // PEM client certificate chain (mTLS); "" = none
  std::string key_file;   // its private key

  bool enabled() const { return !ca_file.empty(); }
  // InvalidArgument naming `flag_prefix` flags ("--client_tls_" -> "--client_tls_cert") when
  // cert and key are not both set or set without a CA.
  absl::Status Validate(absl::string_view flag_prefix) const;
};

// Insecure credentials when `config` is disabled; SSL credentials otherwise. Errors name the
// flag and file: NotFound when a file cannot be read, InvalidArgument when it holds no PEM
// certificate / key or the key does not belong to the certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerConfig& config);

// Same for a client; `flag_prefix` names the flags in errors.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientConfig& config, absl::string_view flag_prefix);

// A metadata entry every call of a channel carries.
using CallHeader = std::pair<std::string, std::string>;
CallHeader ClusterTokenHeader(absl::string_view token);  // x-pd-cluster-token: <token>
CallHeader BearerHeader(absl::string_view api_key);      // authorization: Bearer <key>

// How a process makes its outgoing channels: credentials plus headers added to every call (a
// client interceptor). Immutable; thread-safe; shared by the components of one process.
class ClientSecurity {
 public:
  // Errors: those of MakeChannelCredentials.
  static absl::StatusOr<std::shared_ptr<const ClientSecurity>> Create(
      const TlsClientConfig& tls, std::vector<CallHeader> headers,
      absl::string_view flag_prefix = "--client_tls_");
  // Plaintext, no headers (local development, tests).
  static std::shared_ptr<const ClientSecurity> Insecure();

  // A channel to `address` ("host:port") with these credentials and headers.
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                               const grpc::ChannelArguments& args) const;

  bool tls() const { return tls_; }

 private:
  ClientSecurity() = default;

  bool tls_ = false;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::shared_ptr<const std::vector<CallHeader>> headers_;
};

}  // namespace pd::services
