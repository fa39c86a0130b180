// Mixture-of-experts models through a real cluster (issue #34): random-weight pd-make-model
// checkpoints of Mixtral, Qwen3-MoE and DeepSeek-V2/V3 (8 experts, 2 per token; DeepSeek with
// multi-head latent attention) served by prefill + decode workers (the decode worker of Mixtral
// and DeepSeek-V3 at tensor parallel 2, issue #36) and by a decode worker alone, with their
// weights as stored and quantized to int8 at load. On every path greedy output is token for
// token the single-process engine's (the engine itself is checked against PyTorch in
// integration_torch_parity_test), a repeated prompt (a prefix-cache hit on the decode worker)
// gives the same tokens again, the decode worker reports its expert load, and the OpenAI API
// serves the model with its chat template.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "engine/runtime/model_runtime.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr uint32_t kMaxTokens = 40;

struct MoeCase {
  std::string name;
  engine::Architecture architecture;
  int32_t head_dim;  // 0 = hidden_size / num_heads
  engine::WeightDType weight_dtype;
  // The prefill + decode cluster's decode worker runs at this tensor-parallel size (issue #36):
  // experts split by columns, MLA's heads split with the latent whole on every rank.
  int decode_tp = 1;
  friend void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }
};

// The prompts, as token ids (BOS first): a vocabulary of 2,000 random-weight tokens.
std::vector<std::vector<uint32_t>> Prompts(uint32_t bos) {
  std::vector<std::vector<uint32_t>> out;
  for (uint32_t p = 0; p < 3; ++p) {
    std::vector<uint32_t> prompt = {bos};
    for (uint32_t i = 0; i < 20 + 7 * p; ++i) prompt.push_back(300 + (i * 131 + p * 17) % 1500);
    out.push_back(std::move(prompt));
  }
  return out;
}

std::vector<uint32_t> ReferenceGreedy(engine::ModelRuntime* rt, std::vector<uint32_t> prompt,
                                      uint64_t id) {
  std::vector<uint32_t> tokens;
  engine::GenerationRequest r;
  r.id = RequestId(id);
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = kMaxTokens;
  r.on_output = [&](engine::GenerationOutput o) {
    tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
  };
  EXPECT_TRUE(rt->scheduler()->Submit(std::move(r)).ok());
  while (!rt->scheduler()->idle()) rt->scheduler()->Step();
  return tokens;
}

pdserve::v1::GenerateRequest Request(const std::vector<uint32_t>& prompt) {
  pdserve::v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.mutable_sampling()->set_max_tokens(kMaxTokens);
  return r;
}

class MoeE2eTest : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeE2eTest, PrefillPlusDecodeAndAggregatedGiveTheEnginesTokens) {
  const MoeCase& mc = GetParam();
  absl::StatusOr<pd::testing::TempDir> tmp =
      pd::testing::TempDir::Create(absl::StrCat("pd-moe-", mc.name, "-"));
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  engine::MakeModelOptions o;
  o.out_dir = tmp->path() + "/model";
  o.preset = "tiny";
  o.vocab_size = 2000;
  o.seed = 34;
  o.architecture = mc.architecture;
  o.head_dim = mc.head_dim;
  if (mc.decode_tp > 1 && mc.architecture != engine::Architecture::kMixtral) {
    o.moe_intermediate_size = 48;  // the default 43 (intermediate_size / 4) does not split
  }
  absl::StatusOr<engine::MakeModelResult> made = engine::MakeModel(o);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(made->config.moe());

  engine::ModelRuntimeConfig rc;
  rc.model = o.out_dir;
  rc.kv_blocks = 256;
  rc.threads = 1;
  rc.weight_dtype = mc.weight_dtype;
  absl::StatusOr<std::unique_ptr<engine::ModelRuntime>> rt = engine::ModelRuntime::Create(rc);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const std::vector<std::vector<uint32_t>> prompts = Prompts(made->config.bos_id);
  std::vector<std::vector<uint32_t>> want;
  for (size_t i = 0; i < prompts.size(); ++i) {
    want.push_back(ReferenceGreedy(rt->get(), prompts[i], i + 1));
    ASSERT_EQ(want.back().size(), kMaxTokens);
  }
  rt->reset();

  std::vector<std::string> flags = {"--kv_blocks=256"};
  if (mc.weight_dtype == engine::WeightDType::kInt8) flags.push_back("--weight_dtype=int8");
  for (const int prefill : {1, 0}) {
    SCOPED_TRACE(prefill == 1 ? "prefill + decode" : "decode worker alone");
    const std::string dir = absl::StrCat(tmp->path(), "/cluster-", prefill);
    std::filesystem::create_directories(dir);
    std::vector<std::string> router_flags;
    if (mc.weight_dtype == engine::WeightDType::kInt8) {
      router_flags.push_back("--weight_dtype=int8");  // the fingerprint int8 workers report
    }
    if (prefill == 0) {
      router_flags.push_back(absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort));
    }
    std::function<std::vector<std::string>(const std::string&)> extra;
    if (prefill == 1 && mc.decode_tp > 1) {
      extra = [&](const std::string& id) {
        return id.rfind("decode", 0) == 0
                   ? std::vector<std::string>{absl::StrCat("--tensor_parallel=", mc.decode_tp)}
                   : std::vector<std::string>{};
      };
    }
    Cluster cluster(dir, prefill, 1, "round_robin", flags, router_flags, nullptr, extra,
                    e2e::ModelFiles{o.out_dir, ""});
    ASSERT_TRUE(cluster.WaitReady(absl::Seconds(60))) << cluster.Logs();
    for (size_t i = 0; i < prompts.size(); ++i) {
      e2e::Generated g = cluster.Generate(Request(prompts[i]));
      ASSERT_TRUE(g.status.ok()) << g.status.error_message() << cluster.Logs();
      EXPECT_EQ(g.tokens, want[i]) << "prompt " << i;
    }
    // Again: the prompt's blocks are in the decode worker's cache now.
    e2e::Generated again = cluster.Generate(Request(prompts[0]));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.tokens, want[0]);
    const std::string metrics = cluster.WorkerMetrics(prefill);  // the decode worker
    EXPECT_THAT(metrics, HasSubstr("pd_worker_moe_expert_tokens_total{layer=\"1\",expert=\"7\"}"));
    EXPECT_THAT(metrics, HasSubstr("pd_worker_moe_expert_load_max_ratio"));
    if (prefill == 1 && mc.decode_tp > 1) {
      EXPECT_THAT(metrics, HasSubstr(absl::StrCat("pd_worker_tensor_parallel_ranks ",
                                                  mc.decode_tp)));
    }
    if (prefill == 0) {
      // The OpenAI API, with the chat template pd-make-model writes.
      httplib::Client http("127.0.0.1", cluster.http_port());
      http.set_read_timeout(60, 0);
      const json body = {{"model", "model"},
                         {"messages", {{{"role", "user"}, {"content", "Which expert?"}}}},
                         {"max_tokens", 8},
                         {"temperature", 0}};
      auto res = http.Post("/v1/chat/completions", body.dump(), "application/json");
      ASSERT_TRUE(res) << httplib::to_string(res.error());
      ASSERT_EQ(res->status, 200) << res->body;
      const json answer = json::parse(res->body);
      EXPECT_EQ(answer["usage"]["completion_tokens"], 8) << res->body;
    }
  }
}

// DeepSeek's latent blocks through pd-tierd: a decode worker with a pool of 24 blocks serves
// twelve prompts of 9+ blocks, so blocks spill to the node's DRAM tier; asking again restores
// them (the tier's blocks are the worker's latent bytes) and every output equals the engine's.
TEST(DeepseekTierE2eTest, LatentBlocksComeBackFromTheTiersWithExactOutput) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-mla-tier-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  engine::MakeModelOptions o;
  o.out_dir = tmp->path() + "/model";
  o.preset = "tiny";
  o.vocab_size = 2000;
  o.seed = 35;
  o.architecture = engine::Architecture::kDeepseekV3;
  absl::StatusOr<engine::MakeModelResult> made = engine::MakeModel(o);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(made->config.mla());
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 12; ++p) {
    std::vector<uint32_t> prompt = {made->config.bos_id, 100 + p};  // distinct first blocks
    for (uint32_t i = 0; i < 140; ++i) prompt.push_back(300 + (i * 37 + p) % 1500);
    prompts.push_back(std::move(prompt));
  }
  engine::ModelRuntimeConfig rc;
  rc.model = o.out_dir;
  rc.kv_blocks = 256;
  rc.threads = 1;
  absl::StatusOr<std::unique_ptr<engine::ModelRuntime>> rt = engine::ModelRuntime::Create(rc);
  ASSERT_TRUE(rt.ok()) << rt.status();
  std::vector<std::vector<uint32_t>> want;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<uint32_t> tokens = ReferenceGreedy(rt->get(), prompts[i], i + 1);
    tokens.resize(16);
    want.push_back(std::move(tokens));
  }
  rt->reset();

  const std::string dir = tmp->path();
  e2e::Tierd tierd(dir, {"--model=" + o.out_dir, "--tokenizer="});
  Cluster c(dir, 0, 1, "round_robin",
            {"--kv_blocks=24", "--tierd_address=" + tierd.address(), "--tier_offer_slots=16"}, {},
            nullptr, nullptr, e2e::ModelFiles{o.out_dir, ""});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs() << tierd.Log();
  auto pass = [&](bool reverse) {
    uint64_t tier_cached = 0;
    for (size_t n = 0; n < prompts.size(); ++n) {
      const size_t i = reverse ? prompts.size() - 1 - n : n;
      pdserve::v1::GenerateRequest r = Request(prompts[i]);
      r.mutable_sampling()->set_max_tokens(16);
      e2e::Generated g = c.Generate(r);
      EXPECT_TRUE(g.status.ok()) << g.status.error_message() << c.Logs();
      EXPECT_EQ(g.tokens, want[i]) << "prompt " << i;
      tier_cached += g.last.usage().tier_cached_tokens();
    }
    return tier_cached;
  };
  EXPECT_EQ(pass(false), 0u) << "a cold pass has no tier hits";
  EXPECT_GT(pass(true), 0u) << c.Logs() << tierd.Log();
  const std::string wm = c.WorkerMetrics(0);
  EXPECT_GT(e2e::Metric(wm, "pd_worker_tier_restored_blocks_total"), 0) << wm;
}

INSTANTIATE_TEST_SUITE_P(
    Models, MoeE2eTest,
    ::testing::Values(
        MoeCase{"mixtral", engine::Architecture::kMixtral, 0, engine::WeightDType::kAuto, 2},
        MoeCase{"qwen3_moe_int8", engine::Architecture::kQwen3Moe, 32, engine::WeightDType::kInt8},
        // DeepSeek: multi-head latent attention (latent KV blocks through the
        // hand-off and the caches), a dense first layer, shared experts; V3's
        // sigmoid, biased, group-limited routing.
        MoeCase{"deepseek_v3", engine::Architecture::kDeepseekV3, 0, engine::WeightDType::kAuto,
                2},
        MoeCase{"deepseek_v2_int8", engine::Architecture::kDeepseekV2, 0,
                engine::WeightDType::kInt8}),
    [](const ::testing::TestParamInfo<MoeCase>& info) { return info.param.name; });

}  // namespace
}  // namespace pd
