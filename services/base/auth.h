// Call authentication shared by the pdserve services (docs/security.md):
//
//   - ApiKeyStore: the public API's keys ("tenant:key" lines of --api_keys_file), looked up from
//     the "authorization: Bearer <key>" metadata of a call, in constant time per stored key.
//   - ClusterTokenVerifier: the shared secret every internal RPC (worker, tierd, KV events)
//     carries as "x-pd-cluster-token" metadata (--cluster_token_file).
//   - DeriveTenantCacheSalt: the prefix-cache salt of an authenticated tenant, so one tenant's
//     block hashes can never equal another's.
//
// Secrets are never logged and never appear in a Status message: errors name the file and the
// line, not the value. Comparisons are between SHA-256 digests with CRYPTO_memcmp, so neither
// the content nor the length of a stored secret leaks through timing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace pd::services {

// Metadata keys (gRPC metadata keys are lower-case).
inline constexpr char kAuthorizationMetadata[] = "authorization";
inline constexpr char kClusterTokenMetadata[] = "x-pd-cluster-token";

// Shortest accepted cluster token (--cluster_token_file), e.g. `openssl rand -hex 32` gives 64.
inline constexpr size_t kMinClusterTokenBytes = 16;

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 of `data` (OpenSSL).
Sha256Digest Sha256(absl::string_view data);

// True when the two digests are equal; the time taken does not depend on where they differ.
bool DigestsEqual(const Sha256Digest& a, const Sha256Digest& b);

// The first line of the file at `path` without surrounding whitespace: how passwords and tokens
// are read (a trailing newline from `echo` is not part of the secret). Errors name `flag` and
// `path`, never the content: NotFound when unreadable, InvalidArgument when the secret is
// shorter than `min_bytes` or contains whitespace.
absl::StatusOr<std::string> ReadSecretFile(absl::string_view path, absl::string_view flag,
                                           size_t min_bytes);

// API keys of the public API. Immutable after Parse, so thread-safe.
//
// File format (--api_keys_file), one key per line:
//   # comment
//   tenant-a:k3y-of-at-least-16-bytes
//   tenant-a:second-key-for-rotation
//   tenant-b:another-key-of-16-bytes-or-more
// Tenant ids are 1..128 bytes of [A-Za-z0-9._-]; keys are 16..4096 bytes without whitespace;
// blank lines and lines starting with '#' are skipped; a tenant may have several keys (rotation)
// but a key belongs to one tenant only.
// The value of the first "authorization" metadata entry of a call, or nullopt.
std::optional<absl::string_view> AuthorizationMetadata(const grpc::ServerContextBase& context);

class ApiKeyStore {
 public:
  static constexpr size_t kMinKeyBytes = 16;
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxTenantBytes = 128;

  // InvalidArgument naming `source` and the line number (never the key) for a malformed line,
  // a bad tenant id, a short key or a key listed twice; InvalidArgument when there is no key.
  static absl::StatusOr<ApiKeyStore> Parse(absl::string_view text, absl::string_view source);
  // Reads and parses the file; NotFound when it cannot be read.
  static absl::StatusOr<ApiKeyStore> ReadFile(const std::string& path);

  // The tenant owning `key`, or nullopt. Hashes `key` once and compares the digest with every
  // stored digest (no early exit).
  std::optional<std::string> TenantOf(absl::string_view key) const;

  // The tenant of a call from its "authorization: Bearer <key>" metadata (the scheme is
  // case-insensitive). Unauthenticated, without echoing anything of the key, when the header
  // is missing, not a Bearer token, or the key is unknown.
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContextBase& context) const;
  // The same from the value of an "authorization" header (gRPC metadata or HTTP header, as a
  // front end received it); nullopt = no such header.
  absl::StatusOr<std::string> AuthenticateHeader(
      std::optional<absl::string_view> authorization) const;

  size_t num_keys() const { return keys_.size(); }
  size_t num_tenants() const;

 private:
  struct Entry {
    Sha256Digest digest;
    std::string tenant;
  };
  std::vector<Entry> keys_;
};

// Checks the cluster token on internal RPCs. A default-constructed verifier is disabled and
// accepts every call (local development). Copyable value; thread-safe.
class ClusterTokenVerifier {
 public:
  ClusterTokenVerifier() = default;
  // A verifier accepting calls that carry exactly `token` (non-empty).
  explicit ClusterTokenVerifier(absl::string_view token);

  bool enabled() const { return enabled_; }

  // OK when disabled or when the call's "x-pd-cluster-token" metadata equals the token;
  // Unauthenticated otherwise ("<service>: missing or invalid cluster token").
  absl::Status Check(const grpc::ServerContextBase& context, absl::string_view service) const;

 private:
  bool enabled_ = false;
  Sha256Digest digest_{};
};

// Logs, once at startup, the WARNING of a process running without --cluster_token_file: its
// internal RPCs are unauthenticated. `component` names the process ("pd-tierd"), `exposes` says
// what that allows (docs/security.md "Threat model").
void WarnUnauthenticatedInternalRpcs(absl::string_view component, absl::string_view exposes);

// The prefix-cache salt the router uses for a request of an authenticated `tenant`:
// "tenant-v1:" + hex(SHA-256(domain, tenant, client salt)), with every field length-prefixed
// and "salt absent" distinct from any salt value. Requests of different tenants get different
// salts whatever their client salts, so they never share (or can time) each other's cached
// blocks; requests of one tenant with the same client salt share them.
std::string DeriveTenantCacheSalt(absl::string_view tenant,
                                  const std::optional<std::string>& client_salt);

}  // namespace pd::services
