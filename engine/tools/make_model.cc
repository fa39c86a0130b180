#include "engine/tools/make_model.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/errno_status.h"
#include "common/base/status_macros.h"
#include "engine/model/hf_config.h"
#include "engine/model/hf_model.h"
#include "engine/model/safetensors_writer.h"
#include "engine/tools/tokenizer_builder.h"
#include "kernels/half.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

// The chat template every generated model carries (tokenizer_config.json "chat_template"), so
// the router's /v1/chat/completions works on them. Role markers are plain text: the generated
// vocabulary has no chat tokens, and the weights are random anyway.
constexpr char kChatTemplate[] =
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] | trim + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

// tokenizer_config.json: the tokenizer class, BOS/EOS, context length and the chat template.
std::string TokenizerConfigJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["bos_token"] = "<|begin_of_text|>";
  j["eos_token"] = "<|end_of_text|>";
  j["model_max_length"] = c.seq_len;
  j["chat_template"] = kChatTemplate;
  return j.dump(2) + "\n";
}

constexpr size_t kChunkElements = 1u << 20;

// mkdir -p.
absl::Status MakeDirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') {
      continue;
    }
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "mkdir", prefix);
    }
  }
  return absl::OkStatus();
}

// Creates `dir` or checks that it may be written to (see MakeModelOptions::force).
absl::Status PrepareDir(const std::string& dir, bool force) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return ErrnoToStatus(errno, "stat", dir);
    }
    PD_RETURN_IF_ERROR(MakeDirs(dir));
  } else if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  } else if (!force) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      return ErrnoToStatus(errno, "opendir", dir);
    }
    bool empty = true;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        empty = false;
        break;
      }
    }
    ::closedir(d);
    if (!empty) {
      return absl::AlreadyExistsError(
          absl::StrCat(dir, " exists and is not empty; pass --force to overwrite"));
    }
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoToStatus(errno, "cannot write to", dir);
  }
  return absl::OkStatus();
}

// Writes `contents` to `path` through a temporary file and rename.
absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoToStatus(errno, "open", tmp);
  }
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoToStatus(err, "write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, "write", path);
  }
  return absl::OkStatus();
}

// The layer index of a tensor named "model.layers.N. ...", or -1.
int LayerOf(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "model.layers.")) return -1;
  int layer = -1;
  if (!absl::SimpleAtoi(name.substr(0, name.find('.')), &layer)) return -1;
  return layer;
}

// center and amplitude of the initialisation of tensor `name` with shape `shape`, before
// MakeModelOptions::layer_output_scale.
std::pair<float, float> BaseInitOf(absl::string_view name, const std::vector<int64_t>& shape) {
  if (absl::EndsWith(name, "norm.weight")) {
    return {1.0f, 0.1f};
  }
  if (absl::EndsWith(name, ".bias")) {
    return {0.0f, 0.1f};
  }
  if (absl::EndsWith(name, ".e_score_correction_bias")) {
    // DeepSeek-V3's selection bias, kept positive so that every biased score is too (where
    // Hugging Face's masking of the unused groups with 0 and exclusion agree).
    return {0.05f, 0.05f};
  }
  const double fan_in = static_cast<double>(shape.back());
  return {0.0f, static_cast<float>(std::sqrt(3.0 / fan_in))};
}

// The initialisation of tensor `name`: BaseInitOf, the output projections of the scaled layers
// multiplied by the scale.
std::pair<float, float> InitOf(const MakeModelOptions& options, absl::string_view name,
                               const std::vector<int64_t>& shape) {
  auto [center, amplitude] = BaseInitOf(name, shape);
  if (options.layer_output_scale != 1.0f && LayerOf(name) >= options.scaled_layers_from &&
      (absl::EndsWith(name, "o_proj.weight") || absl::EndsWith(name, "down_proj.weight") ||
       absl::EndsWith(name, ".w2.weight"))) {  // (Mixtral's experts' down projection)
    amplitude *= options.layer_output_scale;
  }
  return {center, amplitude};
}

inline uint64_t SplitMix64At(uint64_t key, uint64_t index) {
  uint64_t z = key + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float UnitFromBits(uint64_t z) {
  // 2k + 1 - 2^24 is an odd integer of magnitude < 2^24: exact in f32, as is the scaling.
  const int32_t k = static_cast<int32_t>(z >> 40);
  return static_cast<float>(2 * k + 1 - (1 << 24)) * 0x1p-24f;
}

uint64_t TensorKey(uint64_t seed, absl::string_view name) {
  return XXH3_64bits_withSeed(name.data(), name.size(), seed);
}

// Whether --fp8_block stores tensor `name` as fp8: the linear projections and experts, not
// the embedding, lm_head, routers or vectors.
bool Fp8Tensor(absl::string_view name, const std::vector<int64_t>& shape) {
  return shape.size() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight" &&
         !absl::EndsWith(name, ".gate.weight");
}

// The power-of-two scale of each block of tensor `name`'s generated values (fp8's 448 holds the
// block's largest magnitude), [ceil(rows / b)][ceil(cols / b)].
std::vector<float> Fp8Scales(const std::vector<float>& values, int64_t rows, int64_t cols,
                             int64_t b) {
  const int64_t br = (rows + b - 1) / b, bc = (cols + b - 1) / b;
  std::vector<float> amax(static_cast<size_t>(br * bc), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float& m = amax[(r / b) * bc + c / b];
      m = std::max(m, std::fabs(values[r * cols + c]));
    }
  }
  for (float& m : amax) m = m > 0 ? std::exp2(std::ceil(std::log2(m / 448.0f))) : 1.0f;
  return amax;
}

absl::Status WriteWeights(const MakeModelOptions& options, const ModelConfig& config,
                          const std::string& path, MakeModelResult* result) {
  const SafetensorsDtype dtype = FromKernelDType(config.weight_dtype);
  std::vector<SafetensorsTensorSpec> specs;
  const int64_t block = options.fp8_block;
  for (HfTensorRequirement& req : HfRequiredTensors(config)) {
    if (block > 0 && Fp8Tensor(req.name, req.shape)) {
      const int64_t rows = req.shape[0], cols = req.shape[1];
      specs.push_back({req.name + "_scale_inv",
                       SafetensorsDtype::kF32,
                       {(rows + block - 1) / block, (cols + block - 1) / block}});
      specs.push_back({std::move(req.name), SafetensorsDtype::kF8E4M3, std::move(req.shape)});
      continue;
    }
    specs.push_back({std::move(req.name), dtype, std::move(req.shape)});
  }
  PD_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::Create(path, std::move(specs)));
  std::vector<float> f32(kChunkElements);
  std::vector<uint16_t> half(kChunkElements);
  for (const SafetensorsTensorSpec& spec : writer.order()) {
    if (spec.dtype == SafetensorsDtype::kF8E4M3 || absl::EndsWith(spec.name, "_scale_inv")) {
      // fp8: the tensor's values are generated whole (its blocks need their maxima), then the
      // codes or the scales written.
      const bool scales = spec.dtype != SafetensorsDtype::kF8E4M3;
      const std::string name =
          scales ? spec.name.substr(0, spec.name.size() - std::strlen("_scale_inv")) : spec.name;
      std::vector<int64_t> shape;
      for (const SafetensorsTensorSpec& s : writer.order()) {
        if (s.name == name) shape = s.shape;
      }
      const int64_t rows = shape[0], cols = shape[1];
      const auto [center, amplitude] = InitOf(options, name, shape);
      const uint64_t key = TensorKey(options.seed, name);
      std::vector<float> values(static_cast<size_t>(rows * cols));
      for (int64_t i = 0; i < rows * cols; ++i) {
        values[i] = center + amplitude * UnitFromBits(SplitMix64At(key, i));
      }
      const std::vector<float> s = Fp8Scales(values, rows, cols, block);
      if (scales) {
        PD_RETURN_IF_ERROR(writer.Append(s.data(), s.size() * sizeof(float)));
        result->num_parameters += s.size();
      } else {
        const int64_t bc = (cols + block - 1) / block;
        std::vector<uint8_t> codes(values.size());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            codes[r * cols + c] =
                kernels::F32ToE4M3(values[r * cols + c] / s[(r / block) * bc + c / block]);
          }
        }
        PD_RETURN_IF_ERROR(writer.Append(codes.data(), codes.size()));
        result->num_parameters += codes.size();
      }
      if (options.progress) {
        options.progress(writer.written_bytes(), writer.data_bytes());
      }
      continue;
    }
    const auto [center, amplitude] = InitOf(options, spec.name, spec.shape);
    const uint64_t key = TensorKey(options.seed, spec.name);
    const uint64_t n = spec.size_bytes() / SafetensorsDtypeSize(dtype);
    for (uint64_t begin = 0; begin < n; begin += kChunkElements) {
      const size_t count = static_cast<size_t>(std::min<uint64_t>(kChunkElements, n - begin));
      for (size_t i = 0; i < count; ++i) {
        f32[i] = center + amplitude * UnitFromBits(SplitMix64At(key, begin + i));
      }
      if (dtype == SafetensorsDtype::kF32) {
        PD_RETURN_IF_ERROR(writer.Append(f32.data(), count * sizeof(float)));
      } else {
        for (size_t i = 0; i < count; ++i) {
          half[i] = dtype == SafetensorsDtype::kBF16 ? kernels::F32ToBf16(f32[i])
                                                     : kernels::F32ToF16(f32[i]);
        }
        PD_RETURN_IF_ERROR(writer.Append(half.data(), count * sizeof(uint16_t)));
      }
      if (options.progress) {
        options.progress(writer.written_bytes(), writer.data_bytes());
      }
    }
    result->num_parameters += n;
  }
  result->weight_bytes = writer.data_bytes();
  return writer.Finish();
}

}  // namespace

float GeneratedWeight(uint64_t seed, absl::string_view name, uint64_t index, float center,
                      float amplitude) {
  return center + amplitude * UnitFromBits(SplitMix64At(TensorKey(seed, name), index));
}

absl::StatusOr<kernels::DType> ParseDTypeName(absl::string_view name) {
  if (name == "f32") {
    return kernels::DType::kF32;
  }
  if (name == "bf16") {
    return kernels::DType::kBF16;
  }
  if (name == "f16") {
    return kernels::DType::kF16;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", name, "\" is not one of f32, bf16, f16"));
}

absl::StatusOr<Architecture> ParseArchitectureName(absl::string_view name) {
  for (Architecture a : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2,
                         Architecture::kQwen3, Architecture::kMixtral, Architecture::kQwen3Moe,
                         Architecture::kDeepseekV2, Architecture::kDeepseekV3}) {
    if (name == ArchitectureName(a)) {
      return a;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("architecture \"", name,
                   "\" is not one of llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, "
                   "deepseek_v2, deepseek_v3"));
}

absl::Status MakeModelOptions::Validate() const {
  if (out_dir.empty()) {
    return absl::InvalidArgumentError("out_dir is empty");
  }
  PD_RETURN_IF_ERROR(PresetConfig(preset).status());
  const std::pair<const char*, int32_t> overrides[] = {
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_layers", num_layers},
      {"num_heads", num_heads},
      {"num_kv_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
      {"num_experts", num_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"moe_intermediate_size", moe_intermediate_size},
      {"q_lora_rank", q_lora_rank},
      {"kv_lora_rank", kv_lora_rank},
      {"qk_rope_head_dim", qk_rope_head_dim},
      {"n_shared_experts", n_shared_experts.value_or(0)},
      {"first_k_dense_replace", first_k_dense_replace.value_or(0)},
      {"fp8_block", fp8_block}};
  for (const auto& [name, value] : overrides) {
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is ", value, ", must be >= 0"));
    }
  }
  if (architecture == Architecture::kLlama2c) {
    return absl::InvalidArgumentError("architecture llama2c cannot be written as an HF model");
  }
  if (!(layer_output_scale >= 0.0f && layer_output_scale <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_output_scale is ", layer_output_scale, ", must be in [0, 1]"));
  }
  if (scaled_layers_from < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scaled_layers_from is ", scaled_layers_from, ", must be >= 0"));
  }
  const bool deepseek =
      architecture == Architecture::kDeepseekV2 || architecture == Architecture::kDeepseekV3;
  if (!deepseek && (q_lora_rank > 0 || kv_lora_rank > 0 || qk_rope_head_dim > 0 ||
                    n_shared_experts.has_value() || first_k_dense_replace.has_value())) {
    return absl::InvalidArgumentError(
        "q_lora_rank, kv_lora_rank, qk_rope_head_dim, n_shared_experts and first_k_dense_replace "
        "need a DeepSeek architecture (deepseek_v2, deepseek_v3)");
  }
  const bool moe =
      architecture == Architecture::kMixtral || architecture == Architecture::kQwen3Moe || deepseek;
  if (!moe && (num_experts > 0 || num_experts_per_tok > 0 || moe_intermediate_size > 0 ||
               norm_topk_prob.has_value())) {
    return absl::InvalidArgumentError(
        "num_experts, num_experts_per_tok, moe_intermediate_size and norm_topk_prob need a "
        "mixture-of-experts architecture (mixtral, qwen3_moe)");
  }
  if (architecture == Architecture::kMixtral &&
      (moe_intermediate_size > 0 || norm_topk_prob.has_value())) {
    return absl::InvalidArgumentError(
        "mixtral: the experts are intermediate_size wide and always renormalized; "
        "moe_intermediate_size and norm_topk_prob are Qwen3-MoE's");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view preset) {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.rope_form = RopeForm::kRotateHalf;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  if (preset == "tiny") {
    c.dim = 64, c.hidden_dim = 172, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
    c.vocab_size = 512, c.seq_len = 512, c.shared_classifier = false;
    c.weight_dtype = kernels::DType::kF32;
  } else if (preset == "small") {
    c.dim = 768, c.hidden_dim = 2304, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 4;
    c.vocab_size = 8192, c.seq_len = 2048, c.shared_classifier = false;
    c.weight_dtype = kernels::DType::kBF16;
  } else if (preset == "1b") {
    c.dim = 2048, c.hidden_dim = 8192, c.n_layers = 16, c.n_heads = 32, c.n_kv_heads = 8;
    c.vocab_size = 128256, c.seq_len = 131072, c.shared_classifier = true;
    c.rope_theta = 500000.0f;
    c.rope_scaling = Llama3RopeScaling{32.0f, 1.0f, 4.0f, 8192};
    c.weight_dtype = kernels::DType::kBF16;
  } else if (preset == "8b") {
    c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8;
    c.vocab_size = 128256, c.seq_len = 131072, c.shared_classifier = false;
    c.rope_theta = 500000.0f;
    c.rope_scaling = Llama3RopeScaling{8.0f, 1.0f, 4.0f, 8192};
    c.weight_dtype = kernels::DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset \"", preset, "\"; known presets: tiny, small, 1b, 8b"));
  }
  return c;
}

absl::StatusOr<ModelConfig> ResolveMakeModelConfig(const MakeModelOptions& o) {
  PD_RETURN_IF_ERROR(o.Validate());
  PD_ASSIGN_OR_RETURN(ModelConfig c, PresetConfig(o.preset));
  auto apply = [](int32_t value, int32_t* field) {
    if (value > 0) {
      *field = value;
    }
  };
  apply(o.hidden_size, &c.dim);
  apply(o.intermediate_size, &c.hidden_dim);
  apply(o.num_layers, &c.n_layers);
  apply(o.num_heads, &c.n_heads);
  apply(o.num_kv_heads, &c.n_kv_heads);
  apply(o.vocab_size, &c.vocab_size);
  apply(o.max_position_embeddings, &c.seq_len);
  if (o.tie_word_embeddings.has_value()) {
    c.shared_classifier = *o.tie_word_embeddings;
  }
  if (o.dtype.has_value()) {
    c.weight_dtype = *o.dtype;
  }
  if (o.architecture.has_value()) {
    c.architecture = *o.architecture;
  }
  c.qkv_bias = c.architecture == Architecture::kQwen2;
  c.qk_norm = c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  if (c.architecture == Architecture::kMixtral || c.architecture == Architecture::kQwen3Moe) {
    const bool mixtral = c.architecture == Architecture::kMixtral;
    c.n_experts = o.num_experts > 0 ? o.num_experts : 8;
    c.n_experts_per_tok = o.num_experts_per_tok > 0 ? o.num_experts_per_tok : 2;
    c.moe_hidden_dim = mixtral                       ? c.hidden_dim
                       : o.moe_intermediate_size > 0 ? o.moe_intermediate_size
                                                     : std::max(1, c.hidden_dim / 4);
    c.moe_norm_topk = mixtral || o.norm_topk_prob.value_or(true);
  }
  const bool deepseek =
      c.architecture == Architecture::kDeepseekV2 || c.architecture == Architecture::kDeepseekV3;
  if (deepseek) {
    const bool v3 = c.architecture == Architecture::kDeepseekV3;
    if (c.dim % c.n_heads != 0 && o.head_dim == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden_size ", c.dim, " is not a multiple of num_heads ", c.n_heads));
    }
    const int32_t nope = o.head_dim > 0 ? o.head_dim : c.dim / c.n_heads;
    c.qk_nope_head_dim = nope;
    c.v_head_dim = nope;
    c.qk_rope_head_dim =
        o.qk_rope_head_dim > 0 ? o.qk_rope_head_dim : std::max(2, nope / 2 / 2 * 2);
    c.kv_lora_rank = o.kv_lora_rank > 0 ? o.kv_lora_rank : 4 * nope;
    c.q_lora_rank = o.q_lora_rank;
    c.head_dim = nope + c.qk_rope_head_dim;
    c.n_kv_heads = c.n_heads;
    c.kv_dim = c.n_kv_heads * c.head_dim;
    c.rope_form = RopeForm::kInterleaved;
    c.n_experts = o.num_experts > 0 ? o.num_experts : 8;
    c.n_experts_per_tok = o.num_experts_per_tok > 0 ? o.num_experts_per_tok : 2;
    c.moe_hidden_dim =
        o.moe_intermediate_size > 0 ? o.moe_intermediate_size : std::max(1, c.hidden_dim / 4);
    c.n_shared_experts = o.n_shared_experts.value_or(1);
    c.first_dense_layers = std::min(o.first_k_dense_replace.value_or(1), c.n_layers);
    const bool norm = o.norm_topk_prob.value_or(v3) && c.n_experts_per_tok > 1;
    c.moe_norm_topk = norm;
    c.moe_scoring = v3 ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
    c.moe_topk = v3 ? MoeTopk::kNoAuxTc : MoeTopk::kGreedy;
    c.moe_n_group = v3 && c.n_experts % 4 == 0 ? 4 : 1;
    c.moe_topk_group = v3 && c.n_experts % 4 == 0 ? 2 : 1;
    c.moe_routed_scale = v3 ? 2.5f : 1.0f;
  } else {
    if (o.head_dim > 0) {
      c.head_dim = o.head_dim;  // (Qwen3's heads are wider than hidden_size / num_heads)
    } else if (c.dim % c.n_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden_size ", c.dim, " is not a multiple of num_heads ", c.n_heads));
    } else {
      c.head_dim = c.dim / c.n_heads;
    }
    c.kv_dim = c.n_kv_heads * c.head_dim;
  }
  if (o.layer_output_scale != 1.0f && o.scaled_layers_from >= c.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scaled_layers_from ", o.scaled_layers_from, " scales no layer: the model has ",
        c.n_layers, " (layers ", o.scaled_layers_from, " and later are scaled)"));
  }
  PD_ASSIGN_OR_RETURN(TokenizerLayout layout,
                      ComputeTokenizerLayout(static_cast<uint32_t>(c.vocab_size)));
  c.bos_id = layout.bos_id;
  c.eos_id = layout.eos_id;
  c.eos_ids = {layout.eos_id};
  PD_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<MakeModelResult> MakeModel(const MakeModelOptions& options) {
  const absl::Time start = absl::Now();
  MakeModelResult result;
  PD_ASSIGN_OR_RETURN(result.config, ResolveMakeModelConfig(options));
  const ModelConfig& c = result.config;
  const std::string& dir = options.out_dir;
  PD_RETURN_IF_ERROR(PrepareDir(dir, options.force));
  const std::string index = absl::StrCat(dir, "/model.safetensors.index.json");
  if (::unlink(index.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "unlink", index);
  }
  PD_ASSIGN_OR_RETURN(std::string config_json, HfConfigJson(c));
  if (options.fp8_block > 0) {
    nlohmann::json j = nlohmann::json::parse(config_json);
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {options.fp8_block, options.fp8_block}}};
    config_json = j.dump(2) + "\n";
  }
  PD_RETURN_IF_ERROR(WriteFile(absl::StrCat(dir, "/config.json"), config_json));
  PD_RETURN_IF_ERROR(
      WriteFile(absl::StrCat(dir, "/generation_config.json"), HfGenerationConfigJson(c)));
  PD_ASSIGN_OR_RETURN(std::string tokenizer,
                      BuildTokenizerJson(static_cast<uint32_t>(c.vocab_size)));
  PD_RETURN_IF_ERROR(WriteFile(absl::StrCat(dir, "/tokenizer.json"), tokenizer));
  PD_RETURN_IF_ERROR(
      WriteFile(absl::StrCat(dir, "/tokenizer_config.json"), TokenizerConfigJson(c)));
  const absl::Time weights_start = absl::Now();
  PD_RETURN_IF_ERROR(WriteWeights(options, c, absl::StrCat(dir, "/model.safetensors"), &result));
  result.weight_seconds = absl::ToDoubleSeconds(absl::Now() - weights_start);
  result.total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace pd::engine
