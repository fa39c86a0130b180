// --client_tls_ca, --client_tls_cert, --client_tls_key: linked only by the binaries that call
// workers (pd-router, pd-worker), through WorkerClientTlsFromFlags (see tls_flags.h).
#include "absl/flags/flag.h"
#include "services/base/tls_flags.h"

ABSL_FLAG(std::string, client_tls_ca, "",
          "PEM CA of the workers' certificates: set = TLS on calls to workers");
ABSL_FLAG(std::string, client_tls_cert, "", "PEM client certificate for workers requiring mTLS");
ABSL_FLAG(std::string, client_tls_key, "", "PEM private key of --client_tls_cert");

namespace pd::services {

TlsClientConfig WorkerClientTlsFromFlags() {
  return {absl::GetFlag(FLAGS_client_tls_ca), absl::GetFlag(FLAGS_client_tls_cert),
          absl::GetFlag(FLAGS_client_tls_key)};
}

}  // namespace pd::services
