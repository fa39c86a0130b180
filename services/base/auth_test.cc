#include "services/base/auth.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::services {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKeyA[] = "key-of-tenant-a-0123456789";
constexpr char kKeyA2[] = "second-key-of-tenant-a-xyz";
constexpr char kKeyB[] = "key-of-tenant-b-0123456789";

TEST(Sha256Test, KnownVector) {
  const Sha256Digest d = Sha256("abc");
  EXPECT_EQ(d[0], 0xba);
  EXPECT_EQ(d[1], 0x78);
  EXPECT_EQ(d[31], 0xad);
}

TEST(DigestsEqualTest, EqualOnlyWhenEveryByteIs) {
  const Sha256Digest a = Sha256("one");
  Sha256Digest b = a;
  EXPECT_TRUE(DigestsEqual(a, b));
  for (size_t i : {size_t{0}, size_t{15}, size_t{31}}) {
    b = a;
    b[i] ^= 1;
    EXPECT_FALSE(DigestsEqual(a, b)) << i;
  }
}

TEST(ApiKeyStoreTest, ParsesTenantsKeysCommentsAndRotation) {
  absl::StatusOr<ApiKeyStore> s =
      ApiKeyStore::Parse(absl::StrCat("# keys\n\n  tenant-a:", kKeyA, "  \ntenant-a:", kKeyA2,
                                      "\nb.t_2:", kKeyB, "\n"),
                         "keys");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_keys(), 3u);
  EXPECT_EQ(s->num_tenants(), 2u);
  EXPECT_EQ(s->TenantOf(kKeyA), "tenant-a");
  EXPECT_EQ(s->TenantOf(kKeyA2), "tenant-a");
  EXPECT_EQ(s->TenantOf(kKeyB), "b.t_2");
  EXPECT_EQ(s->TenantOf(""), std::nullopt);
  EXPECT_EQ(s->TenantOf(std::string(kKeyA) + "x"), std::nullopt);
  EXPECT_EQ(s->TenantOf(std::string(kKeyA).substr(1)), std::nullopt);
}

TEST(ApiKeyStoreTest, KeyMayContainColons) {
  absl::StatusOr<ApiKeyStore> s = ApiKeyStore::Parse("t:abc:def:0123456789abcdef", "keys");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->TenantOf("abc:def:0123456789abcdef"), "t");
}

TEST(ApiKeyStoreTest, BadFilesNameTheLineButNeverTheKey) {
  struct Case {
    std::string text;
    std::string words;
  };
  const std::string secret = "secret-value-0123456789";
  for (const Case& c : std::vector<Case>{
           {"no-colon-" + secret, "keys:1: expected tenant:key"},
           {"\n:" + secret, "keys:2: tenant id"},
           {"bad tenant:" + secret, "keys:1: tenant id"},
           {"t:short", "keys:1: key of tenant 't' has 5 bytes"},
           {"t:" + secret + " tail", "whitespace"},
           {"a:" + secret + "\nb:" + secret, "keys:2: key of tenant 'b' is listed twice"},
           {"# only a comment\n", "no api key"},
       }) {
    absl::StatusOr<ApiKeyStore> s = ApiKeyStore::Parse(c.text, "keys");
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr(c.words));
    EXPECT_THAT(s.status().message(), Not(HasSubstr(secret)));
  }
}

TEST(ApiKeyStoreTest, ReadFile) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/keys";
  std::ofstream(path) << "t:" << kKeyA << "\n";
  absl::StatusOr<ApiKeyStore> s = ApiKeyStore::ReadFile(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->TenantOf(kKeyA), "t");
  absl::StatusOr<ApiKeyStore> missing = ApiKeyStore::ReadFile(path + ".nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--api_keys_file"));
}

TEST(ReadSecretFileTest, StripsTheNewlineAndChecksLength) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/token";
  std::ofstream(path) << "  cluster-token-0123456789\nsecond line ignored\n";
  absl::StatusOr<std::string> t = ReadSecretFile(path, "--cluster_token_file", 16);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "cluster-token-0123456789");
  std::ofstream(path) << "short\n";
  t = ReadSecretFile(path, "--cluster_token_file", 16);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("--cluster_token_file"));
  EXPECT_THAT(t.status().message(), Not(HasSubstr("short")));
  std::ofstream(path) << "has space inside the secret\n";
  EXPECT_EQ(ReadSecretFile(path, "--f", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile(path + ".nope", "--f", 1).status().code(), absl::StatusCode::kNotFound);
}

TEST(DeriveTenantCacheSaltTest, SeparatesTenantsAndKeepsATenantsOwnSalts) {
  const std::string a = DeriveTenantCacheSalt("tenant-a", std::nullopt);
  EXPECT_THAT(a, ::testing::StartsWith("tenant-v1:"));
  EXPECT_EQ(a.size(), 10u + 64u);
  // Deterministic: a tenant's repeat gets the same salt, hence the same block hashes.
  EXPECT_EQ(a, DeriveTenantCacheSalt("tenant-a", std::nullopt));
  // Another tenant never gets it, whatever client salt it sends.
  EXPECT_NE(a, DeriveTenantCacheSalt("tenant-b", std::nullopt));
  EXPECT_NE(a, DeriveTenantCacheSalt("tenant-b", std::string("")));
  EXPECT_NE(a, DeriveTenantCacheSalt("tenant-b", a));
  // No ambiguity between the fields or between "no salt" and "empty salt".
  EXPECT_NE(a, DeriveTenantCacheSalt("tenant-a", std::string("")));
  EXPECT_NE(DeriveTenantCacheSalt("ab", std::string("c")),
            DeriveTenantCacheSalt("a", std::string("bc")));
  // A tenant's client salt still partitions its own cache.
  EXPECT_NE(DeriveTenantCacheSalt("tenant-a", std::string("s1")),
            DeriveTenantCacheSalt("tenant-a", std::string("s2")));
  EXPECT_EQ(DeriveTenantCacheSalt("tenant-a", std::string("s1")),
            DeriveTenantCacheSalt("tenant-a", std::string("s1")));
}

TEST(ClusterTokenVerifierTest, DefaultIsDisabled) {
  EXPECT_FALSE(ClusterTokenVerifier().enabled());
  EXPECT_TRUE(ClusterTokenVerifier("x").enabled());
}

}  // namespace
}  // namespace pd::services
