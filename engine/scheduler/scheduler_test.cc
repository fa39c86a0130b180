#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/log/log.h"
#include "engine/grammar/constraint.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "engine/model/model_weights.h"
#include "engine/scheduler/scheduler_test_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

using scheduler_testing::Harness;
using scheduler_testing::kPrompts;
using scheduler_testing::MaxTokens;
using scheduler_testing::Result;

TEST(SchedulerTest, GreedyFromBosMatchesReadmeText) {
  Harness h(64, {});
  ASSERT_TRUE(h.Submit(1, {1}, MaxTokens(40)).ok());
  h.RunToCompletion();
  const Result& r = h.results()[1];
  EXPECT_EQ(r.last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.tokens.size(), 40u);
  EXPECT_EQ(r.last.completion_tokens, 40u);
  EXPECT_EQ(r.last.prompt_tokens, 1u);
  EXPECT_THAT(r.text, ::testing::StartsWith(
                          "Once upon a time, there was a little girl named Lily. She loved to "
                          "play outside in the park."));
}

// What a drained worker offers its tier: each running stream's full computed blocks, with the
// hashes of the chain of its prompt and the tokens generated so far, stream by stream.
TEST(SchedulerTest, ForEachRunningBlockGivesEachStreamsComputedBlocks) {
  Harness h(64, {});
  std::vector<uint32_t> a(40), b(23);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 5 + static_cast<uint32_t>(i * 7 % 300);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 9 + static_cast<uint32_t>(i * 11 % 300);
  SamplingOptions so = MaxTokens(100);
  so.ignore_eos = true;  // both still running after 20 steps
  ASSERT_TRUE(h.Submit(1, a, so).ok());
  ASSERT_TRUE(h.Submit(2, b, so).ok());
  for (int i = 0; i < 20; ++i) h.scheduler()->Step();
  std::vector<std::pair<BlockHash, BlockId>> got;
  h.scheduler()->ForEachRunningBlock(
      [&](const BlockHash& hash, BlockId block) { got.emplace_back(hash, block); });
  std::vector<BlockHash> want;
  for (const auto& [id, prompt] : {std::pair<uint64_t, std::vector<uint32_t>>{1, a}, {2, b}}) {
    std::vector<uint32_t> text = prompt;
    const std::vector<uint32_t>& gen = h.results()[id].tokens;
    ASSERT_FALSE(gen.empty());
    text.insert(text.end(), gen.begin(), gen.end());
    text.pop_back();  // the last sampled token's KV is computed by the next step
    const std::vector<BlockHash> chain = h.ChainOf(text);
    want.insert(want.end(), chain.begin(), chain.end());
  }
  ASSERT_EQ(got.size(), want.size());
  absl::flat_hash_set<uint32_t> blocks;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i]) << i;
    EXPECT_TRUE(blocks.insert(got[i].second.value()).second) << "block used twice: " << i;
  }
  EXPECT_EQ(got.size(), 5u);  // (40 + 19) / 16 + (23 + 19) / 16
}

// Batch composition, chunking and cache hits must not change a single token.
TEST(SchedulerTest, OutputsIdenticalAloneBatchedChunkedAndCached) {
  std::map<int, std::vector<uint32_t>> alone;
  for (int i = 0; i < 5; ++i) {
    Harness h(64, {});
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), MaxTokens(24)).ok());
    h.RunToCompletion();
    alone[i] = h.results()[i].tokens;
    ASSERT_EQ(alone[i].size(), 24u);
  }
  // All five at once, with a tiny token budget so prompts are chunked and batched with decodes.
  SchedulerConfig small;
  small.max_batch_tokens = 6;
  small.max_running = 5;
  Harness h(64, small);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), MaxTokens(24)).ok());
  }
  h.RunToCompletion();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h.results()[i].tokens, alone[i]) << "prompt " << i;
  }
  // A new prompt twice on the same scheduler: the second time its full blocks are cache hits.
  std::vector<uint32_t> long_prompt =
      h.Encode("Zebras in a green field sang loudly while the bright sun shone over the hills.");
  ASSERT_GE(long_prompt.size(), 17u);
  ASSERT_TRUE(h.Submit(10, long_prompt, MaxTokens(16)).ok());
  h.RunToCompletion();
  ASSERT_TRUE(h.Submit(11, long_prompt, MaxTokens(16)).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[10].last.cached_tokens, 0u);
  EXPECT_GE(h.results()[11].last.cached_tokens, 16u);
  EXPECT_EQ(h.results()[11].tokens, h.results()[10].tokens);
  // A different cache salt never hits.
  ASSERT_TRUE(h.Submit(12, long_prompt, MaxTokens(16), "tenant-b").ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[12].last.cached_tokens, 0u);
  EXPECT_EQ(h.results()[12].tokens, h.results()[10].tokens);
}

// A pool too small for all requests at once forces preemption by recompute.
TEST(SchedulerTest, PreemptedRequestsProduceUndisturbedOutput) {
  std::map<int, std::vector<uint32_t>> alone;
  for (int i = 0; i < 4; ++i) {
    Harness h(64, {});
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), MaxTokens(60)).ok());
    h.RunToCompletion();
    alone[i] = h.results()[i].tokens;
  }
  Harness h(12, {});  // 12 blocks of 16 = 192 token slots for four ~70-token sequences
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), MaxTokens(60)).ok());
  }
  h.RunToCompletion();
  EXPECT_GT(h.scheduler()->Stats().preemptions, 0);
  uint32_t preempted = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h.results()[i].tokens, alone[i]) << "prompt " << i;
    preempted += h.results()[i].last.num_preemptions;
  }
  EXPECT_GT(preempted, 0u);
}

// Issue #19 item 3: the blocks filled with a reply are committed to the prefix cache as they
// fill (not only the prompt's), so the next turn of a conversation (prompt + reply + more)
// hits every full block of the previous turn, reply included, with the output a cold
// scheduler gives.
TEST(SchedulerTest, NextTurnHitsThePreviousTurnsReply) {
  Harness h(64, {});
  const std::vector<uint32_t> turn1 = h.Encode(kPrompts[3]);
  ASSERT_TRUE(h.Submit(1, turn1, MaxTokens(45)).ok());
  h.RunToCompletion();
  const std::vector<uint32_t>& reply = h.results()[1].tokens;
  ASSERT_EQ(reply.size(), 45u);
  std::vector<uint32_t> turn2 = turn1;
  turn2.insert(turn2.end(), reply.begin(), reply.end());
  const std::vector<uint32_t> more = h.Encode(" Then the bird sang");
  turn2.insert(turn2.end(), more.begin() + 1, more.end());  // (without its BOS)
  ASSERT_TRUE(h.Submit(2, turn2, MaxTokens(20)).ok());
  h.RunToCompletion();
  // The last reply token was sampled but never fed back: its KV does not exist. Every full
  // block before it does.
  const size_t computed = turn1.size() + reply.size() - 1;
  EXPECT_EQ(h.results()[2].last.cached_tokens, computed / 16 * 16);
  EXPECT_GT(h.results()[2].last.cached_tokens, turn1.size());  // reply blocks hit too
  Harness cold(64, {});
  ASSERT_TRUE(cold.Submit(2, turn2, MaxTokens(20)).ok());
  cold.RunToCompletion();
  EXPECT_EQ(h.results()[2].tokens, cold.results()[2].tokens);
}

// ---- Sink + window KV policy (block size 16: 1 sink block, 4 window blocks, cap 6 blocks).

SamplingOptions Long(uint32_t n) {
  SamplingOptions s = MaxTokens(n);
  s.ignore_eos = true;  // stories260K ends its stories: keep going
  return s;
}

SchedulerConfig Windowed(int64_t sink, int64_t window, int64_t max_batch_tokens = 256) {
  SchedulerConfig c;
  c.kv_sink_tokens = sink;
  c.kv_window_tokens = window;
  c.max_batch_tokens = max_batch_tokens;
  c.max_running = std::min<int64_t>(c.max_running, max_batch_tokens);
  return c;
}

// Generates 4x the model's 512-token context with flat memory, and pins the blocks dropped:
// the table never exceeds S + W + 1 blocks, the dropped one is always the oldest after the
// sinks, the sinks' originals are held aside, and up to the first drop the output is the
// full cache's.
TEST(SchedulerWindowTest, FourTimesTheContextWithFlatMemoryDroppingTheOldestWindowBlock) {
  constexpr int64_t kSinks = 1, kWindow = 4, kCap = kSinks + kWindow + 1;
  const std::vector<uint32_t> prompt = {1};
  Harness full(64, {});
  ASSERT_TRUE(full.Submit(1, prompt, Long(500)).ok());
  full.RunToCompletion();

  Harness h(64, Windowed(16, 64));
  ASSERT_TRUE(h.Submit(1, prompt, Long(2048)).ok());
  std::vector<BlockId> last;
  size_t last_aside = 0;
  int64_t max_used = 0, drops = 0;
  kvcache::SequenceId seq;
  while (!h.scheduler()->idle()) {
    h.scheduler()->Step();
    const kvcache::BlockTable* table = nullptr;
    h.kv().ForEachSequence([&](kvcache::SequenceId id, const kvcache::BlockTable& t) {
      seq = id;
      table = &t;
    });
    max_used = std::max(max_used, h.kv().Stats().num_blocks_used);
    if (table == nullptr) {
      break;
    }
    ASSERT_LE(table->num_blocks(), kCap);
    std::vector<BlockId> now(table->blocks().begin(), table->blocks().end());
    if (!last.empty() && now.size() == last.size() && now.back() != last.back()) {
      // A block boundary at the cap: block kSinks dropped, one appended; the sinks are the
      // same live copies, or at the first drop fresh copies with the originals set aside.
      ++drops;
      ASSERT_EQ(table->set_aside().size(), static_cast<size_t>(kSinks));
      if (last_aside == 0) {
        ASSERT_TRUE(std::equal(table->set_aside().begin(), table->set_aside().end(), last.begin()));
        ASSERT_NE(now.front(), last.front());
      } else {
        ASSERT_TRUE(std::equal(now.begin(), now.begin() + kSinks, last.begin()));
      }
      ASSERT_TRUE(std::equal(now.begin() + kSinks, now.end() - 1, last.begin() + kSinks + 1));
    }
    last = std::move(now);
    last_aside = table->set_aside().size();
  }
  const Result& r = h.results()[1];
  ASSERT_EQ(r.tokens.size(), 2048u) << r.last.status;
  EXPECT_EQ(r.last.finish_reason, FinishReason::kLength);
  EXPECT_LE(max_used, kCap + kSinks);  // the table plus the sinks' originals
  // The 2048 + 1 tokens minus the last (sampled, never computed) occupy 128 text blocks; all
  // but kCap of them were dropped, each seen above.
  const int64_t expected_drops = 2048 / 16 - kCap;
  EXPECT_EQ(h.scheduler()->Stats().window_dropped_blocks, expected_drops);
  EXPECT_EQ(drops, expected_drops);
  // Identical to the full cache until the first drop: tokens at text positions < kCap * 16.
  const size_t same = kCap * 16 - prompt.size();
  ASSERT_GE(full.results()[1].tokens.size(), same);
  EXPECT_TRUE(
      std::equal(r.tokens.begin(), r.tokens.begin() + same, full.results()[1].tokens.begin()));
  // The text stays text after the drops (no NaN / garbage: tokens are real words).
  EXPECT_FALSE(r.text.empty());
}

// The output does not depend on batching, chunking, preemption or on whether the past came as
// a prompt (prefilled block by block with the drops between) or was generated.
TEST(SchedulerWindowTest, OutputIdenticalBatchedChunkedPreemptedAndAsAPrompt) {
  constexpr uint32_t kTokens = 200;
  std::map<int, std::vector<uint32_t>> alone;
  for (int i = 0; i < 3; ++i) {
    Harness h(64, Windowed(16, 32));
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    h.RunToCompletion();
    alone[i] = h.results()[i].tokens;
    ASSERT_EQ(alone[i].size(), kTokens);
    EXPECT_GT(h.scheduler()->Stats().window_dropped_blocks, 5);
  }
  {  // Batched with a tiny token budget.
    SchedulerConfig c = Windowed(16, 32, 5);
    c.max_running = 3;
    Harness h(64, c);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    }
    h.RunToCompletion();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.results()[i].tokens, alone[i]) << "batched " << i;
  }
  {  // 14 blocks for three sequences of up to 5 + 1: preemption, recompute by replay.
    Harness h(14, Windowed(16, 32));
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    }
    h.RunToCompletion();
    EXPECT_GT(h.scheduler()->Stats().preemptions, 0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.results()[i].tokens, alone[i]) << "preempted " << i;
  }
  for (int64_t budget : {256, 7}) {  // The first 150 generated tokens as the prompt.
    Harness h(64, Windowed(16, 32, budget));
    std::vector<uint32_t> prompt = h.Encode(kPrompts[0]);
    prompt.insert(prompt.end(), alone[0].begin(), alone[0].begin() + 150);
    ASSERT_TRUE(h.Submit(1, prompt, Long(kTokens - 150)).ok());
    h.RunToCompletion();
    EXPECT_EQ(h.results()[1].tokens, std::vector<uint32_t>(alone[0].begin() + 150, alone[0].end()))
        << "budget " << budget;
  }
}

// The policy on the CUDA path's staging (rope offsets, CopyBlocksShifted and decode graphs run
// from uploaded metadata): the same tokens as the direct CPU path, batched.
TEST(SchedulerWindowTest, StagedForwardGivesTheSameTokens) {
  constexpr uint32_t kTokens = 200;
  std::map<int, std::vector<uint32_t>> want;
  for (bool staged : {false, true}) {
    Harness h(64, Windowed(16, 32), Clock::Real(), staged);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    }
    h.RunToCompletion();
    EXPECT_GT(h.scheduler()->Stats().window_dropped_blocks, 10);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(h.results()[i].tokens.size(), kTokens) << h.results()[i].last.status;
      if (staged) {
        EXPECT_EQ(h.results()[i].tokens, want[i]) << "sequence " << i;
      } else {
        want[i] = h.results()[i].tokens;
      }
    }
  }
}

// Without sinks the policy is a plain sliding window of whole blocks.
TEST(SchedulerWindowTest, WindowWithoutSinks) {
  Harness h(64, Windowed(0, 32));
  ASSERT_TRUE(h.Submit(1, {1}, Long(600)).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[1].tokens.size(), 600u) << h.results()[1].last.status;
  EXPECT_EQ(h.scheduler()->Stats().window_dropped_blocks, (600 + 15) / 16 - 3);
}

// Blocks written before the first drop are shared through the prefix cache as usual; none
// after it. A prefill-only request that would need a drop is refused.
TEST(SchedulerWindowTest, PrefixCacheBeforeTheFirstDropOnly) {
  Harness h(64, Windowed(16, 32));
  std::vector<uint32_t> prompt =
      h.Encode("Zebras in a green field sang loudly while the bright sun shone over the hills.");
  ASSERT_GE(prompt.size(), 17u);
  ASSERT_TRUE(h.Submit(1, prompt, Long(150)).ok());
  h.RunToCompletion();
  const std::vector<uint32_t> first = h.results()[1].tokens;
  // Cap 4 blocks: text blocks 0..3 were committed before the first drop, nothing later.
  std::vector<uint32_t> all = prompt;
  all.insert(all.end(), first.begin(), first.end());
  const std::vector<BlockHash> chain = h.ChainOf(all);
  EXPECT_EQ(h.kv().Match(chain), 4);
  ASSERT_TRUE(h.Submit(2, prompt, Long(150)).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[2].last.cached_tokens, std::min<size_t>(4, (prompt.size() - 1) / 16) * 16);
  EXPECT_GT(h.results()[2].last.cached_tokens, 0u);
  EXPECT_EQ(h.results()[2].tokens, first);

  GenerationRequest base;
  base.on_prefilled = [](PrefilledBlocks) {};
  absl::Status s = h.SubmitRequest(3, std::vector<uint32_t>(65, 5), MaxTokens(1), "", base);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("sink + window"));
}

// ---- H2O and SnapKV (compress_policy.h; block size 16).

SchedulerConfig Compressed(const char* policy, int64_t budget, int64_t recent,
                           int64_t max_batch_tokens = 256) {
  SchedulerConfig c;
  c.kv_policy = policy;
  c.kv_budget_tokens = budget;
  c.kv_recent_tokens = recent;
  c.max_batch_tokens = max_batch_tokens;
  c.max_running = std::min<int64_t>(c.max_running, max_batch_tokens);
  return c;
}

// H2O generates past the 512-token context holding at most its budget plus the block being
// filled (and, during a compaction, the fresh blocks); until the first compaction the output is
// the full cache's, and a budget the sequence never reaches changes nothing (scoring does not
// touch the logits).
TEST(SchedulerCompressTest, H2oHoldsItsBudgetAndMatchesTheFullCacheBeforeItsFirstCompaction) {
  const std::vector<uint32_t> prompt = {1};
  Harness full(64, {});
  ASSERT_TRUE(full.Submit(1, prompt, Long(400)).ok());
  full.RunToCompletion();

  Harness h(64, Compressed("h2o", 64, 16));
  ASSERT_TRUE(h.Submit(1, prompt, Long(700)).ok());
  int64_t max_table = 0;
  while (!h.scheduler()->idle()) {
    h.scheduler()->Step();
    h.kv().ForEachSequence([&](kvcache::SequenceId, const kvcache::BlockTable& t) {
      max_table = std::max(max_table, t.num_blocks());
    });
  }
  const Result& r = h.results()[1];
  ASSERT_EQ(r.tokens.size(), 700u) << r.last.status;
  EXPECT_EQ(max_table, 5);  // (64 + 16) / 16
  const SchedulerStats st = h.scheduler()->Stats();
  EXPECT_GE(st.kv_compactions, (700 - 80) / 16);
  EXPECT_EQ(st.kv_evicted_tokens, 16 * st.kv_compactions);
  const size_t same = 80 - prompt.size();
  EXPECT_TRUE(
      std::equal(r.tokens.begin(), r.tokens.begin() + same, full.results()[1].tokens.begin()));
  EXPECT_FALSE(r.text.empty());
  // Past it the evictions show: 64 of up to 400 tokens kept is not the full cache.
  EXPECT_NE(std::vector<uint32_t>(r.tokens.begin(), r.tokens.begin() + 399),
            std::vector<uint32_t>(full.results()[1].tokens.begin(),
                                  full.results()[1].tokens.begin() + 399));

  Harness roomy(64, Compressed("h2o", 448, 16));
  ASSERT_TRUE(roomy.Submit(1, prompt, Long(400)).ok());
  roomy.RunToCompletion();
  EXPECT_EQ(roomy.scheduler()->Stats().kv_compactions, 0);
  EXPECT_EQ(roomy.results()[1].tokens, full.results()[1].tokens);
}

// The eviction decisions, and so the output, do not depend on batching, chunking, preemption
// or on whether the past came as a prompt (prefilled up to the cap, then block by block with
// the compactions between) or was generated.
TEST(SchedulerCompressTest, H2oOutputIdenticalBatchedChunkedPreemptedAndAsAPrompt) {
  constexpr uint32_t kTokens = 200;
  std::map<int, std::vector<uint32_t>> alone;
  for (int i = 0; i < 3; ++i) {
    Harness h(64, Compressed("h2o", 48, 16));
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    h.RunToCompletion();
    alone[i] = h.results()[i].tokens;
    ASSERT_EQ(alone[i].size(), kTokens) << h.results()[i].last.status;
    EXPECT_GT(h.scheduler()->Stats().kv_compactions, 5);
  }
  {  // Batched with a tiny token budget.
    SchedulerConfig c = Compressed("h2o", 48, 16, 5);
    c.max_running = 3;
    Harness h(64, c);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    }
    h.RunToCompletion();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.results()[i].tokens, alone[i]) << "batched " << i;
  }
  {  // 12 blocks for three sequences of up to 4 + 3: preemption, recompute by replay.
    Harness h(12, Compressed("h2o", 48, 16));
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), Long(kTokens)).ok());
    }
    h.RunToCompletion();
    EXPECT_GT(h.scheduler()->Stats().preemptions, 0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.results()[i].tokens, alone[i]) << "preempted " << i;
  }
  for (int64_t budget : {256, 7}) {  // The first 150 generated tokens as the prompt.
    Harness h(64, Compressed("h2o", 48, 16, budget));
    std::vector<uint32_t> prompt = h.Encode(kPrompts[0]);
    prompt.insert(prompt.end(), alone[0].begin(), alone[0].begin() + 150);
    ASSERT_TRUE(h.Submit(1, prompt, Long(kTokens - 150)).ok());
    h.RunToCompletion();
    EXPECT_EQ(h.results()[1].tokens, std::vector<uint32_t>(alone[0].begin() + 150, alone[0].end()))
        << "budget " << budget;
  }
}

// SnapKV compresses a long prompt once, after its prefill, to the budget; then every generated
// token is kept. The same output batched and chunked, and after preemption; a prompt within the
// budget is not touched (the full cache's output).
TEST(SchedulerCompressTest, SnapKvCompressesALongPromptOnce) {
  std::vector<uint32_t> prompt;
  std::vector<uint32_t> full_tokens;
  {
    Harness full(64, {});
    prompt = full.Encode(kPrompts[1]);
    ASSERT_TRUE(full.Submit(1, prompt, Long(140)).ok());
    full.RunToCompletion();
    prompt.insert(prompt.end(), full.results()[1].tokens.begin(), full.results()[1].tokens.end());
    ASSERT_TRUE(full.Submit(2, prompt, Long(60)).ok());
    full.RunToCompletion();
    full_tokens = full.results()[2].tokens;
  }
  const auto p = static_cast<int64_t>(prompt.size());
  std::vector<uint32_t> want;
  {
    Harness h(64, Compressed("snapkv", 64, 16));
    ASSERT_TRUE(h.Submit(1, prompt, Long(60)).ok());
    h.RunToCompletion();
    want = h.results()[1].tokens;
    ASSERT_EQ(want.size(), 60u) << h.results()[1].last.status;
    EXPECT_EQ(h.scheduler()->Stats().kv_compactions, 1);
    EXPECT_EQ(h.scheduler()->Stats().kv_evicted_tokens, p - 64);
    EXPECT_EQ(h.results()[1].last.cached_tokens, 0u);
  }
  {  // Chunked and batched with another request, and then preempted in a small pool.
    SchedulerConfig c = Compressed("snapkv", 64, 16, 7);
    c.max_running = 2;
    Harness h(64, c);
    ASSERT_TRUE(h.Submit(1, prompt, Long(60)).ok());
    ASSERT_TRUE(h.Submit(2, h.Encode(kPrompts[2]), Long(60)).ok());
    h.RunToCompletion();
    EXPECT_EQ(h.results()[1].tokens, want);
  }
  {
    Harness h(16, Compressed("snapkv", 64, 16));
    ASSERT_TRUE(h.Submit(1, prompt, Long(60)).ok());
    ASSERT_TRUE(h.Submit(2, prompt, Long(60)).ok());
    h.RunToCompletion();
    EXPECT_GT(h.scheduler()->Stats().preemptions, 0);
    EXPECT_EQ(h.results()[1].tokens, want);
    EXPECT_EQ(h.results()[2].tokens, want);
  }
  {
    Harness h(64, Compressed("snapkv", 256, 16));
    ASSERT_TRUE(h.Submit(1, prompt, Long(60)).ok());
    h.RunToCompletion();
    EXPECT_EQ(h.scheduler()->Stats().kv_compactions, 0);
    EXPECT_EQ(h.results()[1].tokens, full_tokens);
  }
}

// The CUDA path's staging on the host: the scores in a device buffer (downloaded for each
// selection, uploaded after the move), AttentionMass reading the staged block tables,
// GatherKvRows's ids uploaded. The same kernels run, so the output is bitwise the host path's,
// batched and preempted.
TEST(SchedulerCompressTest, StagedForwardPassGivesTheHostPathsOutput) {
  struct Run {
    std::map<int, std::vector<uint32_t>> tokens;
    SchedulerStats stats;
  };
  auto run = [](const SchedulerConfig& config, int64_t blocks, bool staged) {
    Harness h(blocks, config, Clock::Real(), staged);
    for (int i = 0; i < 3; ++i) {
      std::vector<uint32_t> prompt = h.Encode(kPrompts[i]);
      for (int r = 0; r < 9; ++r) {  // past the budget: SnapKV compresses
        const std::vector<uint32_t> again = h.Encode(kPrompts[(i + r + 1) % 3]);
        prompt.insert(prompt.end(), again.begin() + 1, again.end());
      }
      EXPECT_TRUE(h.Submit(i, prompt, Long(120)).ok());
    }
    h.RunToCompletion();
    Run out;
    for (int i = 0; i < 3; ++i) {
      out.tokens[i] = h.results()[i].tokens;
      EXPECT_EQ(out.tokens[i].size(), 120u) << h.results()[i].last.status;
    }
    out.stats = h.scheduler()->Stats();
    return out;
  };
  for (const char* policy : {"h2o", "snapkv"}) {
    SchedulerConfig c = Compressed(policy, 48, 16, 7);
    c.max_running = 3;
    for (int64_t blocks : {64, 14}) {  // 14: preemptions, recomputed by replay
      const Run host = run(c, blocks, false);
      const Run staged = run(c, blocks, true);
      EXPECT_GT(staged.stats.kv_compactions, 0) << policy;
      EXPECT_EQ(staged.stats.kv_compactions, host.stats.kv_compactions) << policy;
      EXPECT_EQ(staged.stats.preemptions, host.stats.preemptions) << policy;
      if (blocks == 14) {
        EXPECT_GT(staged.stats.preemptions, 0) << policy;
        // A preempted sequence gave its score buffer back and took one again when readmitted:
        // zeroed, or the staged tokens would differ.
        EXPECT_GT(staged.stats.score_buffers_reused, 0) << policy;
      }
      EXPECT_GT(staged.stats.score_buffers_allocated, 0) << policy;
      EXPECT_EQ(host.stats.score_buffers_allocated + host.stats.score_buffers_reused, 0);
      EXPECT_EQ(staged.tokens, host.tokens) << policy << ", " << blocks << " blocks";
    }
  }
}

// A governed request publishes its full-prefix blocks until its first compaction (they hold
// the full prefix's KV) but never reuses cached blocks itself (their scores were never
// computed): the same request again computes everything and says the same.
TEST(SchedulerCompressTest, GovernedRequestsPublishTheirPrefixButNeverHitIt) {
  Harness h(64, Compressed("h2o", 48, 16));
  const std::vector<uint32_t> prompt =
      h.Encode("Zebras in a green field sang loudly while the bright sun shone over the hills.");
  ASSERT_TRUE(h.Submit(1, prompt, Long(150)).ok());
  h.RunToCompletion();
  const std::vector<uint32_t> first = h.results()[1].tokens;
  std::vector<uint32_t> all = prompt;
  all.insert(all.end(), first.begin(), first.end());
  EXPECT_EQ(h.kv().Match(h.ChainOf(all)), 4);  // the cap, 64 tokens, before the first compaction
  ASSERT_TRUE(h.Submit(2, prompt, Long(150)).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[2].last.cached_tokens, 0u);
  EXPECT_EQ(h.results()[2].tokens, first);
}

TEST(SchedulerCompressTest, ConfigIsValidated) {
  EXPECT_TRUE(Compressed("h2o", 64, 16).Validate().ok());
  EXPECT_TRUE(absl::IsInvalidArgument(Compressed("h3o", 64, 16).Validate()));
  EXPECT_TRUE(absl::IsInvalidArgument(Compressed("snapkv", 16, 16).Validate()));
  SchedulerConfig both = Compressed("h2o", 64, 16);
  both.kv_window_tokens = 32;
  EXPECT_THAT(both.Validate().message(), ::testing::HasSubstr("exclude each other"));
}

// Teacher forcing (scoring a text): forced tokens are emitted as given, with the logprobs a
// sampled run computes for the same tokens; sampling resumes after them.
TEST(SchedulerTest, ForcedTokensAreScoredLikeSampledOnes) {
  Harness h(64, {});
  const std::vector<uint32_t> prompt = h.Encode(kPrompts[2]);
  SamplingOptions greedy = MaxTokens(20);
  greedy.logprobs = 3;
  ASSERT_TRUE(h.Submit(1, prompt, greedy).ok());
  h.RunToCompletion();
  const Result greedy_run = h.results()[1];
  ASSERT_EQ(greedy_run.tokens.size(), 20u);

  SamplingOptions forced = greedy;
  forced.forced_tokens.assign(greedy_run.tokens.begin(), greedy_run.tokens.begin() + 10);
  ASSERT_TRUE(h.Submit(2, prompt, forced).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[2].tokens, greedy_run.tokens);
  ASSERT_EQ(h.results()[2].logprobs.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(h.results()[2].logprobs[i].logprob, greedy_run.logprobs[i].logprob) << i;
  }

  forced.forced_tokens = {5, 6, 7};
  forced.max_tokens = 3;
  ASSERT_TRUE(h.Submit(3, prompt, forced).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[3].tokens, (std::vector<uint32_t>{5, 6, 7}));
  EXPECT_LT(h.results()[3].logprobs[0].logprob, greedy_run.logprobs[0].logprob);

  forced.forced_tokens = {512};
  EXPECT_TRUE(absl::IsInvalidArgument(h.Submit(4, prompt, forced)));
}

TEST(SchedulerWindowTest, ConfigIsValidated) {
  SchedulerConfig c = Windowed(16, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(c.Validate()));
  c = Windowed(-1, 16);
  EXPECT_TRUE(absl::IsInvalidArgument(c.Validate()));
  EXPECT_TRUE(Windowed(0, 16).Validate().ok());
}

TEST(SchedulerTest, StopConditions) {
  Harness h(64, {});
  // Baseline to pick stop tokens and strings from.
  ASSERT_TRUE(h.Submit(1, {1}, MaxTokens(30)).ok());
  h.RunToCompletion();
  const Result base = h.results()[1];

  SamplingOptions stop_id = MaxTokens(30);
  stop_id.stop_token_ids = {base.tokens[5]};
  ASSERT_TRUE(h.Submit(2, {1}, stop_id).ok());
  SamplingOptions stop_str = MaxTokens(30);
  stop_str.stop = {"little girl"};
  ASSERT_TRUE(h.Submit(3, {1}, stop_str).ok());
  SamplingOptions min_tok = stop_id;
  min_tok.min_tokens = 10;
  ASSERT_TRUE(h.Submit(4, {1}, min_tok).ok());
  h.RunToCompletion();

  const Result& r2 = h.results()[2];
  EXPECT_EQ(r2.last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r2.tokens.size(), 6u);  // the stop token is reported
  const Result& r3 = h.results()[3];
  EXPECT_EQ(r3.last.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(r3.text, "Once upon a time, there was a ");
  const Result& r4 = h.results()[4];
  EXPECT_NE(r4.last.finish_reason, FinishReason::kStop);  // that id only appears at step 6
  EXPECT_EQ(r4.tokens, base.tokens);
}

TEST(SchedulerTest, SeededSamplingIsReproducibleAndBatchInvariant) {
  SamplingOptions s = MaxTokens(20);
  s.temperature = 0.9f;
  s.top_p = 0.9f;
  s.top_k = 40;
  s.seed = 1234;
  Harness a(64, {});
  ASSERT_TRUE(a.Submit(1, {1}, s).ok());
  a.RunToCompletion();
  Harness b(64, {});
  ASSERT_TRUE(b.Submit(7, b.Encode(kPrompts[2]), MaxTokens(20)).ok());
  ASSERT_TRUE(b.Submit(1, {1}, s).ok());
  b.RunToCompletion();
  EXPECT_EQ(a.results()[1].tokens, b.results()[1].tokens);
  SamplingOptions other = s;
  other.seed = 99;
  ASSERT_TRUE(b.Submit(2, {1}, other).ok());
  b.RunToCompletion();
  EXPECT_NE(b.results()[2].tokens, a.results()[1].tokens);
}

// Temperatures below 1e-5 decode greedily (pd-generate and every service go through here):
// subnormal ones used to give random tokens, their reciprocal overflowing to +inf (issue #39).
TEST(SchedulerTest, TemperatureBelowTheThresholdIsGreedy) {
  Harness h(64, {});
  ASSERT_TRUE(h.Submit(1, {1}, MaxTokens(24)).ok());
  int id = 2;
  for (float t : {1e-39f, 1e-45f, 9e-6f}) {
    SamplingOptions s = MaxTokens(24);
    s.temperature = t;
    s.seed = 5;
    ASSERT_TRUE(h.Submit(id++, {1}, s).ok());
  }
  h.RunToCompletion();
  ASSERT_EQ(h.results()[1].tokens.size(), 24u);
  for (int i = 2; i < id; ++i) {
    EXPECT_EQ(h.results()[i].tokens, h.results()[1].tokens) << "request " << i;
  }
}

TEST(SchedulerTest, CancelAndDeadline) {
  FakeClock clock;
  Harness h(64, {}, &clock);
  ASSERT_TRUE(h.Submit(1, {1}, MaxTokens(100)).ok());
  GenerationRequest timed;
  h.scheduler()->Step();
  h.scheduler()->Step();
  ASSERT_TRUE(h.scheduler()->Cancel(RequestId(1)).ok());
  h.RunToCompletion();
  EXPECT_EQ(h.results()[1].last.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(h.results()[1].last.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(h.scheduler()->Cancel(RequestId(1)).code(), absl::StatusCode::kNotFound);

  GenerationRequest r;
  r.id = RequestId(2);
  r.prompt = {1};
  r.sampling = MaxTokens(100);
  r.deadline = clock.Now() + absl::Seconds(1);
  Result* res = &h.results()[2];
  r.on_output = [res](GenerationOutput out) {
    if (out.finish_reason != FinishReason::kNone) res->last = std::move(out);
  };
  ASSERT_TRUE(h.scheduler()->Submit(std::move(r)).ok());
  h.scheduler()->Step();
  clock.Advance(absl::Seconds(2));
  h.RunToCompletion();
  EXPECT_EQ(res->last.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(h.scheduler()->Stats().kv.num_blocks_used, 0);  // everything released
}

TEST(SchedulerTest, SubmitRejectsBadRequests) {
  SchedulerConfig c;
  c.max_waiting = 1;
  Harness h(4, c);
  EXPECT_EQ(h.Submit(1, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Submit(1, {1, 600}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status too_long = h.Submit(1, std::vector<uint32_t>(100, 5));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.message(), HasSubstr("KV blocks"));
  EXPECT_EQ(h.Submit(1, std::vector<uint32_t>(600, 5)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(h.Submit(1, {1}).ok());
  EXPECT_EQ(h.Submit(1, {1}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(h.Submit(2, {1}).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pd::engine

namespace pd::engine {
namespace {

// The disaggregated handoff at the engine level: a prefill scheduler (P) computes a prompt and
// holds its blocks, the bytes are copied into the blocks a decode scheduler (D) reserved (what
// the transport does between processes), and D decodes. Output must equal the local run.
TEST(SchedulerDisaggTest, RemotePrefillGivesTheLocalOutput) {
  for (int i = 0; i < 5; ++i) {
    Harness local(64, {});
    ASSERT_TRUE(local.Submit(1, local.Encode(kPrompts[i]), MaxTokens(20)).ok());
    local.RunToCompletion();

    Harness p(64, {});
    Harness d(64, {});
    std::optional<RemotePrefillTarget> target;
    GenerationRequest dr;
    dr.remote_prefill = [&](RemotePrefillTarget t) { target = std::move(t); };
    ASSERT_TRUE(d.SubmitRequest(1, d.Encode(kPrompts[i]), MaxTokens(20), "", std::move(dr)).ok());
    EXPECT_FALSE(d.scheduler()->Step());  // admitted, waiting for the remote prefill
    ASSERT_TRUE(target.has_value());
    EXPECT_EQ(d.scheduler()->Stats().remote_prefills, 1);
    EXPECT_FALSE(d.scheduler()->idle());

    std::optional<PrefilledBlocks> prefilled;
    GenerationRequest pr;
    pr.on_prefilled = [&](PrefilledBlocks b) { prefilled = std::move(b); };
    ASSERT_TRUE(p.SubmitRequest(7, p.Encode(kPrompts[i]), MaxTokens(20), "", std::move(pr)).ok());
    while (!prefilled.has_value()) {
      ASSERT_TRUE(p.scheduler()->Step());
    }
    EXPECT_EQ(p.scheduler()->Stats().held, 1);
    EXPECT_TRUE(p.results().empty());  // a prefill-only request emits no output
    ASSERT_EQ(static_cast<int64_t>(prefilled->block_ids.size()),
              target->first_block + static_cast<int64_t>(target->block_ids.size()));
    for (size_t b = 0; b < target->block_ids.size(); ++b) {
      std::memcpy(d.pool()->BlockData(target->block_ids[b]),
                  p.pool()->BlockData(prefilled->block_ids[target->first_block + b]),
                  d.pool()->block_bytes());
    }
    ASSERT_TRUE(p.scheduler()->ReleasePrefilled(RequestId(7)).ok());
    EXPECT_TRUE(p.scheduler()->idle());
    EXPECT_EQ(p.scheduler()->ReleasePrefilled(RequestId(7)).code(), absl::StatusCode::kNotFound);

    ASSERT_TRUE(d.scheduler()->CompleteRemotePrefill(RequestId(1), prefilled->first_token).ok());
    d.RunToCompletion();
    EXPECT_EQ(d.results()[1].tokens, local.results()[1].tokens) << kPrompts[i];
    EXPECT_EQ(d.results()[1].text, local.results()[1].text);
    EXPECT_TRUE(d.results()[1].last.prefilled_remotely);
    EXPECT_EQ(d.scheduler()->Stats().prefill_tokens, 0);  // D computed no prompt token

    // The prompt's full blocks are now prefix-cache hits on D.
    ASSERT_TRUE(d.Submit(2, d.Encode(kPrompts[i]), MaxTokens(20)).ok());
    d.RunToCompletion();
    EXPECT_EQ(d.results()[2].tokens, local.results()[1].tokens);
  }
}

TEST(SchedulerDisaggTest, FailedRemotePrefillPrefillsLocally) {
  Harness local(64, {});
  const std::vector<uint32_t> prompt = local.Encode(kPrompts[1]);
  ASSERT_TRUE(local.Submit(1, prompt, MaxTokens(16)).ok());
  local.RunToCompletion();

  Harness d(64, {});
  std::optional<RemotePrefillTarget> target;
  GenerationRequest dr;
  dr.remote_prefill = [&](RemotePrefillTarget t) { target = std::move(t); };
  ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(16), "", std::move(dr)).ok());
  d.scheduler()->Step();
  ASSERT_TRUE(target.has_value());
  // Garbage where the remote write would have gone must not matter: local prefill rewrites.
  for (BlockId b : target->block_ids) {
    std::memset(d.pool()->BlockData(b), 0x7f, d.pool()->block_bytes());
  }
  ASSERT_TRUE(d.scheduler()->FailRemotePrefill(RequestId(1)).ok());
  EXPECT_EQ(d.scheduler()->FailRemotePrefill(RequestId(1)).code(), absl::StatusCode::kNotFound);
  d.RunToCompletion();
  EXPECT_EQ(d.results()[1].tokens, local.results()[1].tokens);
  EXPECT_FALSE(d.results()[1].last.prefilled_remotely);
  EXPECT_EQ(d.scheduler()->Stats().remote_prefill_failures, 1);
}

TEST(SchedulerDisaggTest, CancelWhileRemotePendingKeepsBlocksUntilResolved) {
  Harness d(64, {});
  std::optional<RemotePrefillTarget> target;
  GenerationRequest dr;
  dr.remote_prefill = [&](RemotePrefillTarget t) { target = std::move(t); };
  ASSERT_TRUE(d.SubmitRequest(1, d.Encode(kPrompts[2]), MaxTokens(16), "", std::move(dr)).ok());
  d.scheduler()->Step();
  ASSERT_TRUE(target.has_value());
  const int64_t used = d.scheduler()->Stats().kv.num_blocks_used;
  EXPECT_GT(used, 0);
  ASSERT_TRUE(d.scheduler()->Cancel(RequestId(1)).ok());
  d.scheduler()->Step();
  EXPECT_EQ(d.results()[1].last.finish_reason, FinishReason::kAbort);
  // The final output went out, but the blocks stay reserved: a late write may still land.
  EXPECT_EQ(d.scheduler()->Stats().kv.num_blocks_used, used);
  EXPECT_FALSE(d.scheduler()->idle());
  ASSERT_TRUE(d.scheduler()->CompleteRemotePrefill(RequestId(1), 5).ok());
  d.scheduler()->Step();
  EXPECT_TRUE(d.scheduler()->idle());
  EXPECT_EQ(d.scheduler()->Stats().kv.num_blocks_used, 0);
  // Uncommitted blocks never became cache hits.
  EXPECT_EQ(d.scheduler()->Stats().kv.num_blocks_cached, 0);
}

TEST(SchedulerDisaggTest, OutOfVocabFirstTokenFallsBackToLocal) {
  Harness local(64, {});
  const std::vector<uint32_t> prompt = local.Encode(kPrompts[3]);
  ASSERT_TRUE(local.Submit(1, prompt, MaxTokens(8)).ok());
  local.RunToCompletion();
  Harness d(64, {});
  GenerationRequest dr;
  bool started = false;
  dr.remote_prefill = [&](RemotePrefillTarget) { started = true; };
  ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(8), "", std::move(dr)).ok());
  d.scheduler()->Step();
  ASSERT_TRUE(started);
  EXPECT_EQ(d.scheduler()->CompleteRemotePrefill(RequestId(1), 1u << 30).code(),
            absl::StatusCode::kInvalidArgument);
  d.RunToCompletion();
  EXPECT_EQ(d.results()[1].tokens, local.results()[1].tokens);
}

// SnapKV on the prefill worker: P runs the decode worker's policy (prefill_kv_policy), computes
// the whole prompt, samples the first token, compresses, and hands off only the kept tokens'
// blocks, into the fewer blocks D reserved; D decodes on. The same output as D compressing the
// prompt itself; a wrong kept count, or a failed transfer, prefills locally in full.
TEST(SchedulerDisaggTest, SnapKvPromptCompressedByThePrefillWorkerGivesTheLocalOutput) {
  std::vector<uint32_t> prompt;
  {
    Harness full(64, {});
    prompt = full.Encode(kPrompts[1]);
    ASSERT_TRUE(full.Submit(1, prompt, Long(120)).ok());
    full.RunToCompletion();
    prompt.insert(prompt.end(), full.results()[1].tokens.begin(), full.results()[1].tokens.end());
  }
  const auto p_len = static_cast<int64_t>(prompt.size());
  ASSERT_GT(p_len, 64 + 16);
  Harness local(64, Compressed("snapkv", 64, 16));
  ASSERT_TRUE(local.Submit(1, prompt, Long(40)).ok());
  local.RunToCompletion();
  const std::vector<uint32_t> want = local.results()[1].tokens;
  ASSERT_EQ(want.size(), 40u) << local.results()[1].last.status;

  for (int outcome = 0; outcome < 3; ++outcome) {  // sent; refused (kept count); failed
    Harness p(64, {});
    Harness d(64, Compressed("snapkv", 64, 16));
    std::optional<RemotePrefillTarget> target;
    GenerationRequest dr;
    dr.remote_prefill = [&](RemotePrefillTarget t) { target = std::move(t); };
    ASSERT_TRUE(d.SubmitRequest(1, prompt, Long(40), "", std::move(dr)).ok());
    EXPECT_FALSE(d.scheduler()->Step());
    ASSERT_TRUE(target.has_value());
    EXPECT_EQ(target->kv_policy.policy, "snapkv");
    EXPECT_EQ(target->kv_policy.budget_tokens, 64);
    EXPECT_EQ(target->kv_policy.recent_tokens, 16);
    EXPECT_EQ(target->first_block, 0);
    EXPECT_TRUE(target->chain.empty());
    ASSERT_EQ(target->block_ids.size(), 4u);  // 64 kept tokens, not the prompt's blocks
    EXPECT_EQ(d.scheduler()->Stats().kv.num_blocks_used, 4);

    std::optional<PrefilledBlocks> prefilled;
    GenerationRequest pr;
    pr.on_prefilled = [&](PrefilledBlocks b) { prefilled = std::move(b); };
    pr.prefill_kv_policy = target->kv_policy;
    ASSERT_TRUE(p.SubmitRequest(7, prompt, Long(40), "", std::move(pr)).ok());
    while (!prefilled.has_value()) {
      ASSERT_TRUE(p.scheduler()->Step());
    }
    EXPECT_EQ(prefilled->kept_tokens, 64);
    ASSERT_EQ(prefilled->block_ids.size(), 4u);
    EXPECT_EQ(prefilled->first_token, want[0]);
    EXPECT_EQ(p.scheduler()->Stats().kv_compactions, 1);
    EXPECT_EQ(p.scheduler()->Stats().kv_evicted_tokens, p_len - 64);
    for (size_t b = 0; b < 4; ++b) {
      std::memcpy(d.pool()->BlockData(target->block_ids[b]),
                  p.pool()->BlockData(prefilled->block_ids[b]), d.pool()->block_bytes());
    }
    ASSERT_TRUE(p.scheduler()->ReleasePrefilled(RequestId(7)).ok());
    EXPECT_TRUE(p.scheduler()->idle());

    if (outcome == 0) {
      ASSERT_TRUE(d.scheduler()
                      ->CompleteRemotePrefill(RequestId(1), prefilled->first_token, std::nullopt,
                                              prefilled->kept_tokens)
                      .ok());
    } else if (outcome == 1) {
      EXPECT_EQ(d.scheduler()
                    ->CompleteRemotePrefill(RequestId(1), prefilled->first_token, std::nullopt,
                                            p_len)
                    .code(),
                absl::StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(d.scheduler()->FailRemotePrefill(RequestId(1)).ok());
    }
    d.RunToCompletion();
    EXPECT_EQ(d.results()[1].tokens, want) << "outcome " << outcome;
    EXPECT_EQ(d.results()[1].last.prefilled_remotely, outcome == 0);
    // D computed no prompt token when P's blocks were used; all of them after a fallback.
    EXPECT_EQ(d.scheduler()->Stats().prefill_tokens, outcome == 0 ? 0 : p_len) << outcome;
    EXPECT_EQ(d.scheduler()->Stats().kv_compactions, outcome == 0 ? 0 : 1);
    // Nothing compressed is shared; a local prefill publishes the full prefix it computed
    // before compacting (as SchedulerCompressTest.GovernedRequestsPublishTheirPrefix...).
    EXPECT_EQ(d.scheduler()->Stats().kv.num_blocks_cached, outcome == 0 ? 0 : p_len / 16);
  }
}

// A prefill-only request runs only SnapKV, with valid budgets, on a CPU per-head cache; a
// normal request cannot name a prefill policy.
TEST(SchedulerDisaggTest, PrefillKvPolicyIsChecked) {
  Harness p(64, {});
  auto submit = [&](uint64_t id, KvPolicySpec spec, bool prefill_only) {
    GenerationRequest r;
    if (prefill_only) r.on_prefilled = [](PrefilledBlocks) {};
    r.prefill_kv_policy = std::move(spec);
    return p.SubmitRequest(id, {1, 2, 3}, MaxTokens(4), "", std::move(r));
  };
  EXPECT_THAT(submit(1, {"h2o", 64, 16}, true).message(),
              ::testing::HasSubstr("only snapkv compresses on the prefill worker"));
  EXPECT_THAT(submit(2, {"snapkv", 64, 64}, true).message(), ::testing::HasSubstr("recent"));
  EXPECT_THAT(submit(3, {"snapkv", 4096, 16}, true).message(),
              ::testing::HasSubstr("exceeds the model's context"));
  EXPECT_THAT(submit(4, {"snapkv", 64, 16}, false).message(),
              ::testing::HasSubstr("for prefill-only requests"));
  EXPECT_TRUE(submit(5, {"snapkv", 64, 16}, true).ok());
  EXPECT_TRUE(submit(6, {}, true).ok());
}

TEST(SchedulerDisaggTest, HooksAreExclusive) {
  Harness d(64, {});
  GenerationRequest r;
  r.remote_prefill = [](RemotePrefillTarget) {};
  r.on_prefilled = [](PrefilledBlocks) {};
  EXPECT_EQ(d.SubmitRequest(1, {1, 2}, MaxTokens(4), "", std::move(r)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::engine

namespace pd::engine {
namespace {

constexpr char kLongPrompt[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
    "with her friends and her big brown dog";

// The KV bytes of every full block of `prompt`, computed by a prefill-only request.
std::vector<std::vector<uint8_t>> ComputeBlockBytes(const std::vector<uint32_t>& prompt) {
  Harness src(64, {});
  std::optional<PrefilledBlocks> prefilled;
  GenerationRequest pr;
  pr.on_prefilled = [&](PrefilledBlocks b) { prefilled = std::move(b); };
  CHECK(src.SubmitRequest(9, prompt, MaxTokens(1), "", std::move(pr)).ok());
  while (!prefilled.has_value() && src.scheduler()->Step()) {
  }
  CHECK(prefilled.has_value());
  std::vector<std::vector<uint8_t>> out;
  for (size_t b = 0; b < prompt.size() / 16; ++b) {
    const uint8_t* data = src.pool()->BlockData(prefilled->block_ids[b]);
    out.emplace_back(data, data + src.pool()->block_bytes());
  }
  return out;
}

// A tier prefix serving blocks [first, first + n) of `chain` from `bytes`; copy number
// `fail_at` (0-based, -1 = never) reports a failed check.
TierPrefix MakeTierPrefix(Harness* h, const std::vector<BlockHash>& chain,
                          const std::vector<std::vector<uint8_t>>* bytes, int64_t first, int64_t n,
                          int fail_at, int* copies, bool* released) {
  TierPrefix tp;
  tp.first_block = first;
  tp.chain.assign(chain.begin() + first, chain.begin() + first + n);
  tp.copy_in = [h, bytes, fail_at, copies](int64_t index, BlockId dst) {
    if ((*copies)++ == fail_at) {
      return false;
    }
    const std::vector<uint8_t>& src = (*bytes)[static_cast<size_t>(index)];
    std::memcpy(h->pool()->BlockData(dst), src.data(), src.size());
    return true;
  };
  tp.release = [released] { *released = true; };
  return tp;
}

TEST(SchedulerTierTest, RestoredBlocksGiveTheComputedOutput) {
  Harness local(64, {});
  const std::vector<uint32_t> prompt = local.Encode(kLongPrompt);
  const int64_t full = static_cast<int64_t>(prompt.size()) / 16;
  ASSERT_GE(full, 2);
  ASSERT_TRUE(local.Submit(1, prompt, MaxTokens(24)).ok());
  local.RunToCompletion();
  const std::vector<uint32_t>& want = local.results()[1].tokens;
  const std::vector<std::vector<uint8_t>> bytes = ComputeBlockBytes(prompt);
  const int64_t usable = std::min<int64_t>(full, (static_cast<int64_t>(prompt.size()) - 1) / 16);

  // Every full block restorable: only the rest is computed, the output is unchanged.
  {
    Harness d(64, {});
    int copies = 0;
    bool released = false;
    GenerationRequest r;
    r.tier_prefix = MakeTierPrefix(&d, d.ChainOf(prompt), &bytes, 0, full, -1, &copies, &released);
    ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(24), "", std::move(r)).ok());
    d.RunToCompletion();
    EXPECT_EQ(d.results()[1].tokens, want);
    EXPECT_TRUE(released);
    EXPECT_EQ(copies, usable);
    EXPECT_EQ(d.results()[1].last.cached_tokens, usable * 16);
    EXPECT_EQ(d.results()[1].last.restored_tokens, usable * 16);
    EXPECT_EQ(d.scheduler()->Stats().prefill_tokens,
              static_cast<int64_t>(prompt.size()) - usable * 16);
    EXPECT_EQ(d.scheduler()->Stats().tier_restored_blocks, usable);
  }
  // A copy failing its check ends the restore there; the rest is computed, output unchanged.
  {
    Harness d(64, {});
    int copies = 0;
    bool released = false;
    GenerationRequest r;
    r.tier_prefix = MakeTierPrefix(&d, d.ChainOf(prompt), &bytes, 0, full, 1, &copies, &released);
    ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(24), "", std::move(r)).ok());
    d.RunToCompletion();
    EXPECT_EQ(d.results()[1].tokens, want);
    EXPECT_EQ(d.results()[1].last.restored_tokens, 16u);
    EXPECT_EQ(d.scheduler()->Stats().tier_restore_failures, 1);
    EXPECT_TRUE(released);
  }
  // Hashes that are not this prompt's (another salt) are never used.
  {
    Harness d(64, {});
    int copies = 0;
    bool released = false;
    GenerationRequest r;
    r.tier_prefix = MakeTierPrefix(&d, d.ChainOf(prompt), &bytes, 0, full, -1, &copies, &released);
    ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(24), "tenant-b", std::move(r)).ok());
    d.RunToCompletion();
    EXPECT_EQ(d.results()[1].tokens, want);
    EXPECT_EQ(copies, 0);
    EXPECT_EQ(d.results()[1].last.cached_tokens, 0u);
    EXPECT_TRUE(released);
  }
  // The pool holds block 0; the tiers continue it from block 1.
  {
    Harness d(64, {});
    ASSERT_TRUE(
        d.Submit(5, std::vector<uint32_t>(prompt.begin(), prompt.begin() + 17), MaxTokens(1)).ok());
    d.RunToCompletion();
    int copies = 0;
    bool released = false;
    GenerationRequest r;
    r.tier_prefix =
        MakeTierPrefix(&d, d.ChainOf(prompt), &bytes, 1, full - 1, -1, &copies, &released);
    ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(24), "", std::move(r)).ok());
    d.RunToCompletion();
    EXPECT_EQ(d.results()[1].tokens, want);
    EXPECT_EQ(copies, usable - 1);
    EXPECT_EQ(d.results()[1].last.cached_tokens, usable * 16);
    EXPECT_EQ(d.results()[1].last.restored_tokens, (usable - 1) * 16);
  }
}

TEST(SchedulerTierTest, ReleasedWhenTheRequestNeverRuns) {
  Harness d(64, {});
  const std::vector<uint32_t> prompt = d.Encode(kLongPrompt);
  int copies = 0;
  bool released = false;
  std::vector<std::vector<uint8_t>> none;
  GenerationRequest r;
  r.tier_prefix = MakeTierPrefix(&d, d.ChainOf(prompt), &none, 0, 1, -1, &copies, &released);
  r.deadline = absl::Now() - absl::Seconds(1);
  ASSERT_TRUE(d.SubmitRequest(1, prompt, MaxTokens(4), "", std::move(r)).ok());
  d.RunToCompletion();
  EXPECT_EQ(d.results()[1].last.finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(released);
  EXPECT_EQ(copies, 0);
}

}  // namespace
}  // namespace pd::engine

namespace pd::engine {
namespace {

// log_softmax of one row in double: the definition, independent of kernels::LogProbs.
std::vector<double> LogSoftmax(const std::vector<float>& row) {
  const double m = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float x : row) sum += std::exp(x - m);
  std::vector<double> out;
  for (float x : row) out.push_back(x - m - std::log(sum));
  return out;
}

// Checks r's entries against log_softmax of the recomputed logits: one entry per token, the
// token's logprob, `n` alternatives that are the n most likely tokens, most likely first.
void ExpectLogprobsOfTheLogits(Harness* h, const std::vector<uint32_t>& prompt, const Result& r,
                               int32_t n, bool greedy) {
  ASSERT_EQ(r.logprobs.size(), r.tokens.size());
  EXPECT_EQ(r.misaligned_outputs, 0);
  const std::vector<std::vector<float>> rows = h->LogitsAlong(prompt, r.tokens);
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const std::vector<double> want = LogSoftmax(rows[i]);
    const TokenLogprob& got = r.logprobs[i];
    EXPECT_NEAR(got.logprob, want[r.tokens[i]], 1e-5) << "token " << i;
    EXPECT_LE(got.logprob, 0.0f);
    ASSERT_EQ(got.top.size(), static_cast<size_t>(n)) << "token " << i;
    std::vector<uint32_t> order(want.size());
    for (uint32_t v = 0; v < order.size(); ++v) order[v] = v;
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return rows[i][a] > rows[i][b]; });
    for (int32_t j = 0; j < n; ++j) {
      EXPECT_EQ(got.top[j].first, order[j]) << "token " << i << " alternative " << j;
      EXPECT_NEAR(got.top[j].second, want[order[j]], 1e-5);
      if (j > 0) {
        EXPECT_GE(got.top[j - 1].second, got.top[j].second);
      }
    }
    if (greedy && n > 0) {
      EXPECT_EQ(got.top[0].first, r.tokens[i]) << "token " << i;
      EXPECT_EQ(got.top[0].second, got.logprob);
    }
    if (!got.all.empty()) {  // (SamplingOptions::full_distribution)
      ASSERT_EQ(got.all.size(), want.size()) << "token " << i;
      for (size_t v = 0; v < want.size(); ++v) {
        ASSERT_NEAR(got.all[v], want[v], 1e-5) << "token " << i << " id " << v;
      }
    }
  }
}

SamplingOptions WithLogprobs(uint32_t max_tokens, int32_t n) {
  SamplingOptions s = MaxTokens(max_tokens);
  s.logprobs = n;
  return s;
}

TEST(SchedulerLogprobsTest, EntriesAreLogSoftmaxOfTheLogits) {
  Harness h(64, {});
  const std::vector<uint32_t> prompt = h.Encode(kPrompts[0]);
  ASSERT_TRUE(h.Submit(1, prompt, WithLogprobs(12, 5)).ok());
  SamplingOptions sampled = WithLogprobs(12, 3);
  sampled.temperature = 1.3f;  // the entries stay those of the raw distribution
  sampled.top_k = 10;
  sampled.seed = 77;
  ASSERT_TRUE(h.Submit(2, prompt, sampled).ok());
  ASSERT_TRUE(h.Submit(3, prompt, WithLogprobs(6, 0)).ok());
  ASSERT_TRUE(h.Submit(4, prompt, MaxTokens(12)).ok());  // not asked
  SamplingOptions whole = WithLogprobs(8, 1);
  whole.full_distribution = true;
  ASSERT_TRUE(h.Submit(5, prompt, whole).ok());
  h.RunToCompletion();
  ExpectLogprobsOfTheLogits(&h, prompt, h.results()[1], 5, /*greedy=*/true);
  ExpectLogprobsOfTheLogits(&h, prompt, h.results()[2], 3, /*greedy=*/false);
  ExpectLogprobsOfTheLogits(&h, prompt, h.results()[3], 0, /*greedy=*/true);
  ExpectLogprobsOfTheLogits(&h, prompt, h.results()[5], 1, /*greedy=*/true);
  ASSERT_EQ(h.results()[5].logprobs.size(), 8u);
  EXPECT_FALSE(h.results()[5].logprobs[0].all.empty());
  EXPECT_TRUE(h.results()[1].logprobs[0].all.empty());  // (only when asked)
  EXPECT_TRUE(h.results()[4].logprobs.empty());
  EXPECT_EQ(h.results()[4].tokens, h.results()[1].tokens);  // asking changes no token
  EXPECT_EQ(h.results()[2].last.finish_reason, FinishReason::kLength);
}

TEST(SchedulerLogprobsTest, SubmitRejectsOutOfRange) {
  Harness h(64, {});
  EXPECT_EQ(h.Submit(1, {1}, WithLogprobs(4, 21)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Submit(1, {1}, WithLogprobs(4, -2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.Submit(1, {1}, WithLogprobs(4, 20)).ok());
  h.RunToCompletion();
  ASSERT_EQ(h.results()[1].logprobs.size(), 4u);
  EXPECT_EQ(h.results()[1].logprobs[0].top.size(), 20u);
}

// Preemption recomputes the KV of emitted tokens but never emits their entries again: the
// entries equal those of an undisturbed run, one per token.
TEST(SchedulerLogprobsTest, PreemptionKeepsTheEntries) {
  std::map<int, Result> alone;
  for (int i = 0; i < 4; ++i) {
    Harness h(64, {});
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), WithLogprobs(60, 2)).ok());
    h.RunToCompletion();
    alone[i] = h.results()[i];
  }
  Harness h(12, {});
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(h.Submit(i, h.Encode(kPrompts[i]), WithLogprobs(60, 2)).ok());
  }
  h.RunToCompletion();
  EXPECT_GT(h.scheduler()->Stats().preemptions, 0);
  for (int i = 0; i < 4; ++i) {
    const Result& r = h.results()[i];
    EXPECT_EQ(r.tokens, alone[i].tokens);
    ASSERT_EQ(r.logprobs.size(), r.tokens.size()) << i;
    EXPECT_EQ(r.misaligned_outputs, 0);
    for (size_t t = 0; t < r.logprobs.size(); ++t) {
      EXPECT_EQ(r.logprobs[t].logprob, alone[i].logprobs[t].logprob) << i << " " << t;
      EXPECT_EQ(r.logprobs[t].top, alone[i].logprobs[t].top) << i << " " << t;
    }
  }
}

// The first token is sampled on the prefill side: its entry travels in PrefilledBlocks to
// CompleteRemotePrefill. A decode side that asked but got no entry prefills locally.
TEST(SchedulerLogprobsTest, RemotePrefillCarriesTheFirstEntry) {
  Harness local(64, {});
  const std::vector<uint32_t> prompt = local.Encode(kPrompts[1]);
  ASSERT_TRUE(local.Submit(1, prompt, WithLogprobs(10, 4)).ok());
  local.RunToCompletion();
  const Result& want = local.results()[1];
  ASSERT_EQ(want.logprobs.size(), 10u);

  // Prefill side: the entry comes with the first token; a request not asking gets none.
  Harness p(64, {});
  std::optional<PrefilledBlocks> prefilled, plain;
  GenerationRequest pr;
  pr.on_prefilled = [&](PrefilledBlocks b) { prefilled = std::move(b); };
  ASSERT_TRUE(p.SubmitRequest(7, prompt, WithLogprobs(10, 4), "", std::move(pr)).ok());
  GenerationRequest pr2;
  pr2.on_prefilled = [&](PrefilledBlocks b) { plain = std::move(b); };
  ASSERT_TRUE(p.SubmitRequest(8, prompt, MaxTokens(10), "", std::move(pr2)).ok());
  while (!prefilled.has_value() || !plain.has_value()) {
    ASSERT_TRUE(p.scheduler()->Step());
  }
  ASSERT_TRUE(prefilled->first_logprob.has_value());
  EXPECT_EQ(prefilled->first_logprob->logprob, want.logprobs[0].logprob);
  EXPECT_EQ(prefilled->first_logprob->top, want.logprobs[0].top);
  EXPECT_FALSE(plain->first_logprob.has_value());

  for (bool send_entry : {true, false}) {
    Harness d(64, {});
    std::optional<RemotePrefillTarget> target;
    GenerationRequest dr;
    dr.remote_prefill = [&](RemotePrefillTarget t) { target = std::move(t); };
    ASSERT_TRUE(d.SubmitRequest(1, prompt, WithLogprobs(10, 4), "", std::move(dr)).ok());
    d.scheduler()->Step();
    ASSERT_TRUE(target.has_value());
    for (size_t b = 0; b < target->block_ids.size(); ++b) {
      std::memcpy(d.pool()->BlockData(target->block_ids[b]),
                  p.pool()->BlockData(prefilled->block_ids[target->first_block + b]),
                  d.pool()->block_bytes());
    }
    const absl::Status done =
        send_entry ? d.scheduler()->CompleteRemotePrefill(RequestId(1), prefilled->first_token,
                                                          prefilled->first_logprob)
                   : d.scheduler()->CompleteRemotePrefill(RequestId(1), prefilled->first_token);
    if (send_entry) {
      ASSERT_TRUE(done.ok()) << done;
    } else {
      EXPECT_EQ(done.code(), absl::StatusCode::kInvalidArgument) << done;
      EXPECT_THAT(done.message(), HasSubstr("logprobs"));
    }
    d.RunToCompletion();
    const Result& r = d.results()[1];
    EXPECT_EQ(r.last.prefilled_remotely, send_entry);
    EXPECT_EQ(r.tokens, want.tokens);
    ASSERT_EQ(r.logprobs.size(), want.logprobs.size());
    EXPECT_EQ(r.misaligned_outputs, 0);
    for (size_t t = 0; t < r.logprobs.size(); ++t) {
      EXPECT_EQ(r.logprobs[t].logprob, want.logprobs[t].logprob) << t;
      EXPECT_EQ(r.logprobs[t].top, want.logprobs[t].top) << t;
    }
  }
  // An entry with more alternatives than asked is refused as well.
  Harness d(64, {});
  GenerationRequest dr;
  dr.remote_prefill = [](RemotePrefillTarget) {};
  ASSERT_TRUE(d.SubmitRequest(1, prompt, WithLogprobs(10, 1), "", std::move(dr)).ok());
  d.scheduler()->Step();
  EXPECT_EQ(
      d.scheduler()
          ->CompleteRemotePrefill(RequestId(1), prefilled->first_token, prefilled->first_logprob)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.scheduler()->Stats().remote_prefill_failures, 1);
  ASSERT_TRUE(p.scheduler()->ReleasePrefilled(RequestId(7)).ok());
  ASSERT_TRUE(p.scheduler()->ReleasePrefilled(RequestId(8)).ok());
}

// Structured output: the grammar's mask is applied where the token is sampled, so greedy and
// sampled outputs are sentences of the grammar that end with EOS (STOP); the output is the same
// alone, batched with others, preempted, and with the staged (decode-graph) forward pass.
std::shared_ptr<const grammar::CompiledGrammar> TestGrammar(grammar::ConstraintSpec spec) {
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      grammar::CompileConstraint(spec);
  CHECK(g.ok()) << g.status();
  return *g;
}

constexpr char kPersonSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},)"
    R"("age":{"type":"integer","minimum":0,"maximum":99},"pet":{"enum":["cat","dog"]}},)"
    R"("required":["name","age","pet"],"additionalProperties":false})";

SamplingOptions Constrained(std::shared_ptr<const grammar::CompiledGrammar> g, float temperature,
                            uint64_t seed = 0) {
  SamplingOptions so;
  so.max_tokens = 200;
  so.temperature = temperature;
  so.seed = seed;
  so.grammar = std::move(g);
  return so;
}

TEST(SchedulerGrammarTest, OutputsAreSentencesOfTheGrammarOnEveryPath) {
  auto schema = TestGrammar({grammar::ConstraintSpec::Kind::kJsonSchema, kPersonSchema, {}});
  std::map<int, std::vector<uint32_t>> alone;
  for (int i = 0; i < 4; ++i) {
    Harness h(64, {});
    ASSERT_TRUE(
        h.Submit(i, h.Encode(kPrompts[i]), Constrained(schema, i % 2 ? 1.0f : 0.0f, i)).ok());
    h.RunToCompletion();
    const Result& r = h.results()[i];
    EXPECT_EQ(r.last.finish_reason, FinishReason::kStop) << r.last.status << " " << r.text;
    EXPECT_TRUE(grammar::Matches(schema, r.text)) << "prompt " << i << ": " << r.text;
    alone[i] = r.tokens;
  }
  for (bool staged : {false, true}) {
    Harness h(14, {}, Clock::Real(), staged);  // small pool: some requests are preempted
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(
          h.Submit(i, h.Encode(kPrompts[i]), Constrained(schema, i % 2 ? 1.0f : 0.0f, i)).ok());
    }
    h.RunToCompletion();
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(h.results()[i].tokens, alone[i]) << "prompt " << i << " staged " << staged;
    }
  }
}

// Speculative decoding (n-gram): greedy output is token for token the output without it, alone,
// batched, with a pool small enough to preempt, and with logprobs; proposals are verified and
// many accepted (stories260K repeats itself); max_tokens is never overshot.
TEST(SchedulerSpecTest, NgramSpeculationGivesTheSameGreedyOutput) {
  SchedulerConfig spec;
  spec.speculative = "ngram";
  spec.spec_max_tokens = 4;
  spec.spec_adaptive = false;  // (stories260K is too small for speculation to pay)
  auto run = [](int64_t blocks, SchedulerConfig config, bool logprobs, bool staged = false) {
    Harness h(blocks, config, Clock::Real(), staged);
    for (int i = 0; i < 4; ++i) {
      SamplingOptions so = MaxTokens(i == 3 ? 37 : 120);
      if (logprobs && i == 1) so.logprobs = 3;
      CHECK(h.Submit(i, h.Encode(kPrompts[i]), so).ok());
    }
    h.RunToCompletion();
    std::map<int, Result> out;
    for (int i = 0; i < 4; ++i) out[i] = h.results()[i];
    return std::make_pair(out, h.scheduler()->Stats());
  };
  for (const bool logprobs : {false, true}) {
    const auto [plain, plain_stats] = run(64, {}, logprobs);
    const auto [fast, fast_stats] = run(64, spec, logprobs);
    const auto [tight, tight_stats] = run(14, spec, logprobs);  // preempts
    // The CUDA path's staging and decode graphs, on the host.
    const auto [staged, staged_stats] = run(64, spec, logprobs, /*staged=*/true);
    std::printf("proposed %lld, accepted %lld; steps %lld (without: %lld)\n",
                static_cast<long long>(fast_stats.spec_proposed_tokens),
                static_cast<long long>(fast_stats.spec_accepted_tokens),
                static_cast<long long>(fast_stats.steps), static_cast<long long>(plain_stats.steps));
    EXPECT_EQ(plain_stats.spec_proposed_tokens, 0);
    EXPECT_GT(staged_stats.spec_accepted_tokens, 20);
    EXPECT_GT(fast_stats.spec_accepted_tokens, 20);
    EXPECT_LE(fast_stats.spec_accepted_tokens, fast_stats.spec_proposed_tokens);
    // Each accepted token is a step saved.
    EXPECT_LT(fast_stats.steps, plain_stats.steps);
    EXPECT_GT(tight_stats.preemptions, 0);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(fast.at(i).tokens, plain.at(i).tokens) << "prompt " << i;
      EXPECT_EQ(fast.at(i).text, plain.at(i).text) << "prompt " << i;
      EXPECT_EQ(fast.at(i).last.finish_reason, plain.at(i).last.finish_reason);
      EXPECT_EQ(tight.at(i).tokens, plain.at(i).tokens) << "prompt " << i << " (preempted)";
      EXPECT_EQ(staged.at(i).tokens, plain.at(i).tokens) << "prompt " << i << " (staged)";
      ASSERT_EQ(fast.at(i).logprobs.size(), plain.at(i).logprobs.size());
      for (size_t t = 0; t < plain.at(i).logprobs.size(); ++t) {
        EXPECT_NEAR(fast.at(i).logprobs[t].logprob, plain.at(i).logprobs[t].logprob, 1e-5);
        EXPECT_EQ(fast.at(i).logprobs[t].top.size(), plain.at(i).logprobs[t].top.size());
      }
    }
    EXPECT_EQ(fast.at(3).tokens.size(), 37u);  // max_tokens, not one more
  }
}

// The n-gram proposer, proposing every step (stories260K is too small for speculation to pay,
// so the controller would decline).
SchedulerConfig AlwaysNgram() {
  SchedulerConfig spec;
  spec.speculative = "ngram";
  spec.spec_max_tokens = 4;
  spec.spec_adaptive = false;
  return spec;
}

// Every request's tokens and logprobs are the plain run's.
void ExpectSameOutput(const std::map<int, Result>& fast, const std::map<int, Result>& plain,
                      const std::string& label) {
  for (const auto& [i, want] : plain) {
    const Result& got = fast.at(i);
    EXPECT_EQ(got.tokens, want.tokens) << label << ", prompt " << i;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << label << ", prompt " << i;
    for (size_t t = 0; t < want.logprobs.size(); ++t) {
      EXPECT_NEAR(got.logprobs[t].logprob, want.logprobs[t].logprob, 1e-5);
    }
  }
}

// Sampled requests speculate too, and their output is token for token the output without
// speculation for the same seeds: a verify row samples with the draw of the step it stands
// for, so a proposal is accepted exactly when plain decoding would have taken it (accepted
// with the target's probability of the proposed token, as rejection sampling of a
// deterministic proposal does). Equal outputs for every seed are a stronger check than a
// goodness-of-fit test of the distribution: the distribution is the plain sampler's.
TEST(SchedulerSpecTest, SampledRequestsSpeculateAndKeepTheirSeededOutput) {
  const SchedulerConfig spec = AlwaysNgram();
  auto run = [](SchedulerConfig config, bool staged) {
    Harness h(64, config, Clock::Real(), staged);
    for (int i = 0; i < 4; ++i) {
      SamplingOptions so = MaxTokens(100);
      so.temperature = i == 0 ? 0.3f : 0.8f;
      so.top_p = i == 2 ? 0.9f : 1.0f;
      so.top_k = i == 3 ? 20 : 0;
      so.min_p = i == 1 ? 0.05f : 0.0f;
      so.seed = 1000 + static_cast<uint64_t>(i);
      if (i == 1) so.logprobs = 2;
      CHECK(h.Submit(i, h.Encode(kPrompts[i]), so).ok());
    }
    h.RunToCompletion();
    std::map<int, Result> out;
    for (int i = 0; i < 4; ++i) out[i] = h.results()[i];
    return std::make_pair(out, h.scheduler()->Stats());
  };
  const auto [plain, plain_stats] = run({}, false);
  for (const bool staged : {false, true}) {
    const auto [fast, fast_stats] = run(spec, staged);
    std::printf("sampled: proposed %lld, accepted %lld; steps %lld (without: %lld)\n",
                static_cast<long long>(fast_stats.spec_proposed_tokens),
                static_cast<long long>(fast_stats.spec_accepted_tokens),
                static_cast<long long>(fast_stats.steps), static_cast<long long>(plain_stats.steps));
    EXPECT_GT(fast_stats.spec_accepted_tokens, 0);
    ExpectSameOutput(fast, plain, staged ? "staged" : "host");
  }
}

// Logit bias and penalties too: a verify row's edits count the proposed tokens before it, as
// plain decoding would have counted them; output equal to plain decoding, greedy and sampled.
TEST(SchedulerSpecTest, PenalizedRequestsSpeculateAndKeepTheirOutput) {
  const SchedulerConfig spec = AlwaysNgram();
  auto run = [](SchedulerConfig config) {
    Harness h(64, config);
    for (int i = 0; i < 4; ++i) {
      SamplingOptions so = MaxTokens(100);
      so.temperature = i % 2 == 0 ? 0.0f : 0.7f;
      so.seed = 50 + static_cast<uint64_t>(i);
      // Mild: stories260K still repeats itself, so proposals are made and some accepted.
      so.presence_penalty = i == 0 ? 0.2f : 0.0f;
      so.frequency_penalty = i == 1 ? 0.1f : 0.0f;
      so.repetition_penalty = i == 2 ? 1.1f : 1.0f;
      if (i == 3) so.logit_bias = {{13, -2.0f}, {100, 1.5f}};
      if (i == 0) so.logprobs = 1;
      CHECK(h.Submit(i, h.Encode(kPrompts[i]), so).ok());
    }
    h.RunToCompletion();
    std::map<int, Result> out;
    for (int i = 0; i < 4; ++i) out[i] = h.results()[i];
    return std::make_pair(out, h.scheduler()->Stats());
  };
  const auto [plain, plain_stats] = run({});
  const auto [fast, fast_stats] = run(spec);
  std::printf("penalized: proposed %lld, accepted %lld\n",
              static_cast<long long>(fast_stats.spec_proposed_tokens),
              static_cast<long long>(fast_stats.spec_accepted_tokens));
  EXPECT_GT(fast_stats.spec_accepted_tokens, 0);
  ExpectSameOutput(fast, plain, "penalized");
}

// A request that opts out takes no proposals: alone with speculation on, it is decoded one
// token a step (nothing proposed); beside one that speculates, only the other is proposed for.
// Both outputs equal the ones without speculation.
TEST(SchedulerSpecTest, ARequestThatOptsOutTakesNoProposals) {
  const SchedulerConfig spec = AlwaysNgram();
  auto run = [](SchedulerConfig config, bool opt_out_first, bool with_second) {
    Harness h(64, config);
    SamplingOptions first = MaxTokens(120);
    first.no_speculation = opt_out_first;
    CHECK(h.Submit(0, h.Encode(kPrompts[0]), first).ok());
    if (with_second) {
      CHECK(h.Submit(1, h.Encode(kPrompts[1]), MaxTokens(120)).ok());
    }
    h.RunToCompletion();
    std::map<int, std::vector<uint32_t>> out;
    out[0] = h.results()[0].tokens;
    if (with_second) out[1] = h.results()[1].tokens;
    return std::make_pair(out, h.scheduler()->Stats());
  };
  const auto [plain, plain_stats] = run({}, false, true);
  const auto [alone, alone_stats] = run(spec, /*opt_out_first=*/true, /*with_second=*/false);
  EXPECT_EQ(alone_stats.spec_proposed_tokens, 0);
  EXPECT_EQ(alone.at(0), plain.at(0));
  const auto [spec_alone, spec_alone_stats] = run(spec, false, false);
  EXPECT_GT(spec_alone_stats.spec_proposed_tokens, 0);  // (the same request, not opted out)
  const auto [mixed, mixed_stats] = run(spec, true, true);
  const auto [second_alone, second_stats] = [&] {
    Harness h(64, spec);
    CHECK(h.Submit(1, h.Encode(kPrompts[1]), MaxTokens(120)).ok());
    h.RunToCompletion();
    return std::make_pair(h.results()[1].tokens, h.scheduler()->Stats());
  }();
  EXPECT_GT(mixed_stats.spec_proposed_tokens, 0);
  // Proposals went to the second request only: as many as it gets alone.
  EXPECT_EQ(mixed_stats.spec_proposed_tokens, second_stats.spec_proposed_tokens);
  EXPECT_EQ(mixed.at(0), plain.at(0));
  EXPECT_EQ(mixed.at(1), plain.at(1));
  EXPECT_EQ(second_alone, plain.at(1));
}

// A draft model proposes (batched across sequences, its own KV pool kept in step by content):
// the output is token for token the output without speculation, greedy, sampled and with a
// grammar, batched, preempted, staged, and with a draft pool so small that sequences' draft
// blocks are evicted for others. With the model itself as its draft, every greedy proposal is
// accepted; its int8 copy is sometimes wrong, and those proposals are rejected.
TEST(SchedulerSpecTest, DraftModelGivesTheSameOutput) {
  auto person = TestGrammar({grammar::ConstraintSpec::Kind::kJsonSchema, kPersonSchema, {}});
  struct Setup {
    int64_t blocks = 64;
    bool speculate = true;
    bool int8 = false;
    int64_t draft_blocks = 64;
    bool staged = false;
  };
  auto run = [&](Setup setup) {
    SchedulerConfig config;
    if (setup.speculate) {
      config.speculative = "draft";
      config.spec_max_tokens = 4;
      config.spec_adaptive = false;
    }
    config.mask_grace_us = 10'000'000;  // (no late masks: equal step counts below)
    Harness h(setup.blocks, config, Clock::Real(), setup.staged);
    if (setup.speculate) h.UseDraft(setup.draft_blocks, setup.int8, setup.staged);
    for (int i = 0; i < 5; ++i) {
      SamplingOptions so = MaxTokens(i == 4 ? 33 : 100);
      if (i == 1) {
        so.temperature = 0.8f;
        so.seed = 5;
      }
      if (i == 2) so = Constrained(person, 0.0f);
      if (i == 3) so.logprobs = 2;
      CHECK(h.Submit(i, h.Encode(kPrompts[i]), so).ok());
    }
    h.RunToCompletion();
    std::map<int, Result> out;
    for (int i = 0; i < 5; ++i) out[i] = h.results()[i];
    return std::make_pair(out, h.scheduler()->Stats());
  };
  const auto [plain, plain_stats] = run({.speculate = false});
  auto report = [](const char* label, const SchedulerStats& s) {
    std::printf("%s: proposed %lld, accepted %lld, steps %lld, draft passes %lld, catch-up %lld, "
                "evictions %lld\n",
                label, static_cast<long long>(s.spec_proposed_tokens),
                static_cast<long long>(s.spec_accepted_tokens), static_cast<long long>(s.steps),
                static_cast<long long>(s.draft_forward_passes),
                static_cast<long long>(s.draft_catch_up_tokens),
                static_cast<long long>(s.draft_evictions));
  };
  report("plain", plain_stats);
  const auto [same, same_stats] = run({});
  report("self draft", same_stats);
  ExpectSameOutput(same, plain, "self draft");
  EXPECT_GT(same_stats.spec_accepted_tokens, 100);
  EXPECT_LT(same_stats.steps, plain_stats.steps);
  const auto [q, q_stats] = run({.int8 = true});
  report("int8 draft", q_stats);
  ExpectSameOutput(q, plain, "int8 draft");
  EXPECT_GT(q_stats.spec_accepted_tokens, 50);
  EXPECT_LE(q_stats.spec_accepted_tokens, same_stats.spec_accepted_tokens);
  const auto [tight, tight_stats] = run({.blocks = 14, .int8 = true});
  report("preempted", tight_stats);
  EXPECT_GT(tight_stats.preemptions, 0);
  ExpectSameOutput(tight, plain, "int8 draft, preempted");
  const auto [small, small_stats] = run({.int8 = true, .draft_blocks = 12});
  report("small draft pool", small_stats);
  EXPECT_GT(small_stats.draft_evictions, 0);
  EXPECT_GT(small_stats.spec_accepted_tokens, 0);
  ExpectSameOutput(small, plain, "int8 draft, small draft pool");
  const auto [staged, staged_stats] = run({.int8 = true, .staged = true});
  report("staged", staged_stats);
  ExpectSameOutput(staged, plain, "int8 draft, staged");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(q.at(i).text, plain.at(i).text) << "prompt " << i;
  EXPECT_EQ(q.at(4).tokens.size(), 33u);  // max_tokens, not one more
}

TEST(SchedulerSpecTest, UseDraftModelNeedsTheDraftMode) {
  SchedulerConfig config;
  config.speculative = "ngram";
  Harness h(16, config);
  // No draft is wanted here: refused before the draft is looked at.
  EXPECT_EQ(h.scheduler()->UseDraftModel(nullptr, 16).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerSpecTest, ConfigIsValidated) {
  SchedulerConfig c;
  c.speculative = "draft";
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.ForwardMaxSeqs(), std::min<int64_t>(c.max_batch_tokens, 5 * c.max_running));
  c.speculative = "eagle";
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  c.speculative = "ngram";
  c.spec_max_tokens = 0;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  c.spec_max_tokens = 4;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.ForwardMaxSeqs(), std::min<int64_t>(c.max_batch_tokens, 5 * c.max_running));
  c.speculative = "off";
  EXPECT_EQ(c.ForwardMaxSeqs(), c.max_running);
}

// A late mask holds no one: with no grace, a constrained sequence whose mask is held on
// purpose sits steps out while its unconstrained neighbour goes on, and both outputs are the
// ones computed without delay. Alone, the step waits for it instead. A sequence cancelled while
// its mask is late leaves the job to finish on its own.
TEST(SchedulerGrammarTest, LateMaskSitsTheStepOutAndChangesNothing) {
  auto schema = TestGrammar({grammar::ConstraintSpec::Kind::kJsonSchema, kPersonSchema, {}});
  // The neighbour outlasts the constrained request whatever the timing (with no grace, a mask
  // slower than the layers sits a step out at any time).
  auto Long = [] {
    SamplingOptions so = MaxTokens(400);
    so.ignore_eos = true;
    return so;
  };
  SchedulerConfig no_grace;
  no_grace.mask_grace_us = 0;
  std::map<int, std::vector<uint32_t>> reference;
  {
    Harness h(64, {});
    ASSERT_TRUE(h.Submit(0, h.Encode(kPrompts[0]), Constrained(schema, 0.0f)).ok());
    ASSERT_TRUE(h.Submit(1, h.Encode(kPrompts[1]), Long()).ok());
    h.RunToCompletion();
    reference[0] = h.results()[0].tokens;
    reference[1] = h.results()[1].tokens;
    ASSERT_GT(reference[0].size(), 8u);
  }
  // Masks 4 and 9 (decode steps) are each held until three more steps ran.
  std::atomic<int> steps{0};
  std::atomic<int> masks{0};
  std::atomic<bool> timed_out{false};
  auto hold_for_steps = [&](int n) {
    const int until = steps.load() + n;
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (steps.load() < until) {
      if (absl::Now() > give_up) {
        timed_out = true;  // the steps waited for the mask: it held the batch
        return;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  };
  {
    Harness h(64, no_grace);
    h.scheduler()->SetMaskHookForTesting([&] {
      const int k = masks.fetch_add(1);
      if (k == 4 || k == 9) hold_for_steps(3);
    });
    ASSERT_TRUE(h.Submit(0, h.Encode(kPrompts[0]), Constrained(schema, 0.0f)).ok());
    ASSERT_TRUE(h.Submit(1, h.Encode(kPrompts[1]), Long()).ok());
    for (int i = 0; i < 10000 && !h.scheduler()->idle(); ++i) {
      h.scheduler()->Step();
      steps.fetch_add(1);
    }
    ASSERT_TRUE(h.scheduler()->idle());
    EXPECT_FALSE(timed_out.load());
    EXPECT_GE(h.scheduler()->Stats().late_masks, 6);
    EXPECT_EQ(h.results()[0].tokens, reference[0]);
    EXPECT_EQ(h.results()[1].tokens, reference[1]);
  }
  {
    // Alone: the step waits (nothing sat out), the output is the same.
    Harness h(64, no_grace);
    h.scheduler()->SetMaskHookForTesting([] { absl::SleepFor(absl::Milliseconds(5)); });
    ASSERT_TRUE(h.Submit(0, h.Encode(kPrompts[0]), Constrained(schema, 0.0f)).ok());
    h.RunToCompletion();
    EXPECT_EQ(h.scheduler()->Stats().late_masks, 0);
    EXPECT_EQ(h.results()[0].tokens, reference[0]);
  }
  {
    // Cancelled while late: the request ends, the job finishes after it.
    std::atomic<bool> release{false};
    masks = 0;
    Harness h(64, no_grace);
    h.scheduler()->SetMaskHookForTesting([&] {
      if (masks.fetch_add(1) != 4) return;
      while (!release.load()) absl::SleepFor(absl::Milliseconds(1));
    });
    ASSERT_TRUE(h.Submit(0, h.Encode(kPrompts[0]), Constrained(schema, 0.0f)).ok());
    ASSERT_TRUE(h.Submit(1, h.Encode(kPrompts[1]), Long()).ok());
    for (int i = 0; i < 10000 && h.scheduler()->Stats().late_masks == 0; ++i) {
      h.scheduler()->Step();
    }
    ASSERT_GT(h.scheduler()->Stats().late_masks, 0);
    ASSERT_TRUE(h.scheduler()->Cancel(RequestId(0)).ok());
    h.scheduler()->Step();
    release = true;
    h.RunToCompletion();
    EXPECT_EQ(h.results()[0].last.finish_reason, FinishReason::kAbort);
    EXPECT_EQ(h.results()[1].tokens, reference[1]);
  }
}

// Speculation composes with structured output: a proposal is cut before the first token the
// grammar refuses, each verify row samples under the mask of the grammar after the proposed
// tokens before it, and the output is token for token the output without speculation, greedy
// and sampled, on the host and staged paths, with logprobs, and when verify rows' masks are
// late (the proposal is cut there; nothing else changes).
TEST(SchedulerGrammarTest, SpeculationUnderAGrammarGivesTheSameOutput) {
  auto person = TestGrammar({grammar::ConstraintSpec::Kind::kJsonSchema, kPersonSchema, {}});
  // Free text (stories260K repeats itself inside it, so proposals are accepted) and an array of
  // short strings.
  auto text = TestGrammar({grammar::ConstraintSpec::Kind::kRegex, "[A-Za-z ,.']{1,300}", {}});
  auto lines = TestGrammar(
      {grammar::ConstraintSpec::Kind::kJsonSchema,
       R"({"type":"array","items":{"type":"string","maxLength":60},"minItems":2,"maxItems":6})",
       {}});
  auto run = [&](SchedulerConfig config, bool staged, std::function<void()> hook = nullptr) {
    Harness h(64, config, Clock::Real(), staged);
    if (hook) h.scheduler()->SetMaskHookForTesting(hook);
    const std::shared_ptr<const grammar::CompiledGrammar> grammars[] = {text, lines, person, text};
    for (int i = 0; i < 4; ++i) {
      SamplingOptions so = Constrained(grammars[i], i == 3 ? 0.8f : 0.0f, 70 + i);
      so.max_tokens = 150;
      if (i == 0) so.logprobs = 2;
      CHECK(h.Submit(i, h.Encode(kPrompts[i]), so).ok());
    }
    h.RunToCompletion();
    std::map<int, Result> out;
    for (int i = 0; i < 4; ++i) out[i] = h.results()[i];
    return std::make_pair(out, h.scheduler()->Stats());
  };
  // With a grace longer than any mask, no mask is late: the steps count only the proposals.
  SchedulerConfig patient;
  patient.mask_grace_us = 10'000'000;
  SchedulerConfig spec = AlwaysNgram();
  spec.mask_grace_us = patient.mask_grace_us;
  const auto [plain, plain_stats] = run(patient, false);
  for (int i = 0; i < 4; ++i) {
    ASSERT_NE(plain.at(i).last.finish_reason, FinishReason::kError) << plain.at(i).last.status;
  }
  for (const bool staged : {false, true}) {
    const auto [fast, fast_stats] = run(spec, staged);
    std::printf(
        "grammar: proposed %lld, accepted %lld; steps %lld (without: %lld); late masks %lld, "
        "late verify masks %lld (without: %lld)\n",
        static_cast<long long>(fast_stats.spec_proposed_tokens),
        static_cast<long long>(fast_stats.spec_accepted_tokens),
        static_cast<long long>(fast_stats.steps), static_cast<long long>(plain_stats.steps),
        static_cast<long long>(fast_stats.late_masks),
        static_cast<long long>(fast_stats.late_verify_masks),
        static_cast<long long>(plain_stats.late_masks));
    EXPECT_GT(fast_stats.spec_accepted_tokens, 20);
    EXPECT_EQ(fast_stats.late_masks + fast_stats.late_verify_masks, 0);
    EXPECT_LT(fast_stats.steps, plain_stats.steps);
    ExpectSameOutput(fast, plain, staged ? "grammar, staged" : "grammar, host");
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(fast.at(i).text, plain.at(i).text) << "prompt " << i;
      EXPECT_EQ(fast.at(i).last.finish_reason, plain.at(i).last.finish_reason) << "prompt " << i;
    }
  }
  // Verify rows' masks held past the layers (no grace): proposals are cut, the output is the
  // same. The hook runs before every mask; every third is held a while.
  SchedulerConfig no_grace = AlwaysNgram();
  no_grace.mask_grace_us = 0;
  std::atomic<int> masks{0};
  const auto [slow, slow_stats] = run(no_grace, false, [&] {
    if (masks.fetch_add(1) % 3 == 2) absl::SleepFor(absl::Milliseconds(3));
  });
  EXPECT_GT(slow_stats.late_verify_masks, 0);
  ExpectSameOutput(slow, plain, "grammar, late verify masks");
}

TEST(SchedulerGrammarTest, ChoicesRegexesAndLogprobsStayInsideTheMask) {
  Harness h(64, {});
  auto choice = TestGrammar({grammar::ConstraintSpec::Kind::kChoice, "", {"Lily", "Tom", "Ben"}});
  SamplingOptions so = Constrained(choice, 0.0f);
  so.logprobs = 5;
  ASSERT_TRUE(h.Submit(1, h.Encode(kPrompts[0]), so).ok());
  auto re =
      TestGrammar({grammar::ConstraintSpec::Kind::kRegex, "[a-z]{2,6}( [a-z]{2,6}){2}\\.", {}});
  ASSERT_TRUE(h.Submit(2, h.Encode(kPrompts[1]), Constrained(re, 0.8f, 9)).ok());
  h.RunToCompletion();
  const Result& c = h.results()[1];
  EXPECT_EQ(c.last.finish_reason, FinishReason::kStop) << c.last.status;
  EXPECT_THAT((std::vector<std::string>{"Lily", "Tom", "Ben"}), ::testing::Contains(c.text));
  ASSERT_EQ(c.logprobs.size(), c.tokens.size());
  for (const TokenLogprob& lp : c.logprobs) {
    EXPECT_TRUE(std::isfinite(lp.logprob));
    for (const auto& [id, logprob] : lp.top) {
      // Masked tokens have logprob -inf and are never among the alternatives.
      EXPECT_TRUE(std::isfinite(logprob)) << "token " << id;
    }
  }
  const Result& r = h.results()[2];
  EXPECT_EQ(r.last.finish_reason, FinishReason::kStop) << r.last.status;
  EXPECT_TRUE(grammar::Matches(re, r.text)) << r.text;
}

TEST(SchedulerGrammarTest, ConflictingOptionsAreRefused) {
  Harness h(64, {});
  auto choice = TestGrammar({grammar::ConstraintSpec::Kind::kChoice, "", {"a"}});
  SamplingOptions so = Constrained(choice, 0.0f);
  so.ignore_eos = true;
  absl::Status s = h.Submit(1, h.Encode(kPrompts[0]), so);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("structured-output"));
  so.ignore_eos = false;
  so.min_tokens = 2;
  EXPECT_EQ(h.Submit(2, h.Encode(kPrompts[0]), so).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::engine

namespace pd::engine {
namespace {

// Migration: a request resumed from any output boundary of an earlier run (its tokens so far
// and the text offset of that output) continues exactly as the run did: same tokens, same text
// (held-back text included), same logprobs, same finish and usage; greedy, seeded, with stop
// strings that hold text back, with a grammar, and batched with a preempting neighbour.
TEST(SchedulerResumeTest, ResumedRequestContinuesTheRunExactly) {
  auto schema = TestGrammar({grammar::ConstraintSpec::Kind::kJsonSchema, kPersonSchema, {}});
  std::vector<SamplingOptions> cases;
  cases.push_back(MaxTokens(40));
  SamplingOptions seeded = MaxTokens(40);
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 77;
  seeded.logprobs = 2;
  cases.push_back(seeded);
  SamplingOptions held = MaxTokens(60);
  held.stop = {"the dragon", "a big dog"};  // "the", "a b"... are held back often
  cases.push_back(held);
  cases.push_back(Constrained(schema, 1.0f, 5));
  for (size_t c = 0; c < cases.size(); ++c) {
    Harness base(64, {});
    const std::vector<uint32_t> prompt = base.Encode(kPrompts[c % 5]);
    ASSERT_TRUE(base.Submit(1, prompt, cases[c]).ok());
    base.RunToCompletion();
    const Result want = base.results()[1];
    ASSERT_GT(want.marks.size(), 3u) << c;
    bool held_somewhere = false;
    for (size_t m = 0; m + 1 < want.marks.size(); ++m) {
      const Result::Mark& mark = want.marks[m];
      EXPECT_EQ(mark.text_offset, mark.text) << c << " " << m;  // the offset counts sent text
      held_somewhere |=
          base.TextOf(prompt.back(), absl::MakeConstSpan(want.tokens).first(mark.tokens)).size() >
          mark.text_offset;
      Harness h(14, {});  // small pool: the neighbour preempts now and then
      GenerationRequest r;
      r.resume.tokens.assign(want.tokens.begin(), want.tokens.begin() + mark.tokens);
      r.resume.text_offset = mark.text_offset;
      ASSERT_TRUE(h.SubmitRequest(2, prompt, cases[c], "", std::move(r)).ok()) << c << " " << m;
      ASSERT_TRUE(h.Submit(3, h.Encode(kPrompts[(c + 1) % 5]), MaxTokens(50)).ok());
      h.RunToCompletion();
      const Result& got = h.results()[2];
      std::vector<uint32_t> tokens(want.tokens.begin(), want.tokens.begin() + mark.tokens);
      tokens.insert(tokens.end(), got.tokens.begin(), got.tokens.end());
      EXPECT_EQ(tokens, want.tokens) << "case " << c << " resumed after output " << m;
      EXPECT_EQ(want.text.substr(0, mark.text) + got.text, want.text) << c << " " << m;
      EXPECT_EQ(got.last.finish_reason, want.last.finish_reason) << c << " " << m;
      EXPECT_EQ(got.last.completion_tokens, want.last.completion_tokens) << c << " " << m;
      EXPECT_EQ(got.last.prompt_tokens, want.last.prompt_tokens) << c << " " << m;
      EXPECT_EQ(got.last.text_offset, want.last.text_offset) << c << " " << m;
      ASSERT_EQ(got.logprobs.size() + mark.tokens,
                cases[c].logprobs >= 0 ? want.logprobs.size() : mark.tokens);
      for (size_t t = 0; t < got.logprobs.size(); ++t) {
        EXPECT_EQ(got.logprobs[t].logprob, want.logprobs[mark.tokens + t].logprob) << c << t;
        EXPECT_EQ(got.logprobs[t].top, want.logprobs[mark.tokens + t].top) << c << t;
      }
    }
    // Held back at some boundary (a possible stop string): resuming from there must send it.
    EXPECT_EQ(held_somewhere, c == 2) << c;
  }
}

// Where a moved stream's resumed prompt came from (pd_worker_resumed_tokens_total): all
// computed on a cold worker; on a worker that ran the stream before, every full block of the
// prompt + resumed tokens but the last one's is found in the pool.
TEST(SchedulerResumeTest, ResumedTokensAreCountedByWhereTheirKvCameFrom) {
  Harness h(64, {});
  const std::vector<uint32_t> prompt = h.Encode(kPrompts[0]);
  ASSERT_TRUE(h.Submit(1, prompt, MaxTokens(40)).ok());
  h.RunToCompletion();
  const std::vector<uint32_t> run = h.results()[1].tokens;
  ASSERT_GE(run.size(), 30u);
  const SchedulerStats before = h.scheduler()->Stats();
  EXPECT_EQ(before.resumed_pool_tokens + before.resumed_computed_tokens, 0);

  Harness cold(64, {});
  GenerationRequest r;
  r.resume.tokens.assign(run.begin(), run.begin() + 30);
  ASSERT_TRUE(cold.SubmitRequest(2, prompt, MaxTokens(40), "", r).ok());
  cold.RunToCompletion();
  const SchedulerStats c = cold.scheduler()->Stats();
  const auto resumed_len = static_cast<int64_t>(prompt.size() + 30);
  EXPECT_EQ(c.resumed_computed_tokens, resumed_len);
  EXPECT_EQ(c.resumed_pool_tokens, 0);
  EXPECT_EQ(c.resumed_tier_tokens, 0);

  // The worker that generated the run holds its blocks: the resume finds them.
  ASSERT_TRUE(h.SubmitRequest(3, prompt, MaxTokens(40), "", r).ok());
  h.RunToCompletion();
  const SchedulerStats w = h.scheduler()->Stats();
  EXPECT_EQ(w.resumed_pool_tokens + w.resumed_computed_tokens, resumed_len);
  EXPECT_EQ(w.resumed_pool_tokens % 16, 0);
  EXPECT_GE(w.resumed_pool_tokens, (resumed_len - 1) / 16 * 16 - 16);
  EXPECT_GT(w.resumed_pool_tokens, 0);
  EXPECT_EQ(h.results()[3].tokens, std::vector<uint32_t>(run.begin() + 30, run.end()));
}

// A migrated stream's client waits mid-stream: it is admitted before a new request that came
// first.
TEST(SchedulerResumeTest, MigratedStreamsAreAdmittedBeforeNewRequests) {
  SchedulerConfig one;
  one.max_running = 1;
  Harness h(64, one);
  ASSERT_TRUE(h.Submit(1, {1}, MaxTokens(8)).ok());
  h.RunToCompletion();
  const std::vector<uint32_t> out = h.results()[1].tokens;
  ASSERT_TRUE(h.Submit(2, h.Encode(kPrompts[1]), MaxTokens(8)).ok());
  GenerationRequest r;
  r.resume.tokens.assign(out.begin(), out.begin() + 3);
  ASSERT_TRUE(h.SubmitRequest(3, {1}, MaxTokens(8), "", std::move(r)).ok());
  while (h.results()[2].last.finish_reason == FinishReason::kNone &&
         h.results()[3].last.finish_reason == FinishReason::kNone) {
    h.scheduler()->Step();
  }
  EXPECT_EQ(h.results()[3].last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(h.results()[2].outputs, 0);  // not admitted yet
  h.RunToCompletion();
  std::vector<uint32_t> resumed(out.begin(), out.begin() + 3);
  resumed.insert(resumed.end(), h.results()[3].tokens.begin(), h.results()[3].tokens.end());
  EXPECT_EQ(resumed, out);
}

// A resume that could not have been streamed is refused at Submit, naming what is wrong.
TEST(SchedulerResumeTest, ImpossibleResumesAreRefused) {
  Harness h(64, {});
  ASSERT_TRUE(h.Submit(1, {1}, MaxTokens(10)).ok());
  h.RunToCompletion();
  const std::vector<uint32_t> out = h.results()[1].tokens;
  auto submit = [&](uint64_t id, std::vector<uint32_t> tokens, uint64_t offset,
                    SamplingOptions so) {
    GenerationRequest r;
    r.resume.tokens = std::move(tokens);
    r.resume.text_offset = offset;
    return h.SubmitRequest(id, {1}, std::move(so), "", std::move(r));
  };
  const std::vector<uint32_t> three(out.begin(), out.begin() + 3);
  EXPECT_THAT(submit(2, three, 1000, MaxTokens(10)).message(), HasSubstr("past the resumed"));
  EXPECT_THAT(submit(3, three, 0, MaxTokens(3)).message(), HasSubstr("nothing of max_tokens"));
  EXPECT_THAT(submit(4, {600}, 0, MaxTokens(10)).message(), HasSubstr("vocab size"));
  SamplingOptions stop = MaxTokens(10);
  stop.stop_token_ids = {out[1]};
  EXPECT_THAT(submit(5, three, 0, stop).message(), HasSubstr("ends generation"));
  EXPECT_THAT(submit(6, {}, 4, MaxTokens(10)).message(), HasSubstr("without resumed tokens"));
  auto choice = TestGrammar({grammar::ConstraintSpec::Kind::kChoice, "", {"Lily", "Tom"}});
  EXPECT_THAT(submit(7, three, 0, Constrained(choice, 0.0f)).message(),
              HasSubstr("does not continue the structured output"));
  std::vector<uint32_t> long_resume(600, out[0]);
  EXPECT_THAT(submit(8, long_resume, 0, MaxTokens(0)).message(), HasSubstr("context"));
  EXPECT_TRUE(submit(9, three, 0, stop.stop_token_ids.empty() ? stop : MaxTokens(10)).ok());
}

}  // namespace
}  // namespace pd::engine
