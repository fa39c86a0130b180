#include "engine/tools/make_model.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/model/hf_model.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/safetensors.h"
#include "engine/tools/tokenizer_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

constexpr char kBinary[] = PD_BINARY_DIR "/engine/tools/pd-make-model";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

uint64_t NumParameters(const ModelConfig& c) {
  uint64_t n = 0;
  for (const HfTensorRequirement& r : HfRequiredTensors(c)) {
    uint64_t e = 1;
    for (int64_t d : r.shape) {
      e *= static_cast<uint64_t>(d);
    }
    n += e;
  }
  return n;
}

// ResolveMakeModelConfig refuses `bad` with InvalidArgument naming `fragment`.
void ExpectInvalid(const MakeModelOptions& bad, absl::string_view fragment) {
  absl::StatusOr<ModelConfig> r = ResolveMakeModelConfig(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << fragment;
  EXPECT_THAT(r.status().message(), HasSubstr(fragment));
}

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<pd::testing::TempDir>(std::move(*dir));
  }
  MakeModelOptions Tiny(const std::string& name) {
    MakeModelOptions o;
    o.out_dir = dir_->File(name);
    return o;
  }
  std::unique_ptr<pd::testing::TempDir> dir_;
};

TEST_F(MakeModelTest, Presets) {
  absl::StatusOr<ModelConfig> tiny = PresetConfig("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->dim, 64);
  EXPECT_EQ(tiny->vocab_size, 512);
  EXPECT_EQ(tiny->weight_dtype, kernels::DType::kF32);
  MakeModelOptions o;
  o.out_dir = "/unused";
  o.preset = "small";
  absl::StatusOr<ModelConfig> small = ResolveMakeModelConfig(o);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->weight_dtype, kernels::DType::kBF16);
  EXPECT_EQ(NumParameters(*small), 95'177'472u);  // ~95 M
  o.preset = "1b";
  absl::StatusOr<ModelConfig> big = ResolveMakeModelConfig(o);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(NumParameters(*big), 1'235'814'400u);  // Llama-3.2-1B
  EXPECT_TRUE(big->shared_classifier);
  EXPECT_EQ(big->head_dim, 64);
  EXPECT_EQ(big->kv_dim, 512);
  EXPECT_FLOAT_EQ(big->rope_theta, 500000.0f);
  ASSERT_TRUE(big->rope_scaling.has_value());
  EXPECT_EQ(*big->rope_scaling, (Llama3RopeScaling{32.0f, 1.0f, 4.0f, 8192}));
  EXPECT_EQ(big->bos_id, 128000u);
  EXPECT_EQ(big->eos_id, 128001u);
  o.preset = "8b";
  absl::StatusOr<ModelConfig> eight = ResolveMakeModelConfig(o);
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(NumParameters(*eight), 8'030'261'248u);  // Llama-3.1-8B
  EXPECT_FALSE(eight->shared_classifier);
  EXPECT_EQ(eight->head_dim, 128);
  EXPECT_EQ(eight->kv_dim, 1024);
  EXPECT_EQ(*eight->rope_scaling, (Llama3RopeScaling{8.0f, 1.0f, 4.0f, 8192}));
  o.preset = "7b";
  EXPECT_THAT(ResolveMakeModelConfig(o).status().message(), HasSubstr("unknown preset \"7b\""));
}

TEST_F(MakeModelTest, Overrides) {
  MakeModelOptions o = Tiny("x");
  o.hidden_size = 128;
  o.num_heads = 8;
  o.num_kv_heads = 4;
  o.vocab_size = 1000;
  o.architecture = Architecture::kQwen2;
  o.dtype = kernels::DType::kF16;
  o.tie_word_embeddings = true;
  absl::StatusOr<ModelConfig> c = ResolveMakeModelConfig(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->kv_dim, 64);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->shared_classifier);
  EXPECT_EQ(c->weight_dtype, kernels::DType::kF16);
  EXPECT_EQ(c->bos_id, 1000u - 15u);  // 1000 / 64 = 15 special tokens

  MakeModelOptions bad = Tiny("x");
  bad.hidden_size = 66;
  ExpectInvalid(bad, "not a multiple of num_heads");
  bad = Tiny("x");
  bad.vocab_size = 259;
  ExpectInvalid(bad, "vocab_size 259");
  bad = Tiny("x");
  bad.num_layers = -1;
  ExpectInvalid(bad, "num_layers is -1");
  bad = Tiny("x");
  bad.num_kv_heads = 3;
  ExpectInvalid(bad, "n_kv_heads 3");
  bad = Tiny("x");
  bad.architecture = Architecture::kLlama2c;
  ExpectInvalid(bad, "llama2c");
  bad.out_dir = "";
  ExpectInvalid(bad, "out_dir");
}

TEST_F(MakeModelTest, DirectoryRules) {
  MakeModelOptions o = Tiny("deep/er/model");  // parents are created
  uint64_t last_done = 0, last_total = 0;
  o.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
  };
  absl::StatusOr<MakeModelResult> r = MakeModel(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_parameters, 156'480u);
  EXPECT_EQ(r->weight_bytes, 156'480u * 4);
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, r->weight_bytes);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "model.safetensors"}) {
    EXPECT_FALSE(ReadFile(absl::StrCat(o.out_dir, "/", f)).empty()) << f;
  }
  o.progress = nullptr;
  // Existing, non-empty: refused without force and left alone.
  const std::string before = ReadFile(o.out_dir + "/model.safetensors");
  o.seed = 9;
  absl::StatusOr<MakeModelResult> again = MakeModel(o);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("--force"));
  EXPECT_EQ(ReadFile(o.out_dir + "/model.safetensors"), before);
  // With force: overwritten, and a stale sharded index is removed so the new file is used.
  WriteFile(o.out_dir + "/model.safetensors.index.json", "{}");
  o.force = true;
  again = MakeModel(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(ReadFile(o.out_dir + "/model.safetensors"), before);
  EXPECT_TRUE(HfModel::Load(o.out_dir).ok());
  // An existing empty directory is fine.
  ASSERT_EQ(::mkdir(dir_->File("empty").c_str(), 0755), 0);
  EXPECT_TRUE(MakeModel(Tiny("empty")).ok());
  // A file where the directory should be.
  WriteFile(dir_->File("file"), "x");
  EXPECT_EQ(MakeModel(Tiny("file")).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeModel(Tiny("file/sub")).status().code(), absl::StatusCode::kNotFound);
}

// A target for a draft: the draft (the same options, fewer layers, no scale) holds exactly the
// target's first layers, embedding, final norm and classifier; the target's later layers have
// their output projections scaled and nothing else changed.
TEST_F(MakeModelTest, ScaledLayersMakeATargetWhoseFirstLayersAreItsDraft) {
  MakeModelOptions target = Tiny("target");
  target.num_layers = 4;
  target.seed = 7;
  target.layer_output_scale = 0.25f;
  target.scaled_layers_from = 2;
  ASSERT_TRUE(MakeModel(target).ok());
  MakeModelOptions draft = Tiny("draft");
  draft.num_layers = 2;
  draft.seed = 7;
  ASSERT_TRUE(MakeModel(draft).ok());
  MakeModelOptions plain = target;  // the same target without the scale
  plain.out_dir = dir_->File("plain");
  plain.layer_output_scale = 1.0f;
  ASSERT_TRUE(MakeModel(plain).ok());

  absl::StatusOr<WeightSet> t = WeightSet::Open(target.out_dir);
  absl::StatusOr<WeightSet> d = WeightSet::Open(draft.out_dir);
  absl::StatusOr<WeightSet> p = WeightSet::Open(plain.out_dir);
  ASSERT_TRUE(t.ok() && d.ok() && p.ok());
  auto bytes = [](const TensorView& v) {
    return std::string(static_cast<const char*>(v.data), v.size_bytes);
  };
  for (const auto& [name, view] : d->tensors()) {
    const TensorView* in_target = t->Find(name);
    ASSERT_NE(in_target, nullptr) << name;
    EXPECT_EQ(bytes(view), bytes(*in_target)) << name;
  }
  EXPECT_LT(d->tensors().size(), t->tensors().size());
  int scaled = 0;
  for (const auto& [name, view] : t->tensors()) {
    const TensorView* unscaled = p->Find(name);
    ASSERT_NE(unscaled, nullptr) << name;
    const bool output = absl::StartsWith(name, "model.layers.2.") ||
                        absl::StartsWith(name, "model.layers.3.");
    const bool projection = absl::EndsWith(name, "o_proj.weight") ||
                            absl::EndsWith(name, "down_proj.weight");
    if (!output || !projection) {
      EXPECT_EQ(bytes(view), bytes(*unscaled)) << name;
      continue;
    }
    ++scaled;
    ASSERT_EQ(view.dtype, SafetensorsDtype::kF32);
    const float* a = static_cast<const float*>(view.data);
    const float* b = static_cast<const float*>(unscaled->data);
    for (int64_t i = 0; i < view.num_elements(); ++i) {
      ASSERT_FLOAT_EQ(a[i], 0.25f * b[i]) << name << " [" << i << "]";
    }
  }
  EXPECT_EQ(scaled, 4);  // o_proj and down_proj of layers 2 and 3

  // Mixtral's experts write their down projection as w2: scaled too.
  MakeModelOptions moe = target;
  moe.out_dir = dir_->File("moe");
  moe.architecture = Architecture::kMixtral;
  moe.num_layers = 2;
  moe.scaled_layers_from = 1;
  MakeModelOptions moe_plain = moe;
  moe_plain.out_dir = dir_->File("moe-plain");
  moe_plain.layer_output_scale = 1.0f;
  ASSERT_TRUE(MakeModel(moe).ok());
  ASSERT_TRUE(MakeModel(moe_plain).ok());
  absl::StatusOr<WeightSet> m = WeightSet::Open(moe.out_dir);
  absl::StatusOr<WeightSet> mp = WeightSet::Open(moe_plain.out_dir);
  ASSERT_TRUE(m.ok() && mp.ok());
  std::vector<std::string> changed;
  for (const auto& [name, view] : m->tensors()) {
    if (bytes(view) != bytes(*mp->Find(name))) changed.push_back(name);
  }
  EXPECT_EQ(changed.size(), 9u);  // layer 1's o_proj and its 8 experts' w2
  for (const std::string& name : changed) {
    EXPECT_TRUE(absl::StartsWith(name, "model.layers.1.")) << name;
    EXPECT_TRUE(absl::EndsWith(name, "o_proj.weight") || absl::EndsWith(name, ".w2.weight"))
        << name;
  }

  MakeModelOptions bad = target;
  bad.layer_output_scale = 1.5f;
  ExpectInvalid(bad, "layer_output_scale is 1.5");
  bad.layer_output_scale = std::nanf("");
  ExpectInvalid(bad, "layer_output_scale is nan");
  bad = target;
  bad.scaled_layers_from = 4;
  ExpectInvalid(bad, "scaled_layers_from 4 scales no layer");
  bad.scaled_layers_from = -1;
  ExpectInvalid(bad, "scaled_layers_from is -1");
}

TEST_F(MakeModelTest, UnwritableDirectory) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "root ignores directory permissions";
  }
  ASSERT_EQ(::mkdir(dir_->File("ro").c_str(), 0555), 0);
  absl::StatusOr<MakeModelResult> r = MakeModel(Tiny("ro"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr(dir_->File("ro")));
  r = MakeModel(Tiny("ro/sub"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(TokenizerBuilderTest, Layout) {
  absl::StatusOr<TokenizerLayout> l = ComputeTokenizerLayout(512);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_special, 8u);
  EXPECT_EQ(l->bos_id, 504u);
  EXPECT_EQ(l->eos_id, 505u);
  l = ComputeTokenizerLayout(128256);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_special, 256u);
  EXPECT_EQ(l->bos_id, 128000u);  // as Llama 3
  EXPECT_EQ(l->eos_id, 128001u);
  l = ComputeTokenizerLayout(kMinTokenizerVocab);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->first_special, 256u);
  EXPECT_EQ(ComputeTokenizerLayout(259).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerBuilderTest, DeterministicAndTrained) {
  absl::StatusOr<std::string> a = BuildTokenizerJson(8192), b = BuildTokenizerJson(8192);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::Parse(*a);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 8192u);
  EXPECT_EQ(tok->bos_id(), 8064u);
  // The corpus supports fewer merges than the regular region holds: the rest is reserved.
  EXPECT_GT(tok->num_merges(), 800u);
  const uint32_t first_reserved = 256 + static_cast<uint32_t>(tok->num_merges());
  EXPECT_TRUE(tok->IsSpecial(8191));
  EXPECT_TRUE(tok->IsSpecial(first_reserved + 100));
  EXPECT_FALSE(tok->IsSpecial(300));
  // Trained merges compress the training text well, and it round-trips.
  absl::StatusOr<std::vector<uint32_t>> ids = tok->Encode(TrainingCorpus(), false, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_LT(ids->size(), TrainingCorpus().size() / 3);
  EXPECT_EQ(*tok->Decode(*ids), TrainingCorpus());
}

// The binary: thin main over MakeModel.
class MakeModelCliTest : public MakeModelTest {
 protected:
  pd::testing::ExitInfo Run(std::vector<std::string> args, std::string* log) {
    args.insert(args.begin(), kBinary);
    const std::string log_path = dir_->File(absl::StrCat("log", runs_++));
    absl::StatusOr<pd::testing::Subprocess> p = pd::testing::Subprocess::Spawn(args, log_path);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) {
      return {};
    }
    absl::StatusOr<pd::testing::ExitInfo> e = p->Wait(absl::Seconds(30));
    EXPECT_TRUE(e.ok()) << e.status();
    *log = p->ReadLog();
    return e.ok() ? *e : pd::testing::ExitInfo{};
  }
  int runs_ = 0;
};

TEST_F(MakeModelCliTest, WritesVerifiesAndRefusesToOverwrite) {
  std::string log;
  const std::string out = dir_->File("cli");
  pd::testing::ExitInfo e = Run({"--out", out, "--preset", "tiny", "--seed", "3"}, &log);
  EXPECT_TRUE(e.Success()) << e.ToString() << log;
  EXPECT_THAT(log, HasSubstr("fingerprint "));
  EXPECT_THAT(log, HasSubstr("156480 parameters"));
  e = Run({"--out", out}, &log);
  EXPECT_EQ(e.code, 1) << log;
  EXPECT_THAT(log, HasSubstr("--force"));
  e = Run({"--out", out, "--force", "--dtype", "bf16", "--arch", "mistral"}, &log);
  EXPECT_TRUE(e.Success()) << e.ToString() << log;
  EXPECT_THAT(log, HasSubstr("architecture=mistral"));
  EXPECT_THAT(log, HasSubstr("weight_dtype=bf16"));
}

TEST_F(MakeModelCliTest, UsageErrors) {
  std::string log;
  pd::testing::ExitInfo e = Run({"--help"}, &log);
  EXPECT_EQ(e.code, 1) << log;  // absl exits 1 after printing help
  EXPECT_THAT(log, HasSubstr("--preset"));
  e = Run({}, &log);
  EXPECT_EQ(e.code, 2);
  EXPECT_THAT(log, HasSubstr("--out is required"));
  e = Run({"--out", dir_->File("x"), "--dtype", "f64"}, &log);
  EXPECT_EQ(e.code, 2);
  EXPECT_THAT(log, HasSubstr("dtype \"f64\" is not one of"));
  e = Run({"--out", dir_->File("x"), "--preset", "huge"}, &log);
  EXPECT_EQ(e.code, 1);
  EXPECT_THAT(log, HasSubstr("unknown preset \"huge\""));
  e = Run({"--out", dir_->File("x"), "--no_such_flag"}, &log);
  EXPECT_NE(e.code, 0);
}

}  // namespace
}  // namespace pd::engine
