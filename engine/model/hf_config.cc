#include "engine/model/hf_config.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "engine/model/mapped_file.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kSupported =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
    "MixtralForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM "
    "(model_type llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v2, deepseek_v3)";

// A JSON value for an error message: invalid UTF-8 replaced (dump() would throw), at most 80
// characters.
std::string Short(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) {
    s = absl::StrCat(s.substr(0, 77), "...");
  }
  return s;
}

// The float closest to `f` written with the fewest decimal digits that read back as `f`, so that
// config.json shows 1e-05 rather than 9.999999747378752e-06.
double ShortestDouble(float f) {
  for (int digits = 6; digits <= 9; ++digits) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(f));
    double d = 0;
    if (absl::SimpleAtod(buf, &d) && static_cast<float>(d) == f) {
      return d;
    }
  }
  return static_cast<double>(f);
}

// Reads fields of one JSON object with messages naming the source and the field. Never throws:
// every access checks the type first.
class FieldReader {
 public:
  FieldReader(const Json& object, absl::string_view source) : obj_(object), source_(source) {}

  // Present and not null.
  bool Has(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const Json* Find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::Status Error(const char* key, absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field \"", key, "\" ", why));
  }

  // An integer in [min_value, INT32_MAX]; `fallback` when absent or null (nullopt = required).
  absl::StatusOr<int32_t> Int32(const char* key, std::optional<int32_t> fallback,
                                int32_t min_value = 1) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (!fallback.has_value()) {
        return Error(key, "is missing");
      }
      return *fallback;
    }
    return ToInt32(*v, key, min_value);
  }

  absl::StatusOr<int32_t> ToInt32(const Json& v, const char* key, int32_t min_value) const {
    int64_t value = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      value = u > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                  ? std::numeric_limits<int64_t>::max()
                  : static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else {
      return Error(key, absl::StrCat("must be an integer, got ", Short(v)));
    }
    if (value < min_value || value > std::numeric_limits<int32_t>::max()) {
      return Error(key, absl::StrCat("is ", Short(v), ", must be in [", min_value, ", ",
                                     std::numeric_limits<int32_t>::max(), "]"));
    }
    return static_cast<int32_t>(value);
  }

  // A positive finite number; `fallback` when absent or null (nullopt = required).
  absl::StatusOr<float> PositiveFloat(const char* key, std::optional<float> fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (!fallback.has_value()) {
        return Error(key, "is missing");
      }
      return *fallback;
    }
    if (!v->is_number()) {
      return Error(key, absl::StrCat("must be a number, got ", Short(*v)));
    }
    const double d = v->get<double>();
    if (!std::isfinite(d) || d <= 0.0 || d > std::numeric_limits<float>::max()) {
      return Error(key, absl::StrCat("is ", Short(*v), ", must be a positive finite float"));
    }
    return static_cast<float>(d);
  }

  // A finite float >= 0; `fallback` when absent or null.
  absl::StatusOr<float> NonNegativeFloat(const char* key, float fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return fallback;
    }
    if (!v->is_number()) {
      return Error(key, absl::StrCat("must be a number, got ", Short(*v)));
    }
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < 0.0 || d > std::numeric_limits<float>::max()) {
      return Error(key, absl::StrCat("is ", Short(*v), ", must be a finite float >= 0"));
    }
    return static_cast<float>(d);
  }

  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return fallback;
    }
    if (!v->is_boolean()) {
      return Error(key, absl::StrCat("must be true or false, got ", Short(*v)));
    }
    return v->get<bool>();
  }

  // A string, or `fallback` when absent or null.
  absl::StatusOr<std::string> String(const char* key, absl::string_view fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return std::string(fallback);
    }
    if (!v->is_string()) {
      return Error(key, absl::StrCat("must be a string, got ", Short(*v)));
    }
    return v->get<std::string>();
  }

  // A token id (int) or a non-empty list of them; nullopt when absent or null.
  absl::StatusOr<std::optional<std::vector<uint32_t>>> TokenIds(const char* key) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return std::optional<std::vector<uint32_t>>();
    }
    std::vector<uint32_t> ids;
    if (v->is_array()) {
      if (v->empty()) {
        return Error(key, "is an empty list");
      }
      for (const Json& e : *v) {
        PD_ASSIGN_OR_RETURN(int32_t id, ToInt32(e, key, 0));
        ids.push_back(static_cast<uint32_t>(id));
      }
    } else {
      PD_ASSIGN_OR_RETURN(int32_t id, ToInt32(*v, key, 0));
      ids.push_back(static_cast<uint32_t>(id));
    }
    return std::optional<std::vector<uint32_t>>(std::move(ids));
  }

 private:
  const Json& obj_;
  absl::string_view source_;
};

absl::StatusOr<Json> ParseObject(absl::string_view text, absl::string_view source) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": top level is not a JSON object"));
  }
  return j;
}

absl::StatusOr<Architecture> DetectArchitecture(const Json& j, absl::string_view source) {
  auto it = j.find("architectures");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": field \"architectures\" must be a non-empty list of strings, got ",
          Short(*it)));
    }
    const std::string name = (*it)[0].get<std::string>();
    if (name == "LlamaForCausalLM") {
      return Architecture::kLlama;
    }
    if (name == "MistralForCausalLM") {
      return Architecture::kMistral;
    }
    if (name == "Qwen2ForCausalLM") {
      return Architecture::kQwen2;
    }
    if (name == "Qwen3ForCausalLM") {
      return Architecture::kQwen3;
    }
    if (name == "MixtralForCausalLM") {
      return Architecture::kMixtral;
    }
    if (name == "Qwen3MoeForCausalLM") {
      return Architecture::kQwen3Moe;
    }
    if (name == "DeepseekV2ForCausalLM") {
      return Architecture::kDeepseekV2;
    }
    if (name == "DeepseekV3ForCausalLM") {
      return Architecture::kDeepseekV3;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unsupported architecture \"", name, "\"; supported: ", kSupported));
  }
  FieldReader r(j, source);
  PD_ASSIGN_OR_RETURN(std::string type, r.String("model_type", ""));
  if (type == "llama") {
    return Architecture::kLlama;
  }
  if (type == "mistral") {
    return Architecture::kMistral;
  }
  if (type == "qwen2") {
    return Architecture::kQwen2;
  }
  if (type == "qwen3") {
    return Architecture::kQwen3;
  }
  if (type == "mixtral") {
    return Architecture::kMixtral;
  }
  if (type == "qwen3_moe") {
    return Architecture::kQwen3Moe;
  }
  if (type == "deepseek_v2") {
    return Architecture::kDeepseekV2;
  }
  if (type == "deepseek_v3") {
    return Architecture::kDeepseekV3;
  }
  if (type.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": neither \"architectures\" nor \"model_type\" is set"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": unsupported model_type \"", type, "\"; supported: ", kSupported));
}

absl::StatusOr<kernels::DType> ParseTorchDtype(const FieldReader& r) {
  const char* key = r.Has("torch_dtype") ? "torch_dtype" : "dtype";
  PD_ASSIGN_OR_RETURN(std::string name, r.String(key, "float32"));
  if (name == "float32") {
    return kernels::DType::kF32;
  }
  if (name == "bfloat16") {
    return kernels::DType::kBF16;
  }
  if (name == "float16") {
    return kernels::DType::kF16;
  }
  return r.Error(key, absl::StrCat("is \"", name, "\"; supported: float32, bfloat16, float16"));
}

// rope_theta and rope_scaling, from the top level or (newer configs) "rope_parameters".
absl::Status ParseRope(const FieldReader& r, absl::string_view source, ModelConfig* c) {
  const Json* params = r.Find("rope_parameters");
  if (params != nullptr && !params->is_object()) {
    return r.Error("rope_parameters", absl::StrCat("must be an object, got ", Short(*params)));
  }
  if (r.Has("rope_theta") || params == nullptr) {
    PD_ASSIGN_OR_RETURN(c->rope_theta, r.PositiveFloat("rope_theta", 10000.0f));
  } else {
    FieldReader p(*params, absl::StrCat(source, " rope_parameters"));
    PD_ASSIGN_OR_RETURN(c->rope_theta, p.PositiveFloat("rope_theta", 10000.0f));
  }
  const Json* scaling = r.Find("rope_scaling");
  if (scaling == nullptr) {
    scaling = params;
  }
  if (scaling == nullptr) {
    return absl::OkStatus();
  }
  if (!scaling->is_object()) {
    return r.Error("rope_scaling",
                   absl::StrCat("must be an object or null, got ", Short(*scaling)));
  }
  const std::string where = absl::StrCat(source, " rope_scaling");
  FieldReader s(*scaling, where);
  const char* type_key = s.Has("rope_type") ? "rope_type" : "type";
  PD_ASSIGN_OR_RETURN(std::string type, s.String(type_key, "default"));
  if (type == "default") {
    return absl::OkStatus();
  }
  if (type == "yarn" && (c->architecture == Architecture::kDeepseekV2 ||
                         c->architecture == Architecture::kDeepseekV3)) {
    YarnRopeScaling y;
    PD_ASSIGN_OR_RETURN(y.factor, s.PositiveFloat("factor", std::nullopt));
    PD_ASSIGN_OR_RETURN(y.original_max_position_embeddings,
                        s.Int32("original_max_position_embeddings", 4096));
    PD_ASSIGN_OR_RETURN(y.beta_fast, s.PositiveFloat("beta_fast", 32.0f));
    PD_ASSIGN_OR_RETURN(y.beta_slow, s.PositiveFloat("beta_slow", 1.0f));
    PD_ASSIGN_OR_RETURN(y.mscale, s.NonNegativeFloat("mscale", 1.0f));
    PD_ASSIGN_OR_RETURN(y.mscale_all_dim, s.NonNegativeFloat("mscale_all_dim", 0.0f));
    c->yarn = y;
    return absl::OkStatus();
  }
  if (type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat(where, ": rope type \"", type,
                     "\" is not supported (supported: default, llama3; yarn for DeepSeek)"));
  }
  Llama3RopeScaling l3;
  PD_ASSIGN_OR_RETURN(l3.factor, s.PositiveFloat("factor", std::nullopt));
  PD_ASSIGN_OR_RETURN(l3.low_freq_factor, s.PositiveFloat("low_freq_factor", std::nullopt));
  PD_ASSIGN_OR_RETURN(l3.high_freq_factor, s.PositiveFloat("high_freq_factor", std::nullopt));
  PD_ASSIGN_OR_RETURN(l3.original_max_position_embeddings,
                      s.Int32("original_max_position_embeddings", std::nullopt));
  c->rope_scaling = l3;
  return absl::OkStatus();
}

// Features of the supported architectures that the engine does not implement.
absl::Status CheckUnsupportedFeatures(const FieldReader& r, absl::string_view source,
                                      Architecture arch) {
  PD_ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "silu"));
  if (act != "silu") {
    return absl::UnimplementedError(
        absl::StrCat(source, ": hidden_act \"", act, "\" is not supported (only silu)"));
  }
  const absl::string_view name = arch == Architecture::kLlama      ? "LlamaForCausalLM"
                                 : arch == Architecture::kQwen2    ? "Qwen2ForCausalLM"
                                 : arch == Architecture::kQwen3    ? "Qwen3ForCausalLM"
                                 : arch == Architecture::kQwen3Moe ? "Qwen3MoeForCausalLM"
                                                                   : ArchitectureName(arch);
  const bool deepseek = arch == Architecture::kDeepseekV2 || arch == Architecture::kDeepseekV3;
  if (arch == Architecture::kLlama || arch == Architecture::kQwen3 ||
      arch == Architecture::kQwen3Moe || deepseek) {
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      PD_ASSIGN_OR_RETURN(bool on, r.Bool(key, false));
      if (on) {
        return absl::UnimplementedError(
            absl::StrCat(source, ": ", key, "=true is not supported for ", name));
      }
    }
  }
  if (arch == Architecture::kQwen2 || arch == Architecture::kQwen3 ||
      arch == Architecture::kQwen3Moe) {
    PD_ASSIGN_OR_RETURN(bool swa, r.Bool("use_sliding_window", false));
    if (swa) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": use_sliding_window=true (per-layer windows) is not supported for ", name));
    }
  }
  if (arch == Architecture::kQwen3Moe) {
    // Dense layers among the sparse ones (Qwen3-MoE's checkpoints have none).
    PD_ASSIGN_OR_RETURN(int32_t step, r.Int32("decoder_sparse_step", 1, 1));
    const Json* dense = r.Find("mlp_only_layers");
    if (step != 1 || (dense != nullptr && !dense->is_null() && !dense->empty())) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": dense layers among the experts (decoder_sparse_step ", step,
          ", mlp_only_layers) are not supported; every layer must be a mixture of experts"));
    }
  }
  if (deepseek && r.Has("n_routed_experts")) {
    PD_ASSIGN_OR_RETURN(int32_t freq, r.Int32("moe_layer_freq", 1, 1));
    if (freq != 1) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": moe_layer_freq ", freq,
          " is not supported (every layer from first_k_dense_replace on must be sparse)"));
    }
  }
  return absl::OkStatus();
}

// DeepSeek-V2 / V3: multi-head latent attention and the mixture of experts (ModelConfig's MLA
// and routing fields). The query head is qk_nope_head_dim + qk_rope_head_dim wide; "head_dim"
// and num_key_value_heads describe the expanded form and are not used.
absl::Status ParseDeepseek(const FieldReader& r, absl::string_view source, ModelConfig* c) {
  const bool v3 = c->architecture == Architecture::kDeepseekV3;
  if (r.Has("q_lora_rank")) {
    PD_ASSIGN_OR_RETURN(c->q_lora_rank, r.Int32("q_lora_rank", std::nullopt));
  }
  PD_ASSIGN_OR_RETURN(c->kv_lora_rank, r.Int32("kv_lora_rank", std::nullopt));
  PD_ASSIGN_OR_RETURN(c->qk_nope_head_dim, r.Int32("qk_nope_head_dim", std::nullopt));
  PD_ASSIGN_OR_RETURN(c->qk_rope_head_dim, r.Int32("qk_rope_head_dim", std::nullopt));
  PD_ASSIGN_OR_RETURN(c->v_head_dim, r.Int32("v_head_dim", std::nullopt));
  c->head_dim = static_cast<int32_t>(std::min<int64_t>(
      int64_t{c->qk_nope_head_dim} + c->qk_rope_head_dim, std::numeric_limits<int32_t>::max()));
  c->n_kv_heads = c->n_heads;
  c->kv_dim = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(c->n_heads) * c->head_dim,
                                                     std::numeric_limits<int32_t>::max()));
  c->rope_form = RopeForm::kInterleaved;  // the stored rope dims pair adjacent elements
  if (!r.Has("n_routed_experts")) {
    return absl::OkStatus();  // every MLP dense
  }
  PD_ASSIGN_OR_RETURN(c->n_experts, r.Int32("n_routed_experts", std::nullopt));
  PD_ASSIGN_OR_RETURN(c->n_experts_per_tok, r.Int32("num_experts_per_tok", std::nullopt));
  PD_ASSIGN_OR_RETURN(c->moe_hidden_dim, r.Int32("moe_intermediate_size", std::nullopt));
  PD_ASSIGN_OR_RETURN(c->n_shared_experts, r.Int32("n_shared_experts", 0, 0));
  PD_ASSIGN_OR_RETURN(c->first_dense_layers, r.Int32("first_k_dense_replace", 0, 0));
  PD_ASSIGN_OR_RETURN(float scale, r.PositiveFloat("routed_scaling_factor", 1.0f));
  PD_ASSIGN_OR_RETURN(bool norm, r.Bool("norm_topk_prob", false));
  PD_ASSIGN_OR_RETURN(std::string scoring, r.String("scoring_func", v3 ? "sigmoid" : "softmax"));
  PD_ASSIGN_OR_RETURN(std::string method, r.String("topk_method", v3 ? "noaux_tc" : "greedy"));
  const std::string name(ArchitectureName(c->architecture));
  if (scoring != (v3 ? "sigmoid" : "softmax")) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": scoring_func \"", scoring, "\" is not supported for ", name));
  }
  c->moe_scoring = v3 ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
  if (v3 ? method != "noaux_tc" : method != "greedy" && method != "group_limited_greedy") {
    return absl::UnimplementedError(
        absl::StrCat(source, ": topk_method \"", method, "\" is not supported for ", name,
                     v3 ? " (noaux_tc)" : " (greedy, group_limited_greedy)"));
  }
  c->moe_topk = method == "noaux_tc"               ? MoeTopk::kNoAuxTc
                : method == "group_limited_greedy" ? MoeTopk::kGroupLimited
                                                   : MoeTopk::kGreedy;
  if (c->moe_topk != MoeTopk::kGreedy) {
    PD_ASSIGN_OR_RETURN(c->moe_n_group, r.Int32("n_group", 1));
    PD_ASSIGN_OR_RETURN(c->moe_topk_group, r.Int32("topk_group", 1));
  }
  // Hugging Face's DeepSeek gates normalize only with more than one expert per token; V2
  // scales only what it does not normalize, V3 scales always.
  c->moe_norm_topk = norm && c->n_experts_per_tok > 1;
  c->moe_routed_scale = !v3 && c->moe_norm_topk ? 1.0f : scale;
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseConfigObject(const Json& j, absl::string_view source) {
  ModelConfig c;
  PD_ASSIGN_OR_RETURN(c.architecture, DetectArchitecture(j, source));
  FieldReader r(j, source);
  PD_RETURN_IF_ERROR(CheckUnsupportedFeatures(r, source, c.architecture));
  const bool qwen = c.architecture == Architecture::kQwen2 ||
                    c.architecture == Architecture::kQwen3 ||
                    c.architecture == Architecture::kQwen3Moe;
  const bool llama_like = !qwen && c.architecture != Architecture::kDeepseekV2 &&
                          c.architecture != Architecture::kDeepseekV3;
  PD_ASSIGN_OR_RETURN(c.dim, r.Int32("hidden_size", std::nullopt));
  PD_ASSIGN_OR_RETURN(c.hidden_dim, r.Int32("intermediate_size", std::nullopt));
  PD_ASSIGN_OR_RETURN(c.n_layers, r.Int32("num_hidden_layers", std::nullopt));
  PD_ASSIGN_OR_RETURN(c.n_heads, r.Int32("num_attention_heads", std::nullopt));
  PD_ASSIGN_OR_RETURN(c.vocab_size, r.Int32("vocab_size", std::nullopt));
  const bool mistral_like =
      c.architecture == Architecture::kMistral || c.architecture == Architecture::kMixtral;
  const int32_t default_kv = c.architecture == Architecture::kLlama ? c.n_heads
                             : mistral_like                         ? 8
                                                                    : 32;
  PD_ASSIGN_OR_RETURN(c.n_kv_heads, r.Int32("num_key_value_heads", default_kv));
  const bool deepseek =
      c.architecture == Architecture::kDeepseekV2 || c.architecture == Architecture::kDeepseekV3;
  if (deepseek) {
    // head_dim comes from the MLA fields (ParseDeepseek).
  } else if (r.Has("head_dim")) {
    PD_ASSIGN_OR_RETURN(c.head_dim, r.Int32("head_dim", std::nullopt));
  } else if (c.dim % c.n_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": hidden_size ", c.dim,
                                                   " is not a multiple of num_attention_heads ",
                                                   c.n_heads, " and no head_dim is given"));
  } else {
    c.head_dim = c.dim / c.n_heads;
  }
  c.kv_dim = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(c.n_kv_heads) * c.head_dim,
                                                    std::numeric_limits<int32_t>::max()));
  const int32_t default_max_pos = c.architecture == Architecture::kLlama ? 2048
                                  : mistral_like                         ? 131072
                                                                         : 32768;
  PD_ASSIGN_OR_RETURN(c.seq_len, r.Int32("max_position_embeddings", default_max_pos));
  PD_ASSIGN_OR_RETURN(c.rms_norm_eps, r.PositiveFloat("rms_norm_eps", 1e-6f));
  PD_ASSIGN_OR_RETURN(c.shared_classifier, r.Bool("tie_word_embeddings", false));
  PD_RETURN_IF_ERROR(ParseRope(r, source, &c));
  c.rope_form = RopeForm::kRotateHalf;
  if (c.architecture == Architecture::kDeepseekV2 || c.architecture == Architecture::kDeepseekV3) {
    PD_RETURN_IF_ERROR(ParseDeepseek(r, source, &c));
  }
  c.qkv_bias = c.architecture == Architecture::kQwen2;
  c.qk_norm = c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  if (c.architecture == Architecture::kMixtral) {
    PD_ASSIGN_OR_RETURN(c.n_experts, r.Int32("num_local_experts", std::nullopt, 1));
    PD_ASSIGN_OR_RETURN(c.n_experts_per_tok, r.Int32("num_experts_per_tok", 2, 1));
    c.moe_hidden_dim = c.hidden_dim;  // Mixtral's intermediate_size is each expert's
    c.moe_norm_topk = true;
  } else if (c.architecture == Architecture::kQwen3Moe) {
    PD_ASSIGN_OR_RETURN(c.n_experts, r.Int32("num_experts", std::nullopt, 1));
    PD_ASSIGN_OR_RETURN(c.n_experts_per_tok, r.Int32("num_experts_per_tok", std::nullopt, 1));
    PD_ASSIGN_OR_RETURN(c.moe_hidden_dim, r.Int32("moe_intermediate_size", std::nullopt, 1));
    PD_ASSIGN_OR_RETURN(c.moe_norm_topk, r.Bool("norm_topk_prob", false));
  }
  if (mistral_like) {
    PD_ASSIGN_OR_RETURN(int32_t window, r.Int32("sliding_window", 0, 0));
    c.sliding_window = window >= c.seq_len ? 0 : window;  // a window >= context changes nothing
  }
  PD_ASSIGN_OR_RETURN(c.weight_dtype, ParseTorchDtype(r));
  PD_ASSIGN_OR_RETURN(std::optional<std::vector<uint32_t>> bos, r.TokenIds("bos_token_id"));
  c.bos_id = bos.has_value()                             ? bos->front()
             : llama_like && !j.contains("bos_token_id") ? 1u
                                                         : ModelConfig::kNoToken;
  PD_ASSIGN_OR_RETURN(std::optional<std::vector<uint32_t>> eos, r.TokenIds("eos_token_id"));
  if (eos.has_value()) {
    c.eos_ids = *eos;
  } else if (llama_like && !j.contains("eos_token_id")) {
    c.eos_ids = {2};
  } else {
    c.eos_ids.clear();  // may still come from generation_config.json
  }
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view config_json,
                                          absl::string_view generation_config_json,
                                          absl::string_view source) {
  PD_ASSIGN_OR_RETURN(Json j, ParseObject(config_json, source));
  PD_ASSIGN_OR_RETURN(ModelConfig c, ParseConfigObject(j, source));
  if (!generation_config_json.empty()) {
    const std::string gen_source = absl::StrCat(source, " (generation_config.json)");
    PD_ASSIGN_OR_RETURN(Json g, ParseObject(generation_config_json, gen_source));
    FieldReader gr(g, gen_source);
    PD_ASSIGN_OR_RETURN(std::optional<std::vector<uint32_t>> eos, gr.TokenIds("eos_token_id"));
    if (eos.has_value()) {
      c.eos_ids = *eos;
    }
    PD_ASSIGN_OR_RETURN(std::optional<std::vector<uint32_t>> bos, gr.TokenIds("bos_token_id"));
    if (bos.has_value()) {
      c.bos_id = bos->front();
    }
  }
  if (c.eos_ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no eos_token_id in config.json or generation_config.json"));
  }
  c.eos_id = c.eos_ids.front();
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfig(absl::string_view dir) {
  const std::string config_path = absl::StrCat(dir, "/config.json");
  PD_ASSIGN_OR_RETURN(MappedFile config, MappedFile::Open(config_path));
  const std::string gen_path = absl::StrCat(dir, "/generation_config.json");
  struct stat st;
  std::optional<MappedFile> gen;
  if (::stat(gen_path.c_str(), &st) == 0) {
    PD_ASSIGN_OR_RETURN(gen, MappedFile::Open(gen_path));
  }
  return ParseHfConfig(config.contents(), gen.has_value() ? gen->contents() : absl::string_view(),
                       config_path);
}

absl::StatusOr<std::string> HfConfigJson(const ModelConfig& c) {
  PD_RETURN_IF_ERROR(c.Validate());
  Json j = Json::object();
  switch (c.architecture) {
    case Architecture::kLlama:
      j["architectures"] = {"LlamaForCausalLM"};
      j["model_type"] = "llama";
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      break;
    case Architecture::kMistral:
      j["architectures"] = {"MistralForCausalLM"};
      j["model_type"] = "mistral";
      j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
      break;
    case Architecture::kQwen2:
      j["architectures"] = {"Qwen2ForCausalLM"};
      j["model_type"] = "qwen2";
      j["use_sliding_window"] = false;
      break;
    case Architecture::kQwen3:
      j["architectures"] = {"Qwen3ForCausalLM"};
      j["model_type"] = "qwen3";
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      break;
    case Architecture::kMixtral:
      j["architectures"] = {"MixtralForCausalLM"};
      j["model_type"] = "mixtral";
      j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
      j["num_local_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.n_experts_per_tok;
      j["router_aux_loss_coef"] = 0.02;
      break;
    case Architecture::kQwen3Moe:
      j["architectures"] = {"Qwen3MoeForCausalLM"};
      j["model_type"] = "qwen3_moe";
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      j["num_experts"] = c.n_experts;
      j["num_experts_per_tok"] = c.n_experts_per_tok;
      j["moe_intermediate_size"] = c.moe_hidden_dim;
      j["norm_topk_prob"] = c.moe_norm_topk;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = Json::array();
      break;
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3: {
      const bool v3 = c.architecture == Architecture::kDeepseekV3;
      j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
      j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
      j["attention_bias"] = false;
      j["q_lora_rank"] = c.q_lora_rank > 0 ? Json(c.q_lora_rank) : Json(nullptr);
      j["kv_lora_rank"] = c.kv_lora_rank;
      j["qk_nope_head_dim"] = c.qk_nope_head_dim;
      j["qk_rope_head_dim"] = c.qk_rope_head_dim;
      j["v_head_dim"] = c.v_head_dim;
      if (c.moe()) {
        j["n_routed_experts"] = c.n_experts;
        j["num_experts_per_tok"] = c.n_experts_per_tok;
        j["moe_intermediate_size"] = c.moe_hidden_dim;
        j["n_shared_experts"] = c.n_shared_experts > 0 ? Json(c.n_shared_experts) : Json(nullptr);
        j["first_k_dense_replace"] = c.first_dense_layers;
        j["moe_layer_freq"] = 1;
        j["norm_topk_prob"] = c.moe_norm_topk;
        j["routed_scaling_factor"] = ShortestDouble(c.moe_routed_scale);
        j["scoring_func"] = c.moe_scoring == MoeScoring::kSigmoid ? "sigmoid" : "softmax";
        j["topk_method"] = c.moe_topk == MoeTopk::kNoAuxTc        ? "noaux_tc"
                           : c.moe_topk == MoeTopk::kGroupLimited ? "group_limited_greedy"
                                                                  : "greedy";
        j["n_group"] = c.moe_n_group;
        j["topk_group"] = c.moe_topk_group;
      } else {
        j["n_routed_experts"] = nullptr;
      }
      break;
    }
    case Architecture::kLlama2c:
      return absl::InvalidArgumentError(
          "HfConfigJson: a llama2.c config has no Hugging Face equivalent");
  }
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  if (!c.mla()) {
    j["head_dim"] = c.head_dim;
  }
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.seq_len;
  j["rms_norm_eps"] = ShortestDouble(c.rms_norm_eps);
  j["rope_theta"] = ShortestDouble(c.rope_theta);
  if (c.yarn.has_value()) {
    j["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", ShortestDouble(c.yarn->factor)},
        {"original_max_position_embeddings", c.yarn->original_max_position_embeddings},
        {"beta_fast", ShortestDouble(c.yarn->beta_fast)},
        {"beta_slow", ShortestDouble(c.yarn->beta_slow)},
        {"mscale", ShortestDouble(c.yarn->mscale)},
        {"mscale_all_dim", ShortestDouble(c.yarn->mscale_all_dim)}};
  } else if (c.rope_scaling.has_value()) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", ShortestDouble(c.rope_scaling->factor)},
        {"low_freq_factor", ShortestDouble(c.rope_scaling->low_freq_factor)},
        {"high_freq_factor", ShortestDouble(c.rope_scaling->high_freq_factor)},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.shared_classifier;
  j["torch_dtype"] = c.weight_dtype == kernels::DType::kF32    ? "float32"
                     : c.weight_dtype == kernels::DType::kBF16 ? "bfloat16"
                                                               : "float16";
  j["bos_token_id"] = c.bos_id == ModelConfig::kNoToken ? Json(nullptr) : Json(c.bos_id);
  j["eos_token_id"] = c.eos_ids.size() == 1 ? Json(c.eos_id) : Json(c.eos_ids);
  return j.dump(2) + "\n";
}

std::string HfGenerationConfigJson(const ModelConfig& c) {
  Json j = Json::object();
  if (c.bos_id != ModelConfig::kNoToken) {
    j["bos_token_id"] = c.bos_id;
  }
  j["eos_token_id"] = c.eos_ids.size() == 1 ? Json(c.eos_id) : Json(c.eos_ids);
  return j.dump(2) + "\n";
}

}  // namespace pd::engine
