#include "loadtest/prompt_synth.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

constexpr VocabRange kVocab{3, 512};

std::vector<uint32_t> Block(std::vector<uint32_t> prompt, size_t j, size_t block_tokens) {
  const size_t end = std::min(prompt.size(), (j + 1) * block_tokens);
  return std::vector<uint32_t>(prompt.begin() + static_cast<long>(j * block_tokens),
                               prompt.begin() + static_cast<long>(end));
}

TEST(PromptSynthTest, EqualHashIdsGiveEqualBlocks) {
  // Two trace requests sharing blocks 0 and 7 at the same positions.
  const std::vector<uint32_t> a = SynthesizeTracePrompt({0, 7, 8}, 512 * 3, 512, kVocab);
  const std::vector<uint32_t> b = SynthesizeTracePrompt({0, 7, 9, 10}, 512 * 4, 512, kVocab);
  EXPECT_EQ(Block(a, 0, 512), Block(b, 0, 512));
  EXPECT_EQ(Block(a, 1, 512), Block(b, 1, 512));
  EXPECT_NE(Block(a, 2, 512), Block(b, 2, 512));
  // The whole shared prefix is identical token for token.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 1024, b.begin()));
}

TEST(PromptSynthTest, DifferentHashIdsGiveDifferentBlocks) {
  absl::flat_hash_set<std::vector<uint32_t>> blocks;
  for (uint64_t id = 0; id < 200; ++id) {
    std::vector<uint32_t> block;
    AppendBlock(BlockKey(KeyDomain::kTraceBlock, id), 512, kVocab, &block);
    EXPECT_TRUE(blocks.insert(block).second) << "hash id " << id << " repeats a block";
  }
  // Even 16-token blocks (the server's block size) differ pairwise here.
  absl::flat_hash_set<std::vector<uint32_t>> small;
  for (uint64_t id = 0; id < 200; ++id) {
    std::vector<uint32_t> block;
    AppendBlock(BlockKey(KeyDomain::kTraceBlock, id), 16, kVocab, &block);
    small.insert(block);
  }
  EXPECT_EQ(small.size(), 200u);
}

TEST(PromptSynthTest, LengthsAndPartialLastBlock) {
  const std::vector<uint32_t> p = SynthesizeTracePrompt({4, 5, 6}, 1100, 512, kVocab);
  ASSERT_EQ(p.size(), 1100u);
  // The partial last block equals the prefix of the full block with the same id.
  const std::vector<uint32_t> full = SynthesizeTracePrompt({4, 5, 6}, 1536, 512, kVocab);
  EXPECT_TRUE(std::equal(p.begin(), p.end(), full.begin()));
  EXPECT_EQ(SynthesizeTracePrompt({4}, 1, 512, kVocab).size(), 1u);
}

TEST(PromptSynthTest, TokensStayInTheVocabularyRange) {
  const VocabRange tiny{3, 7};
  std::vector<uint32_t> block;
  AppendBlock(BlockKey(KeyDomain::kUniquePrompt, 1, 2), 10'000, tiny, &block);
  absl::flat_hash_set<uint32_t> seen(block.begin(), block.end());
  for (uint32_t t : block) {
    ASSERT_GE(t, 3u);
    ASSERT_LT(t, 7u);
  }
  EXPECT_EQ(seen.size(), 4u);  // every id of the range is used
}

TEST(PromptSynthTest, DomainsDoNotCollide) {
  std::vector<uint32_t> a, b;
  AppendBlock(BlockKey(KeyDomain::kTraceBlock, 5), 64, kVocab, &a);
  AppendBlock(BlockKey(KeyDomain::kSharedPrefix, 5), 64, kVocab, &b);
  EXPECT_NE(a, b);
}

TEST(PromptSynthTest, VocabRangeValidation) {
  EXPECT_TRUE((VocabRange{0, 1}).Validate().ok());
  EXPECT_EQ((VocabRange{5, 5}).Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((VocabRange{6, 5}).Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::loadtest
