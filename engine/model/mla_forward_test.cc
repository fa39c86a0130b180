// Multi-head latent attention (DeepSeek) in the forward pass: the latent cache entry is the
// whole of a block, and a sequence's logits are bitwise independent of batching, chunking,
// cache hits and the decode path, as for grouped-query attention (the logits themselves are
// checked against PyTorch in integration_torch_parity_test).
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "engine/model/device_weights.h"
#include "engine/model/forward_compare_test_util.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/device_memory.h"
#include "kernels/latent_attention_params.h"

namespace pd::engine {
namespace {

constexpr int64_t kBlockSize = 16;

std::vector<int32_t> Table(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

class MlaForwardTest : public ::testing::TestWithParam<kernels::DType> {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
    MakeModelOptions o;
    o.out_dir = dir_->File("model");
    o.architecture = Architecture::kDeepseekV3;
    o.q_lora_rank = 24;
    o.seed = 3;
    ASSERT_TRUE(MakeModel(o).ok());
    absl::StatusOr<HfModel> model = HfModel::Load(o.out_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::make_unique<HfModel>(*std::move(model));
    absl::StatusOr<ModelWeights> w = WeightsFromHf(*model_);
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = *std::move(w);
  }

  std::unique_ptr<LlamaForward> MakeForward(int64_t num_blocks, kernels::DType dtype,
                                            ForwardOptions options = {}) {
    const ModelConfig& c = weights_.config;
    const int64_t block = kernels::DenseKvBlockBytes(dtype, c.n_layers, c.cache_kv_heads(),
                                                     kBlockSize, c.cache_head_dim());
    pool_.assign(num_blocks * block / 4 + 1, 0.0f);
    absl::StatusOr<std::unique_ptr<LlamaForward>> f =
        LlamaForward::Create(&weights_, {pool_.data(), dtype, num_blocks, kBlockSize}, {}, options);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *std::move(f) : nullptr;
  }

  std::optional<pd::testing::TempDir> dir_;
  std::unique_ptr<HfModel> model_;
  ModelWeights weights_;
  std::vector<float> pool_;
};

TEST(MlaGeometryTest, TheCacheHoldsTheLatentOnly) {
  ModelConfig c;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  EXPECT_EQ(c.cache_kv_heads(), 2);  // 576 = 2 heads x (K 144 + V 144)
  EXPECT_EQ(c.cache_head_dim(), 144);
  c.kv_lora_rank = 64;
  c.qk_rope_head_dim = 8;
  EXPECT_EQ(c.cache_kv_heads(), 1);
  EXPECT_EQ(c.cache_head_dim(), 36);
}

TEST_P(MlaForwardTest, BlockBytesAreTheLatentsBytes) {
  const ModelConfig& c = weights_.config;
  ASSERT_TRUE(c.mla());
  std::unique_ptr<LlamaForward> f = MakeForward(8, GetParam());
  ASSERT_NE(f, nullptr);
  if (GetParam() == kernels::DType::kF32) {
    EXPECT_EQ(f->block_bytes(), int64_t{c.n_layers} * kBlockSize * c.mla_latent_dim() * 4);
  }
}

TEST_P(MlaForwardTest, LogitsAreBitwiseIndependentOfBatchingChunkingCacheHitsAndDecode) {
  std::unique_ptr<LlamaForward> f = MakeForward(64, GetParam());
  ASSERT_NE(f, nullptr);
  const int64_t vocab = f->vocab_size();
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 23; ++i) prompt.push_back(300 + (i * 13) % 200);
  std::vector<float> whole(vocab), chunked(vocab), batched(3 * vocab), cached(vocab), step(vocab);
  absl::Span<const uint32_t> p(prompt);

  std::vector<int32_t> t_whole = Table(0, 2);
  ASSERT_TRUE(f->Forward({{p, 0, t_whole}}, whole.data()).ok());

  std::vector<int32_t> t_chunk = Table(2, 2);
  ASSERT_TRUE(f->Forward({{p.subspan(0, 7), 0, t_chunk}}, chunked.data()).ok());
  ASSERT_TRUE(f->Forward({{p.subspan(7, 9), 7, t_chunk}}, chunked.data()).ok());
  ASSERT_TRUE(f->Forward({{p.subspan(16, 7), 16, t_chunk}}, chunked.data()).ok());
  EXPECT_EQ(std::memcmp(whole.data(), chunked.data(), vocab * 4), 0) << "chunked prefill";

  std::vector<int32_t> t_a = Table(4, 2), t_b = Table(6, 1), t_c = Table(7, 2);
  std::vector<uint32_t> other = {1, 265, 266, 267};
  std::vector<uint32_t> single = {42};
  ASSERT_TRUE(f->Forward({{other, 0, t_b}, {p, 0, t_a}, {single, 0, t_c}}, batched.data()).ok());
  EXPECT_EQ(std::memcmp(whole.data(), batched.data() + vocab, vocab * 4), 0) << "batched";

  std::vector<int32_t> t_hit = {t_whole[0], 9};
  ASSERT_TRUE(f->Forward({{p.subspan(16), 16, t_hit}}, cached.data()).ok());
  EXPECT_EQ(std::memcmp(whole.data(), cached.data(), vocab * 4), 0) << "cache hit";

  // Token by token (every step a decode), batched with another sequence's decode step.
  std::vector<int32_t> t_step = Table(10, 2);
  for (size_t i = 0; i < prompt.size(); ++i) {
    std::vector<float> two(2 * vocab);
    std::vector<uint32_t> o = {static_cast<uint32_t>(7 + i)};
    ASSERT_TRUE(f->Forward({{o, static_cast<int64_t>(i), Table(12, 2)},
                            {p.subspan(i, 1), static_cast<int64_t>(i), t_step}},
                           two.data())
                    .ok());
    std::copy_n(two.data() + vocab, vocab, step.data());
  }
  EXPECT_EQ(std::memcmp(whole.data(), step.data(), vocab * 4), 0) << "decode steps";
}

// The H2O and SnapKV scores of an MLA model: one row per layer (kv_score_heads), every query
// head handing out its softmax weights over the latent entries (a total of tokens x heads per
// layer, spread unevenly), the logits untouched, and the same bits whether the prompt came in
// one chunk or in chunks and decode steps, and on the staged (CUDA-layout) host path. A
// compaction moves every cache head of an entry: gathered into fresh blocks (all 23 slots
// kept), the next decode step gives the logits it gives from the original blocks.
TEST_P(MlaForwardTest, AttentionMassOnLatentEntriesAndTheirCompaction) {
  const ModelConfig& c = weights_.config;
  ASSERT_EQ(c.kv_score_heads(), 1);
  const int64_t vocab = c.vocab_size, stride = 32, rows = c.n_layers;
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 23; ++i) prompt.push_back(300 + (i * 13) % 200);
  const absl::Span<const uint32_t> p(prompt);
  std::vector<float> plain(vocab), scored(vocab), mass(rows * stride, 0.0f);
  std::unique_ptr<LlamaForward> f = MakeForward(16, GetParam());
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(f->Forward({{p, 0, Table(0, 2)}}, plain.data()).ok());
  const std::vector<int32_t> t_one = Table(2, 2);
  ForwardSequence one{p, 0, t_one};
  one.attention_mass = mass.data();
  one.mass_stride = stride;
  const absl::Status scoring = f->Forward({one}, scored.data());
  ASSERT_TRUE(scoring.ok()) << scoring;
  EXPECT_EQ(std::memcmp(plain.data(), scored.data(), vocab * 4), 0);
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0, top = 0;
    for (int64_t t = 0; t < stride; ++t) {
      total += mass[r * stride + t];
      top = std::max<double>(top, mass[r * stride + t]);
    }
    EXPECT_NEAR(total, 23.0 * c.n_heads, 1e-3) << "layer " << r;
    EXPECT_GT(top, 2.0 * total / 23) << "layer " << r << ": no key stands out";
    for (int64_t t = 23; t < stride; ++t) EXPECT_EQ(mass[r * stride + t], 0.0f);
  }
  std::vector<float> got(rows * stride, 0.0f);
  const std::vector<int32_t> t_chunk = Table(4, 2);
  ForwardSequence first{p.first(9), 0, t_chunk};
  first.attention_mass = got.data();
  first.mass_stride = stride;
  ASSERT_TRUE(f->Forward({first}, scored.data()).ok());
  ForwardSequence second{p.subspan(9, 12), 9, t_chunk};
  second.attention_mass = got.data();
  second.mass_stride = stride;
  ASSERT_TRUE(f->Forward({second}, scored.data()).ok());
  for (int64_t pos : {21, 22}) {
    ForwardSequence d{p.subspan(pos, 1), pos, t_chunk};
    d.attention_mass = got.data();
    d.mass_stride = stride;
    ASSERT_TRUE(f->Forward({d}, scored.data()).ok());
  }
  EXPECT_EQ(std::memcmp(mass.data(), got.data(), mass.size() * 4), 0) << "chunked";

  // Blocks 2-3 hold the prompt; every slot kept, into blocks 6-7.
  std::vector<int32_t> keep;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int32_t s = 0; s < 23; ++s) keep.push_back(s);
  }
  ASSERT_TRUE(f->GatherKvRows(Table(2, 2), Table(6, 2), keep, 23).ok());
  const std::vector<uint32_t> next = {77};
  std::vector<float> from_old(vocab), from_new(vocab);
  ASSERT_TRUE(f->Forward({{next, 23, Table(2, 2)}}, from_old.data()).ok());
  ASSERT_TRUE(f->Forward({{next, 23, Table(6, 2)}}, from_new.data()).ok());
  EXPECT_EQ(std::memcmp(from_old.data(), from_new.data(), vocab * 4), 0) << "compacted";
  // One list per layer, not one per cache head.
  keep.resize(keep.size() / 2);
  EXPECT_TRUE(absl::IsInvalidArgument(f->GatherKvRows(Table(2, 2), Table(8, 2), keep, 23)));
  {  // (last: MakeForward clears the pool f used)
    // The CUDA path's staging on the host (staged block tables, the workspace carved from
    // scratch) adds the same bits.
    ForwardOptions staged;
    staged.staged_metadata = true;
    std::unique_ptr<LlamaForward> s = MakeForward(16, GetParam(), staged);
    ASSERT_NE(s, nullptr);
    std::vector<float> staged_mass(rows * stride, 0.0f);
    ForwardSequence st{p, 0, t_one};
    st.attention_mass = staged_mass.data();
    st.mass_stride = stride;
    ASSERT_TRUE(s->Forward({st}, scored.data()).ok());
    EXPECT_EQ(std::memcmp(mass.data(), staged_mass.data(), mass.size() * 4), 0) << "staged";
  }
}

TEST_P(MlaForwardTest, TheSinkWindowCopyIsRefused) {
  std::unique_ptr<LlamaForward> f = MakeForward(8, GetParam());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->CopyBlocksShifted({0}, {1}, 16, 16).code(), absl::StatusCode::kUnimplemented);
}

// The CUDA forward pass's path on the host: the weights uploaded (DeviceWeights on kCpu is a
// host copy in one allocation, the layout CUDA gets), the metadata staged and decode steps
// replayed as graphs, as on kCuda. Logits bitwise those of the direct path, for prefill and
// batched decode steps, with f32 and int8 weights. Every MLP dense here, so decode steps run
// as graphs; expert layers on this path: engine_moe_forward_test.
TEST_P(MlaForwardTest, UploadedWeightsOnTheStagedPathGiveBitwiseEqualLogits) {
  MakeModelOptions o;
  o.out_dir = dir_->File("dense");
  o.architecture = Architecture::kDeepseekV3;
  o.q_lora_rank = 24;
  o.num_layers = 2;
  o.first_k_dense_replace = 2;  // every MLP dense
  o.seed = 5;
  ASSERT_TRUE(MakeModel(o).ok());
  absl::StatusOr<HfModel> model = HfModel::Load(o.out_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<ModelWeights> dense = WeightsFromHf(*model);
  ASSERT_TRUE(dense.ok()) << dense.status();
  absl::StatusOr<ModelWeights> dense8 = QuantizeWeightsInt8(*dense);
  ASSERT_TRUE(dense8.ok()) << dense8.status();
  const kernels::DType kv = GetParam();
  for (const ModelWeights* host : {&*dense, &*dense8}) {
    absl::StatusOr<std::unique_ptr<DeviceWeights>> up =
        DeviceWeights::Upload(*host, kernels::OpContext{});
    ASSERT_TRUE(up.ok()) << up.status();
    const ModelWeights& copy = (*up)->weights();
    EXPECT_NE(copy.layers[0].wkv_b, host->layers[0].wkv_b);
    EXPECT_NE(copy.layers[0].wuk_t, nullptr);
    EXPECT_EQ(copy.layers[0].wkv_a_scales != nullptr, host->dtype == kernels::DType::kI8);
    testing::CompareSteps steps;
    for (uint32_t i = 0; i < 19; ++i) steps.prompt.push_back(200 + (i * 7) % 300);
    steps.decode_steps = 6;  // run as (emulated) graphs
    testing::ExpectStagedEqualsDirect(*host, copy, kv, steps,
                                      [](LlamaForward&, LlamaForward& device) {
                                        EXPECT_GE(device.graph_stats().captures, 1);
                                        EXPECT_EQ(device.graph_stats().replays, 6);
                                      });
  }
  ModelWeights broken;  // an MLA layer without kv_b_proj
  broken.config = dense->config;
  broken.dtype = dense->dtype;
  broken.embedding_dtype = dense->embedding_dtype;
  broken.embedding = dense->embedding;
  broken.classifier = dense->classifier;
  broken.final_norm = dense->final_norm;
  broken.layers = dense->layers;
  broken.layers.back().wkv_b = nullptr;
  const absl::Status missing = DeviceWeights::Upload(broken, kernels::OpContext{}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_NE(missing.message().find("kv_b_proj"), absl::string_view::npos) << missing;
}

// A latent wider than the attention kernels take is refused when the forward pass is made,
// naming the width, rather than failing every step.
TEST(MlaLimitsTest, AnEntryWiderThanTheKernelsTakeIsRefusedAtCreate) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  MakeModelOptions o;
  o.out_dir = dir->File("wide");
  o.architecture = Architecture::kDeepseekV2;
  o.num_layers = 1;
  o.first_k_dense_replace = 1;
  o.kv_lora_rank = 1024;  // + qk_rope_head_dim: above kernels::kMaxLatentEntryDim
  ASSERT_TRUE(MakeModel(o).ok());
  absl::StatusOr<HfModel> model = HfModel::Load(o.out_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<ModelWeights> w = WeightsFromHf(*model);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = w->config;
  ASSERT_GT(c.mla_latent_dim(), kernels::kMaxLatentEntryDim);
  std::vector<float> pool(kernels::DenseKvBlockBytes(kernels::DType::kF32, c.n_layers,
                                                     c.cache_kv_heads(), kBlockSize,
                                                     c.cache_head_dim()) /
                          4);
  const absl::Status s =
      LlamaForward::Create(&*w, {pool.data(), kernels::DType::kF32, 1, kBlockSize}, {}, {})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("MLA cache entry of " + std::to_string(c.mla_latent_dim())),
            absl::string_view::npos)
      << s;
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, MlaForwardTest,
                         ::testing::Values(kernels::DType::kF32, kernels::DType::kBF16,
                                           kernels::DType::kI8),
                         [](const ::testing::TestParamInfo<kernels::DType>& info) {
                           return info.param == kernels::DType::kF32    ? "F32"
                                  : info.param == kernels::DType::kBF16 ? "Bf16"
                                                                        : "I8";
                         });

}  // namespace
}  // namespace pd::engine
