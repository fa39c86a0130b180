#include "common/hash/block_hash.h"

#include <numeric>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

HashSeedInput StoriesInput(uint32_t block_size = 4, std::string salt = "") {
  HashSeedInput in;
  in.model_fingerprint = "stories260K";
  in.kv_dtype = "f32";
  in.block_size = block_size;
  in.cache_salt = std::move(salt);
  return in;
}

std::vector<uint32_t> Iota(size_t n, uint32_t first = 1) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Vectors computed independently (Python's xxhash.xxh3_128 over the encoding documented in
// block_hash.cc); they pin the wire format: a change here invalidates every stored block.
TEST(BlockHashTest, KnownVectors) {
  absl::StatusOr<BlockHash> seed = ComputeHashSeed(StoriesInput());
  ASSERT_TRUE(seed.ok()) << seed.status();
  EXPECT_EQ(seed->ToHex(), "50eb299d4e262a5c7419a950f4331681");
  std::vector<BlockHash> chain = ComputeBlockHashes(*seed, Iota(10), 4);
  ASSERT_EQ(chain.size(), 2u);  // 10 tokens = 2 full blocks of 4; the partial block is not hashed
  EXPECT_EQ(chain[0].ToHex(), "1981e926c5125e43fe5d02f3f4284ed5");
  EXPECT_EQ(chain[1].ToHex(), "aec15086409dfa359fb39992d4e6c7a1");
  EXPECT_EQ(ComputeHashSeed(StoriesInput(4, "tenant-a"))->ToHex(),
            "f47bdcf84fe764d598c89d2036d6ebc6");
}

TEST(BlockHashTest, Deterministic) {
  BlockHash seed = *ComputeHashSeed(StoriesInput(16));
  std::vector<uint32_t> tokens = Iota(100);
  EXPECT_EQ(ComputeBlockHashes(seed, tokens, 16), ComputeBlockHashes(seed, tokens, 16));
  EXPECT_EQ(ComputeBlockHashes(seed, tokens, 16).size(), 6u);
}

TEST(BlockHashTest, ChangeInAnEarlierTokenChangesEveryLaterHash) {
  BlockHash seed = *ComputeHashSeed(StoriesInput(4));
  std::vector<uint32_t> tokens = Iota(32);
  std::vector<BlockHash> base = ComputeBlockHashes(seed, tokens, 4);
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<uint32_t> changed = tokens;
    changed[pos] += 1000;
    std::vector<BlockHash> other = ComputeBlockHashes(seed, changed, 4);
    for (size_t b = 0; b < base.size(); ++b) {
      if (b < pos / 4) {
        EXPECT_EQ(base[b], other[b]) << "pos " << pos << " block " << b;
      } else {
        EXPECT_NE(base[b], other[b]) << "pos " << pos << " block " << b;
      }
    }
  }
}

TEST(BlockHashTest, SaltFingerprintDtypeAndBlockSizeIsolate) {
  std::vector<uint32_t> tokens = Iota(16);
  auto first_block = [&](HashSeedInput in) {
    return ComputeBlockHashes(*ComputeHashSeed(in), tokens, in.block_size)[0];
  };
  absl::flat_hash_set<BlockHash> seen;
  seen.insert(first_block(StoriesInput(4)));
  seen.insert(first_block(StoriesInput(4, "tenant-a")));
  seen.insert(first_block(StoriesInput(4, "tenant-b")));
  HashSeedInput other_model = StoriesInput(4);
  other_model.model_fingerprint = "other-model";
  seen.insert(first_block(other_model));
  HashSeedInput bf16 = StoriesInput(4);
  bf16.kv_dtype = "bf16";
  seen.insert(first_block(bf16));
  EXPECT_EQ(seen.size(), 5u);
  // Same tokens, different block size: block 0 of size 8 covers other tokens anyway, but the
  // seed itself must also differ.
  EXPECT_NE(*ComputeHashSeed(StoriesInput(4)), *ComputeHashSeed(StoriesInput(8)));
}

TEST(BlockHashTest, FieldBoundariesAreUnambiguous) {
  HashSeedInput a = StoriesInput();
  a.model_fingerprint = "ab";
  a.kv_dtype = "c";
  HashSeedInput b = StoriesInput();
  b.model_fingerprint = "a";
  b.kv_dtype = "bc";
  EXPECT_NE(*ComputeHashSeed(a), *ComputeHashSeed(b));
  BlockHash seed = *ComputeHashSeed(StoriesInput());
  std::vector<uint32_t> t = {1, 2, 3, 4};
  EXPECT_NE(HashBlock(seed, t, ""), HashBlock(seed, t, "x"));
}

TEST(BlockHashTest, ExtendMatchesFullComputation) {
  BlockHash seed = *ComputeHashSeed(StoriesInput(4));
  std::vector<uint32_t> tokens = Iota(23);
  std::vector<BlockHash> chain;
  for (size_t n = 0; n <= tokens.size(); ++n) {
    ExtendBlockHashes(seed, absl::MakeConstSpan(tokens).first(n), 4, &chain);
    EXPECT_EQ(chain.size(), n / 4);
  }
  EXPECT_EQ(chain, ComputeBlockHashes(seed, tokens, 4));
}

TEST(BlockHashTest, BytesAndHexRoundTrip) {
  BlockHash h{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(h.ToHex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(*BlockHash::FromBytes(h.ToBytes()), h);
  EXPECT_EQ(*BlockHash::FromHex(h.ToHex()), h);
  EXPECT_EQ(BlockHash::FromBytes("short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockHash::FromHex("zz23456789abcdeffedcba9876543210").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockHashTest, InvalidSeedInputNamesTheField) {
  HashSeedInput in = StoriesInput();
  in.model_fingerprint.clear();
  EXPECT_NE(ComputeHashSeed(in).status().message().find("model_fingerprint"), absl::string_view::npos);
  in = StoriesInput();
  in.block_size = 0;
  EXPECT_NE(ComputeHashSeed(in).status().message().find("block_size"), absl::string_view::npos);
}

}  // namespace
TEST(BlockHashBytesTest, ConcatAndSplitRoundTrip) {
  const std::vector<BlockHash> hashes = {BlockHash{1, 2}, BlockHash{3, 4}, BlockHash{~0ull, 0}};
  const std::string bytes = ConcatBlockHashes(hashes);
  ASSERT_EQ(bytes.size(), 48u);
  EXPECT_EQ(bytes.substr(16, 16), hashes[1].ToBytes());
  absl::StatusOr<std::vector<BlockHash>> back = SplitBlockHashes(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, hashes);
  EXPECT_TRUE(SplitBlockHashes("").ok());
  absl::StatusOr<std::vector<BlockHash>> bad = SplitBlockHashes(bytes.substr(0, 47));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("47 bytes"), std::string::npos) << bad.status();
}

}  // namespace pd
