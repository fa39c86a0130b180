// The TLS flag group of the pdserve binaries, defined once (names, defaults and help text) so
// that every binary spells it the same way, and the functions that turn it into the configs of
// services/base/grpc_security.h.
//
// Flags are defined only in main.cc files, tools and loadtest
// (docs/development.md, "Config and flags"): this small library is the part of those main.cc files
// they share. Link it (pd::services_base_tls_flags) only into binaries (pd-router, pd-worker,
// pd-tierd, pd-client, pd-loadtest) and their tests, never into a library, so that libraries still
// never read flags.
//
// Each group sits in its own object file of the static library: a binary registers the flags of
// the groups whose function it calls, and no others (pd-tierd and pd-client have no
// --client_tls_* flags).
//
//   --tls_cert, --tls_key, --tls_ca: this process's certificate, its key and the CA of its
//     peers' certificates. A server (pd-router's public API, pd-worker, pd-tierd): TLS on with
//     --tls_cert, callers must present a certificate signed by --tls_ca (mTLS). A client of the
//     public API (pd-client, pd-loadtest): TLS on with --tls_ca (the server's CA), --tls_cert
//     for a server requiring mTLS.
//   --client_tls_ca, --client_tls_cert, --client_tls_key: calls to workers (pd-router, and
//     pd-worker calling prefill workers).
//
// Thread-compatible: call the functions after absl parsed the flags (main's thread).
#pragma once

#include <string>

#include "absl/flags/declare.h"
#include "services/base/grpc_security.h"

ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, client_tls_ca);
ABSL_DECLARE_FLAG(std::string, client_tls_cert);
ABSL_DECLARE_FLAG(std::string, client_tls_key);

namespace pd::services {

// A server's TLS: --tls_cert, --tls_key, --tls_ca (client_ca_file).
TlsServerConfig ServerTlsFromFlags();

// A public-API client's TLS: --tls_ca (the server's CA), --tls_cert, --tls_key. Its errors name
// the flags with the prefix "--tls_".
TlsClientConfig ClientTlsFromFlags();

// TLS of calls to workers: --client_tls_ca, --client_tls_cert, --client_tls_key. Its errors
// name the flags with the prefix "--client_tls_".
TlsClientConfig WorkerClientTlsFromFlags();

}  // namespace pd::services
