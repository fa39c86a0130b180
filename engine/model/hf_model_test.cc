#include "engine/model/hf_model.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/testing/temp_dir.h"
#include "engine/model/model_weights.h"
#include "engine/model/safetensors_writer.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/half.h"

namespace pd::engine {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A tensor to write: its spec and where its bytes come from.
struct Source {
  SafetensorsTensorSpec spec;
  const void* data;
};

// Writes `tensors` (in any order) to `path`.
void WriteTensors(const std::string& path, const std::vector<Source>& tensors) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const Source& s : tensors) {
    specs.push_back(s.spec);
  }
  absl::StatusOr<SafetensorsWriter> w = SafetensorsWriter::Create(path, specs);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const SafetensorsTensorSpec& spec : w->order()) {
    for (const Source& s : tensors) {
      if (s.spec.name == spec.name) {
        ASSERT_TRUE(w->Append(s.data, spec.size_bytes()).ok());
      }
    }
  }
  ASSERT_TRUE(w->Finish().ok());
}

// Every tensor of `model` as a Source, optionally filtered.
std::vector<Source> SourcesOf(const HfModel& model,
                              const std::function<bool(const std::string&)>& keep = nullptr) {
  std::vector<Source> out;
  for (const auto& [name, view] : model.weights().tensors()) {
    if (!keep || keep(name)) {
      out.push_back(Source{{name, view.dtype, view.shape}, view.data});
    }
  }
  return out;
}

class HfModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<pd::testing::TempDir>(std::move(*dir));
  }

  // Generates a tiny model in `name` with `edit` applied to the options.
  std::string Make(const std::string& name, uint64_t seed = 1,
                   const std::function<void(MakeModelOptions*)>& edit = nullptr) {
    MakeModelOptions o;
    o.out_dir = dir_->File(name);
    o.preset = "tiny";
    o.seed = seed;
    if (edit) {
      edit(&o);
    }
    absl::StatusOr<MakeModelResult> r = MakeModel(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return o.out_dir;
  }

  // A copy of `src`'s config files in a fresh directory `name`.
  std::string CopyConfig(const std::string& src, const std::string& name) {
    const std::string out = dir_->File(name);
    EXPECT_EQ(::mkdir(out.c_str(), 0755), 0);
    for (const char* f : {"config.json", "generation_config.json"}) {
      WriteFile(absl::StrCat(out, "/", f), ReadFile(absl::StrCat(src, "/", f)));
    }
    return out;
  }

  std::unique_ptr<pd::testing::TempDir> dir_;
};

TEST_F(HfModelTest, LoadsGeneratedTinyModel) {
  const std::string path = Make("tiny", 1);
  absl::StatusOr<HfModel> m = HfModel::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.weight_dtype, kernels::DType::kF32);
  EXPECT_EQ(c.bos_id, 504u);
  EXPECT_THAT(c.eos_ids, ElementsAre(505u));
  EXPECT_THAT(m->Fingerprint(), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(m->load_stats().hashed_bytes, 156480u * 4);

  EXPECT_THAT(m->embed_tokens().shape, ElementsAre(512, 64));
  EXPECT_THAT(m->lm_head().shape, ElementsAre(512, 64));
  EXPECT_NE(m->lm_head().data, m->embed_tokens().data);  // untied
  EXPECT_THAT(m->norm().shape, ElementsAre(64));
  const HfLayerWeights& l1 = m->layer(1);
  EXPECT_THAT(l1.q_proj.shape, ElementsAre(64, 64));
  EXPECT_THAT(l1.k_proj.shape, ElementsAre(32, 64));
  EXPECT_THAT(l1.v_proj.shape, ElementsAre(32, 64));
  EXPECT_THAT(l1.o_proj.shape, ElementsAre(64, 64));
  EXPECT_THAT(l1.gate_proj.shape, ElementsAre(172, 64));
  EXPECT_THAT(l1.up_proj.shape, ElementsAre(172, 64));
  EXPECT_THAT(l1.down_proj.shape, ElementsAre(64, 172));
  EXPECT_THAT(l1.input_layernorm.shape, ElementsAre(64));
  EXPECT_FALSE(l1.q_bias.has_value());
  EXPECT_EQ(l1.q_proj.data, m->weights().Find("model.layers.1.self_attn.q_proj.weight")->data);

  // The bytes are the documented generator: N(0, 1/fan_in)-scaled uniforms, norms near 1.
  const float* embed = static_cast<const float*>(m->embed_tokens().data);
  const float amp64 = static_cast<float>(std::sqrt(3.0 / 64));
  for (uint64_t i : {0ull, 1ull, 4095ull, 32767ull}) {
    EXPECT_EQ(embed[i], GeneratedWeight(1, "model.embed_tokens.weight", i, 0.0f, amp64)) << i;
  }
  const float* down = static_cast<const float*>(l1.down_proj.data);
  const float amp172 = static_cast<float>(std::sqrt(3.0 / 172));
  EXPECT_EQ(down[777], GeneratedWeight(1, "model.layers.1.mlp.down_proj.weight", 777, 0, amp172));
  double sum_sq = 0;
  for (int i = 0; i < 512 * 64; ++i) {
    sum_sq += static_cast<double>(embed[i]) * embed[i];
    ASSERT_LT(std::fabs(embed[i]), amp64);
  }
  EXPECT_NEAR(sum_sq / (512 * 64), 1.0 / 64, 0.05 / 64);  // variance 1 / fan_in
  const float* norm = static_cast<const float*>(m->norm().data);
  for (int i = 0; i < 64; ++i) {
    EXPECT_GT(norm[i], 0.9f);
    EXPECT_LT(norm[i], 1.1f);
  }
}

TEST_F(HfModelTest, GenerationIsDeterministicAndFingerprintFollowsTheBytes) {
  const std::string a = Make("a", 42), b = Make("b", 42), c = Make("c", 43);
  EXPECT_EQ(ReadFile(a + "/model.safetensors"), ReadFile(b + "/model.safetensors"));
  EXPECT_EQ(ReadFile(a + "/tokenizer.json"), ReadFile(b + "/tokenizer.json"));
  EXPECT_EQ(ReadFile(a + "/config.json"), ReadFile(b + "/config.json"));
  EXPECT_NE(ReadFile(a + "/model.safetensors"), ReadFile(c + "/model.safetensors"));
  absl::StatusOr<HfModel> ma = HfModel::Load(a), mb = HfModel::Load(b), mc = HfModel::Load(c);
  ASSERT_TRUE(ma.ok() && mb.ok() && mc.ok());
  EXPECT_EQ(ma->Fingerprint(), mb->Fingerprint());
  EXPECT_NE(ma->Fingerprint(), mc->Fingerprint());
  // The config is part of the identity: same bytes, different eos -> different fingerprint.
  WriteFile(b + "/generation_config.json", R"({"bos_token_id": 504, "eos_token_id": [505, 506]})");
  mb = HfModel::Load(b);
  ASSERT_TRUE(mb.ok()) << mb.status();
  EXPECT_NE(ma->Fingerprint(), mb->Fingerprint());
}

TEST_F(HfModelTest, TiedQwen2AndBf16Variants) {
  const std::string tied =
      Make("tied", 1, [](MakeModelOptions* o) { o->tie_word_embeddings = true; });
  absl::StatusOr<HfModel> m = HfModel::Load(tied);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->config().shared_classifier);
  EXPECT_EQ(m->lm_head().data, m->embed_tokens().data);
  EXPECT_EQ(m->weights().Find("lm_head.weight"), nullptr);

  const std::string qwen =
      Make("qwen", 1, [](MakeModelOptions* o) { o->architecture = Architecture::kQwen2; });
  m = HfModel::Load(qwen);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().architecture, Architecture::kQwen2);
  ASSERT_TRUE(m->layer(0).q_bias.has_value());
  EXPECT_THAT(m->layer(0).q_bias->shape, ElementsAre(64));
  EXPECT_THAT(m->layer(0).k_bias->shape, ElementsAre(32));
  EXPECT_THAT(m->layer(1).v_bias->shape, ElementsAre(32));
  EXPECT_LT(std::fabs(static_cast<const float*>(m->layer(0).q_bias->data)[3]), 0.1f);

  const std::string bf16 =
      Make("bf16", 1, [](MakeModelOptions* o) { o->dtype = kernels::DType::kBF16; });
  m = HfModel::Load(bf16);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().weight_dtype, kernels::DType::kBF16);
  EXPECT_EQ(m->embed_tokens().dtype, SafetensorsDtype::kBF16);
  const float amp64 = static_cast<float>(std::sqrt(3.0 / 64));
  EXPECT_EQ(static_cast<const uint16_t*>(m->embed_tokens().data)[5],
            kernels::F32ToBf16(GeneratedWeight(1, "model.embed_tokens.weight", 5, 0, amp64)));
  EXPECT_EQ(m->load_stats().hashed_bytes, 156480u * 2);
}

TEST_F(HfModelTest, ShardedCheckpointHasTheSameFingerprint) {
  const std::string single = Make("single", 3);
  absl::StatusOr<HfModel> m = HfModel::Load(single);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string sharded = CopyConfig(single, "sharded");
  auto first = [](const std::string& n) { return absl::StrContains(n, "layers.0."); };
  WriteTensors(sharded + "/model-00001-of-00002.safetensors", SourcesOf(*m, first));
  WriteTensors(sharded + "/model-00002-of-00002.safetensors",
               SourcesOf(*m, [&](const std::string& n) { return !first(n); }));
  std::string index = R"({"metadata": {}, "weight_map": {)";
  for (const auto& [name, view] : m->weights().tensors()) {
    absl::StrAppend(&index, "\"", name, "\": \"model-0000", first(name) ? 1 : 2,
                    "-of-00002.safetensors\",");
  }
  index.back() = '}';
  index += "}";
  WriteFile(sharded + "/model.safetensors.index.json", index);
  absl::StatusOr<HfModel> s = HfModel::Load(sharded);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->weights().files().size(), 2u);
  EXPECT_EQ(s->Fingerprint(), m->Fingerprint());
  // An unused extra tensor changes nothing either.
  const std::string extra = CopyConfig(single, "extra");
  std::vector<Source> sources = SourcesOf(*m);
  const float inv_freq[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  sources.push_back(Source{
      {"model.layers.0.self_attn.rotary_emb.inv_freq", SafetensorsDtype::kF32, {8}}, inv_freq});
  WriteTensors(extra + "/model.safetensors", sources);
  s = HfModel::Load(extra);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->Fingerprint(), m->Fingerprint());
}

TEST_F(HfModelTest, MissingTensorIsNamed) {
  const std::string src = Make("src", 1);
  absl::StatusOr<HfModel> m = HfModel::Load(src);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string out = CopyConfig(src, "missing");
  WriteTensors(out + "/model.safetensors", SourcesOf(*m, [](const std::string& n) {
                 return n != "model.layers.1.mlp.up_proj.weight";
               }));
  absl::StatusOr<HfModel> bad = HfModel::Load(out);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr(out), HasSubstr("missing tensor model.layers.1.mlp.up_proj.weight")));
}

TEST_F(HfModelTest, ShapeMismatchNamesBothShapes) {
  const std::string path = Make("shape", 1);
  const std::string config = ReadFile(path + "/config.json");
  WriteFile(
      path + "/config.json",
      absl::StrReplaceAll(config, {{"\"intermediate_size\": 172", "\"intermediate_size\": 176"}}));
  absl::StatusOr<HfModel> bad = HfModel::Load(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("tensor model.layers.0.mlp.gate_proj.weight has shape [172, 64], "
                        "config implies [176, 64]"));
}

TEST_F(HfModelTest, DtypeChecks) {
  const std::string src = Make("src", 1);
  absl::StatusOr<HfModel> m = HfModel::Load(src);
  ASSERT_TRUE(m.ok()) << m.status();
  // One tensor in another dtype.
  std::vector<uint16_t> halves(64, 0x3f80);
  std::vector<Source> mixed =
      SourcesOf(*m, [](const std::string& n) { return n != "model.norm.weight"; });
  mixed.push_back(Source{{"model.norm.weight", SafetensorsDtype::kBF16, {64}}, halves.data()});
  const std::string out = CopyConfig(src, "mixed");
  WriteTensors(out + "/model.safetensors", mixed);
  absl::StatusOr<HfModel> bad = HfModel::Load(out);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("model.norm.weight has dtype BF16"), HasSubstr("mixed")));
  // Integer weights.
  std::vector<Source> ints = SourcesOf(*m);
  for (Source& s : ints) {
    s.spec.dtype = SafetensorsDtype::kI32;
  }
  const std::string out2 = CopyConfig(src, "ints");
  WriteTensors(out2 + "/model.safetensors", ints);
  bad = HfModel::Load(out2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("must be F32, BF16 or F16"));
  // torch_dtype disagreeing with the tensors: the tensors win.
  const std::string config = ReadFile(src + "/config.json");
  WriteFile(src + "/config.json", absl::StrReplaceAll(config, {{"\"float32\"", "\"bfloat16\""}}));
  absl::StatusOr<HfModel> ok = HfModel::Load(src);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->config().weight_dtype, kernels::DType::kF32);
  EXPECT_EQ(ok->Fingerprint(), m->Fingerprint());
}

// Block-scaled fp8 (DeepSeek-V3's and Qwen3-FP8's format): the projections are F8_E4M3 with
// weight_scale_inv, dequantized at load into the checkpoint's other dtype; the scales are part
// of the fingerprint; a missing or misshapen scale is named.
TEST_F(HfModelTest, BlockScaledFp8WeightsAreDequantizedAtLoad) {
  const std::string plain =
      Make("plain", 1, [](MakeModelOptions* o) { o->dtype = kernels::DType::kBF16; });
  const std::string fp8 = Make("fp8", 1, [](MakeModelOptions* o) {
    o->dtype = kernels::DType::kBF16;
    o->fp8_block = 16;  // intermediate 172: partial blocks too
  });
  absl::StatusOr<HfModel> m = HfModel::Load(fp8);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().weight_dtype, kernels::DType::kBF16);
  EXPECT_EQ(m->layer(0).gate_proj.dtype, SafetensorsDtype::kF8E4M3);
  const TensorView* scale = m->weights().Find("model.layers.0.mlp.gate_proj.weight_scale_inv");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->shape, (std::vector<int64_t>{11, 4}));
  absl::StatusOr<ModelWeights> w = WeightsFromHf(*m);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dtype, kernels::DType::kBF16);
  // Element (r, c) of the dequantized matrix is code * its block's scale (a power of two, so
  // exact in bf16), and close to the plain model's bf16 value (fp8 keeps 3 mantissa bits).
  absl::StatusOr<HfModel> p = HfModel::Load(plain);
  ASSERT_TRUE(p.ok()) << p.status();
  const auto* deq = static_cast<const uint16_t*>(w->layers[0].w_gate);
  const auto* codes = static_cast<const uint8_t*>(m->layer(0).gate_proj.data);
  const auto* ref = static_cast<const uint16_t*>(p->layer(0).gate_proj.data);
  const auto* s = static_cast<const float*>(scale->data);
  for (int64_t r : {0, 17, 171}) {
    for (int64_t c : {0, 5, 63}) {
      const float want = kernels::E4M3ToF32(codes[r * 64 + c]) * s[(r / 16) * 4 + c / 16];
      EXPECT_EQ(kernels::Bf16ToF32(deq[r * 64 + c]), want) << r << "," << c;
      EXPECT_NEAR(want, kernels::Bf16ToF32(ref[r * 64 + c]),
                  std::fabs(kernels::Bf16ToF32(ref[r * 64 + c])) / 8 + 1e-3);
    }
  }
  EXPECT_NE(m->Fingerprint(), p->Fingerprint());
  // The scales are part of the fingerprint.
  std::vector<float> doubled(s, s + 44);
  for (float& v : doubled) v *= 2;
  std::vector<Source> changed = SourcesOf(*m, [](const std::string& n) {
    return n != "model.layers.0.mlp.gate_proj.weight_scale_inv";
  });
  changed.push_back(
      Source{{"model.layers.0.mlp.gate_proj.weight_scale_inv", SafetensorsDtype::kF32, {11, 4}},
             doubled.data()});
  const std::string out = CopyConfig(fp8, "scaled");
  WriteTensors(out + "/model.safetensors", changed);
  absl::StatusOr<HfModel> other = HfModel::Load(out);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->Fingerprint(), m->Fingerprint());
  // A missing scale, and one of the wrong shape, are named.
  const std::string missing = CopyConfig(fp8, "missing-scale");
  WriteTensors(missing + "/model.safetensors", SourcesOf(*m, [](const std::string& n) {
                 return n != "model.layers.1.self_attn.o_proj.weight_scale_inv";
               }));
  absl::StatusOr<HfModel> bad = HfModel::Load(missing);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("missing tensor model.layers.1.self_attn.o_proj.weight_scale_inv"));
  std::vector<Source> misshapen = SourcesOf(*m, [](const std::string& n) {
    return n != "model.layers.0.mlp.gate_proj.weight_scale_inv";
  });
  misshapen.push_back(
      Source{{"model.layers.0.mlp.gate_proj.weight_scale_inv", SafetensorsDtype::kF32, {4, 11}},
             doubled.data()});
  const std::string shape = CopyConfig(fp8, "misshapen");
  WriteTensors(shape + "/model.safetensors", misshapen);
  bad = HfModel::Load(shape);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("needs model.layers.0.mlp.gate_proj.weight_scale_inv"));
  // Another quantization method is refused by name.
  const std::string awq = CopyConfig(fp8, "awq");
  WriteFile(awq + "/config.json",
            absl::StrReplaceAll(ReadFile(awq + "/config.json"), {{"\"fp8\"", "\"awq\""}}));
  WriteTensors(awq + "/model.safetensors", SourcesOf(*m));
  bad = HfModel::Load(awq);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(bad.status().message(), HasSubstr("awq"));
}

TEST_F(HfModelTest, MissingFiles) {
  EXPECT_EQ(HfModel::Load(dir_->File("nothing")).status().code(), absl::StatusCode::kNotFound);
  const std::string src = Make("src", 1);
  const std::string no_weights = CopyConfig(src, "no_weights");
  absl::StatusOr<HfModel> m = HfModel::Load(no_weights);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("model.safetensors"));
}

TEST(HfRequiredTensorsTest, NamesAndShapes) {
  ModelConfig c;
  c.architecture = Architecture::kQwen2;
  c.dim = 8, c.hidden_dim = 16, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1;
  c.head_dim = 4, c.kv_dim = 4, c.vocab_size = 10, c.shared_classifier = false, c.qkv_bias = true;
  std::vector<std::string> names;
  for (const HfTensorRequirement& r : HfRequiredTensors(c)) {
    names.push_back(absl::StrCat(r.name, absl::StrJoin(r.shape, "x")));
  }
  EXPECT_THAT(
      names,
      ElementsAre(
          "model.embed_tokens.weight10x8", "model.layers.0.input_layernorm.weight8",
          "model.layers.0.self_attn.q_proj.weight8x8", "model.layers.0.self_attn.k_proj.weight4x8",
          "model.layers.0.self_attn.v_proj.weight4x8", "model.layers.0.self_attn.q_proj.bias8",
          "model.layers.0.self_attn.k_proj.bias4", "model.layers.0.self_attn.v_proj.bias4",
          "model.layers.0.self_attn.o_proj.weight8x8",
          "model.layers.0.post_attention_layernorm.weight8",
          "model.layers.0.mlp.gate_proj.weight16x8", "model.layers.0.mlp.up_proj.weight16x8",
          "model.layers.0.mlp.down_proj.weight8x16", "model.norm.weight8", "lm_head.weight10x8"));
}

}  // namespace
}  // namespace pd::engine
