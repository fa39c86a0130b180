// The engine's logits against the PyTorch oracle (tests/reference/llama_reference.py, run as a
// child process under /usr/bin/python3): prefill and 32 decode steps, f32 within 1e-4 relative.
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/tools/make_model.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

constexpr char kOracle[] = PD_SOURCE_DIR "/tests/reference/llama_reference.py";
constexpr int kDecodeSteps = 32;
constexpr int64_t kBlockSize = 16;

// The oracle's output file: tokens (prompt then generated) and one logits row per position.
struct Reference {
  uint32_t vocab = 0, num_prompt = 0, num_steps = 0;
  std::vector<uint32_t> tokens;
  std::vector<float> logits;  // [num_prompt + num_steps][vocab]
};

absl::StatusOr<Reference> ReadReference(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4];
  uint32_t header[4];
  if (!in.read(magic, 4) || std::string(magic, 4) != "PDRL" ||
      !in.read(reinterpret_cast<char*>(header), sizeof(header)) || header[0] != 1) {
    return absl::DataLossError(absl::StrCat("bad oracle output ", path));
  }
  Reference r{header[1], header[2], header[3], {}, {}};
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
                                    const pd::testing::TempDir& dir) {
  std::vector<std::string> argv = {"/usr/bin/python3", kOracle};
  argv.insert(argv.end(), model_args.begin(), model_args.end());
  const std::string out = dir.File("oracle.pdrl");
  argv.insert(argv.end(), {"--tokens", absl::StrJoin(prompt, ","), "--decode-steps",
                           std::to_string(kDecodeSteps), "--out", out});
  absl::StatusOr<pd::testing::Subprocess> p =
      pd::testing::Subprocess::Spawn(argv, dir.File("oracle.log"));
  if (!p.ok()) return p.status();
  absl::StatusOr<pd::testing::ExitInfo> exit = p->Wait(absl::Seconds(120));
  if (!exit.ok()) return exit.status();
  if (!exit->Success()) {
    return absl::InternalError(absl::StrCat("oracle ", exit->ToString(), ": ", p->LogTail()));
  }
  return ReadReference(out);
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
  };
  absl::Span<const uint32_t> seq(ref.tokens);
  ASSERT_TRUE((*f)->Forward({{seq.first(ref.num_prompt), 0, table}}, logits.data()).ok());
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

struct HfCase {
  std::string name;
  std::optional<Architecture> architecture;
  kernels::DType dtype;
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
  absl::StatusOr<MakeModelResult> made = MakeModel(options);
  ASSERT_TRUE(made.ok()) << made.status();
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 37; ++i) prompt.push_back((i * 97 + 11) % 400);  // crosses blocks
  absl::StatusOr<Reference> ref = RunOracle({"--hf", options.out_dir}, prompt, *dir);
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
                      HfCase{"LlamaBf16", std::nullopt, kernels::DType::kBF16}),
    [](const ::testing::TestParamInfo<HfCase>& info) { return info.param.name; });

}  // namespace
}  // namespace pd::engine
