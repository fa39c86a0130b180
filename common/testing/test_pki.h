// TestPki: a throw-away certificate authority and certificates for TLS tests, made with the
// openssl command-line tool (Debian package openssl) in a directory the test owns. Nothing is
// committed: every run makes fresh keys. Test-only.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace pd::testing {

struct TestPki {
  std::string ca_cert;      // the cluster CA (PEM)
  std::string server_cert;  // signed by ca_cert; SAN IP:127.0.0.1 and DNS:localhost
  std::string server_key;
  std::string client_cert;  // signed by ca_cert; a client certificate for mTLS
  std::string client_key;
  std::string other_ca_cert;      // an unrelated CA
  std::string other_client_cert;  // signed by other_ca_cert (must be refused under mTLS)
  std::string other_client_key;
};

// Writes the files above under `dir` (which must exist) and returns their paths. Internal,
// with the openssl log tail, when a command fails; NotFound when openssl is not installed.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

}  // namespace pd::testing
