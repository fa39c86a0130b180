#include "services/base/auth.h"

#include <grpcpp/server_context.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/log/log.h"

namespace pd::services {
namespace {

bool ValidTenant(absl::string_view t) {
  if (t.empty() || t.size() > ApiKeyStore::kMaxTenantBytes) {
    return false;
  }
  for (char c : t) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool HasSpace(absl::string_view s) {
  for (char c : s) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return true;
    }
  }
  return false;
}

// The value of the first `key` metadata entry, or nullopt.
std::optional<absl::string_view> Metadata(const grpc::ServerContextBase& context,
                                          absl::string_view key) {
  const auto& md = context.client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) {
    return std::nullopt;
  }
  return absl::string_view(it->second.data(), it->second.size());
}

void AppendLengthPrefixed(std::string* out, absl::string_view field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(field.data(), field.size());
}

}  // namespace

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d.data());
  return d;
}

bool DigestsEqual(const Sha256Digest& a, const Sha256Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> ReadSecretFile(absl::string_view path, absl::string_view flag,
                                           size_t min_bytes) {
  std::ifstream in{std::string(path)};
  if (!in) {
    return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  }
  std::string line;
  std::getline(in, line);
  const absl::string_view secret = absl::StripAsciiWhitespace(line);
  if (secret.size() < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": the secret in ", path, " has ",
                                                   secret.size(), " bytes; at least ", min_bytes,
                                                   " are required"));
  }
  if (HasSpace(secret)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the secret in ", path, " contains whitespace"));
  }
  return std::string(secret);
}

absl::StatusOr<ApiKeyStore> ApiKeyStore::Parse(absl::string_view text, absl::string_view source) {
  ApiKeyStore store;
  absl::flat_hash_set<std::string> seen;  // digests as bytes
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') {
      continue;
    }
    const size_t colon = line.find(':');
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", why));
    };
    if (colon == absl::string_view::npos) {
      return bad("expected tenant:key");
    }
    const absl::string_view tenant = line.substr(0, colon);
    const absl::string_view key = line.substr(colon + 1);
    if (!ValidTenant(tenant)) {
      return bad(
          absl::StrCat("tenant id must be 1..", kMaxTenantBytes, " bytes of [A-Za-z0-9._-]"));
    }
    if (key.size() < kMinKeyBytes || key.size() > kMaxKeyBytes) {
      return bad(absl::StrCat("key of tenant '", tenant, "' has ", key.size(), " bytes; keys are ",
                              kMinKeyBytes, "..", kMaxKeyBytes, " bytes"));
    }
    if (HasSpace(key)) {
      return bad(absl::StrCat("key of tenant '", tenant, "' contains whitespace"));
    }
    Entry e{Sha256(key), std::string(tenant)};
    if (!seen.insert(std::string(e.digest.begin(), e.digest.end())).second) {
      return bad(absl::StrCat("key of tenant '", tenant, "' is listed twice"));
    }
    store.keys_.push_back(std::move(e));
  }
  if (store.keys_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no api key"));
  }
  return store;
}

absl::StatusOr<ApiKeyStore> ApiKeyStore::ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--api_keys_file: cannot read ", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), absl::StrCat("--api_keys_file ", path));
}

std::optional<std::string> ApiKeyStore::TenantOf(absl::string_view key) const {
  const Sha256Digest d = Sha256(key);
  const Entry* found = nullptr;
  for (const Entry& e : keys_) {
    // No early exit: every stored digest is compared whatever matched before.
    if (DigestsEqual(d, e.digest)) {
      found = &e;
    }
  }
  if (found == nullptr) {
    return std::nullopt;
  }
  return found->tenant;
}

std::optional<absl::string_view> AuthorizationMetadata(const grpc::ServerContextBase& context) {
  return Metadata(context, kAuthorizationMetadata);
}

absl::StatusOr<std::string> ApiKeyStore::Authenticate(
    const grpc::ServerContextBase& context) const {
  return AuthenticateHeader(AuthorizationMetadata(context));
}

absl::StatusOr<std::string> ApiKeyStore::AuthenticateHeader(
    std::optional<absl::string_view> header) const {
  if (!header.has_value()) {
    return absl::UnauthenticatedError(
        "missing api key: send metadata \"authorization: Bearer <key>\"");
  }
  absl::string_view value = absl::StripLeadingAsciiWhitespace(*header);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("authorization metadata is not a Bearer token");
  }
  value = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  std::optional<std::string> tenant = TenantOf(value);
  if (!tenant.has_value()) {
    return absl::UnauthenticatedError("invalid api key");
  }
  return *std::move(tenant);
}

size_t ApiKeyStore::num_tenants() const {
  absl::flat_hash_set<absl::string_view> tenants;
  for (const Entry& e : keys_) tenants.insert(e.tenant);
  return tenants.size();
}

ClusterTokenVerifier::ClusterTokenVerifier(absl::string_view token)
    : enabled_(true), digest_(Sha256(token)) {}

absl::Status ClusterTokenVerifier::Check(const grpc::ServerContextBase& context,
                                         absl::string_view service) const {
  if (!enabled_) {
    return absl::OkStatus();
  }
  const std::optional<absl::string_view> token = Metadata(context, kClusterTokenMetadata);
  // A missing token is hashed too (as empty), so both failures take the same path.
  if (!DigestsEqual(Sha256(token.value_or("")), digest_) || !token.has_value()) {
    return absl::UnauthenticatedError(
        absl::StrCat(service, ": missing or invalid cluster token (x-pd-cluster-token)"));
  }
  return absl::OkStatus();
}

void WarnUnauthenticatedInternalRpcs(absl::string_view component, absl::string_view exposes) {
  LOG(WARNING) << component
               << ": internal RPCs are unauthenticated (no --cluster_token_file): " << exposes
               << ". Give every process the same --cluster_token_file (pd-local does unless "
                  "--insecure_internal); see docs/security.md";
}

std::string DeriveTenantCacheSalt(absl::string_view tenant,
                                  const std::optional<std::string>& client_salt) {
  std::string in = "pdserve/tenant-cache-salt/v1";
  AppendLengthPrefixed(&in, tenant);
  in.push_back(client_salt.has_value() ? '\1' : '\0');
  AppendLengthPrefixed(&in, client_salt.value_or(""));
  const Sha256Digest d = Sha256(in);
  return absl::StrCat("tenant-v1:", absl::BytesToHexString(absl::string_view(
                                        reinterpret_cast<const char*>(d.data()), d.size())));
}

}  // namespace pd::services
