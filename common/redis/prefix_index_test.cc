// Hermetic: the prefix index's key names, tier values and node-name rules.
#include "common/redis/prefix_index.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::redis {
namespace {

BlockHash H(uint64_t n) { return BlockHash{0x0123456789abcdefULL, n}; }

TEST(PrefixIndexKeysTest, FormatsKeysWithLowerCaseHex) {
  const BlockHash hash{0xABCDEF0011223344ULL, 0x5566778899AABBCCULL};
  EXPECT_EQ(PrefixBlockKey("node-1", hash), "blk:node-1:abcdef00112233445566778899aabbcc");
  EXPECT_EQ(PrefixNodeBlocksKey("node-1"), "node:node-1:blocks");
  EXPECT_EQ(PrefixPeerKey("node-1"), "peer:node-1");
  EXPECT_EQ(kPrefixNodesKey, "nodes");
  RedisConfig config;
  config.key_prefix = "pd:c1:";
  EXPECT_EQ(config.Key(PrefixBlockKey("n", H(1))), "pd:c1:blk:n:0123456789abcdef0000000000000001");
}

TEST(PrefixIndexKeysTest, TierValuesRoundTrip) {
  for (PrefixTier tier : {PrefixTier::kDram, PrefixTier::kNvme}) {
    PrefixTier parsed = tier == PrefixTier::kDram ? PrefixTier::kNvme : PrefixTier::kDram;
    ASSERT_TRUE(ParsePrefixTier(PrefixTierValue(tier), &parsed));
    EXPECT_EQ(parsed, tier);
  }
  EXPECT_EQ(PrefixTierValue(PrefixTier::kDram), "dram");
  EXPECT_EQ(PrefixTierValue(PrefixTier::kNvme), "nvme");
  PrefixTier untouched = PrefixTier::kNvme;
  EXPECT_FALSE(ParsePrefixTier("DRAM", &untouched));
  EXPECT_FALSE(ParsePrefixTier("", &untouched));
  EXPECT_FALSE(ParsePrefixTier("hbm", &untouched));
  EXPECT_EQ(untouched, PrefixTier::kNvme);
}

TEST(PrefixIndexKeysTest, ValidatesNodeNames) {
  EXPECT_TRUE(ValidatePrefixNodeName("node-1.example").ok());
  EXPECT_TRUE(ValidatePrefixNodeName(std::string(255, 'n')).ok());
  for (const std::string& bad :
       {std::string(), std::string(256, 'n'), std::string("a:b"), std::string("a b"),
        std::string("a\nb"), std::string("a\0b", 3), std::string("a\x7f")}) {
    absl::Status s = ValidatePrefixNodeName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
  }
}

}  // namespace
}  // namespace pd::redis
