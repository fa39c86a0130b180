// Tensor parallelism on the CPU (engine/model/tensor_parallel.h): the plan's errors, and a
// TP = N forward pass against TP = 1 on stories260K and on random-weight Hugging Face models.
#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "common/threads/parallel_for.h"
#include "engine/kvcache/kv_layout.h"
#include "engine/memory/tp_kv_pool.h"
#include "engine/model/forward_compare_test_util.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama_forward.h"
#include "engine/model/stories260k_test_util.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;
using testing::Table;

constexpr int64_t kBlockSize = 16;

// A KV pool for `w` of `blocks` blocks of `dtype`, zeroed.
struct Pool {
  Pool(const ModelConfig& c, kernels::DType dtype, int64_t blocks)
      : bytes(kernels::DenseKvBlockBytes(dtype, c.n_layers, c.cache_kv_heads(), kBlockSize,
                                         c.cache_head_dim())),
        data(static_cast<size_t>(bytes * blocks / 4 + 1), 0.0f),
        view{data.data(), dtype, blocks, kBlockSize} {}
  int64_t bytes;
  std::vector<float> data;
  KvPoolView view;
};

std::unique_ptr<LlamaForward> MakeForward(const ModelWeights& w, const KvPoolView& pool, int tp,
                                          ParallelFor* team) {
  ForwardOptions options;
  options.tensor_parallel = tp;
  absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
      &w, pool, kernels::OpContext{kernels::Device::kCpu, nullptr, team}, options);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

// Two sequences: A's 23-token prompt in chunks of 7 and 16, B's 5 tokens batched with A's
// second chunk, then `steps` greedy decode steps of both together. Every sampled token and
// every step's logits rows, in order.
struct Trace {
  std::vector<uint32_t> tokens;
  std::vector<float> logits;
};

Trace Generate(LlamaForward* f, int steps) {
  const int64_t vocab = f->vocab_size();
  std::vector<uint32_t> a = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273, 270, 280,
                             301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311};
  std::vector<uint32_t> b = {1, 265, 266, 267, 268};
  for (uint32_t& t : a) t %= static_cast<uint32_t>(vocab);
  for (uint32_t& t : b) t %= static_cast<uint32_t>(vocab);
  const std::vector<int32_t> ta = Table(0, 8), tb = Table(8, 8);
  Trace trace;
  std::vector<float> logits(static_cast<size_t>(2 * vocab));
  int32_t next[2] = {0, 0};
  SampleSpec greedy;
  greedy.want_logits = true;
  const SampleSpec specs[2] = {greedy, greedy};
  absl::Span<const uint32_t> pa(a);
  EXPECT_TRUE(f->Forward({{pa.subspan(0, 7), 0, ta}}, logits.data()).ok());
  absl::Status s =
      f->ForwardSample({{pa.subspan(7), 7, ta}, {b, 0, tb}}, specs, next, logits.data());
  EXPECT_TRUE(s.ok()) << s;
  int64_t pos[2] = {static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size())};
  for (int step = 0; step <= steps && s.ok(); ++step) {
    trace.tokens.insert(trace.tokens.end(),
                        {static_cast<uint32_t>(next[0]), static_cast<uint32_t>(next[1])});
    trace.logits.insert(trace.logits.end(), logits.begin(), logits.end());
    if (step == steps) break;
    const uint32_t in[2] = {static_cast<uint32_t>(next[0]), static_cast<uint32_t>(next[1])};
    s = f->ForwardSample({{absl::MakeConstSpan(&in[0], 1), pos[0], ta},
                          {absl::MakeConstSpan(&in[1], 1), pos[1], tb}},
                         specs, next, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    ++pos[0];
    ++pos[1];
  }
  return trace;
}

float MaxAbsDiff(const std::vector<float>& x, const std::vector<float>& y) {
  EXPECT_EQ(x.size(), y.size());
  float d = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  return d;
}

TEST(TensorParallelPlanTest, SplitsHeadsMlpAndVocabularyAndNamesWhatDoesNotDivide) {
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.kv_dim = 32;
  c.vocab_size = 515;
  c.seq_len = 64;
  absl::StatusOr<TpPlan> p = PlanTensorParallel(c, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->shared_kv);
  int64_t vocab = 0;
  for (const TpRankPlan& r : p->ranks) {
    EXPECT_EQ(r.head_begin, 2 * r.rank);
    EXPECT_EQ(r.num_heads, 2);
    EXPECT_EQ(r.kv_head_begin, r.rank);
    EXPECT_EQ(r.num_kv_heads, 1);
    EXPECT_TRUE(r.writes_kv);
    EXPECT_EQ(r.hidden_begin, 43 * r.rank);
    EXPECT_EQ(r.vocab_begin, vocab);
    vocab += r.vocab_count;
  }
  EXPECT_EQ(vocab, 515);  // uneven: 128, 129, 129, 129
  EXPECT_EQ(p->ranks[0].vocab_count, 128);

  c.n_kv_heads = 2;  // 4 ranks share 2 KV heads: ranks 0 and 2 write, 1 and 3 read
  c.kv_dim = 16;
  p = PlanTensorParallel(c, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->shared_kv);
  EXPECT_EQ(p->ranks[1].kv_head_begin, 0);
  EXPECT_FALSE(p->ranks[1].writes_kv);
  EXPECT_EQ(p->ranks[2].kv_head_begin, 1);
  EXPECT_TRUE(p->ranks[2].writes_kv);

  EXPECT_THAT(PlanTensorParallel(c, 3).status().message(), HasSubstr("8 query heads"));
  EXPECT_THAT(PlanTensorParallel(c, 0).status().message(), HasSubstr("must be >= 1"));
  c.hidden_dim = 170;
  EXPECT_THAT(PlanTensorParallel(c, 4).status().message(), HasSubstr("MLP width 170"));
  c.hidden_dim = 172;
  c.n_heads = 12;
  c.n_kv_heads = 3;
  c.kv_dim = 24;
  EXPECT_THAT(PlanTensorParallel(c, 4).status().message(), HasSubstr("3 KV heads"));
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.kv_dim = 32;
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_hidden_dim = 36;
  c.hidden_dim = 170;  // no dense layer: the unused width need not divide
  p = PlanTensorParallel(c, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ranks[3].expert_begin, 27);
  EXPECT_EQ(p->ranks[3].expert_width, 9);
  EXPECT_EQ(ShardConfig(c, p->ranks[3]).moe_hidden_dim, 9);
  EXPECT_EQ(ShardConfig(c, p->ranks[3]).hidden_dim, 170);
  EXPECT_THAT(PlanTensorParallel(c, 8).status().message(), HasSubstr("experts' width 36"));
  c.first_dense_layers = 1;  // now the dense width must divide too
  EXPECT_THAT(PlanTensorParallel(c, 4).status().message(), HasSubstr("MLP width 170"));
  // MLA: one latent entry, written by rank 0 and read whole by every rank.
  ModelConfig m = c;
  m.n_experts = 0;
  m.first_dense_layers = 0;
  m.hidden_dim = 172;
  m.n_kv_heads = 8;
  m.kv_dim = 64;
  m.kv_lora_rank = 32;
  m.qk_nope_head_dim = 4;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 4;
  p = PlanTensorParallel(m, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->shared_kv);
  EXPECT_EQ(p->pool_kv_heads, m.cache_kv_heads());
  for (const TpRankPlan& r : p->ranks) {
    EXPECT_EQ(r.kv_head_begin, 0);
    EXPECT_EQ(r.writes_kv, r.rank == 0);
    EXPECT_EQ(r.head_begin, 2 * r.rank);
  }
}

class TensorParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LoadStories260K(&checkpoint_, &weights_);
    ParallelFor::Options o;
    o.num_threads = 2;
    team_ = std::make_unique<ParallelFor>(o);
  }
  // Small bf16 pd-make-model checkpoints of `archs`, loaded into hf_: 8 heads of 16, Qwen3
  // with 2 KV heads (shared by 4 ranks), the others 4, experts 48 wide, DeepSeek-V3 with a
  // q_lora_rank of 32.
  void MakeTinyModels(std::initializer_list<Architecture> archs, uint64_t seed) {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-tp-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
    for (const Architecture arch : archs) {
      MakeModelOptions mo;
      mo.out_dir = dir_->path() + "/" + std::to_string(static_cast<int>(arch));
      mo.preset = "tiny";
      mo.architecture = arch;
      mo.dtype = kernels::DType::kBF16;
      mo.vocab_size = 1001;
      mo.num_heads = 8;
      mo.num_kv_heads = arch == Architecture::kQwen3 ? 2 : 4;
      mo.head_dim = 16;
      if (arch != Architecture::kQwen3) mo.moe_intermediate_size = 48;
      if (arch == Architecture::kDeepseekV3) mo.q_lora_rank = 32;
      mo.seed = seed;
      ASSERT_TRUE(MakeModel(mo).ok());
      absl::StatusOr<HfModel> model = HfModel::Load(mo.out_dir);
      ASSERT_TRUE(model.ok()) << model.status();
      models_.push_back(std::make_unique<HfModel>(*std::move(model)));
      absl::StatusOr<ModelWeights> w = WeightsFromHf(*models_.back());
      ASSERT_TRUE(w.ok()) << w.status();
      hf_.push_back(*std::move(w));
    }
  }

  std::unique_ptr<Llama2cCheckpoint> checkpoint_;
  ModelWeights weights_;
  std::unique_ptr<ParallelFor> team_;
  std::optional<pd::testing::TempDir> dir_;
  std::vector<std::unique_ptr<HfModel>> models_;
  std::vector<ModelWeights> hf_;
};

// Stories260K (8 heads, 4 KV heads, f32): TP = 2 and 4 give TP = 1's greedy tokens for 64
// steps of two batched sequences, logits within 1e-4 (stated tolerance: float rounding of the
// row-parallel sums, |logits| ~ 10), and the same bits when run again.
TEST_F(TensorParallelTest, Stories260kTokensEqualTp1AndLogitsWithinRounding) {
  Pool p1(weights_.config, kernels::DType::kF32, 16);
  std::unique_ptr<LlamaForward> f1 = MakeForward(weights_, p1.view, 1, team_.get());
  ASSERT_NE(f1, nullptr);
  const Trace want = Generate(f1.get(), 64);
  for (int tp : {2, 4}) {
    Pool pool(weights_.config, kernels::DType::kF32, 16);
    std::unique_ptr<LlamaForward> f = MakeForward(weights_, pool.view, tp, team_.get());
    ASSERT_NE(f, nullptr);
    const Trace got = Generate(f.get(), 64);
    EXPECT_EQ(got.tokens, want.tokens) << "tp " << tp;
    EXPECT_LE(MaxAbsDiff(got.logits, want.logits), 1e-4f) << "tp " << tp;
    // The KV the ranks wrote is TP = 1's KV within rounding, in the same layout.
    EXPECT_LE(MaxAbsDiff(pool.data, p1.data), 1e-4f) << "tp " << tp;
    Pool again(weights_.config, kernels::DType::kF32, 16);
    std::unique_ptr<LlamaForward> g = MakeForward(weights_, again.view, tp, team_.get());
    const Trace repeat = Generate(g.get(), 64);
    EXPECT_EQ(std::memcmp(repeat.logits.data(), got.logits.data(), got.logits.size() * 4), 0)
        << "tp " << tp << " is not reproducible run to run";
  }
}

// One pool, forward passes of different TP sizes taking turns on it: the layout is TP = 1's,
// so a prefix written at TP = 4 is read at TP = 1 and the other way round, as a block
// transferred or restored from the tiers would be.
TEST_F(TensorParallelTest, KvWrittenAtOneTpIsReadAtAnother) {
  Pool ref(weights_.config, kernels::DType::kF32, 16);
  std::unique_ptr<LlamaForward> f1 = MakeForward(weights_, ref.view, 1, team_.get());
  ASSERT_NE(f1, nullptr);
  const Trace want = Generate(f1.get(), 24);

  Pool shared(weights_.config, kernels::DType::kF32, 16);
  std::unique_ptr<LlamaForward> t1 = MakeForward(weights_, shared.view, 1, team_.get());
  std::unique_ptr<LlamaForward> t4 = MakeForward(weights_, shared.view, 4, team_.get());
  ASSERT_NE(t1, nullptr);
  ASSERT_NE(t4, nullptr);
  // A's prompt at TP = 4, then decode alternating TP = 1 and TP = 4, one step each.
  const std::vector<uint32_t> a = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273, 270, 280,
                                   301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311};
  const std::vector<int32_t> table = Table(0, 8);
  std::vector<float> logits(static_cast<size_t>(t1->vocab_size()));
  SampleSpec greedy;
  int32_t next = 0;
  ASSERT_TRUE(t4->ForwardSample({{a, 0, table}}, {&greedy, 1}, &next, logits.data()).ok());
  std::vector<uint32_t> got = {static_cast<uint32_t>(next)};
  for (int step = 0; step < 24; ++step) {
    LlamaForward* f = step % 2 == 0 ? t1.get() : t4.get();
    const uint32_t in = static_cast<uint32_t>(next);
    ASSERT_TRUE(f->ForwardSample(
                     {{absl::MakeConstSpan(&in, 1), static_cast<int64_t>(a.size()) + step, table}},
                     {&greedy, 1}, &next, logits.data())
                    .ok());
    got.push_back(static_cast<uint32_t>(next));
  }
  std::vector<uint32_t> want_a;
  for (size_t i = 0; i < want.tokens.size(); i += 2) want_a.push_back(want.tokens[i]);
  EXPECT_EQ(got, want_a);
}

// Quantized KV caches: each rank's view moves to its heads' codes and scales
// (KvCacheView::first_head). At TP 2 and 4 greedy tokens equal TP 1's of the same dtype; the
// logits differ where a K or V row computed within float rounding of TP 1's quantizes to a
// neighbouring code (measured: i8 8.6e-4, fp8 0.040, i4 2.0e-5 at most over 48 steps).
TEST_F(TensorParallelTest, QuantizedKvCachesSplitByHead) {
  for (const auto& [dtype, tolerance] :
       {std::pair{kernels::DType::kI8, 5e-3f}, std::pair{kernels::DType::kF8E4M3, 1e-1f},
        std::pair{kernels::DType::kI4, 1e-2f}}) {
    Pool p1(weights_.config, dtype, 16);
    std::unique_ptr<LlamaForward> f1 = MakeForward(weights_, p1.view, 1, team_.get());
    ASSERT_NE(f1, nullptr);
    const Trace want = Generate(f1.get(), 48);
    for (int tp : {2, 4}) {
      Pool pool(weights_.config, dtype, 16);
      std::unique_ptr<LlamaForward> f = MakeForward(weights_, pool.view, tp, team_.get());
      ASSERT_NE(f, nullptr);
      const Trace got = Generate(f.get(), 48);
      EXPECT_EQ(got.tokens, want.tokens) << kernels::DTypeName(dtype) << " tp " << tp;
      EXPECT_LE(MaxAbsDiff(got.logits, want.logits), tolerance)
          << kernels::DTypeName(dtype) << " tp " << tp;
    }
  }
}

// The errors a caller sees instead of a wrong answer.
TEST_F(TensorParallelTest, RefusesWhatIsNotSplitYet) {
  ForwardOptions o;
  o.tensor_parallel = 2;
  Pool f32(weights_.config, kernels::DType::kF32, 4);
  const absl::Status cuda =
      LlamaForward::Create(&weights_, f32.view, {kernels::Device::kCuda, nullptr, nullptr}, o)
          .status();
  EXPECT_EQ(cuda.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(cuda.message(), HasSubstr("no NCCL ranks"));
  o.tensor_parallel = 3;
  absl::StatusOr<std::unique_ptr<LlamaForward>> bad =
      LlamaForward::Create(&weights_, f32.view, {}, o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("tensor_parallel 3"));
  o.tensor_parallel = 2;
  absl::StatusOr<std::unique_ptr<LlamaForward>> f =
      LlamaForward::Create(&weights_, f32.view, {}, o);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::vector<int32_t> table = Table(0, 1);
  // Each rank checks the whole keep list (5 layers x 4 KV heads x 4 rows = 80 slots).
  EXPECT_THAT((*f)->GatherKvRows(table, Table(1, 1), std::vector<int32_t>(40, 0), 4).message(),
              HasSubstr("needs 80 kept slots, got 40"));
  // A bad request fails on every rank and leaves the group usable.
  const std::vector<uint32_t> bad_token = {1, 9999};
  std::vector<float> logits(512);
  EXPECT_EQ((*f)->Forward({{bad_token, 0, table}}, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  SampleSpec nan_temp;
  nan_temp.temperature = std::nanf("");
  int32_t tok = 0;
  const std::vector<uint32_t> ok_tokens = {1, 403};
  // Rank 0 refuses the spec before its first collective; the other rank, already inside the
  // step, is released by the abort.
  EXPECT_EQ(
      (*f)->ForwardSample({{ok_tokens, 0, table}}, {&nan_temp, 1}, &tok, logits.data()).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*f)->Forward({{ok_tokens, 0, table}}, logits.data()).ok());
  EXPECT_GT(*LlamaForward::ScratchBytes(&weights_, f32.view, {}, o), 0);
}

// Random-weight Hugging Face checkpoints: bf16 weights and KV cache, an odd vocabulary (uneven
// vocabulary slices), 2 KV heads shared by 4 ranks, and int8 weights.
TEST_F(TensorParallelTest, RandomHfModelsAtTp4EqualTp1) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-tp-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  MakeModelOptions mo;
  mo.out_dir = dir->path() + "/m";
  mo.preset = "tiny";
  mo.dtype = kernels::DType::kBF16;
  mo.vocab_size = 1001;
  mo.num_heads = 8;
  mo.head_dim = 16;
  mo.seed = 7;
  ASSERT_TRUE(MakeModel(mo).ok());
  absl::StatusOr<HfModel> model = HfModel::Load(mo.out_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<ModelWeights> w = WeightsFromHf(*model);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->config.n_kv_heads, 2);
  absl::StatusOr<ModelWeights> w8 = QuantizeWeightsInt8(*w);
  ASSERT_TRUE(w8.ok()) << w8.status();
  struct Case {
    const ModelWeights* weights;
    kernels::DType kv;
    float tolerance;
    const char* name;
  };
  // bf16 KV: a K or V that rounds to the neighbouring bf16 value would move logits by ~1e-3.
  Trace reference;
  for (const Case& c : {Case{&*w, kernels::DType::kF32, 1e-4f, "bf16 weights, f32 kv"},
                        Case{&*w, kernels::DType::kBF16, 1e-3f, "bf16 weights, bf16 kv"}}) {
    Pool p1(c.weights->config, c.kv, 16), p4(c.weights->config, c.kv, 16);
    std::unique_ptr<LlamaForward> f1 = MakeForward(*c.weights, p1.view, 1, team_.get());
    std::unique_ptr<LlamaForward> f4 = MakeForward(*c.weights, p4.view, 4, team_.get());
    ASSERT_NE(f1, nullptr);
    ASSERT_NE(f4, nullptr);
    const Trace want = Generate(f1.get(), 32), got = Generate(f4.get(), 32);
    EXPECT_EQ(got.tokens, want.tokens) << c.name;
    EXPECT_LE(MaxAbsDiff(got.logits, want.logits), c.tolerance) << c.name;
    if (c.kv == kernels::DType::kF32) reference = Generate(f1.get(), 0);
  }
  // int8 weights: each rank quantizes its slice of the row-parallel activations with its own
  // scale (W8A8 quantizes per row of x), a finer rounding than TP = 1's, so the logits are not
  // TP = 1's within float rounding and greedy tokens may part at a near tie. What holds: TP = 4
  // is as close to the unquantized model as TP = 1 is (first step, both sequences).
  Pool q1(w8->config, kernels::DType::kF32, 16), q4(w8->config, kernels::DType::kF32, 16);
  std::unique_ptr<LlamaForward> f1 = MakeForward(*w8, q1.view, 1, team_.get());
  std::unique_ptr<LlamaForward> f4 = MakeForward(*w8, q4.view, 4, team_.get());
  ASSERT_NE(f1, nullptr);
  ASSERT_NE(f4, nullptr);
  const float err1 = MaxAbsDiff(Generate(f1.get(), 0).logits, reference.logits);
  const float err4 = MaxAbsDiff(Generate(f4.get(), 0).logits, reference.logits);
  EXPECT_GT(err1, 0.0f);
  EXPECT_LE(err4, 1.5f * err1) << "int8 at TP = 4 is further from the bf16 model than at TP = 1";
}

// Mixture-of-experts and MLA checkpoints of every family pd-make-model writes: each expert and
// the shared experts split by columns with the router whole on every rank, MLA's heads split
// with the latent entry whole (rank 0 writes it, every rank reads it). Tokens equal TP = 1's for
// 32 steps and logits are within float rounding (bf16 weights, f32 KV).
TEST_F(TensorParallelTest, ExpertsAndLatentAttentionAtTp2AndTp4EqualTp1) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-tp-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  struct Family {
    Architecture arch;
    int32_t q_lora_rank;
    const char* name;
  };
  for (const Family& fam : {Family{Architecture::kMixtral, 0, "mixtral"},
                            Family{Architecture::kQwen3Moe, 0, "qwen3_moe"},
                            Family{Architecture::kDeepseekV2, 0, "deepseek_v2"},
                            Family{Architecture::kDeepseekV3, 32, "deepseek_v3, q_lora_rank 32"}}) {
    SCOPED_TRACE(fam.name);
    MakeModelOptions mo;
    mo.out_dir = dir->path() + "/" + std::to_string(static_cast<int>(fam.arch));
    mo.preset = "tiny";
    mo.architecture = fam.arch;
    mo.dtype = kernels::DType::kBF16;
    mo.vocab_size = 1001;
    mo.num_heads = 8;
    mo.num_kv_heads = 4;
    mo.head_dim = 16;
    mo.q_lora_rank = fam.q_lora_rank;
    if (fam.arch != Architecture::kMixtral) mo.moe_intermediate_size = 48;
    mo.seed = 11;
    absl::StatusOr<MakeModelResult> made = MakeModel(mo);
    ASSERT_TRUE(made.ok()) << made.status();
    absl::StatusOr<HfModel> model = HfModel::Load(mo.out_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<ModelWeights> w = WeightsFromHf(*model);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->config.moe());
    Pool p1(w->config, kernels::DType::kF32, 16);
    std::unique_ptr<LlamaForward> f1 = MakeForward(*w, p1.view, 1, team_.get());
    ASSERT_NE(f1, nullptr);
    const Trace want = Generate(f1.get(), 32);
    for (int tp : {2, 4}) {
      Pool pn(w->config, kernels::DType::kF32, 16);
      std::unique_ptr<LlamaForward> fn = MakeForward(*w, pn.view, tp, team_.get());
      ASSERT_NE(fn, nullptr);
      const Trace got = Generate(fn.get(), 32);
      EXPECT_EQ(got.tokens, want.tokens) << "tp " << tp;
      EXPECT_LE(MaxAbsDiff(got.logits, want.logits), 1e-4f) << "tp " << tp;
      // The pool holds TP = 1's bytes: the same cache entries within rounding.
      float kv = 0;
      for (size_t i = 0; i < p1.data.size(); ++i) {
        kv = std::max(kv, std::abs(p1.data[i] - pn.data[i]));
      }
      EXPECT_LE(kv, 1e-4f) << "tp " << tp;
      // Every rank routed the same tokens: the coordinator reports rank 0's counts, TP = 1's.
      EXPECT_EQ(fn->expert_tokens(), f1->expert_tokens()) << "tp " << tp;
    }
  }
}

// The ranks on the device path, run on the host: each rank's shard uploaded on its own
// (DeviceWeights), metadata staged, the embedding's rows moved by CopyBlocks and the partial
// sums added by the device kernels, the collectives on the ranks' scratch. Logits and pools
// bitwise those of the same TP size on the direct path, prefill and decode steps (run as
// emulated graphs), for stories260K (f32, 4 KV heads), a bf16 Qwen3 with 2 KV heads shared by
// 4 ranks, and the expert and latent-attention families (bf16).
TEST_F(TensorParallelTest, StagedRanksEqualDirectRanksBitwise) {
  MakeTinyModels({Architecture::kQwen3, Architecture::kQwen3Moe, Architecture::kDeepseekV3}, 17);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<const ModelWeights*> all = {&weights_};
  for (const ModelWeights& w : hf_) all.push_back(&w);
  for (const ModelWeights* w : all) {
    for (int tp : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(ArchitectureName(w->config.architecture), " tp ", tp));
      testing::CompareSteps steps;
      for (uint32_t i = 0; i < 21; ++i) steps.prompt.push_back(3 + (i * 37) % 400);
      steps.options.tensor_parallel = tp;
      steps.ctx.parallel = team_.get();
      const bool experts = w->config.has_moe_layers();
      testing::ExpectStagedEqualsDirect(*w, *w, kernels::DType::kF32, steps,
                                        [&](LlamaForward& direct, LlamaForward& device) {
                                          EXPECT_EQ(device.expert_tokens(), direct.expert_tokens());
                                          // Decode steps as graphs, but for expert layers.
                                          EXPECT_EQ(device.graph_stats().captures > 0, !experts);
                                        });
    }
  }
}

// Per-rank pools (ForwardOptions::tp_rank_pools over a memory::TpKvPool): each rank writes and
// reads only a pool of its own heads, ranks sharing a KV head each keep a copy, MLA ranks each
// the whole latent entry. Logits are bitwise those of the same TP size on the shared pool, and
// the blocks gathered back into the TP = 1 layout are the shared pool's bytes, also after a
// compaction's row gather: for stories260K (f32, int8 and int4 caches), a bf16 Qwen3 with 2 KV
// heads shared by 4 ranks, and DeepSeek-V3 (MLA).
TEST_F(TensorParallelTest, RankPoolsEqualTheSharedPoolBitwise) {
  MakeTinyModels({Architecture::kQwen3, Architecture::kDeepseekV3}, 23);
  ASSERT_FALSE(HasFatalFailure());
  struct Case {
    const ModelWeights* w;
    kernels::DType dtype;
  };
  std::vector<Case> cases = {{&weights_, kernels::DType::kF32},
                             {&weights_, kernels::DType::kI8},
                             {&weights_, kernels::DType::kI4}};
  for (const ModelWeights& w : hf_) cases.push_back({&w, kernels::DType::kF32});
  constexpr int64_t kBlocks = 16;
  for (const Case& k : cases) {
    const ModelConfig& c = k.w->config;
    for (int tp : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(ArchitectureName(c.architecture), " ", kernels::DTypeName(k.dtype),
                                " tp ", tp));
      Pool shared(c, k.dtype, kBlocks);
      std::unique_ptr<LlamaForward> f = MakeForward(*k.w, shared.view, tp, team_.get());
      ASSERT_NE(f, nullptr);
      const Trace want = Generate(f.get(), 16);

      const kvcache::KvLayout layout{.num_layers = c.n_layers,
                                     .num_kv_heads = c.cache_kv_heads(),
                                     .head_dim = c.cache_head_dim(),
                                     .block_size = kBlockSize,
                                     .dtype = k.dtype};
      absl::StatusOr<TpPlan> plan = PlanTensorParallel(c, tp);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<memory::TpKvPool::RankHeads> heads;
      for (const TpPoolHeads& h : PoolHeadsOfRanks(c, *plan)) heads.push_back({h.begin, h.count});
      absl::StatusOr<std::unique_ptr<memory::TpKvPool>> pools =
          memory::TpKvPool::CreateHost(layout, kBlocks, heads);
      ASSERT_TRUE(pools.ok()) << pools.status();
      ForwardOptions options;
      options.tensor_parallel = tp;
      for (int r = 0; r < tp; ++r) {
        options.tp_rank_pools.push_back({(*pools)->rank(r)->base(), k.dtype, kBlocks, kBlockSize});
      }
      absl::StatusOr<std::unique_ptr<LlamaForward>> g = LlamaForward::Create(
          k.w, {nullptr, k.dtype, kBlocks, kBlockSize},
          kernels::OpContext{kernels::Device::kCpu, nullptr, team_.get()}, options);
      ASSERT_TRUE(g.ok()) << g.status();
      const Trace got = Generate(g->get(), 16);
      EXPECT_EQ(got.tokens, want.tokens);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * 4), 0);

      // A compaction (H2O, SnapKV) gathers kept rows: A's first two blocks into block 12, each
      // KV head (MLA: each layer) its own slots.
      const int64_t keep_heads = c.mla() ? 1 : c.n_kv_heads;
      std::vector<int32_t> keep;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        for (int64_t h = 0; h < keep_heads; ++h) {
          for (int32_t j = 0; j < 12; ++j) keep.push_back(2 * j + static_cast<int32_t>(h % 2));
        }
      }
      const std::vector<int32_t> src = {0, 1}, dst = {12};
      ASSERT_TRUE(f->GatherKvRows(src, dst, keep, 12).ok());
      ASSERT_TRUE((*g)->GatherKvRows(src, dst, keep, 12).ok());

      std::vector<uint8_t> block(static_cast<size_t>(shared.bytes));
      for (uint32_t b = 0; b < kBlocks; ++b) {
        ASSERT_TRUE((*pools)->ReadBlock(BlockId(b), block.data()).ok());
        EXPECT_EQ(
            std::memcmp(block.data(),
                        reinterpret_cast<const uint8_t*>(shared.data.data()) + b * shared.bytes,
                        block.size()),
            0)
            << "block " << b;
      }
    }
  }
}

// One TpKvPool view per rank, of the pool's geometry: else a named error.
TEST_F(TensorParallelTest, RankPoolsOfTheWrongCountOrGeometryAreRefused) {
  Pool p(weights_.config, kernels::DType::kF32, 4);
  ForwardOptions o;
  o.tensor_parallel = 2;
  o.tp_rank_pools = {p.view};
  const kernels::OpContext ctx{kernels::Device::kCpu, nullptr, team_.get()};
  absl::Status s = LlamaForward::Create(&weights_, p.view, ctx, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1 per-rank KV pools, need one per rank"));
  o.tp_rank_pools = {p.view, p.view};
  o.tp_rank_pools[1].num_blocks = 3;
  s = LlamaForward::Create(&weights_, p.view, ctx, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 1's KV pool (3 blocks"));
}

}  // namespace
}  // namespace pd::engine
