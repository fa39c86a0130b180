// ApplyLogitEdits (logit bias and penalties, kernels/sampling_params.h LogitEdit): the CPU op
// against hand-computed values and, bitwise, against kernels/reference on random edits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/reference/reference_ops.h"
#include "kernels/sampling.h"

namespace pd::kernels {
namespace {

using testing::CpuVariant;
using testing::CpuVariants;
using testing::RandomVector;
using testing::VariantScope;

LogitEditParams ParamsFor(std::vector<float>* logits, const std::vector<LogitEdit>& edits,
                          const std::vector<int32_t>& rows, int64_t num_seqs, int64_t vocab,
                          int64_t stride) {
  LogitEditParams p;
  p.logits = logits->data();
  p.edits = edits.data();
  p.rows = rows.data();
  p.num_edits = static_cast<int64_t>(edits.size());
  p.num_seqs = num_seqs;
  p.vocab_size = vocab;
  p.logits_stride = stride;
  return p;
}

// Each step of the rule, with values whose float results are exact.
TEST(LogitEditsTest, HandComputedTable) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float logit;
    LogitEdit edit;
    float want;
  };
  const Case cases[] = {
      // (2 + 1) / 2 - 0.5 - 0.25: bias, then the repetition penalty on a positive logit.
      {2.0f, {0, 1.0f, 2.0f, 0.5f, 0.25f}, 0.75f},
      // -1 * 2 - (0.5 * 3) - (-0.5): a negative logit is multiplied; a negative presence adds.
      {-1.0f, {0, 0.0f, 2.0f, 1.5f, -0.5f}, -3.0f},
      // The sign after the bias decides: 0.5 - 1 = -0.5, times 2.
      {0.5f, {0, -1.0f, 2.0f, 0.0f, 0.0f}, -1.0f},
      // Zero is not positive: multiplied (stays 0).
      {0.0f, {0, 0.0f, 2.0f, 0.0f, 0.0f}, 0.0f},
      // A repetition penalty below 1 favours the token.
      {3.0f, {0, 0.0f, 0.5f, 0.0f, 0.0f}, 6.0f},
      // logit_bias alone: +100 and -100.
      {1.0f, {0, 100.0f, 1.0f, 0.0f, 0.0f}, 101.0f},
      {1.0f, {0, -100.0f, 1.0f, 0.0f, 0.0f}, -99.0f},
      // A frequency penalty of 2 on a token seen 4 times (the host passes 2 * 4).
      {10.0f, {0, 0.0f, 1.0f, 8.0f, 2.0f}, 0.0f},
      // Infinities stay infinite.
      {-inf, {0, 5.0f, 2.0f, 1.0f, 1.0f}, -inf},
      {inf, {0, -100.0f, 1.5f, 2.0f, 2.0f}, inf},
  };
  for (const Case& c : cases) {
    std::vector<float> logits = {9.0f, c.logit, 9.0f};
    LogitEdit e = c.edit;
    e.token = 1;
    const std::vector<LogitEdit> edits = {e};
    const std::vector<int32_t> rows = {0};
    ASSERT_TRUE(ApplyLogitEdits(OpContext{}, ParamsFor(&logits, edits, rows, 1, 3, 3)).ok());
    EXPECT_EQ(logits[1], c.want) << "logit " << c.logit << " bias " << c.edit.bias;
    EXPECT_EQ(logits[0], 9.0f);  // other tokens untouched
    EXPECT_EQ(logits[2], 9.0f);
    std::vector<float> ref = {9.0f, c.logit, 9.0f};
    reference::ApplyLogitEdits(ParamsFor(&ref, edits, rows, 1, 3, 3));
    EXPECT_EQ(ref[1], c.want);
  }
  // A masked (NaN) logit stays NaN: the sampler still never picks it.
  std::vector<float> logits = {nan};
  const std::vector<LogitEdit> edits = {{0, 100.0f, 2.0f, -2.0f, -2.0f}};
  const std::vector<int32_t> rows = {0};
  ASSERT_TRUE(ApplyLogitEdits(OpContext{}, ParamsFor(&logits, edits, rows, 1, 1, 1)).ok());
  EXPECT_TRUE(std::isnan(logits[0]));
}

// Random edits over several rows (strided): the CPU op equals the reference bit for bit, for
// every CPU variant, and the rows and tokens without edits are untouched.
TEST(LogitEditsTest, MatchesReferenceBitwise) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> pen(-2.0f, 2.0f), rep(0.05f, 4.0f), bias(-100.0f, 100.0f);
  constexpr int64_t kSeqs = 5, kVocab = 3000, kStride = 3007;
  const std::vector<float> logits = RandomVector(kSeqs * kStride, rng, 5.0f);
  std::vector<LogitEdit> edits;
  std::vector<int32_t> rows;
  for (int64_t s = 0; s < kSeqs; ++s) {
    if (s == 2) continue;  // a row without edits
    for (int32_t t = 0; t < kVocab; ++t) {
      if (rng() % 4 != 0) continue;
      LogitEdit e;
      e.token = t;
      e.bias = rng() % 3 == 0 ? bias(rng) : 0.0f;
      e.repetition = rng() % 2 == 0 ? rep(rng) : 1.0f;
      e.frequency = pen(rng) * static_cast<float>(rng() % 9);
      e.presence = pen(rng);
      edits.push_back(e);
      rows.push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<float> want = logits;
  reference::ApplyLogitEdits(ParamsFor(&want, edits, rows, kSeqs, kVocab, kStride));
  for (const CpuVariant& variant : CpuVariants()) {
    VariantScope scope(variant);
    std::vector<float> got = logits;
    ASSERT_TRUE(
        ApplyLogitEdits(scope.ctx(), ParamsFor(&got, edits, rows, kSeqs, kVocab, kStride)).ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << variant.Name();
  }
  EXPECT_EQ(std::memcmp(&want[2 * kStride], &logits[2 * kStride], kStride * sizeof(float)), 0);
  for (int64_t s = 0; s < kSeqs; ++s) {  // the stride padding is never written
    for (int64_t t = kVocab; t < kStride; ++t) {
      EXPECT_EQ(want[s * kStride + t], logits[s * kStride + t]);
    }
  }
}

TEST(LogitEditsDispatchTest, RejectsBadInput) {
  std::vector<float> logits(6, 1.0f);
  std::vector<LogitEdit> edits = {{1, 1.0f, 1.0f, 0.0f, 0.0f}};
  std::vector<int32_t> rows = {1};
  const LogitEditParams good = ParamsFor(&logits, edits, rows, 2, 3, 3);
  EXPECT_TRUE(ApplyLogitEdits(OpContext{}, good).ok());
  EXPECT_EQ(logits[4], 2.0f);
  LogitEditParams none;  // nothing to do: nothing is read
  EXPECT_TRUE(ApplyLogitEdits(OpContext{}, none).ok());
  LogitEditParams bad = good;
  bad.rows = nullptr;
  EXPECT_EQ(ApplyLogitEdits(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.logits_stride = 2;
  EXPECT_EQ(ApplyLogitEdits(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.num_seqs = 1;  // row 1 is out of range
  const absl::Status row = ApplyLogitEdits(OpContext{}, bad);
  EXPECT_EQ(row.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(row.message().find("row 1"), absl::string_view::npos) << row;
  std::vector<LogitEdit> past = {{3, 1.0f, 1.0f, 0.0f, 0.0f}};  // token 3 of a vocab of 3
  bad = ParamsFor(&logits, past, rows, 2, 3, 3);
  EXPECT_EQ(ApplyLogitEdits(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(logits[4], 2.0f);  // refused calls change nothing
}

}  // namespace
}  // namespace pd::kernels
