// The scheduler with logit bias, presence/frequency/repetition penalties and min_p (issue #31
// section 3): greedy tokens are the argmax of the penalised logits (an independent dense
// implementation of the rule over recomputed logits rows), and every path gives the same
// output: alone, batched and preempted, with the staged (decode-graph) forward pass, resumed
// after a migration from any output boundary, and with the first token sampled by a prefill
// worker.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "engine/scheduler/scheduler.h"
#include "engine/scheduler/scheduler_test_harness.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using scheduler_testing::Harness;
using scheduler_testing::kPrompts;
using scheduler_testing::MaxTokens;
using scheduler_testing::Result;

// The options each test runs: greedy with every penalty, seeded sampling with penalties,
// min_p and top-k, a repetition penalty alone, and logit_bias alone.
std::vector<SamplingOptions> PenaltyCases() {
  std::vector<SamplingOptions> cases;
  SamplingOptions greedy = MaxTokens(40);
  greedy.frequency_penalty = 1.5f;
  greedy.presence_penalty = 0.5f;
  greedy.repetition_penalty = 1.3f;
  greedy.logit_bias = {{13, 3.0f}, {280, -4.0f}};
  cases.push_back(greedy);
  SamplingOptions sampled = MaxTokens(40);
  sampled.temperature = 0.9f;
  sampled.seed = 31;
  sampled.top_k = 30;
  sampled.min_p = 0.05f;
  sampled.frequency_penalty = 0.8f;
  sampled.presence_penalty = -0.3f;
  sampled.logprobs = 2;
  cases.push_back(sampled);
  SamplingOptions repetition = MaxTokens(40);
  repetition.repetition_penalty = 1.8f;
  cases.push_back(repetition);
  SamplingOptions bias = MaxTokens(30);
  bias.logit_bias = {{1, -100.0f}, {2, -100.0f}, {400, 7.5f}};
  cases.push_back(bias);
  return cases;
}

// The penalised logits of the token after `generated` (dense, one token at a time: the rule of
// vLLM's apply_logits_bias + apply_penalties, written independently of kernels::LogitEdit).
std::vector<float> Penalised(std::vector<float> row, const SamplingOptions& so,
                             const std::vector<uint32_t>& prompt,
                             const std::vector<uint32_t>& generated) {
  std::map<uint32_t, int> count;
  for (uint32_t t : generated) ++count[t];
  for (size_t t = 0; t < row.size(); ++t) {
    for (const auto& [id, b] : so.logit_bias) {
      if (id == t) row[t] += b;
    }
    const int c = count.count(t) > 0 ? count[t] : 0;
    const bool seen = c > 0 || std::find(prompt.begin(), prompt.end(), t) != prompt.end();
    if (seen) {
      row[t] = row[t] > 0 ? row[t] / so.repetition_penalty : row[t] * so.repetition_penalty;
    }
    row[t] -= so.frequency_penalty * static_cast<float>(c);
    row[t] -= c > 0 ? so.presence_penalty : 0.0f;
  }
  return row;
}

TEST(SchedulerPenaltiesTest, GreedyTokensAreTheArgmaxOfThePenalisedLogits) {
  for (const SamplingOptions& so : PenaltyCases()) {
    if (so.temperature > 0) continue;
    Harness h(64, {});
    const std::vector<uint32_t> prompt = h.Encode(kPrompts[1]);
    ASSERT_TRUE(h.Submit(1, prompt, so).ok());
    ASSERT_TRUE(h.Submit(2, prompt, MaxTokens(so.max_tokens)).ok());
    h.RunToCompletion();
    const std::vector<uint32_t>& got = h.results()[1].tokens;
    ASSERT_EQ(got.size(), so.max_tokens) << h.results()[1].last.status;
    EXPECT_NE(got, h.results()[2].tokens);  // the options change the output
    const std::vector<std::vector<float>> rows = h.LogitsAlong(prompt, got);
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<uint32_t> before(got.begin(), got.begin() + i);
      const std::vector<float> row = Penalised(rows[i], so, prompt, before);
      const auto best =
          static_cast<uint32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      ASSERT_EQ(got[i], best) << "step " << i;
    }
    if (so.logit_bias.size() == 3) {  // -100 on ids 1 and 2 (BOS, EOS): never generated
      EXPECT_EQ(std::count(got.begin(), got.end(), 1u) + std::count(got.begin(), got.end(), 2u), 0);
    }
  }
}

TEST(SchedulerPenaltiesTest, SameOutputAloneBatchedPreemptedAndStaged) {
  const std::vector<SamplingOptions> cases = PenaltyCases();
  std::vector<std::vector<uint32_t>> alone;
  for (size_t c = 0; c < cases.size(); ++c) {
    Harness h(64, {});
    ASSERT_TRUE(h.Submit(c, h.Encode(kPrompts[c]), cases[c]).ok());
    h.RunToCompletion();
    alone.push_back(h.results()[c].tokens);
  }
  for (bool staged : {false, true}) {
    Harness h(8, {}, Clock::Real(), staged);  // small pool: requests are preempted
    for (size_t c = 0; c < cases.size(); ++c) {
      ASSERT_TRUE(h.Submit(c, h.Encode(kPrompts[c]), cases[c]).ok());
    }
    h.RunToCompletion();
    EXPECT_GT(h.scheduler()->Stats().preemptions, 0);
    for (size_t c = 0; c < cases.size(); ++c) {
      EXPECT_EQ(h.results()[c].tokens, alone[c]) << "case " << c << " staged " << staged;
    }
  }
}

// A migrated request rebuilds its counts from the resumed tokens: resumed at each of a few
// output boundaries, next to a preempting neighbour, it continues exactly as the run did.
TEST(SchedulerPenaltiesTest, ResumedRequestContinuesTheRunExactly) {
  const std::vector<SamplingOptions> cases = PenaltyCases();
  for (size_t c = 0; c < cases.size(); ++c) {
    Harness base(64, {});
    const std::vector<uint32_t> prompt = base.Encode(kPrompts[c]);
    ASSERT_TRUE(base.Submit(1, prompt, cases[c]).ok());
    base.RunToCompletion();
    const Result want = base.results()[1];
    ASSERT_GT(want.marks.size(), 3u);
    const size_t n = want.marks.size();
    for (size_t m : {size_t{0}, n / 2, n - 2}) {
      const Result::Mark& mark = want.marks[m];
      Harness h(14, {});
      GenerationRequest r;
      r.resume.tokens.assign(want.tokens.begin(), want.tokens.begin() + mark.tokens);
      r.resume.text_offset = mark.text_offset;
      ASSERT_TRUE(h.SubmitRequest(2, prompt, cases[c], "", std::move(r)).ok());
      ASSERT_TRUE(h.Submit(3, h.Encode(kPrompts[(c + 1) % 5]), MaxTokens(50)).ok());
      h.RunToCompletion();
      std::vector<uint32_t> tokens(want.tokens.begin(), want.tokens.begin() + mark.tokens);
      tokens.insert(tokens.end(), h.results()[2].tokens.begin(), h.results()[2].tokens.end());
      EXPECT_EQ(tokens, want.tokens) << "case " << c << " resumed after output " << m;
      const std::vector<TokenLogprob>& lp = h.results()[2].logprobs;
      for (size_t t = 0; t < lp.size(); ++t) {
        EXPECT_EQ(lp[t].logprob, want.logprobs[mark.tokens + t].logprob) << c << " " << t;
      }
    }
  }
}

// Disaggregated: the prefill worker samples the first token from the prompt (and, for a
// resumed request, the resumed tokens); the decode worker the rest. Both build the same
// edits, so the output is the local one.
TEST(SchedulerPenaltiesTest, RemotePrefillGivesTheLocalOutput) {
  const std::vector<SamplingOptions> cases = PenaltyCases();
  for (size_t c = 0; c < cases.size(); ++c) {
    for (size_t resumed : {size_t{0}, size_t{5}}) {
      Harness local(64, {});
      const std::vector<uint32_t> prompt = local.Encode(kPrompts[c]);
      ASSERT_TRUE(local.Submit(1, prompt, cases[c]).ok());
      local.RunToCompletion();
      const std::vector<uint32_t>& want = local.results()[1].tokens;
      const std::vector<uint32_t> resume(want.begin(), want.begin() + resumed);

      Harness p(64, {}), d(64, {});
      std::optional<RemotePrefillTarget> target;
      GenerationRequest dr;
      dr.remote_prefill = [&](RemotePrefillTarget t) { target = std::move(t); };
      dr.resume.tokens = resume;
      ASSERT_TRUE(d.SubmitRequest(1, prompt, cases[c], "", std::move(dr)).ok());
      EXPECT_FALSE(d.scheduler()->Step());
      ASSERT_TRUE(target.has_value());
      std::optional<PrefilledBlocks> prefilled;
      GenerationRequest pr;
      pr.on_prefilled = [&](PrefilledBlocks b) { prefilled = std::move(b); };
      pr.resume.tokens = resume;
      ASSERT_TRUE(p.SubmitRequest(7, prompt, cases[c], "", std::move(pr)).ok());
      while (!prefilled.has_value()) {
        ASSERT_TRUE(p.scheduler()->Step());
      }
      EXPECT_EQ(prefilled->first_token, want[resumed]) << "case " << c;
      for (size_t b = 0; b < target->block_ids.size(); ++b) {
        std::memcpy(d.pool()->BlockData(target->block_ids[b]),
                    p.pool()->BlockData(prefilled->block_ids[target->first_block + b]),
                    d.pool()->block_bytes());
      }
      ASSERT_TRUE(p.scheduler()->ReleasePrefilled(RequestId(7)).ok());
      ASSERT_TRUE(d.scheduler()
                      ->CompleteRemotePrefill(RequestId(1), prefilled->first_token,
                                              prefilled->first_logprob)
                      .ok());
      d.RunToCompletion();
      std::vector<uint32_t> tokens = resume;
      tokens.insert(tokens.end(), d.results()[1].tokens.begin(), d.results()[1].tokens.end());
      EXPECT_EQ(tokens, want) << "case " << c << " resumed " << resumed;
    }
  }
}

TEST(SchedulerPenaltiesTest, SubmitRejectsOutOfRangeOptions) {
  Harness h(64, {});
  SamplingOptions so = MaxTokens(4);
  so.logit_bias = {{512, 1.0f}};  // stories260K's vocabulary is 512
  EXPECT_EQ(h.Submit(1, {1}, so).code(), absl::StatusCode::kInvalidArgument);
  so.logit_bias = {{5, 101.0f}};
  EXPECT_EQ(h.Submit(2, {1}, so).code(), absl::StatusCode::kInvalidArgument);
  so.logit_bias = {{5, 1.0f}, {5, 2.0f}};
  EXPECT_EQ(h.Submit(3, {1}, so).code(), absl::StatusCode::kInvalidArgument);
  so = MaxTokens(4);
  so.frequency_penalty = 2.5f;
  EXPECT_EQ(h.Submit(4, {1}, so).code(), absl::StatusCode::kInvalidArgument);
  so = MaxTokens(4);
  so.repetition_penalty = 0.0f;
  EXPECT_EQ(h.Submit(5, {1}, so).code(), absl::StatusCode::kInvalidArgument);
  so = MaxTokens(4);
  so.min_p = -0.5f;
  EXPECT_EQ(h.Submit(6, {1}, so).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::engine
