#include "kernels/logprobs.h"

#include <cmath>
#include <cstdint>
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

constexpr float kInf = std::numeric_limits<float>::infinity();

// What one call produced for every row.
struct Out {
  std::vector<float> token_logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// Runs LogProbs (dispatch under ctx, or the reference) over `rows` rows of `vocab` logits,
// `stride` apart, asking for `tokens` (empty = no token logprobs) and `top_n` alternatives.
Out RunLogProbs(const OpContext& ctx, const std::vector<float>& logits, int64_t rows, int64_t vocab,
                int64_t stride, const std::vector<int32_t>& tokens, int32_t top_n,
                bool reference = false) {
  Out o;
  o.token_logprobs.assign(tokens.size(), 12345.0f);
  o.top_ids.assign(rows * top_n, -7);
  o.top_logprobs.assign(rows * top_n, 12345.0f);
  LogProbsParams p;
  p.logits = logits.data();
  p.num_seqs = rows;
  p.vocab_size = vocab;
  p.logits_stride = stride;
  if (!tokens.empty()) {
    p.tokens = tokens.data();
    p.out_token_logprobs = o.token_logprobs.data();
  }
  p.top_n = top_n;
  p.out_top_ids = top_n > 0 ? o.top_ids.data() : nullptr;
  p.out_top_logprobs = top_n > 0 ? o.top_logprobs.data() : nullptr;
  if (reference) {
    reference::LogProbs(p);
  } else {
    const absl::Status s = LogProbs(ctx, p);
    EXPECT_TRUE(s.ok()) << s;
  }
  return o;
}

// One row, every token's logprob (via tokens) plus `top_n` alternatives, from the reference.
Out Reference(const std::vector<float>& row, int32_t top_n) {
  std::vector<int32_t> tokens(row.size());
  for (size_t i = 0; i < row.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i);
  }
  // Each token as its own row (the same logits repeated, stride 0 is not allowed: copy).
  std::vector<float> rows;
  for (size_t i = 0; i < row.size(); ++i) {
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const int64_t v = static_cast<int64_t>(row.size());
  Out all = RunLogProbs(OpContext{}, rows, v, v, v, tokens, top_n, /*reference=*/true);
  all.top_ids.resize(top_n);
  all.top_logprobs.resize(top_n);
  return all;
}

// Same value, NaN equal to NaN and infinities exact; finite values within the op's tolerance:
// the f32 vector exp (2e-7 relative) moves log(sum) by ~2e-7, plus the final f32 rounding.
void ExpectClose(float got, float want, const std::string& what) {
  if (std::isnan(want) || std::isinf(want)) {
    EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want)
        << what << ": got " << got << " want " << want;
    return;
  }
  EXPECT_NEAR(got, want, 2e-6 + 1e-6 * std::abs(want)) << what;
}

void ExpectMatches(const Out& got, const Out& want, const std::string& what) {
  ASSERT_EQ(got.token_logprobs.size(), want.token_logprobs.size());
  for (size_t i = 0; i < got.token_logprobs.size(); ++i) {
    ExpectClose(got.token_logprobs[i], want.token_logprobs[i],
                what + " token row " + std::to_string(i));
  }
  EXPECT_EQ(got.top_ids, want.top_ids) << what;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
  for (size_t i = 0; i < got.top_logprobs.size(); ++i) {
    ExpectClose(got.top_logprobs[i], want.top_logprobs[i], what + " top " + std::to_string(i));
  }
}

// The reference on cases worked out by hand.
TEST(LogProbsReferenceTest, HandComputedRows) {
  // p = {0.1, 0.2, 0.3, 0.4}: log p exactly.
  {
    const Out o = Reference({std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)}, 3);
    const double want[] = {std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.4)};
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(o.token_logprobs[i], want[i], 1e-6) << i;
    }
    EXPECT_EQ(o.top_ids, (std::vector<int32_t>{3, 2, 1}));
    EXPECT_NEAR(o.top_logprobs[0], std::log(0.4), 1e-6);
  }
  // Ties rank by id; log p = 5 - log(2 e^5 + e^1).
  {
    const Out o = Reference({1, 5, 5}, 3);
    const double tied = 5.0 - std::log(2 * std::exp(5.0) + std::exp(1.0));
    EXPECT_EQ(o.top_ids, (std::vector<int32_t>{1, 2, 0}));
    EXPECT_NEAR(o.top_logprobs[0], tied, 1e-6);
    EXPECT_NEAR(o.top_logprobs[1], tied, 1e-6);
    EXPECT_NEAR(o.token_logprobs[0], 1.0 - std::log(2 * std::exp(5.0) + std::exp(1.0)), 1e-6);
  }
  // Vocabulary of one: probability 1.
  {
    const Out o = Reference({-3}, 20);
    EXPECT_EQ(o.token_logprobs[0], 0.0f);
    EXPECT_EQ(o.top_ids[0], 0);
    EXPECT_EQ(o.top_logprobs[0], 0.0f);
    EXPECT_EQ(o.top_ids[1], -1);  // past the vocabulary: padding
    EXPECT_EQ(o.top_logprobs[19], -kInf);
  }
  // Masked (-inf) and NaN logits have p = 0 and are never alternatives.
  {
    const Out o = Reference({-kInf, 0, NAN, 0}, 4);
    EXPECT_EQ(o.token_logprobs[0], -kInf);
    EXPECT_NEAR(o.token_logprobs[1], std::log(0.5), 1e-7);
    EXPECT_EQ(o.token_logprobs[2], -kInf);
    EXPECT_EQ(o.top_ids, (std::vector<int32_t>{1, 3, -1, -1}));
  }
  // +inf logits share all the mass.
  {
    const Out o = Reference({kInf, 1e30f, kInf, NAN, -kInf}, 3);
    EXPECT_NEAR(o.token_logprobs[0], -std::log(2.0), 1e-7);
    EXPECT_EQ(o.token_logprobs[1], -kInf);
    EXPECT_EQ(o.top_ids, (std::vector<int32_t>{0, 2, -1}));
  }
  // Every non-NaN logit -inf: uniform over them (what Sample draws from).
  {
    const Out o = Reference({-kInf, NAN, -kInf, -kInf}, 4);
    EXPECT_NEAR(o.token_logprobs[0], -std::log(3.0), 1e-7);
    EXPECT_EQ(o.token_logprobs[1], -kInf);
    EXPECT_EQ(o.top_ids, (std::vector<int32_t>{0, 2, 3, -1}));
  }
  // No non-NaN logit: no distribution.
  {
    const Out o = Reference({NAN, NAN}, 2);
    EXPECT_TRUE(std::isnan(o.token_logprobs[0]));
    EXPECT_EQ(o.top_ids, (std::vector<int32_t>{-1, -1}));
    EXPECT_EQ(o.top_logprobs[0], -kInf);
  }
  // Huge logits: max-subtracted, so nothing overflows; a gap beyond f32 range rounds to -inf
  // but the token still counts as an alternative.
  {
    const Out o = Reference({1e30f, 0, -1e30f}, 3);
    EXPECT_EQ(o.token_logprobs[0], 0.0f);
    EXPECT_EQ(o.token_logprobs[1], -1e30f);
    EXPECT_EQ(o.token_logprobs[2], -2e30f);
    const Out big = Reference({3e38f, -3e38f, 3e38f}, 3);
    EXPECT_NEAR(big.token_logprobs[0], -std::log(2.0), 1e-7);
    EXPECT_EQ(big.token_logprobs[1], -kInf);
    EXPECT_EQ(big.top_ids, (std::vector<int32_t>{0, 2, 1}));
  }
}

// The edge rows above, through every CPU variant, equal the reference.
TEST(LogProbsTest, EdgeRowsMatchReference) {
  const std::vector<std::vector<float>> rows = {
      {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)},
      {1, 5, 5},
      {-3},
      {-kInf, 0, NAN, 0},
      {kInf, 1e30f, kInf, NAN, -kInf},
      {-kInf, NAN, -kInf, -kInf},
      {NAN, NAN},
      {1e30f, 0, -1e30f},
      {3e38f, -3e38f, 3e38f},
      {-3e38f, -3e38f},
      std::vector<float>(70, 2.5f),   // all tied, several vector chunks
      std::vector<float>(70, -kInf),  // all masked, several chunks
      std::vector<float>(33, NAN),    // all NaN, several chunks
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t v = static_cast<int64_t>(rows[r].size());
    std::vector<float> batch;
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < v; ++t) {
      batch.insert(batch.end(), rows[r].begin(), rows[r].end());
      tokens.push_back(static_cast<int32_t>(t));
    }
    for (int32_t n : {0, 1, 3, 20}) {
      const Out want = RunLogProbs(OpContext{}, batch, v, v, v, tokens, n, /*reference=*/true);
      for (const CpuVariant& variant : CpuVariants()) {
        VariantScope scope(variant);
        ExpectMatches(
            RunLogProbs(scope.ctx(), batch, v, v, v, tokens, n), want,
            "row " + std::to_string(r) + " n " + std::to_string(n) + " " + variant.Name());
      }
    }
  }
}

// Random shapes (vocabularies around the vector widths and real ones), strided rows, ties,
// masked and NaN logits, large magnitudes: every variant equals the reference.
TEST(LogProbsTest, RandomShapesMatchReference) {
  std::mt19937 rng(17);
  const int64_t vocabs[] = {1, 2, 7, 15, 16, 17, 63, 64, 65, 129, 1000, 32000, 128256};
  for (int64_t vocab : vocabs) {
    const int64_t rows = vocab > 10000 ? 2 : 5;
    const int64_t stride = vocab + (vocab % 3);
    std::vector<float> logits(rows * stride, NAN);  // the gap past vocab is never read
    std::vector<int32_t> tokens;
    for (int64_t s = 0; s < rows; ++s) {
      std::vector<float> row = RandomVector(vocab, rng, s == 3 ? 30.0f : s == 4 ? 1e30f : 3.0f);
      if (s == 1) {
        for (int64_t i = 0; i < vocab; i += 2) {
          row[i] = std::round(row[i]);  // many exact ties
        }
      }
      if (s == 2 && vocab > 4) {
        row[1] = -kInf;
        row[vocab / 2] = NAN;
        row[vocab - 1] = 1e4f;  // one dominant token: the rest is far below the max
      }
      std::copy(row.begin(), row.end(), logits.begin() + s * stride);
      tokens.push_back(static_cast<int32_t>(rng() % vocab));
    }
    // The reference sorts whole rows: run it once, then cut its top-20 down to each n.
    const Out all = RunLogProbs(OpContext{}, logits, rows, vocab, stride, tokens, 20, true);
    for (int32_t n : {0, 1, 5, 20}) {
      Out want;
      want.token_logprobs = all.token_logprobs;
      for (int64_t s = 0; s < rows; ++s) {
        want.top_ids.insert(want.top_ids.end(), all.top_ids.begin() + s * 20,
                            all.top_ids.begin() + s * 20 + n);
        want.top_logprobs.insert(want.top_logprobs.end(), all.top_logprobs.begin() + s * 20,
                                 all.top_logprobs.begin() + s * 20 + n);
      }
      for (const CpuVariant& variant : CpuVariants()) {
        VariantScope scope(variant);
        ExpectMatches(
            RunLogProbs(scope.ctx(), logits, rows, vocab, stride, tokens, n), want,
            "vocab " + std::to_string(vocab) + " n " + std::to_string(n) + " " + variant.Name());
      }
    }
  }
}

// A batched call equals one call per row, whatever the team; alternatives alone (no tokens)
// give the same alternatives.
TEST(LogProbsTest, BatchedEqualsRowByRow) {
  std::mt19937 rng(3);
  const int64_t vocab = 5000, rows = 7;
  std::vector<float> logits = RandomVector(rows * vocab, rng, 2.0f);
  std::vector<int32_t> tokens;
  for (int64_t s = 0; s < rows; ++s) {
    tokens.push_back(static_cast<int32_t>(rng() % vocab));
  }
  VariantScope threaded({cpu::DetectedIsa(), 3});
  const Out together = RunLogProbs(threaded.ctx(), logits, rows, vocab, vocab, tokens, 8);
  const Out no_tokens = RunLogProbs(threaded.ctx(), logits, rows, vocab, vocab, {}, 8);
  EXPECT_EQ(no_tokens.top_ids, together.top_ids);
  EXPECT_EQ(no_tokens.top_logprobs, together.top_logprobs);
  for (int64_t s = 0; s < rows; ++s) {
    const std::vector<float> row(logits.begin() + s * vocab, logits.begin() + (s + 1) * vocab);
    const Out alone = RunLogProbs(OpContext{}, row, 1, vocab, vocab, {tokens[s]}, 8);
    EXPECT_EQ(alone.token_logprobs[0], together.token_logprobs[s]) << s;
    EXPECT_EQ(alone.top_ids, std::vector<int32_t>(together.top_ids.begin() + s * 8,
                                                  together.top_ids.begin() + (s + 1) * 8));
    EXPECT_EQ(alone.top_logprobs, std::vector<float>(together.top_logprobs.begin() + s * 8,
                                                     together.top_logprobs.begin() + (s + 1) * 8));
  }
}

// The top-1 alternative is the greedy token, ties and NaN included; the probabilities of a
// whole small vocabulary sum to 1.
TEST(LogProbsTest, TopOneIsTheGreedyTokenAndMassIsOne) {
  std::mt19937 rng(5);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> row = RandomVector(17, rng, 2.0f);
    if (i % 3 == 0) {
      row[i % 17] = row[(i + 5) % 17] = 9.0f;  // a tie for the max
    }
    if (i % 4 == 0) {
      row[(i + 1) % 17] = NAN;
    }
    int32_t greedy = -1;
    SamplingParams sp;
    sp.logits = row.data();
    sp.out_tokens = &greedy;
    sp.num_seqs = 1;
    sp.vocab_size = 17;
    sp.logits_stride = 17;
    ASSERT_TRUE(Sample(OpContext{}, sp).ok());
    const Out o = RunLogProbs(OpContext{}, row, 1, 17, 17, {greedy}, 20);
    EXPECT_EQ(o.top_ids[0], greedy) << i;
    EXPECT_EQ(o.top_logprobs[0], o.token_logprobs[0]);
    double mass = 0.0;
    for (int32_t j = 0; j < 20; ++j) {
      if (o.top_ids[j] >= 0) {
        mass += std::exp(static_cast<double>(o.top_logprobs[j]));
        if (j > 0) {
          EXPECT_GE(o.top_logprobs[j - 1], o.top_logprobs[j]);
        }
      }
    }
    EXPECT_NEAR(mass, 1.0, 1e-5) << i;
  }
}

TEST(LogProbsDispatchTest, RejectsBadInput) {
  std::vector<float> logits = {0, 1, 2, 3, 4, 5};
  std::vector<int32_t> ids(4);
  std::vector<float> lps(4);
  LogProbsParams p;
  p.logits = logits.data();
  p.num_seqs = 2;
  p.vocab_size = 3;
  p.logits_stride = 3;
  int32_t tokens[2] = {1, 2};
  float token_lps[2];
  p.tokens = tokens;
  p.out_token_logprobs = token_lps;
  p.top_n = 2;
  p.out_top_ids = ids.data();
  p.out_top_logprobs = lps.data();
  ASSERT_TRUE(LogProbs(OpContext{}, p).ok());
  auto code = [](const LogProbsParams& bad) { return LogProbs(OpContext{}, bad).code(); };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  LogProbsParams bad = p;
  bad.logits = nullptr;
  EXPECT_EQ(code(bad), kInvalid);
  bad = p;
  bad.num_seqs = 0;
  EXPECT_EQ(code(bad), kInvalid);
  bad = p;
  bad.logits_stride = 2;
  EXPECT_EQ(code(bad), kInvalid);
  bad = p;
  bad.top_n = kMaxTopLogprobs + 1;
  EXPECT_EQ(code(bad), kInvalid);
  bad.top_n = -1;
  EXPECT_EQ(code(bad), kInvalid);
  bad = p;
  bad.out_token_logprobs = nullptr;
  EXPECT_EQ(code(bad), kInvalid);
  bad = p;
  bad.out_top_ids = nullptr;
  EXPECT_EQ(code(bad), kInvalid);
  bad = p;
  tokens[1] = 3;
  EXPECT_EQ(code(bad), kInvalid);
  tokens[1] = -1;
  const absl::Status negative = LogProbs(OpContext{}, bad);
  EXPECT_EQ(negative.code(), kInvalid);
  EXPECT_NE(negative.message().find("tokens[1]"), absl::string_view::npos) << negative;
  tokens[1] = 2;
  bad = p;
  bad.out_top_logprobs = logits.data() + 4;  // writes into the logits
  EXPECT_EQ(code(bad), kInvalid);
  // Nothing asked but valid: fine. Top-N alone: fine.
  bad = p;
  bad.tokens = nullptr;
  bad.out_token_logprobs = nullptr;
  EXPECT_TRUE(LogProbs(OpContext{}, bad).ok());
  bad.top_n = 0;
  bad.out_top_ids = nullptr;
  bad.out_top_logprobs = nullptr;
  EXPECT_TRUE(LogProbs(OpContext{}, bad).ok());
  // No CUDA implementation: the scheduler's logits are host memory on every device.
  EXPECT_FALSE(SupportsLogProbs(Device::kCuda));
  EXPECT_TRUE(SupportsLogProbs(Device::kCpu));
  EXPECT_EQ(LogProbs(OpContext{Device::kCuda, nullptr, nullptr}, p).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pd::kernels
