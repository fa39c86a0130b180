#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

using testing::CpuVariant;
using testing::CpuVariants;
using testing::RandomVector;
using testing::VariantScope;

// Per-row sampling settings plus the buffers a call needs.
struct Rows {
  std::vector<float> logits;
  int64_t vocab = 0;
  std::vector<float> temperature;
  std::vector<int32_t> top_k;
  std::vector<float> top_p;
  std::vector<uint64_t> seeds, steps;
  std::vector<float> min_p;  // empty = none (else one per row)
  int64_t size() const { return static_cast<int64_t>(temperature.size()); }
  void Add(const std::vector<float>& row, float t, int32_t k, float p, uint64_t seed,
           uint64_t step) {
    ASSERT_TRUE(vocab == 0 || vocab == static_cast<int64_t>(row.size())) << "ragged rows";
    vocab = static_cast<int64_t>(row.size());
    logits.insert(logits.end(), row.begin(), row.end());
    temperature.push_back(t);
    top_k.push_back(k);
    top_p.push_back(p);
    seeds.push_back(seed);
    steps.push_back(step);
  }
};

// Samples every row through dispatch (ctx) or, with reference = true, the reference.
std::vector<int32_t> SampleRows(const OpContext& ctx, const Rows& r, bool reference = false) {
  std::vector<int32_t> out(r.size(), -1);
  SamplingParams p;
  p.logits = r.logits.data();
  p.out_tokens = out.data();
  p.num_seqs = r.size();
  p.vocab_size = r.vocab;
  p.logits_stride = r.vocab;
  p.temperature = r.temperature.data();
  p.top_k = r.top_k.data();
  p.top_p = r.top_p.data();
  p.seeds = r.seeds.data();
  p.steps = r.steps.data();
  p.min_p = r.min_p.empty() ? nullptr : r.min_p.data();
  std::vector<uint8_t> workspace(SamplingWorkspaceBytes(ctx, p));
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  if (reference) {
    reference::Sample(p);
  } else {
    const absl::Status s = Sample(ctx, p);
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

TEST(SamplingUniformTest, DeterministicAndUniform) {
  EXPECT_EQ(SamplingUniform(1, 2), SamplingUniform(1, 2));
  EXPECT_NE(SamplingUniform(1, 2), SamplingUniform(1, 3));
  EXPECT_NE(SamplingUniform(1, 2), SamplingUniform(2, 2));
  EXPECT_NE(SamplingUniform(0, 1), SamplingUniform(1, 0));
  // 100k steps of one seed into 10 bins: each within 4.5 sigma of 10000 (fixed, no flakiness).
  std::vector<int> bins(10);
  for (uint64_t step = 0; step < 100000; ++step) {
    const double u = SamplingUniform(42, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[static_cast<int>(u * 10)];
  }
  for (int b : bins) {
    EXPECT_NEAR(b, 10000, 4.5 * std::sqrt(100000 * 0.1 * 0.9));
  }
}

TEST(SampleTest, GreedyArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {
      1,         7,         NAN, 7,         -INFINITY, 3,    // row 0: ids 1 and 3 tie
      NAN,       NAN,       NAN, NAN,       NAN,       NAN,  // row 1: all NaN -> 0
      -INFINITY, -INFINITY, -2,  -INFINITY, -2,        -5};  // row 2: 2
  std::vector<int32_t> out(3, -1);
  SamplingParams p;
  p.logits = logits.data();
  p.out_tokens = out.data();
  p.num_seqs = 3;
  p.vocab_size = 6;
  p.logits_stride = 6;
  for (const CpuVariant& variant : CpuVariants()) {
    VariantScope scope(variant);
    ASSERT_TRUE(Sample(scope.ctx(), p).ok());  // temperature null: all greedy, no workspace
    EXPECT_EQ(out, (std::vector<int32_t>{1, 0, 2}));
  }
  std::vector<int32_t> want(3);
  p.out_tokens = want.data();
  reference::Sample(p);
  EXPECT_EQ(want, (std::vector<int32_t>{1, 0, 2}));
  // temperature <= 0 per row is greedy too, whatever the other settings.
  Rows r;
  r.Add({0, 1, 5, 5}, 0.0f, 3, 0.5f, 1, 1);
  r.Add({9, 1, 5, 5}, -1.0f, 0, 1.0f, 1, 1);
  EXPECT_EQ(SampleRows(OpContext{}, r), (std::vector<int32_t>{2, 0}));
}

// Temperatures below kMinSamplingTemperature (subnormals included, whose reciprocal overflows
// to +inf) are greedy on every CPU variant and in the reference; at and above it they sample.
// The row has a tie at the top (ids 1 and 2) and id 3 just 1e-5 below it, so sampling at the
// threshold draws all three while greedy always gives id 1.
TEST(SampleTest, TemperaturesBelowTheThresholdAreGreedy) {
  const std::vector<float> row = {1.0f, 7.0f, 7.0f, 7.0f - 1e-5f, 3.0f};
  const float greedy_temperatures[] = {0.0f,
                                       -0.0f,
                                       -1.0f,
                                       std::numeric_limits<float>::denorm_min(),  // 1.4e-45
                                       1e-42f,
                                       1e-39f,
                                       std::numeric_limits<float>::min(),  // 1.2e-38
                                       1e-38f,
                                       1e-6f,
                                       std::nextafter(kMinSamplingTemperature, 0.0f)};
  Rows greedy;
  for (float t : greedy_temperatures) {
    for (uint64_t step = 0; step < 40; ++step) {
      greedy.Add(row, t, 0, 1.0f, 11, step);
      greedy.Add(row, t, 2, 0.5f, 12, step);  // top-k and top-p do not matter either
    }
  }
  const std::vector<int32_t> all_one(greedy.size(), 1);
  for (const CpuVariant& variant : CpuVariants()) {
    VariantScope scope(variant);
    EXPECT_EQ(SampleRows(scope.ctx(), greedy), all_one) << variant.Name();
  }
  EXPECT_EQ(SampleRows(OpContext{}, greedy, /*reference=*/true), all_one);

  for (float t : {kMinSamplingTemperature, 2e-5f}) {
    Rows sampled;
    for (uint64_t step = 0; step < 300; ++step) {
      sampled.Add(row, t, 0, 1.0f, 13, step);
    }
    const std::vector<int32_t> out = SampleRows(OpContext{}, sampled);
    EXPECT_EQ(out, SampleRows(OpContext{}, sampled, /*reference=*/true)) << t;
    int seen[5] = {};
    for (int32_t id : out) {
      ASSERT_GE(id, 1);
      ASSERT_LE(id, 3);
      ++seen[id];
    }
    EXPECT_GT(seen[1], 0) << t;
    EXPECT_GT(seen[2], 0) << t;
    EXPECT_GT(seen[3], 0) << t;
  }
}

// Random rows and settings: the CPU sampler and the reference pick the same token.
TEST(SampleTest, MatchesReference) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> temp(0.1f, 2.0f), prob(0.05f, 1.0f);
  std::uniform_int_distribution<int32_t> k_dist(0, 80);
  Rows r;
  for (int i = 0; i < 300; ++i) {
    std::vector<float> row = RandomVector(i % 3 == 0 ? 1000 : 1000, rng, 3.0f);
    if (i % 7 == 0) {
      row[i % 1000] = row[(i + 1) % 1000];  // ties
    }
    if (i % 11 == 0) {
      row[(i * 7) % 1000] = -INFINITY;
      row[(i * 13) % 1000] = NAN;
    }
    const int32_t k = i % 4 == 0 ? 0 : k_dist(rng);
    const float p = i % 5 == 0 ? 1.0f : prob(rng);
    r.Add(row, temp(rng), k, p, /*seed=*/1000 + i, /*step=*/i * 3);
  }
  const std::vector<int32_t> want = SampleRows(OpContext{}, r, /*reference=*/true);
  for (const CpuVariant& variant : CpuVariants()) {
    VariantScope scope(variant);
    EXPECT_EQ(SampleRows(scope.ctx(), r), want) << variant.Name();
  }
}

// min-p, alone and before top-k and top-p: the CPU sampler and the reference pick the same
// token, and never one whose weight (probability over the top token's) is below min_p.
TEST(SampleTest, MinPMatchesReference) {
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> temp(0.3f, 2.0f), prob(0.3f, 1.0f);
  Rows r;
  for (int i = 0; i < 300; ++i) {
    std::vector<float> row = RandomVector(800, rng, 3.0f);
    if (i % 9 == 0) {
      row[(i * 5) % 800] = NAN;
      row[(i * 3) % 800] = -INFINITY;
    }
    r.Add(row, temp(rng), i % 3 == 0 ? 0 : 1 + i % 50, i % 4 == 0 ? 1.0f : prob(rng), 500 + i, i);
    r.min_p.push_back(std::vector<float>{0.0f, 1e-3f, 0.02f, 0.2f, 0.7f, 1.0f}[i % 6]);
  }
  const std::vector<int32_t> want = SampleRows(OpContext{}, r, /*reference=*/true);
  for (const CpuVariant& variant : CpuVariants()) {
    VariantScope scope(variant);
    EXPECT_EQ(SampleRows(scope.ctx(), r), want) << variant.Name();
  }
  for (int64_t s = 0; s < r.size(); ++s) {
    const float* row = &r.logits[s * r.vocab];
    float max = -INFINITY;
    for (int64_t t = 0; t < r.vocab; ++t) {
      if (row[t] > max) max = row[t];
    }
    const double w = std::exp((static_cast<double>(row[want[s]]) - max) / r.temperature[s]);
    EXPECT_GE(w, r.min_p[s] * (1 - 1e-5)) << "row " << s;
  }
}

// Draw frequencies under min-p: p = {0.1, 0.2, 0.3, 0.4}; min_p 0.6 keeps p >= 0.24 (0.3 and
// 0.4), min_p 0.3 keeps p >= 0.12 (0.2 too); at temperature 0.5 the weights square first
// (p^2 / 0.16 >= 0.3 keeps 0.3 and 0.4 only). Then top-k and top-p cut what min-p kept.
TEST(SampleTest, MinPDistributions) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f),
                                     std::log(0.4f)};
  struct Setting {
    float temperature;
    float min_p;
    int32_t top_k;
    float top_p;
    std::vector<double> want;
  };
  const Setting settings[] = {
      {1.0f, 0.6f, 0, 1.0f, {0, 0, 3.0 / 7, 4.0 / 7}},
      {1.0f, 0.3f, 0, 1.0f, {0, 2.0 / 9, 3.0 / 9, 4.0 / 9}},
      {0.5f, 0.3f, 0, 1.0f, {0, 0, 9.0 / 25, 16.0 / 25}},
      {1.0f, 0.3f, 2, 1.0f, {0, 0, 3.0 / 7, 4.0 / 7}},
      {1.0f, 0.3f, 0, 0.5f, {0, 0, 3.0 / 7, 4.0 / 7}},  // 4/9 < 0.5 <= 7/9 of the kept mass
      {1.0f, 1.0f, 0, 1.0f, {0, 0, 0, 1}},
  };
  constexpr int kDraws = 20000;
  for (const Setting& s : settings) {
    Rows r;
    for (int step = 0; step < kDraws; ++step) {
      r.Add(logits, s.temperature, s.top_k, s.top_p, 77, step);
      r.min_p.push_back(s.min_p);
    }
    VariantScope scope({cpu::DetectedIsa(), 3});
    std::vector<int> counts(4);
    for (int32_t t : SampleRows(scope.ctx(), r)) {
      ++counts.at(t);
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(counts[i] / static_cast<double>(kDraws), s.want[i], 0.015)
          << "temperature " << s.temperature << " min_p " << s.min_p << " top_k " << s.top_k
          << " top_p " << s.top_p << " id " << i;
    }
  }
  // Greedy rows ignore min_p.
  Rows g;
  g.Add(logits, 0.0f, 0, 1.0f, 1, 1);
  g.min_p.push_back(1.0f);
  EXPECT_EQ(SampleRows(OpContext{}, g)[0], 3);
}

// A row's token does not depend on its batch neighbours, its position in the batch or threads.
TEST(SampleTest, IndependentOfBatchAndThreads) {
  std::mt19937 rng(10);
  Rows batch;
  for (int i = 0; i < 9; ++i) {
    batch.Add(RandomVector(5000, rng), 1.0f, i % 2 == 0 ? 40 : 0, i % 3 == 0 ? 0.9f : 1.0f, 77 + i,
              5);
  }
  VariantScope threaded({cpu::DetectedIsa(), 3});
  const std::vector<int32_t> together = SampleRows(threaded.ctx(), batch);
  for (int64_t i = 0; i < batch.size(); ++i) {
    Rows alone;
    alone.Add(
        std::vector<float>(batch.logits.begin() + i * 5000, batch.logits.begin() + (i + 1) * 5000),
        batch.temperature[i], batch.top_k[i], batch.top_p[i], batch.seeds[i], batch.steps[i]);
    EXPECT_EQ(SampleRows(OpContext{}, alone)[0], together[i]) << i;
  }
}

// Draw frequencies over 20000 steps of one request match the distribution each setting
// defines, within 0.015 (> 4 sigma; the draws are fixed by the seed, so this never flakes).
TEST(SampleTest, DistributionsFollowSettings) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f),
                                     std::log(0.4f)};
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p;
    std::vector<double> want;
  };
  const Setting settings[] = {
      {1.0f, 0, 1.0f, {0.1, 0.2, 0.3, 0.4}},
      {0.5f, 0, 1.0f, {0.01 / 0.3, 0.04 / 0.3, 0.09 / 0.3, 0.16 / 0.3}},  // p^2, renormalised
      {1.0f, 2, 1.0f, {0, 0, 3.0 / 7, 4.0 / 7}},
      {1.0f, 0, 0.5f, {0, 0, 3.0 / 7, 4.0 / 7}},  // 0.4 < 0.5 <= 0.4 + 0.3
      {1.0f, 0, 0.35f, {0, 0, 0, 1}},
      {1.0f, 3, 0.6f, {0, 0, 3.0 / 7, 4.0 / 7}},  // top-p over the top-3 mass 0.9: 0.4/0.9 < 0.6
  };
  constexpr int kDraws = 20000;
  for (const Setting& s : settings) {
    Rows r;
    for (int step = 0; step < kDraws; ++step) {
      r.Add(logits, s.temperature, s.top_k, s.top_p, 2024, step);
    }
    VariantScope scope({cpu::DetectedIsa(), 3});
    std::vector<int> counts(4);
    for (int32_t t : SampleRows(scope.ctx(), r)) {
      ++counts.at(t);
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(counts[i] / static_cast<double>(kDraws), s.want[i], 0.015)
          << "temperature " << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p
          << " id " << i;
    }
  }
}

// Ties at the top-k boundary are cut by id; -inf logits are never drawn.
TEST(SampleTest, TiesAndMaskedLogits) {
  Rows r;
  for (int step = 0; step < 500; ++step) {
    r.Add({1, 5, 5, 5, -INFINITY}, 1.0f, 2, 1.0f, 3, step);
    r.Add({-INFINITY, 0, -INFINITY, 0, -INFINITY}, 1.0f, 0, 1.0f, 4, step);
  }
  const std::vector<int32_t> out = SampleRows(OpContext{}, r);
  int first = 0;
  for (size_t i = 0; i < out.size(); i += 2) {
    EXPECT_TRUE(out[i] == 1 || out[i] == 2) << out[i];
    first += out[i] == 1;
    EXPECT_TRUE(out[i + 1] == 1 || out[i + 1] == 3) << out[i + 1];
  }
  EXPECT_GT(first, 150);
  EXPECT_LT(first, 350);
}

// One vocabulary-sized (Llama 3) row with top-p only: exercises the lazy partial sort.
TEST(SampleTest, LargeVocabularyTopP) {
  std::mt19937 rng(12);
  Rows r;
  r.Add(RandomVector(128256, rng, 2.0f), 0.8f, 0, 0.95f, 5, 9);
  r.Add(RandomVector(128256, rng, 2.0f), 1.0f, 50, 0.9f, 6, 9);
  EXPECT_EQ(SampleRows(OpContext{}, r), SampleRows(OpContext{}, r, /*reference=*/true));
}

TEST(SampleDispatchTest, RejectsBadInput) {
  Rows r;
  r.Add({0, 1, 2}, 1.0f, 0, 1.0f, 1, 1);
  std::vector<int32_t> out(1);
  SamplingParams p;
  p.logits = r.logits.data();
  p.out_tokens = out.data();
  p.num_seqs = 1;
  p.vocab_size = 3;
  p.logits_stride = 3;
  p.temperature = r.temperature.data();
  p.seeds = r.seeds.data();
  p.steps = r.steps.data();
  const absl::Status no_workspace = Sample(OpContext{}, p);
  EXPECT_EQ(no_workspace.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_workspace.message().find("workspace"), absl::string_view::npos) << no_workspace;
  std::vector<uint8_t> ws(SamplingWorkspaceBytes(OpContext{}, p));
  p.workspace = ws.data();
  p.workspace_bytes = static_cast<int64_t>(ws.size());
  EXPECT_TRUE(Sample(OpContext{}, p).ok());
  SamplingParams bad = p;
  bad.seeds = nullptr;
  EXPECT_EQ(Sample(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  const float zero_p = 0.0f;
  bad = p;
  bad.top_p = &zero_p;
  EXPECT_EQ(Sample(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  const float nan_t = NAN;
  bad = p;
  bad.temperature = &nan_t;
  EXPECT_EQ(Sample(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.logits_stride = 2;
  EXPECT_EQ(Sample(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  for (float min_p : {-0.1f, 1.5f, NAN}) {
    bad = p;
    bad.min_p = &min_p;
    const absl::Status s = Sample(OpContext{}, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << min_p;
    EXPECT_NE(s.message().find("min_p"), absl::string_view::npos) << s;
  }
  if (!SupportsSample(Device::kCuda)) {
    EXPECT_EQ(Sample(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
  }
}

// Token masks: a masked-out token is never picked, greedy or sampled (with top-k and top-p
// over a set that would otherwise contain it), and an all-ones row is untouched.
TEST(TokenMaskTest, MaskedTokensAreNeverPicked) {
  constexpr int64_t kVocab = 77;  // not a multiple of 32: the last word is partial
  const int64_t words = (kVocab + 31) / 32;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Rows r;
    std::vector<uint32_t> mask;
    std::vector<std::vector<bool>> allowed;
    for (int s = 0; s < 4; ++s) {
      r.Add(RandomVector(kVocab, rng, 4.0f), s == 0 ? 0.0f : 1.5f, s == 2 ? 5 : 0,
            s == 3 ? 0.5f : 1.0f, 1000 + trial, s);
      std::vector<bool> ok(kVocab);
      std::vector<uint32_t> row(words, 0);
      for (int64_t t = 0; t < kVocab; ++t) {
        ok[t] = (rng() % 5 == 0) || t == (trial % kVocab);  // at least one allowed
        if (ok[t]) row[t / 32] |= 1u << (t % 32);
      }
      allowed.push_back(ok);
      mask.insert(mask.end(), row.begin(), row.end());
    }
    // Greedy's expectation: the best allowed logit, lowest id on ties.
    int32_t best = -1;
    for (int64_t t = 0; t < kVocab; ++t) {
      if (allowed[0][t] && (best < 0 || r.logits[t] > r.logits[best]))
        best = static_cast<int32_t>(t);
    }
    TokenMaskParams m;
    m.logits = r.logits.data();
    m.mask = mask.data();
    m.num_seqs = r.size();
    m.vocab_size = m.logits_stride = kVocab;
    m.mask_stride_words = words;
    ASSERT_TRUE(ApplyTokenMask(OpContext{}, m).ok());
    const std::vector<int32_t> out = SampleRows(OpContext{}, r);
    EXPECT_EQ(out[0], best) << "trial " << trial;
    for (int s = 0; s < 4; ++s) {
      ASSERT_GE(out[s], 0);
      EXPECT_TRUE(allowed[s][out[s]]) << "trial " << trial << " row " << s << " token " << out[s];
    }
  }
}

TEST(TokenMaskTest, AllOnesRowIsUntouchedAndBadInputIsRefused) {
  std::mt19937 rng(3);
  std::vector<float> logits = RandomVector(40, rng, 1.0f);
  const std::vector<float> before = logits;
  std::vector<uint32_t> mask = {0xffffffffu, 0xffu};
  TokenMaskParams m;
  m.logits = logits.data();
  m.mask = mask.data();
  m.num_seqs = 1;
  m.vocab_size = m.logits_stride = 40;
  m.mask_stride_words = 2;
  ASSERT_TRUE(ApplyTokenMask(OpContext{}, m).ok());
  EXPECT_EQ(std::memcmp(logits.data(), before.data(), 40 * sizeof(float)), 0);
  m.mask_stride_words = 1;  // 40 tokens need 2 words
  EXPECT_EQ(ApplyTokenMask(OpContext{}, m).code(), absl::StatusCode::kInvalidArgument);
  m.mask_stride_words = 2;
  m.mask = nullptr;
  EXPECT_EQ(ApplyTokenMask(OpContext{}, m).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::kernels
