#include "engine/scheduler/window_policy.h"

#include <limits>
#include <memory>
#include <vector>

#include "common/log/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int64_t kBlockSize = 4;

WindowPolicy MakePolicy(int64_t sink_tokens, int64_t window_tokens) {
  absl::StatusOr<WindowPolicy> p = WindowPolicy::Create(sink_tokens, window_tokens, kBlockSize, 64);
  CHECK(p.ok()) << p.status();
  return *p;
}

// A KV cache of `num_blocks` blocks with sequence 1 holding `num_tokens` computed tokens.
std::unique_ptr<kvcache::KvCacheManager> CacheWithSequence(int64_t num_blocks, int64_t num_tokens) {
  absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> kv =
      kvcache::KvCacheManager::Create({num_blocks, kBlockSize});
  CHECK(kv.ok()) << kv.status();
  CHECK((*kv)->AllocatePrompt(kvcache::SequenceId(1), {}, num_tokens).ok());
  return *std::move(kv);
}

std::vector<BlockId> Blocks(const kvcache::KvCacheManager& kv) {
  absl::Span<const BlockId> b = kv.GetTable(kvcache::SequenceId(1))->blocks();
  return {b.begin(), b.end()};
}

// What the sink copier was asked to do.
struct Copy {
  std::vector<int32_t> originals, live;
  int64_t num_tokens = 0, shift = 0;
};

int32_t Id(BlockId b) { return static_cast<int32_t>(b.value()); }

TEST(WindowPolicyTest, RoundsUpToBlocksAndBoundsTheCache) {
  WindowPolicy p = MakePolicy(5, 9);  // 2 sink blocks, 3 window blocks
  EXPECT_TRUE(p.enabled());
  EXPECT_EQ(p.sink_blocks(), 2);
  EXPECT_EQ(p.window_blocks(), 3);
  EXPECT_EQ(p.CacheCapTokens(), (2 + 3 + 1) * kBlockSize);
  EXPECT_EQ(p.MaxBlocks(100), 2 + 3 + 1 + 2);  // plus the sink copies
  EXPECT_EQ(p.MaxBlocks(3), 3);
  EXPECT_FALSE(p.ContextBoundsLength(10));  // max_tokens bounds the length
  EXPECT_TRUE(p.ContextBoundsLength(0));    // 0 = the context, as without the policy
}

TEST(WindowPolicyTest, OffKeepsEverything) {
  for (const WindowPolicy& p : {WindowPolicy(), MakePolicy(0, 0)}) {
    EXPECT_FALSE(p.enabled());
    EXPECT_EQ(p.CacheCapTokens(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(p.MaxBlocks(100), 100);
    EXPECT_TRUE(p.ContextBoundsLength(10));
    EXPECT_TRUE(p.CheckPrefillOnly("r1", 1 << 20).ok());
  }
}

TEST(WindowPolicyTest, RejectsBadCounts) {
  EXPECT_TRUE(absl::IsInvalidArgument(WindowPolicy::ValidateTokens(-1, 16)));
  EXPECT_TRUE(absl::IsInvalidArgument(WindowPolicy::ValidateTokens(0, -16)));
  absl::Status sinks_alone = WindowPolicy::ValidateTokens(16, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(sinks_alone));
  EXPECT_THAT(sinks_alone.message(), HasSubstr("sinks need a window"));
  EXPECT_TRUE(WindowPolicy::ValidateTokens(0, 16).ok());

  absl::StatusOr<WindowPolicy> too_big = WindowPolicy::Create(16, 48, 16, 64);
  EXPECT_TRUE(absl::IsInvalidArgument(too_big.status()));
  EXPECT_THAT(too_big.status().message(),
              HasSubstr("(80 tokens) exceeds the model's context of 64"));
  EXPECT_TRUE(WindowPolicy::Create(16, 32, 16, 64).ok());  // exactly the context
  EXPECT_TRUE(absl::IsInvalidArgument(WindowPolicy::Create(0, 16, 0, 64).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(WindowPolicy::Create(16, 0, 16, 64).status()));
}

TEST(WindowPolicyTest, PrefillOnlyPromptMustFitWithoutADrop) {
  WindowPolicy p = MakePolicy(4, 8);  // cap (1 + 2 + 1) * 4 = 16 tokens
  EXPECT_TRUE(p.CheckPrefillOnly("r7", 16).ok());
  absl::Status s = p.CheckPrefillOnly("r7", 17);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("request r7: prefill-only prompt of 17 tokens"));
  EXPECT_THAT(s.message(), HasSubstr("sink + window cache of 16"));
}

// S = 1, W = 2: the table holds 4 full blocks; each slide drops the oldest block after the
// sink, forking the sink once (original set aside, live copy rebuilt at every drop).
TEST(WindowPolicyTest, SlideDropsTheOldestWindowBlockAndRebuildsTheSinks) {
  WindowPolicy p = MakePolicy(4, 8);
  std::unique_ptr<kvcache::KvCacheManager> kv = CacheWithSequence(16, 4 * kBlockSize);
  const std::vector<BlockId> before = Blocks(*kv);
  std::vector<Copy> copies;
  auto copier = [&](absl::Span<const int32_t> originals, absl::Span<const int32_t> live,
                    int64_t num_tokens, int64_t shift) {
    copies.push_back(
        {{originals.begin(), originals.end()}, {live.begin(), live.end()}, num_tokens, shift});
    return absl::OkStatus();
  };
  int64_t dropped = 0;
  ASSERT_TRUE(p.Slide(kv.get(), kvcache::SequenceId(1), &dropped, copier).ok());
  EXPECT_EQ(dropped, kBlockSize);
  EXPECT_EQ(p.num_dropped_blocks(), 1);
  const kvcache::BlockTable* table = kv->GetTable(kvcache::SequenceId(1));
  EXPECT_THAT(table->set_aside(), ElementsAre(before[0]));
  const std::vector<BlockId> after = Blocks(*kv);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_NE(after[0], before[0]);  // the live sink copy
  EXPECT_EQ(after[1], before[2]);  // block 1 (the oldest after the sink) is gone
  EXPECT_EQ(after[2], before[3]);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_THAT(copies[0].originals, ElementsAre(Id(before[0])));
  EXPECT_THAT(copies[0].live, ElementsAre(Id(after[0])));
  EXPECT_EQ(copies[0].num_tokens, kBlockSize);
  EXPECT_EQ(copies[0].shift, kBlockSize);

  // The next block fills; the second slide does not fork again and rotates by both drops.
  ASSERT_TRUE(kv->AppendTokens(kvcache::SequenceId(1), kBlockSize).ok());
  ASSERT_TRUE(p.Slide(kv.get(), kvcache::SequenceId(1), &dropped, copier).ok());
  EXPECT_EQ(dropped, 2 * kBlockSize);
  EXPECT_EQ(p.num_dropped_blocks(), 2);
  EXPECT_THAT(table->set_aside(), ElementsAre(before[0]));
  EXPECT_THAT(Blocks(*kv), ElementsAre(after[0], before[3], ::testing::_));
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_THAT(copies[1].originals, ElementsAre(Id(before[0])));
  EXPECT_THAT(copies[1].live, ElementsAre(Id(after[0])));
  EXPECT_EQ(copies[1].shift, 2 * kBlockSize);
}

TEST(WindowPolicyTest, WithoutSinksTheOldestBlockGoesAndNothingIsCopied) {
  WindowPolicy p = MakePolicy(0, 8);
  std::unique_ptr<kvcache::KvCacheManager> kv = CacheWithSequence(16, 3 * kBlockSize);
  const std::vector<BlockId> before = Blocks(*kv);
  int copies = 0;
  int64_t dropped = 0;
  ASSERT_TRUE(p.Slide(kv.get(), kvcache::SequenceId(1), &dropped,
                      [&](absl::Span<const int32_t>, absl::Span<const int32_t>, int64_t, int64_t) {
                        ++copies;
                        return absl::OkStatus();
                      })
                  .ok());
  EXPECT_EQ(copies, 0);
  EXPECT_EQ(dropped, kBlockSize);
  EXPECT_TRUE(kv->GetTable(kvcache::SequenceId(1))->set_aside().empty());
  EXPECT_THAT(Blocks(*kv), ElementsAreArray({before[1], before[2]}));
}

TEST(WindowPolicyTest, SinkCopiesThatDoNotFitChangeNothing) {
  WindowPolicy p = MakePolicy(4, 8);
  std::unique_ptr<kvcache::KvCacheManager> kv = CacheWithSequence(4, 4 * kBlockSize);  // full
  const std::vector<BlockId> before = Blocks(*kv);
  int copies = 0;
  int64_t dropped = 0;
  absl::Status s =
      p.Slide(kv.get(), kvcache::SequenceId(1), &dropped,
              [&](absl::Span<const int32_t>, absl::Span<const int32_t>, int64_t, int64_t) {
                ++copies;
                return absl::OkStatus();
              });
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(Blocks(*kv), before);
  EXPECT_TRUE(kv->GetTable(kvcache::SequenceId(1))->set_aside().empty());
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(p.num_dropped_blocks(), 0);
  EXPECT_EQ(copies, 0);
}

TEST(WindowPolicyTest, AFailedSinkCopyIsInternal) {
  WindowPolicy p = MakePolicy(4, 8);
  std::unique_ptr<kvcache::KvCacheManager> kv = CacheWithSequence(16, 4 * kBlockSize);
  int64_t dropped = 0;
  absl::Status s = p.Slide(kv.get(), kvcache::SequenceId(1), &dropped,
                           [](absl::Span<const int32_t>, absl::Span<const int32_t>, int64_t,
                              int64_t) { return absl::UnavailableError("device lost"); });
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("rebuilding the sinks failed: device lost"));
  EXPECT_EQ(dropped, kBlockSize);  // the block is dropped; the scheduler fails the request
}

}  // namespace
}  // namespace pd::engine
