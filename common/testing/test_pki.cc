#include "common/testing/test_pki.h"

#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"

namespace pd::testing {
namespace {

constexpr char kOpenssl[] = "/usr/bin/openssl";

absl::Status Run(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), kOpenssl);
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(args, log);
  if (!p.ok()) {
    return p.status();
  }
  absl::StatusOr<ExitInfo> e = p->Wait(absl::Seconds(60));
  if (!e.ok()) {
    return e.status();
  }
  if (!e->Success()) {
    return absl::InternalError(
        absl::StrCat("openssl ", args[1], " failed (", e->ToString(), "): ", p->LogTail(10)));
  }
  return absl::OkStatus();
}

// A self-signed CA named `name`: <dir>/<name>.pem and <dir>/<name>.key.
absl::Status MakeCa(const std::string& dir, const std::string& name, const std::string& log) {
  return Run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
              "-days", "2", "-subj", absl::StrCat("/CN=pdserve test ", name), "-keyout",
              absl::StrCat(dir, "/", name, ".key"), "-out", absl::StrCat(dir, "/", name, ".pem")},
             log);
}

// A leaf certificate <dir>/<name>.pem (+ .key) signed by CA <ca>, with the extensions in
// <dir>/<name>.ext.
absl::Status MakeLeaf(const std::string& dir, const std::string& name, const std::string& ca,
                      const std::string& extensions, const std::string& log) {
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  {
    std::ofstream out(ext);
    out << extensions;
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", ext));
    }
  }
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  if (absl::Status s = Run({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-subj", absl::StrCat("/CN=pdserve test ", name), "-keyout",
                            absl::StrCat(dir, "/", name, ".key"), "-out", csr},
                           log);
      !s.ok()) {
    return s;
  }
  return Run({"x509", "-req", "-in", csr, "-CA", absl::StrCat(dir, "/", ca, ".pem"), "-CAkey",
              absl::StrCat(dir, "/", ca, ".key"), "-CAcreateserial", "-days", "2", "-extfile", ext,
              "-out", absl::StrCat(dir, "/", name, ".pem")},
             log);
}

}  // namespace

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  if (std::ifstream(kOpenssl).fail()) {
    return absl::NotFoundError("openssl is not installed (Debian package openssl)");
  }
  const std::string log = dir + "/openssl.log";
  const std::string server_ext =
      "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
      "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n";
  const std::string client_ext =
      "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n";
  for (absl::Status s : {MakeCa(dir, "ca", log), MakeCa(dir, "other-ca", log),
                         MakeLeaf(dir, "server", "ca", server_ext, log),
                         MakeLeaf(dir, "client", "ca", client_ext, log),
                         MakeLeaf(dir, "other-client", "other-ca", client_ext, log)}) {
    if (!s.ok()) {
      return s;
    }
  }
  TestPki pki;
  pki.ca_cert = dir + "/ca.pem";
  pki.server_cert = dir + "/server.pem";
  pki.server_key = dir + "/server.key";
  pki.client_cert = dir + "/client.pem";
  pki.client_key = dir + "/client.key";
  pki.other_ca_cert = dir + "/other-ca.pem";
  pki.other_client_cert = dir + "/other-client.pem";
  pki.other_client_key = dir + "/other-client.key";
  return pki;
}

}  // namespace pd::testing
