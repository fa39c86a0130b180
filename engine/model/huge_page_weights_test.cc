// CopyWeightsToHugePages (engine/model/model_weights.h): every matrix lands in the huge-page
// mapping with its bytes intact, a tied classifier stays tied, and the forward pass on the copy
// gives bitwise the logits of the mapped weights (a swapped or misplaced matrix would not), on
// the real stories260K model (f32, tied classifier), a bf16 copy of it and its int8
// quantization, single-sequence and batched, one thread and a team.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/threads/parallel_for.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/model/stories260k_test_util.h"
#include "gtest/gtest.h"
#include "kernels/half.h"

namespace pd::engine {
namespace {

using testing::LoadStories260K;
using testing::Table;

constexpr int64_t kBlockSize = 16;

class HugePageWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LoadStories260K(&checkpoint_, &f32_);
    if (HasFatalFailure()) return;
    bf16_ = ToBf16(f32_);
  }

  // A bf16 copy of `src`'s matrices and embedding (tied classifier kept tied), owned here.
  ModelWeights ToBf16(const ModelWeights& src) {
    const ModelConfig& c = src.config;
    auto copy = [&](const void* m, int64_t n) -> const void* {
      const auto* f = static_cast<const float*>(m);
      auto& out = bf16_storage_.emplace_back(n);
      for (int64_t i = 0; i < n; ++i) out[i] = kernels::F32ToBf16(f[i]);
      return out.data();
    };
    ModelWeights w;
    w.config = c;
    w.fingerprint = src.fingerprint + "+bf16-test";
    w.dtype = w.embedding_dtype = kernels::DType::kBF16;
    w.embedding = copy(src.embedding, int64_t{c.vocab_size} * c.dim);
    w.classifier = src.classifier == src.embedding
                       ? w.embedding
                       : copy(src.classifier, int64_t{c.vocab_size} * c.dim);
    w.final_norm = src.final_norm;
    const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim, hidden = c.hidden_dim;
    w.layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& s = src.layers[l];
      LayerWeights& o = w.layers[l];
      o = s;  // the f32 norms, then every matrix replaced
      o.wq = copy(s.wq, q * dim);
      o.wk = copy(s.wk, kv * dim);
      o.wv = copy(s.wv, kv * dim);
      o.wo = copy(s.wo, dim * q);
      o.w_gate = copy(s.w_gate, hidden * dim);
      o.w_up = copy(s.w_up, hidden * dim);
      o.w_down = copy(s.w_down, dim * hidden);
    }
    return w;
  }

  // Logits of a 3-sequence workload (a 21-token prefill, then 12 batched decode steps of all
  // three), every step's logits appended: covers the GEMV (one row) and the tiled paths.
  std::vector<float> Run(const ModelWeights* weights, ParallelFor* team) {
    const ModelConfig& c = weights->config;
    const int64_t num_blocks = 24;
    std::vector<float> pool(num_blocks * int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize, 0.0f);
    kernels::OpContext ctx;
    ctx.parallel = team;
    ForwardOptions options;
    options.max_seqs = 4;
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        weights, {pool.data(), kernels::DType::kF32, num_blocks, kBlockSize}, ctx, options);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return {};
    const int64_t vocab = c.vocab_size;
    std::vector<float> all, step(3 * vocab);
    std::vector<std::vector<uint32_t>> seqs = {
        {1,   403, 407, 261, 378, 395, 263, 400, 261, 471, 302,
         279, 267, 353, 283, 400, 431, 395, 263, 271, 427},
        {1, 65, 299},
        {1, 7}};
    std::vector<std::vector<int32_t>> tables = {Table(0, 8), Table(8, 8), Table(16, 8)};
    // The prompts: one single-sequence call (one row per call for sequence 2: a GEMV).
    for (int s = 0; s < 3; ++s) {
      EXPECT_TRUE((*f)->Forward({{seqs[s], 0, tables[s]}}, step.data()).ok());
      all.insert(all.end(), step.begin(), step.begin() + vocab);
    }
    std::vector<uint32_t> next = {5, 9, 13};
    for (int i = 0; i < 12; ++i) {
      std::vector<ForwardSequence> batch;
      for (int s = 0; s < 3; ++s) {
        seqs[s].push_back(next[s]);
        batch.push_back({absl::MakeConstSpan(&seqs[s].back(), 1),
                         static_cast<int64_t>(seqs[s].size()) - 1, tables[s]});
      }
      EXPECT_TRUE((*f)->Forward(batch, step.data()).ok());
      all.insert(all.end(), step.begin(), step.end());
      for (int s = 0; s < 3; ++s) next[s] = static_cast<uint32_t>((next[s] * 31 + i) % vocab);
    }
    return all;
  }

  std::unique_ptr<Llama2cCheckpoint> checkpoint_;
  std::vector<std::vector<uint16_t>> bf16_storage_;
  ModelWeights f32_, bf16_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(HugePageWeightsTest, CopiesEveryMatrixAndKeepsTheTie) {
  absl::StatusOr<ModelWeights> copy = CopyWeightsToHugePages(f32_);
  ASSERT_TRUE(copy.ok()) << copy.status();
  const ModelConfig& c = f32_.config;
  ASSERT_EQ(f32_.classifier, f32_.embedding);  // stories260K ties them
  EXPECT_NE(copy->mapped, nullptr);
  EXPECT_EQ(copy->fingerprint, f32_.fingerprint);  // same bytes: workers still pair
  EXPECT_EQ(copy->dtype, kernels::DType::kF32);
  EXPECT_NE(copy->classifier, f32_.classifier);
  EXPECT_EQ(copy->embedding, copy->classifier);  // still tied, one copy
  EXPECT_EQ(MatrixWeightBytes(*copy), MatrixWeightBytes(f32_));
  EXPECT_EQ(copy->layers[2].attn_norm, f32_.layers[2].attn_norm);  // vectors stay views
  auto same = [](const void* a, const void* b, int64_t bytes) {
    return a != b && std::memcmp(a, b, bytes) == 0;
  };
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim, hidden = c.hidden_dim;
  EXPECT_TRUE(same(copy->classifier, f32_.classifier, int64_t{c.vocab_size} * dim * 4));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& a = copy->layers[l];
    const LayerWeights& b = f32_.layers[l];
    EXPECT_TRUE(same(a.wq, b.wq, q * dim * 4)) << l;
    EXPECT_TRUE(same(a.wk, b.wk, kv * dim * 4)) << l;
    EXPECT_TRUE(same(a.wv, b.wv, kv * dim * 4)) << l;
    EXPECT_TRUE(same(a.wo, b.wo, dim * q * 4)) << l;
    EXPECT_TRUE(same(a.w_gate, b.w_gate, hidden * dim * 4)) << l;
    EXPECT_TRUE(same(a.w_up, b.w_up, hidden * dim * 4)) << l;
    EXPECT_TRUE(same(a.w_down, b.w_down, dim * hidden * 4)) << l;
    EXPECT_EQ(0, reinterpret_cast<uintptr_t>(a.w_down) % 64) << l;  // cache-line aligned
  }
}

TEST_F(HugePageWeightsTest, ForwardIsBitwiseTheMappedOne) {
  absl::StatusOr<ModelWeights> i8 = QuantizeWeightsInt8(f32_);
  ASSERT_TRUE(i8.ok()) << i8.status();
  for (const ModelWeights* weights : {&f32_, &bf16_, &*i8}) {
    absl::StatusOr<ModelWeights> copy = CopyWeightsToHugePages(*weights);
    ASSERT_TRUE(copy.ok()) << copy.status();
    if (weights->dtype == kernels::DType::kI8) {
      EXPECT_NE(copy->classifier_scales, weights->classifier_scales);
      EXPECT_EQ(0, std::memcmp(copy->classifier_scales, weights->classifier_scales,
                               int64_t{weights->config.vocab_size} * 4));
    }
    ParallelFor::Options o;
    o.num_threads = 3;
    ParallelFor team(o);
    for (ParallelFor* t : {static_cast<ParallelFor*>(nullptr), &team}) {
      const std::vector<float> want = Run(weights, t);
      const std::vector<float> got = Run(&*copy, t);
      EXPECT_TRUE(SameBits(got, want))
          << kernels::DTypeSize(weights->dtype) << "-byte weights, team " << (t != nullptr);
    }
  }
}

// Quantizing the copy gives the codes quantizing the mapped weights gives.
TEST_F(HugePageWeightsTest, QuantizingTheCopyIsQuantizingTheOriginal) {
  absl::StatusOr<ModelWeights> copy = CopyWeightsToHugePages(bf16_);
  ASSERT_TRUE(copy.ok()) << copy.status();
  absl::StatusOr<ModelWeights> a = QuantizeWeightsInt8(bf16_);
  absl::StatusOr<ModelWeights> b = QuantizeWeightsInt8(*copy);
  ASSERT_TRUE(a.ok() && b.ok());
  const ModelConfig& c = f32_.config;
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_EQ(0,
            std::memcmp(a->layers[1].w_down, b->layers[1].w_down, int64_t{c.dim} * c.hidden_dim));
  EXPECT_EQ(0, std::memcmp(a->classifier_scales, b->classifier_scales, c.vocab_size * 4));
}

}  // namespace
}  // namespace pd::engine
