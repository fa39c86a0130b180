// The engine's logits against the PyTorch oracle (tests/reference/llama_reference.py, run as a
// child process under /usr/bin/python3): prefill and 32 decode steps, f32 within 1e-4 relative;
// and the top-5 log-probabilities kernels::LogProbs derives from the engine's logits against
// torch.log_softmax of the oracle's, within what the logits' difference allows.
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/scheduler/scheduler.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"
#include "kernels/logprobs.h"

namespace pd::engine {
namespace {

constexpr char kOracle[] = PD_SOURCE_DIR "/tests/reference/llama_reference.py";
constexpr int kDecodeSteps = 32;
constexpr int64_t kBlockSize = 16;
constexpr int kTopLogprobs = 5;

// The oracle's output file: tokens (prompt then generated) and one logits row per position.
struct Reference {
  uint32_t vocab = 0, num_prompt = 0, num_steps = 0;
  std::vector<uint32_t> tokens;
  std::vector<float> logits;  // [num_prompt + num_steps][vocab]
  // torch.log_softmax top-k of every row, as torch.topk ranks them.
  uint32_t top_k = 0;
  std::vector<int32_t> top_ids;  // [num_prompt + num_steps][top_k]
  std::vector<float> top_logprobs;
};

absl::Status ReadTopLogprobs(const std::string& path, Reference* r) {
  std::ifstream in(path, std::ios::binary);
  char magic[4];
  uint32_t header[3];
  if (!in.read(magic, 4) || std::string(magic, 4) != "PDLP" ||
      !in.read(reinterpret_cast<char*>(header), sizeof(header)) || header[0] != 1 ||
      header[1] != r->num_prompt + r->num_steps) {
    return absl::DataLossError(absl::StrCat("bad oracle logprobs ", path));
  }
  r->top_k = header[2];
  r->top_ids.resize(static_cast<size_t>(header[1]) * r->top_k);
  r->top_logprobs.resize(r->top_ids.size());
  for (uint32_t row = 0; row < header[1]; ++row) {
    if (!in.read(reinterpret_cast<char*>(&r->top_ids[row * r->top_k]), r->top_k * 4) ||
        !in.read(reinterpret_cast<char*>(&r->top_logprobs[row * r->top_k]), r->top_k * 4)) {
      return absl::DataLossError(absl::StrCat("truncated oracle logprobs ", path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Reference> ReadReference(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4];
  uint32_t header[4];
  if (!in.read(magic, 4) || std::string(magic, 4) != "PDRL" ||
      !in.read(reinterpret_cast<char*>(header), sizeof(header)) || header[0] != 1) {
    return absl::DataLossError(absl::StrCat("bad oracle output ", path));
  }
  Reference r;
  r.vocab = header[1];
  r.num_prompt = header[2];
  r.num_steps = header[3];
  r.tokens.resize(r.num_prompt + r.num_steps);
  r.logits.resize(static_cast<size_t>(r.num_prompt + r.num_steps) * r.vocab);
  if (!in.read(reinterpret_cast<char*>(r.tokens.data()), r.tokens.size() * 4) ||
      !in.read(reinterpret_cast<char*>(r.logits.data()), r.logits.size() * 4)) {
    return absl::DataLossError(absl::StrCat("truncated oracle output ", path));
  }
  return r;
}

absl::StatusOr<Reference> RunOracle(std::vector<std::string> model_args,
                                    const std::vector<uint32_t>& prompt,
                                    const pd::testing::TempDir& dir,
                                    int decode_steps = kDecodeSteps,
                                    std::vector<std::string> extra_args = {}) {
  std::vector<std::string> argv = {"/usr/bin/python3", kOracle};
  argv.insert(argv.end(), model_args.begin(), model_args.end());
  const std::string out = dir.File("oracle.pdrl");
  const std::string logprobs_out = dir.File("oracle.pdlp");
  argv.insert(argv.end(), {"--tokens", absl::StrJoin(prompt, ","), "--decode-steps",
                           std::to_string(decode_steps), "--out", out, "--logprobs-out",
                           logprobs_out, "--top-logprobs", std::to_string(kTopLogprobs)});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<pd::testing::Subprocess> p =
      pd::testing::Subprocess::Spawn(argv, dir.File("oracle.log"));
  if (!p.ok()) return p.status();
  absl::StatusOr<pd::testing::ExitInfo> exit = p->Wait(absl::Seconds(120));
  if (!exit.ok()) return exit.status();
  if (!exit->Success()) {
    return absl::InternalError(absl::StrCat("oracle ", exit->ToString(), ": ", p->LogTail()));
  }
  absl::StatusOr<Reference> ref = ReadReference(out);
  if (!ref.ok()) return ref.status();
  absl::Status top = ReadTopLogprobs(logprobs_out, &*ref);
  if (!top.ok()) return top;
  return ref;
}

// The engine's top-k log-probabilities of one row (kernels::LogProbs on its logits) against
// torch's. Each log p is x - logsumexp(x), so it moves by at most twice the logits' largest
// difference `max_diff`; ids may differ only where torch's own values are that close (a
// near-tie that the logits' noise may order either way).
void ExpectTopLogprobsMatch(const std::vector<float>& logits, const Reference& ref, int64_t row,
                            double max_diff) {
  const int32_t k = static_cast<int32_t>(ref.top_k);
  std::vector<int32_t> ids(k);
  std::vector<float> values(k);
  kernels::LogProbsParams p;
  p.logits = logits.data();
  p.num_seqs = 1;
  p.vocab_size = ref.vocab;
  p.logits_stride = ref.vocab;
  p.top_n = k;
  p.out_top_ids = ids.data();
  p.out_top_logprobs = values.data();
  ASSERT_TRUE(kernels::LogProbs(kernels::OpContext{}, p).ok());
  const int32_t* want_ids = &ref.top_ids[row * k];
  const float* want = &ref.top_logprobs[row * k];
  for (int32_t j = 0; j < k; ++j) {
    const double tol = 2 * max_diff + 1e-5 * std::max(1.0, std::abs(double{want[j]}));
    EXPECT_NEAR(values[j], want[j], tol) << "row " << row << " rank " << j;
    if (ids[j] != want_ids[j]) {
      const bool near_tie = (j > 0 && want[j - 1] - want[j] <= 2 * tol) ||
                            (j + 1 < k && want[j] - want[j + 1] <= 2 * tol);
      EXPECT_TRUE(near_tie) << "row " << row << " rank " << j << ": id " << ids[j] << ", torch "
                            << want_ids[j] << " (" << want[j] << ")";
    }
  }
}

// Feeds the oracle's sequence through the engine (prompt as one prefill, then one token per
// decode step) and compares every row the engine produces.
void ExpectMatchesOracle(const ModelWeights& weights, const Reference& ref, double rel_tol) {
  const int64_t num_blocks = 64;
  const ModelConfig& c = weights.config;
  std::vector<float> pool(num_blocks * int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize);
  absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
      &weights, {pool.data(), kernels::DType::kF32, num_blocks, kBlockSize}, {}, {});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(ref.vocab, static_cast<uint32_t>(c.vocab_size));
  std::vector<int32_t> table(num_blocks);
  for (int i = 0; i < num_blocks; ++i) table[i] = num_blocks - 1 - i;  // scattered blocks
  std::vector<float> logits(c.vocab_size);
  auto compare = [&](int64_t row) {
    const float* want = &ref.logits[row * ref.vocab];
    double max_ref = 1.0, max_diff = 0.0;
    for (uint32_t v = 0; v < ref.vocab; ++v) {
      max_ref = std::max(max_ref, std::abs(double{want[v]}));
      max_diff = std::max(max_diff, std::abs(double{logits[v]} - want[v]));
    }
    EXPECT_LE(max_diff / max_ref, rel_tol) << "row " << row << ": max diff " << max_diff;
    ExpectTopLogprobsMatch(logits, ref, row, max_diff);
  };
  absl::Span<const uint32_t> seq(ref.tokens);
  const absl::Status prefill =
      (*f)->Forward({{seq.first(ref.num_prompt), 0, table}}, logits.data());
  ASSERT_TRUE(prefill.ok()) << prefill;
  compare(ref.num_prompt - 1);
  for (uint32_t i = 0; i < ref.num_steps; ++i) {
    const int64_t pos = ref.num_prompt + i;
    ASSERT_TRUE((*f)->Forward({{seq.subspan(pos, 1), pos, table}}, logits.data()).ok());
    compare(pos);
  }
}

TEST(TorchParityTest, Stories260kLlama2c) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  const std::string path = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
  absl::StatusOr<Reference> ref = RunOracle({"--llama2c", path}, {1, 403, 407, 261, 378}, *dir);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ExpectMatchesOracle(WeightsFromLlama2c(*ckpt), *ref, 1e-4);
}

// The sink + window KV policy (engine/scheduler) against the oracle's literal StreamingLLM
// (keys cached before RoPE, rotated at their positions inside the cache every step): the
// engine's trick (window keys at text positions, sinks rotated by the dropped tokens from
// their originals) must give the same greedy tokens and log-probabilities, past the model's
// 512-token context.
struct WindowCase {
  int64_t sink_tokens, window_tokens;
  uint32_t steps;
};

class TorchParityWindowTest : public ::testing::TestWithParam<WindowCase> {};

TEST_P(TorchParityWindowTest, Stories260kMatchesStreamingLlm) {
  const WindowCase wc = GetParam();
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  const std::string path = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
  const std::vector<uint32_t> prompt = {1, 403, 407, 261, 378};
  absl::StatusOr<Reference> ref =
      RunOracle({"--llama2c", path}, prompt, *dir, static_cast<int>(wc.steps),
                {"--sink-tokens", std::to_string(wc.sink_tokens), "--window-tokens",
                 std::to_string(wc.window_tokens), "--block-size", std::to_string(kBlockSize)});
  ASSERT_TRUE(ref.ok()) << ref.status();

  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelWeights weights = WeightsFromLlama2c(*ckpt);
  const ModelConfig& c = weights.config;
  constexpr int64_t kBlocks = 32;
  std::vector<float> pool(kBlocks * int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize);
  absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
      &weights, {pool.data(), kernels::DType::kF32, kBlocks, kBlockSize}, {}, {});
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> kv =
      kvcache::KvCacheManager::Create({kBlocks, kBlockSize});
  ASSERT_TRUE(kv.ok());
  absl::StatusOr<Llama2cTokenizer> tok =
      Llama2cTokenizer::Load(PD_SHARED_DIR "/models/stories260K/tok512.bin", c.vocab_size);
  ASSERT_TRUE(tok.ok()) << tok.status();
  SchedulerConfig sc;
  sc.kv_sink_tokens = wc.sink_tokens;
  sc.kv_window_tokens = wc.window_tokens;
  absl::StatusOr<std::unique_ptr<Scheduler>> s =
      Scheduler::Create(sc, f->get(), kv->get(), &*tok, ckpt->Fingerprint());
  ASSERT_TRUE(s.ok()) << s.status();
  GenerationRequest r;
  r.id = RequestId(1);
  r.prompt = prompt;
  r.sampling.max_tokens = wc.steps + 1;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = kTopLogprobs;
  std::vector<uint32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  absl::Status final_status;
  r.on_output = [&](GenerationOutput out) {
    tokens.insert(tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    if (out.finish_reason != FinishReason::kNone) final_status = out.status;
  };
  ASSERT_TRUE((*s)->Submit(std::move(r)).ok());
  while (!(*s)->idle()) (*s)->Step();
  ASSERT_TRUE(final_status.ok()) << final_status;
  ASSERT_EQ(tokens.size(), wc.steps + 1);
  EXPECT_GT((*s)->Stats().window_dropped_blocks, 10);

  // Row num_prompt - 1 + i of the oracle is the distribution generated token i came from.
  // Tokens must agree until a near-tie (torch's top two within the noise), which ends the
  // comparison; it must not come before 3/4 of the run.
  constexpr double kTol = 2e-4;
  uint32_t compared = 0;
  for (uint32_t i = 0; i <= wc.steps; ++i) {
    const int64_t row = ref->num_prompt - 1 + i;
    const int32_t* want_ids = &ref->top_ids[row * ref->top_k];
    const float* want = &ref->top_logprobs[row * ref->top_k];
    if (tokens[i] != static_cast<uint32_t>(want_ids[0])) {
      EXPECT_LE(want[0] - want[1], 2 * kTol)
          << "step " << i << ": engine " << tokens[i] << ", torch " << want_ids[0];
      break;
    }
    ASSERT_EQ(logprobs[i].top.size(), ref->top_k);
    for (uint32_t j = 0; j < ref->top_k; ++j) {
      EXPECT_NEAR(logprobs[i].top[j].second, want[j], kTol) << "step " << i << " rank " << j;
    }
    ++compared;
  }
  EXPECT_GE(compared, wc.steps * 3 / 4);
  std::printf("sink %lld window %lld: %u of %u steps identical to StreamingLLM\n",
              static_cast<long long>(wc.sink_tokens), static_cast<long long>(wc.window_tokens),
              compared, wc.steps + 1);
}

INSTANTIATE_TEST_SUITE_P(Policies, TorchParityWindowTest,
                         ::testing::Values(WindowCase{16, 64, 600}, WindowCase{32, 40, 300},
                                           WindowCase{0, 48, 300}),
                         [](const ::testing::TestParamInfo<WindowCase>& info) {
                           return absl::StrCat("Sinks", info.param.sink_tokens, "Window",
                                               info.param.window_tokens);
                         });

struct HfCase {
  std::string name;
  std::optional<Architecture> architecture;
  kernels::DType dtype;
  int32_t head_dim = 0;                          // 0 = hidden_size / num_heads
  std::optional<bool> norm_topk_prob;            // Qwen3-MoE
  int32_t q_lora_rank = 0;                       // DeepSeek
  std::optional<int32_t> first_k_dense_replace;  // DeepSeek
  std::string rope_scaling;                      // replaces config.json's null rope_scaling
  int32_t fp8_block = 0;                         // block-scaled fp8 projections
  friend void PrintTo(const HfCase& c, std::ostream* os) { *os << c.name; }
};

class TorchParityHfTest : public ::testing::TestWithParam<HfCase> {};

// The oracle reads the same safetensors (bf16 weights widened to f32, f32 activations: the
// engine's semantics), so bf16 weights get the f32 tolerance too.
TEST_P(TorchParityHfTest, TinyModelPrefillAndDecode) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  MakeModelOptions options;
  options.out_dir = dir->File("model");
  options.preset = "tiny";
  options.seed = 7;
  options.dtype = GetParam().dtype;
  options.architecture = GetParam().architecture;
  options.head_dim = GetParam().head_dim;
  options.norm_topk_prob = GetParam().norm_topk_prob;
  options.q_lora_rank = GetParam().q_lora_rank;
  options.first_k_dense_replace = GetParam().first_k_dense_replace;
  options.fp8_block = GetParam().fp8_block;
  absl::StatusOr<MakeModelResult> made = MakeModel(options);
  ASSERT_TRUE(made.ok()) << made.status();
  if (!GetParam().rope_scaling.empty()) {
    const std::string path = options.out_dir + "/config.json";
    std::ifstream in(path);
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string patched =
        absl::StrReplaceAll(json, {{"\"rope_scaling\": null", GetParam().rope_scaling}});
    ASSERT_NE(patched, json);
    std::ofstream(path) << patched;
  }
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 37; ++i) prompt.push_back((i * 97 + 11) % 400);  // crosses blocks
  // 64 greedy steps (issue #34: tokens identical for 64 steps).
  absl::StatusOr<Reference> ref = RunOracle({"--hf", options.out_dir}, prompt, *dir, 64);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<HfModel> model = HfModel::Load(options.out_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<ModelWeights> weights = WeightsFromHf(*model);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectMatchesOracle(*weights, *ref, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Models, TorchParityHfTest,
    ::testing::Values(HfCase{"LlamaF32", std::nullopt, kernels::DType::kF32},
                      HfCase{"Qwen2F32", Architecture::kQwen2, kernels::DType::kF32},
                      // Heads wider than hidden_size / num_heads, as Qwen3's are.
                      HfCase{"Qwen3F32", Architecture::kQwen3, kernels::DType::kF32, 32},
                      HfCase{"Qwen3Bf16", Architecture::kQwen3, kernels::DType::kBF16, 32},
                      HfCase{"LlamaBf16", std::nullopt, kernels::DType::kBF16},
                      // Mixtures of experts (8 experts, 2 per token): Mixtral's renormalized
                      // weights, Qwen3-MoE's with and without norm_topk_prob.
                      HfCase{"MixtralF32", Architecture::kMixtral, kernels::DType::kF32},
                      HfCase{"MixtralBf16", Architecture::kMixtral, kernels::DType::kBF16},
                      HfCase{"Qwen3MoeF32", Architecture::kQwen3Moe, kernels::DType::kF32, 32},
                      HfCase{"Qwen3MoeUnnormalizedF32", Architecture::kQwen3Moe,
                             kernels::DType::kF32, 32, false},
                      // DeepSeek: multi-head latent attention (absorbed, against the oracle's
                      // expanded form) with dense MLPs only; with a low-rank query and
                      // V2's experts (a dense first layer, a shared expert); V3's sigmoid,
                      // biased, group-limited routing.
                      HfCase{"DeepseekV2DenseF32", Architecture::kDeepseekV2, kernels::DType::kF32,
                             0, std::nullopt, 0, 2},
                      HfCase{"DeepseekV2MoeF32", Architecture::kDeepseekV2, kernels::DType::kF32, 0,
                             std::nullopt, 24},
                      HfCase{"DeepseekV3F32", Architecture::kDeepseekV3, kernels::DType::kF32, 0,
                             std::nullopt, 24},
                      HfCase{"DeepseekV3Bf16", Architecture::kDeepseekV3, kernels::DType::kBF16},
                      // DeepSeek's yarn: frequencies blended over a short original context,
                      // the rotated parts scaled by mscale(8, 1) / mscale(8, 0.5) = 1.094
                      // and the attention scale by mscale(8, 0.5)^2 = 1.219.
                      HfCase{"DeepseekV2YarnF32", Architecture::kDeepseekV2, kernels::DType::kF32,
                             0, std::nullopt, 24, std::nullopt,
                             "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8, "
                             "\"original_max_position_embeddings\": 32, \"beta_fast\": 32, "
                             "\"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}"},
                      // Block-scaled fp8 projections (DeepSeek-V3's and Qwen3-FP8's format),
                      // dequantized at load; the oracle dequantizes in f32.
                      HfCase{"LlamaFp8", std::nullopt, kernels::DType::kBF16, 0, std::nullopt, 0,
                             std::nullopt, "", 16},
                      HfCase{"DeepseekV3Fp8", Architecture::kDeepseekV3, kernels::DType::kBF16, 0,
                             std::nullopt, 24, std::nullopt, "", 16}),
    [](const ::testing::TestParamInfo<HfCase>& info) { return info.param.name; });

}  // namespace
}  // namespace pd::engine
