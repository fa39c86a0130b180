// ModelRuntime device selection (label unit): --device parsing, the cpu runtime's pool view,
// and the startup error of --device cuda where this machine cannot run it.
#include "engine/runtime/model_runtime.h"

#include "common/testing/temp_dir.h"
#include "engine/runtime/runtime_test_util.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

TEST(ModelRuntimeTest, BatchLimitsSuitTheDevice) {
  const DeviceBatchLimits cpu = BatchLimitsFor(kernels::Device::kCpu);
  EXPECT_EQ(cpu.max_batch_tokens, 256);
  EXPECT_EQ(cpu.max_running, 32);
  const DeviceBatchLimits gpu = BatchLimitsFor(kernels::Device::kCuda);
  EXPECT_EQ(gpu.max_batch_tokens, 2048);
  EXPECT_EQ(gpu.max_running, 256);
  // Both pass the scheduler's own validation as a configuration.
  for (const DeviceBatchLimits& l : {cpu, gpu}) {
    SchedulerConfig c;
    c.max_batch_tokens = l.max_batch_tokens;
    c.max_running = l.max_running;
    EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  }
}

TEST(ModelRuntimeTest, ParsesDeviceNames) {
  EXPECT_EQ(*ParseDevice("cpu"), kernels::Device::kCpu);
  EXPECT_EQ(*ParseDevice("cuda"), kernels::Device::kCuda);
  const absl::Status bad = ParseDevice("gpu").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--device"));
  EXPECT_EQ(DeviceName(kernels::Device::kCpu), "cpu");
  EXPECT_EQ(DeviceName(kernels::Device::kCuda), "cuda");
}

TEST(ModelRuntimeTest, ParsesWeightDTypes) {
  EXPECT_EQ(*ParseWeightDType("auto"), WeightDType::kAuto);
  EXPECT_EQ(*ParseWeightDType("int8"), WeightDType::kInt8);
  const absl::Status bad = ParseWeightDType("int4").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--weight_dtype must be auto or int8"));
  EXPECT_EQ(WeightDTypeName(WeightDType::kInt8), "int8");
}

// --weight_dtype int8: a different fingerprint (so it never pairs with an f32 worker; ModelFront
// given the flag agrees), and the
// same greedy tokens as f32 on a short generation (quantize_weights_test measures how far).
TEST(ModelRuntimeTest, Int8WeightsChangeTheFingerprintNotTheShortGreedyOutput) {
  absl::StatusOr<std::unique_ptr<ModelRuntime>> f32 =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  ASSERT_TRUE(f32.ok()) << f32.status();
  ModelRuntimeConfig config = testing::StoriesConfig(kernels::Device::kCpu);
  config.weight_dtype = WeightDType::kInt8;
  absl::StatusOr<std::unique_ptr<ModelRuntime>> i8 = ModelRuntime::Create(config);
  ASSERT_TRUE(i8.ok()) << i8.status();
  EXPECT_EQ((*i8)->fingerprint(), (*f32)->fingerprint() + "+w8");
  // What pd-router and pd-tierd compute when told --weight_dtype int8.
  absl::StatusOr<std::unique_ptr<ModelFront>> front =
      ModelFront::Load(config.model, config.tokenizer, WeightDType::kInt8);
  ASSERT_TRUE(front.ok()) << front.status();
  EXPECT_EQ((*front)->fingerprint(), (*i8)->fingerprint());
  EXPECT_THAT((*i8)->Describe(), HasSubstr("weights i8"));
  std::vector<testing::Generated> a = testing::GreedyAll(f32->get(), {{1, 403, 407}}, 8);
  std::vector<testing::Generated> b = testing::GreedyAll(i8->get(), {{1, 403, 407}}, 8);
  ASSERT_TRUE(b[0].status.ok()) << b[0].status;
  EXPECT_EQ(a[0].tokens, b[0].tokens);
}

TEST(ModelRuntimeTest, CpuRuntimeExposesItsHostPoolThroughKvMemory) {
  absl::StatusOr<std::unique_ptr<ModelRuntime>> rt =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_NE((*rt)->kv_pool(), nullptr);
  memory::KvPoolMemory* mem = (*rt)->kv_memory();
  EXPECT_EQ(mem->device(), kernels::Device::kCpu);
  EXPECT_EQ(mem->base(), (*rt)->kv_pool()->base());
  EXPECT_EQ(mem->size_bytes(), (*rt)->kv_pool()->size_bytes());
  EXPECT_EQ((*rt)->device(), kernels::Device::kCpu);
  EXPECT_THAT((*rt)->Describe(), HasSubstr("on cpu"));
  // A generation writes KV into the pool; ReadBlock sees the same bytes as BlockData.
  std::vector<testing::Generated> out = testing::GreedyAll(rt->get(), {{1, 403, 407}}, 4);
  ASSERT_TRUE(out[0].status.ok()) << out[0].status;
  EXPECT_EQ(out[0].tokens.size(), 4u);
  std::vector<uint8_t> block(mem->block_bytes());
  for (uint32_t b = 0; b < 64; ++b) {
    ASSERT_TRUE(mem->ReadBlock(BlockId(b), block.data()).ok());
    ASSERT_EQ(std::memcmp(block.data(), (*rt)->kv_pool()->BlockData(BlockId(b)), block.size()), 0);
  }
}

// --kv_blocks 0 sizes a GPU pool from the device's memory; on the CPU it is a usage error.
TEST(ModelRuntimeTest, AutoKvBlocksFillTheFractionLeft) {
  const int64_t gib = int64_t{1} << 30;
  // 80 GiB card, 6 GiB in use (context + weights), 90%: 72 - 6 - 2 (scratch) - 1 (reserve) GiB.
  AutoPoolSize s = AutoPoolBlocks(80 * gib, 74 * gib, 0.9, 2 * gib, 1 << 20);
  EXPECT_EQ(s.budget_bytes, 63 * gib);
  EXPECT_EQ(s.blocks, 63 * 1024);
  s = AutoPoolBlocks(80 * gib, 74 * gib, 0.9, 2 * gib, 3 << 20);  // partial blocks round down
  EXPECT_EQ(s.blocks, 63 * gib / (3 << 20));
  s = AutoPoolBlocks(8 * gib, 2 * gib, 0.5, gib, 1 << 20);  // already past the fraction
  EXPECT_EQ(s.budget_bytes, 0);
  EXPECT_EQ(s.blocks, 0);

  ModelRuntimeConfig c = testing::StoriesConfig(kernels::Device::kCpu);
  c.kv_blocks = 0;
  absl::Status v = c.Validate();
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << v;
  EXPECT_THAT(v.message(), HasSubstr("--device cuda"));
  c.device = kernels::Device::kCuda;
  EXPECT_TRUE(c.Validate().ok());
  c.gpu_memory_fraction = 1.5;
  v = c.Validate();
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << v;
  EXPECT_THAT(v.message(), HasSubstr("--gpu_memory_fraction"));
}

// --tensor_parallel: out of range and unsupported combinations fail at startup naming the flags;
// at 2 the runtime serves the same greedy tokens as at 1 and says so in Describe().
TEST(ModelRuntimeTest, TensorParallelIsCheckedAtStartupAndServesTheSameTokens) {
  ModelRuntimeConfig c = testing::StoriesConfig(kernels::Device::kCpu);
  c.tensor_parallel = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("--tensor_parallel must be in [1, 64], got 0"));
  c.tensor_parallel = 3;  // stories260K has 8 query heads
  absl::StatusOr<std::unique_ptr<ModelRuntime>> bad = ModelRuntime::Create(c);
  EXPECT_THAT(bad.status().message(), HasSubstr("does not divide the model's 8 query heads"));
  c.tensor_parallel = 2;
  absl::StatusOr<std::unique_ptr<ModelRuntime>> tp2 = ModelRuntime::Create(c);
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_THAT((*tp2)->Describe(), HasSubstr("tensor parallel x2"));
  absl::StatusOr<std::unique_ptr<ModelRuntime>> tp1 =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCpu));
  ASSERT_TRUE(tp1.ok()) << tp1.status();
  // Three prompts batched, 48 tokens each.
  const std::vector<std::vector<uint32_t>> prompts = {{1, 403, 407}, {1, 265, 266, 267}, {1}};
  const std::vector<testing::Generated> got = testing::GreedyAll(tp2->get(), prompts, 48);
  const std::vector<testing::Generated> want = testing::GreedyAll(tp1->get(), prompts, 48);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens.size(), 48u);
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
  }

  // Per-rank pools: the same tokens; the pool has no single base, and its blocks read back in
  // the TP = 1 layout are the shared pool's bytes (the same ranks computed them).
  c.tp_rank_pools = true;
  absl::StatusOr<std::unique_ptr<ModelRuntime>> ranks = ModelRuntime::Create(c);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ((*ranks)->kv_pool(), nullptr);
  EXPECT_EQ((*ranks)->kv_memory()->base(), nullptr);
  const std::vector<testing::Generated> per_rank = testing::GreedyAll(ranks->get(), prompts, 48);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(per_rank[i].tokens, want[i].tokens) << "prompt " << i << ", per-rank pools";
  }
  memory::KvPoolMemory* a = (*tp2)->kv_memory();
  memory::KvPoolMemory* b = (*ranks)->kv_memory();
  ASSERT_EQ(a->block_bytes(), b->block_bytes());
  std::vector<uint8_t> x(a->block_bytes()), y(b->block_bytes());
  for (uint32_t block = 0; block < 64; ++block) {
    ASSERT_TRUE(a->ReadBlock(BlockId(block), x.data()).ok());
    ASSERT_TRUE(b->ReadBlock(BlockId(block), y.data()).ok());
    EXPECT_EQ(x, y) << "block " << block;
  }
  c.tensor_parallel = 1;
  EXPECT_THAT(c.Validate().message(),
              HasSubstr("--tp_kv_pools=per_rank needs --tensor_parallel of 2 or more, got 1"));
  EXPECT_THAT(ParseTpKvPools("both").status().message(),
              HasSubstr("--tp_kv_pools must be shared or per_rank"));
}

// Greedy `max_tokens` from `prompt` under H2O (budget 64) and SnapKV (budget 32), both with 16
// recent tokens, at TP 1 and at `tp` (shared and per-rank pools): every output is the full
// length, every run compacts, and TP `tp` gives TP 1's tokens.
void ExpectScorePoliciesEqualTp1(ModelRuntimeConfig base, int tp,
                                 const std::vector<uint32_t>& prompt, uint32_t max_tokens) {
  for (const char* policy : {"h2o", "snapkv"}) {
    std::vector<std::vector<testing::Generated>> out;
    for (const int size : {1, tp, -tp}) {  // -tp: per-rank pools
      ModelRuntimeConfig c = base;
      c.tensor_parallel = std::abs(size);
      c.tp_rank_pools = size < 0;
      c.scheduler.kv_policy = policy;
      c.scheduler.kv_budget_tokens = std::string(policy) == "h2o" ? 64 : 32;
      c.scheduler.kv_recent_tokens = 16;
      absl::StatusOr<std::unique_ptr<ModelRuntime>> rt = ModelRuntime::Create(c);
      ASSERT_TRUE(rt.ok()) << rt.status();
      out.push_back(testing::GreedyAll(rt->get(), {prompt}, max_tokens));
      EXPECT_GT((*rt)->scheduler()->Stats().kv_compactions, 0) << policy << " tp " << size;
    }
    ASSERT_EQ(out[0][0].tokens.size(), max_tokens) << policy << out[0][0].status;
    EXPECT_EQ(out[1][0].tokens, out[0][0].tokens) << policy;
    EXPECT_EQ(out[2][0].tokens, out[0][0].tokens) << policy << ", per-rank pools";
  }
}

// H2O and SnapKV at TP 2: each rank scores and compacts its own KV heads (the scores of a head
// come from its own query heads, all on one rank), so the policies give TP 1's tokens: 300
// tokens under a 64-token H2O budget, and a SnapKV prompt compressed to 32.
TEST(ModelRuntimeTest, ScorePoliciesRunOnTensorParallelRanks) {
  std::vector<uint32_t> prompt = {1};
  for (uint32_t t = 0; t < 60; ++t) prompt.push_back(300 + t % 40);
  ExpectScorePoliciesEqualTp1(testing::StoriesConfig(kernels::Device::kCpu), 2, prompt, 300);
}

// Ranks sharing a KV head (4 ranks over a random model's 2 KV heads): they take turns adding
// their query heads' scores to the head's row, and the first of them moves the head's rows at
// a compaction. Tokens equal TP 1's under both policies.
TEST(ModelRuntimeTest, ScorePoliciesRunOnRanksSharingAKvHead) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-rt-tp-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  MakeModelOptions mo;
  mo.out_dir = dir->path() + "/m";
  mo.preset = "tiny";
  mo.vocab_size = 1001;
  mo.num_heads = 8;
  mo.num_kv_heads = 2;
  mo.head_dim = 16;
  mo.seed = 5;
  absl::StatusOr<MakeModelResult> made = MakeModel(mo);
  ASSERT_TRUE(made.ok()) << made.status();
  ModelRuntimeConfig c;
  c.model = mo.out_dir;
  c.kv_blocks = 64;
  c.threads = 1;
  std::vector<uint32_t> prompt = {made->config.bos_id};
  for (uint32_t t = 0; t < 60; ++t) prompt.push_back(300 + (t * 37) % 500);
  ExpectScorePoliciesEqualTp1(c, 4, prompt, 200);  // this seed runs 200 tokens without an EOS
}

// MLA models (DeepSeek-V3, q_lora_rank 24, 8 heads over a 32-element latent plus a 4-element
// rope key): one score row per layer, the absorbed queries' weights on the latent entries
// (what LatentAttention softmaxes), and a compaction moves every cache head of an entry. At TP
// 2 both ranks add their heads' weights to the one row in turns; the tokens equal TP 1's under
// both policies. Chunked prefill (7 tokens a step) gives the unchunked tokens: a chunk's mass
// calls add the same floats in the same order.
TEST(ModelRuntimeTest, ScorePoliciesRunOnMlaModels) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-rt-mla-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  MakeModelOptions mo;
  mo.out_dir = dir->path() + "/m";
  mo.preset = "tiny";
  mo.architecture = Architecture::kDeepseekV3;
  mo.vocab_size = 1001;
  mo.num_heads = 8;
  mo.q_lora_rank = 24;
  mo.first_k_dense_replace = 1;   // layer 0 dense, the others experts
  mo.moe_intermediate_size = 48;  // split by TP 2
  mo.seed = 7;
  absl::StatusOr<MakeModelResult> made = MakeModel(mo);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(made->config.mla());
  ModelRuntimeConfig c;
  c.model = mo.out_dir;
  c.kv_blocks = 64;
  c.threads = 1;
  std::vector<uint32_t> prompt = {made->config.bos_id};
  for (uint32_t t = 0; t < 60; ++t) prompt.push_back(200 + (t * 53) % 700);
  ExpectScorePoliciesEqualTp1(c, 2, prompt, 160);
  for (const char* policy : {"h2o", "snapkv"}) {
    std::vector<std::vector<uint32_t>> tokens;
    for (int64_t chunk : {256, 7}) {
      ModelRuntimeConfig cc = c;
      cc.scheduler.kv_policy = policy;
      cc.scheduler.kv_budget_tokens = std::string(policy) == "h2o" ? 64 : 32;
      cc.scheduler.kv_recent_tokens = 16;
      cc.scheduler.max_batch_tokens = chunk;
      cc.scheduler.max_running = std::min<int64_t>(cc.scheduler.max_running, chunk);
      absl::StatusOr<std::unique_ptr<ModelRuntime>> rt = ModelRuntime::Create(cc);
      ASSERT_TRUE(rt.ok()) << rt.status();
      tokens.push_back(testing::GreedyAll(rt->get(), {prompt}, 160)[0].tokens);
    }
    EXPECT_EQ(tokens[1], tokens[0]) << policy << ": chunked differs";
  }
}

TEST(ModelRuntimeTest, CudaWhereItCannotRunFailsAtStartupNamingWhy) {
  if (kernels::DeviceMemoryBuilt(kernels::Device::kCuda) &&
      kernels::DeviceCount(kernels::Device::kCuda) > 0) {
    GTEST_SKIP() << "a CUDA device exists: model_runtime_cuda_test covers it";
  }
  const absl::Status s =
      ModelRuntime::Create(testing::StoriesConfig(kernels::Device::kCuda)).status();
  if (!kernels::DeviceMemoryBuilt(kernels::Device::kCuda)) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(s.message(), HasSubstr("PD_ENABLE_CUDA"));
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("no CUDA device"));
  }
}

}  // namespace
}  // namespace pd::engine
