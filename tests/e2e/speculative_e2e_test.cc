// Speculative decoding through a real cluster (issue #33): a prefill + decode cluster whose
// workers run --speculative=ngram gives, token for token, what a decode worker alone without it
// gives, for greedy requests, a seeded sampled one, one with logprobs and a greedy one under a
// grammar (a regex), with the n-gram proposer and with a draft model (stories260K's int8 copy,
// and a shallower random-weight pair from pd-make-model); the decode worker's metrics show
// proposals accepted; bad draft flags are refused at start.
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::testing::HasSubstr;

constexpr const char* kPrompts[] = {"Once upon a time", "Lily and Tom went to the park.",
                                    "The dog was sad because"};

struct Answers {
  std::vector<std::vector<uint32_t>> greedy;
  std::vector<uint32_t> sampled;
  std::vector<uint32_t> logprob_tokens;
  std::vector<float> logprobs;
  std::vector<uint32_t> constrained;  // greedy under a regex
  std::string constrained_text;
  std::string metrics;  // every worker's, concatenated
};

Answers RunCluster(const std::string& dir, int prefill, std::vector<std::string> worker_flags,
                   e2e::ModelFiles model = {}) {
  std::filesystem::create_directories(dir);
  Cluster cluster(dir, prefill, 1, "round_robin", std::move(worker_flags), {}, nullptr, nullptr,
                  std::move(model));
  Answers a;
  if (!cluster.WaitReady(absl::Seconds(60))) {
    ADD_FAILURE() << cluster.Logs();
    return a;
  }
  for (const char* prompt : kPrompts) {
    pdserve::v1::GenerateRequest r;
    r.set_text(prompt);
    r.mutable_sampling()->set_max_tokens(96);
    e2e::Generated g = cluster.Generate(r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message() << cluster.Logs();
    a.greedy.push_back(g.tokens);
  }
  pdserve::v1::GenerateRequest r;
  r.set_text(kPrompts[0]);
  r.mutable_sampling()->set_max_tokens(48);
  r.mutable_sampling()->set_temperature(0.8f);
  r.mutable_sampling()->set_seed(11);
  a.sampled = cluster.Generate(r).tokens;
  // Greedy with logprobs: the verify rows' logits give them.
  r = pdserve::v1::GenerateRequest();
  r.set_text(kPrompts[1]);
  r.mutable_sampling()->set_max_tokens(48);
  r.mutable_sampling()->set_logprobs(2);
  e2e::Generated g = cluster.Generate(r);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  a.logprob_tokens = g.tokens;
  // Structured output: proposals cut to what the grammar allows, verify rows under its mask.
  r = pdserve::v1::GenerateRequest();
  r.set_text(kPrompts[2]);
  r.mutable_sampling()->set_max_tokens(80);
  r.mutable_sampling()->mutable_constraint()->set_regex("[A-Za-z ,.']{1,200}");
  g = cluster.Generate(r);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  a.constrained = g.tokens;
  a.constrained_text = g.text;
  for (int i = 0; i < prefill + 1; ++i) a.metrics += cluster.WorkerMetrics(i);
  return a;
}

int64_t Counter(const std::string& metrics, const std::string& name) {
  int64_t total = 0;
  size_t at = 0;
  while ((at = metrics.find("\n" + name + " ", at)) != std::string::npos) {
    at += name.size() + 2;
    total += std::stoll(metrics.substr(at, metrics.find('\n', at) - at));
  }
  return total;
}

TEST(SpeculativeE2eTest, NgramOnPrefillPlusDecodeGivesTheOutputOfPlainDecoding) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-spec-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const Answers plain = RunCluster(tmp->path() + "/plain", 0, {});
  const Answers spec =
      RunCluster(tmp->path() + "/spec", 1, {"--speculative=ngram", "--spec_max_tokens=5", "--spec_adaptive=false"});
  ASSERT_EQ(plain.greedy.size(), 3u);
  ASSERT_EQ(spec.greedy.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(plain.greedy[i].empty());
    EXPECT_EQ(spec.greedy[i], plain.greedy[i]) << "prompt " << i;
  }
  EXPECT_EQ(spec.sampled.size(), 48u);
  EXPECT_EQ(spec.sampled, plain.sampled);
  EXPECT_EQ(spec.logprob_tokens, plain.logprob_tokens);
  EXPECT_FALSE(plain.constrained.empty());
  EXPECT_EQ(spec.constrained, plain.constrained);
  EXPECT_THAT(plain.constrained_text, ::testing::MatchesRegex("[A-Za-z ,.']+"));
  EXPECT_EQ(Counter(plain.metrics, "pd_worker_spec_proposed_tokens_total"), 0);
  const int64_t accepted = Counter(spec.metrics, "pd_worker_spec_accepted_tokens_total");
  EXPECT_GT(accepted, 10) << spec.metrics;
  EXPECT_LE(accepted, Counter(spec.metrics, "pd_worker_spec_proposed_tokens_total"));
}

// A draft model (stories260K's int8 copy, loaded by the decode worker from the same checkpoint)
// proposes; the output is plain decoding's, and the metrics show the draft ran and its
// proposals were accepted.
TEST(SpeculativeE2eTest, DraftModelOnPrefillPlusDecodeGivesTheOutputOfPlainDecoding) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-spec-draft-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const Answers plain = RunCluster(tmp->path() + "/plain", 0, {});
  const Answers spec = RunCluster(
      tmp->path() + "/draft", 1,
      {"--speculative=draft", absl::StrCat("--draft_model=", e2e::kModel),
       "--draft_weight_dtype=int8", "--draft_kv_blocks=64", "--spec_max_tokens=4",
       "--spec_adaptive=false"});
  ASSERT_EQ(spec.greedy.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(spec.greedy[i], plain.greedy[i]) << "prompt " << i;
  EXPECT_EQ(spec.sampled, plain.sampled);
  EXPECT_EQ(spec.logprob_tokens, plain.logprob_tokens);
  EXPECT_EQ(spec.constrained, plain.constrained);
  const int64_t accepted = Counter(spec.metrics, "pd_worker_spec_accepted_tokens_total");
  EXPECT_GT(accepted, 50) << spec.metrics;
  EXPECT_GT(Counter(spec.metrics, "pd_worker_draft_forward_passes_total"), 0);
}

// A draft of another shape: pd-make-model writes a 4-layer target whose last two layers add
// little (--layer_output_scale) and its 2-layer draft (the same seed, --num_layers=2). The draft
// has its own KV layout and agrees with the target only part of the time, so proposals are both
// accepted and rejected; the output is still plain decoding's.
TEST(SpeculativeE2eTest, AShallowerDraftOfTheTargetGivesTheOutputOfPlainDecoding) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-spec-pair-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  engine::MakeModelOptions target;
  target.out_dir = tmp->path() + "/target";
  target.num_layers = 4;
  target.seed = 5;
  target.layer_output_scale = 0.3f;
  target.scaled_layers_from = 2;
  ASSERT_TRUE(engine::MakeModel(target).ok());
  engine::MakeModelOptions draft = target;
  draft.out_dir = tmp->path() + "/draft";
  draft.num_layers = 2;
  draft.layer_output_scale = 1.0f;
  draft.scaled_layers_from = 0;
  ASSERT_TRUE(engine::MakeModel(draft).ok());
  const e2e::ModelFiles model{target.out_dir, ""};
  const Answers plain = RunCluster(tmp->path() + "/plain", 0, {}, model);
  const Answers spec = RunCluster(
      tmp->path() + "/spec", 1,
      {"--speculative=draft", "--draft_model=" + draft.out_dir, "--spec_max_tokens=4",
       "--spec_adaptive=false"},
      model);
  ASSERT_EQ(plain.greedy.size(), 3u);
  ASSERT_EQ(spec.greedy.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(plain.greedy[i].empty());
    EXPECT_EQ(spec.greedy[i], plain.greedy[i]) << "prompt " << i;
  }
  EXPECT_EQ(spec.sampled, plain.sampled);
  EXPECT_EQ(spec.logprob_tokens, plain.logprob_tokens);
  EXPECT_EQ(spec.constrained, plain.constrained);
  const int64_t proposed = Counter(spec.metrics, "pd_worker_spec_proposed_tokens_total");
  const int64_t accepted = Counter(spec.metrics, "pd_worker_spec_accepted_tokens_total");
  std::printf("shallower draft: %lld of %lld proposals accepted\n",
              static_cast<long long>(accepted), static_cast<long long>(proposed));
  EXPECT_GT(accepted, proposed / 4) << spec.metrics;
  EXPECT_LT(accepted, proposed) << spec.metrics;
}

// What pd-worker prints and its exit status for `flags` (it must not start).
std::pair<int, std::string> WorkerRefuses(const std::string& flags) {
  const std::string cmd = absl::StrCat("timeout 30 ", e2e::kWorker, " --model=", e2e::kModel,
                                       " --tokenizer=", e2e::kTokenizer,
                                       " --grpc_address=127.0.0.1:0 ", flags, " 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  return {::pclose(p), out};
}

TEST(SpeculativeE2eTest, BadDraftFlagsAreRefusedAtStart) {
  auto [status, out] = WorkerRefuses("--speculative=draft");
  EXPECT_NE(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("--speculative=draft needs --draft_model"));
  std::tie(status, out) = WorkerRefuses(absl::StrCat("--draft_model=", e2e::kModel));
  EXPECT_NE(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("--draft_model is set but --speculative is \"off\""));
  std::tie(status, out) = WorkerRefuses("--speculative=draft --draft_model=/nonexistent/draft");
  EXPECT_NE(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("--draft_model /nonexistent/draft does not exist"));
  // Another tokenizer: a random-weight model of another vocabulary.
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-spec-vocab-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  engine::MakeModelOptions o;
  o.out_dir = tmp->path() + "/draft";
  o.preset = "tiny";
  o.vocab_size = 1000;
  ASSERT_TRUE(engine::MakeModel(o).ok());
  std::tie(status, out) =
      WorkerRefuses(absl::StrCat("--speculative=draft --draft_model=", o.out_dir));
  EXPECT_NE(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("a draft model must share the model's tokenizer"));
  std::tie(status, out) =
      WorkerRefuses(absl::StrCat("--speculative=draft --draft_weight_dtype=int4 --draft_model=",
                                 e2e::kModel));
  EXPECT_NE(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("--draft_weight_dtype"));
}

}  // namespace
}  // namespace pd
