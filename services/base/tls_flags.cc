// --tls_cert, --tls_key, --tls_ca: linked by every binary with TLS (see tls_flags.h).
#include "services/base/tls_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process: a server's (set = TLS, with --tls_key; empty = "
          "plaintext), or a client's for a server requiring mTLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA of the peers' certificates: on a server, set = callers need one (mTLS); on a "
          "client, set = TLS, the server's certificate is checked against it");

namespace pd::services {

TlsServerConfig ServerTlsFromFlags() {
  return {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
}

TlsClientConfig ClientTlsFromFlags() {
  return {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)};
}

}  // namespace pd::services
