#include "services/base/grpc_security.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "services/base/auth.h"

namespace pd::services {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM data"));
  }
  return pem;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// Parses both PEMs and checks that the key belongs to the certificate, so a mismatch is a
// startup error naming the flags instead of a handshake failure at the first call.
absl::Status CheckCertAndKey(const std::string& cert_pem, const std::string& key_pem,
                             absl::string_view cert_flag, absl::string_view key_flag) {
  std::unique_ptr<BIO, BioDeleter> cb(
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  std::unique_ptr<X509, X509Deleter> cert(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(cert_flag, ": no PEM certificate"));
  }
  std::unique_ptr<BIO, BioDeleter> kb(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  std::unique_ptr<EVP_PKEY, PkeyDeleter> key(
      PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(key_flag, ": no unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, ": the key does not belong to the certificate of ", cert_flag));
  }
  return absl::OkStatus();
}

class HeaderInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit HeaderInterceptor(const std::vector<CallHeader>* headers) : headers_(headers) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* md = methods->GetSendInitialMetadata();
      for (const CallHeader& h : *headers_) {
        md->emplace(h.first, h.second);
      }
    }
    methods->Proceed();
  }

 private:
  const std::vector<CallHeader>* headers_;
};

class HeaderInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  // `headers` is shared with the ClientSecurity and every channel made from it.
  explicit HeaderInterceptorFactory(std::shared_ptr<const std::vector<CallHeader>> headers)
      : headers_(std::move(headers)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new HeaderInterceptor(headers_.get());  // gRPC owns interceptors
  }

 private:
  std::shared_ptr<const std::vector<CallHeader>> headers_;
};

}  // namespace

absl::Status TlsServerConfig::Validate() const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be set together");
  }
  if (!client_ca_file.empty() && cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca (client certificates) needs --tls_cert and --tls_key");
  }
  return absl::OkStatus();
}

absl::Status TlsClientConfig::Validate(absl::string_view flag_prefix) const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag_prefix, "cert and ", flag_prefix, "key must be set together"));
  }
  if (!cert_file.empty() && ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag_prefix, "cert needs ", flag_prefix, "ca (TLS is off without it)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (!config.enabled()) {
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadPem(config.cert_file, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(config.key_file, "--tls_key");
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckCertAndKey(*cert, *key, "--tls_cert", "--tls_key"); !s.ok()) {
    return s;
  }
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!config.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(config.client_ca_file, "--tls_ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientConfig& config, absl::string_view flag_prefix) {
  if (absl::Status s = config.Validate(flag_prefix); !s.ok()) return s;
  if (!config.enabled()) {
    return grpc::InsecureChannelCredentials();
  }
  const std::string ca_flag = absl::StrCat(flag_prefix, "ca");
  absl::StatusOr<std::string> ca = ReadPem(config.ca_file, ca_flag);
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  if (!config.cert_file.empty()) {
    const std::string cert_flag = absl::StrCat(flag_prefix, "cert");
    const std::string key_flag = absl::StrCat(flag_prefix, "key");
    absl::StatusOr<std::string> cert = ReadPem(config.cert_file, cert_flag);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(config.key_file, key_flag);
    if (!key.ok()) return key.status();
    if (absl::Status s = CheckCertAndKey(*cert, *key, cert_flag, key_flag); !s.ok()) return s;
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

CallHeader ClusterTokenHeader(absl::string_view token) {
  return {kClusterTokenMetadata, std::string(token)};
}

CallHeader BearerHeader(absl::string_view api_key) {
  return {kAuthorizationMetadata, absl::StrCat("Bearer ", api_key)};
}

absl::StatusOr<std::shared_ptr<const ClientSecurity>> ClientSecurity::Create(
    const TlsClientConfig& tls, std::vector<CallHeader> headers, absl::string_view flag_prefix) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(tls, flag_prefix);
  if (!creds.ok()) return creds.status();
  std::shared_ptr<ClientSecurity> s(new ClientSecurity());
  s->tls_ = tls.enabled();
  s->credentials_ = *std::move(creds);
  s->headers_ = std::make_shared<const std::vector<CallHeader>>(std::move(headers));
  return std::shared_ptr<const ClientSecurity>(std::move(s));
}

std::shared_ptr<const ClientSecurity> ClientSecurity::Insecure() {
  absl::StatusOr<std::shared_ptr<const ClientSecurity>> s = Create(TlsClientConfig{}, {});
  CHECK(s.ok()) << s.status();  // insecure credentials read no file
  return *std::move(s);
}

std::shared_ptr<grpc::Channel> ClientSecurity::CreateChannel(
    const std::string& address, const grpc::ChannelArguments& args) const {
  if (headers_->empty()) {
    return grpc::CreateCustomChannel(address, credentials_, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<HeaderInterceptorFactory>(headers_));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials_, args,
                                                                 std::move(creators));
}

}  // namespace pd::services
