#include "engine/model/hf_model.h"

#include <xxhash.h>

#include <array>
#include <cstdint>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/model/fp8_block.h"
#include "engine/model/hf_config.h"

namespace pd::engine {
namespace {

std::string LayerName(int layer, absl::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

// A mixture-of-experts layer's tensor names: the router, and expert e's gate / up / down.
std::string RouterName(const ModelConfig& c, int layer) {
  return LayerName(layer, c.architecture == Architecture::kMixtral ? "block_sparse_moe.gate.weight"
                                                                   : "mlp.gate.weight");
}

std::array<std::string, 3> ExpertNames(const ModelConfig& c, int layer, int e) {
  if (c.architecture == Architecture::kMixtral) {
    const std::string base = absl::StrCat("block_sparse_moe.experts.", e, ".");
    return {LayerName(layer, base + "w1.weight"), LayerName(layer, base + "w3.weight"),
            LayerName(layer, base + "w2.weight")};
  }
  const std::string base = absl::StrCat("mlp.experts.", e, ".");
  return {LayerName(layer, base + "gate_proj.weight"), LayerName(layer, base + "up_proj.weight"),
          LayerName(layer, base + "down_proj.weight")};
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Checks presence, shape and dtype of every required tensor; returns the common dtype.
absl::StatusOr<SafetensorsDtype> CheckTensors(const ModelConfig& config, const WeightSet& weights,
                                              absl::string_view dir,
                                              std::optional<Fp8BlockSize> fp8) {
  std::optional<SafetensorsDtype> dtype;
  std::string first_name;
  for (const HfTensorRequirement& req : HfRequiredTensors(config)) {
    const TensorView* view = weights.Find(req.name);
    if (view == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": missing tensor ", req.name, " (", ArchitectureName(config.architecture), " with ",
          config.n_layers, " layers needs it)"));
    }
    if (view->shape != req.shape) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor ", req.name, " has shape ",
                                                     view->ShapeString(), ", config implies ",
                                                     ShapeString(req.shape)));
    }
    if (view->dtype == SafetensorsDtype::kF8E4M3 && fp8.has_value()) {
      // Block-scaled fp8 (fp8_block.h): its scales must be there, of the right shape.
      const std::string scale_name = Fp8ScaleName(req.name);
      const TensorView* scale = weights.Find(scale_name);
      if (scale == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": missing tensor ", scale_name, " (", req.name, " is fp8)"));
      }
      absl::Status ok = CheckFp8Scale(req.name, *view, *scale, *fp8);
      if (!ok.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ok.message()));
      }
      continue;
    }
    if (req.any_float) {
      if (!ToKernelDType(view->dtype).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor ", req.name, " has dtype ",
                                                       SafetensorsDtypeName(view->dtype),
                                                       "; it must be F32, BF16 or F16"));
      }
      continue;
    }
    if (!dtype.has_value()) {
      if (!ToKernelDType(view->dtype).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor ", req.name, " has dtype ",
                                                       SafetensorsDtypeName(view->dtype),
                                                       "; weights must be F32, BF16 or F16"));
      }
      dtype = view->dtype;
      first_name = req.name;
    } else if (view->dtype != *dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": tensor ", req.name, " has dtype ", SafetensorsDtypeName(view->dtype),
                       " but ", first_name, " has ", SafetensorsDtypeName(*dtype),
                       "; mixed weight dtypes are not supported"));
    }
  }
  return *dtype;  // HfRequiredTensors is never empty
}

void HashUpdate(XXH3_state_t* state, const void* data, size_t size) {
  CHECK_EQ(XXH3_128bits_update(state, data, size), XXH_OK);
}

template <typename T>
void HashValue(XXH3_state_t* state, T value) {
  HashUpdate(state, &value, sizeof(value));
}

}  // namespace

std::vector<HfTensorRequirement> HfRequiredTensors(const ModelConfig& c) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, vocab = c.vocab_size, kv = c.kv_dim,
                q = c.q_dim();
  std::vector<HfTensorRequirement> out;
  out.push_back({"model.embed_tokens.weight", {vocab, dim}});
  for (int l = 0; l < c.n_layers; ++l) {
    out.push_back({LayerName(l, "input_layernorm.weight"), {dim}});
    if (c.mla()) {
      const int64_t heads = c.n_heads;
      if (c.q_lora_rank > 0) {
        out.push_back({LayerName(l, "self_attn.q_a_proj.weight"), {c.q_lora_rank, dim}});
        out.push_back({LayerName(l, "self_attn.q_a_layernorm.weight"), {c.q_lora_rank}});
        out.push_back({LayerName(l, "self_attn.q_b_proj.weight"), {q, c.q_lora_rank}});
      } else {
        out.push_back({LayerName(l, "self_attn.q_proj.weight"), {q, dim}});
      }
      out.push_back(
          {LayerName(l, "self_attn.kv_a_proj_with_mqa.weight"), {c.mla_latent_dim(), dim}});
      out.push_back({LayerName(l, "self_attn.kv_a_layernorm.weight"), {c.kv_lora_rank}});
      out.push_back({LayerName(l, "self_attn.kv_b_proj.weight"),
                     {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}});
      out.push_back({LayerName(l, "self_attn.o_proj.weight"), {dim, c.attn_out_dim()}});
    } else {
      out.push_back({LayerName(l, "self_attn.q_proj.weight"), {q, dim}});
      out.push_back({LayerName(l, "self_attn.k_proj.weight"), {kv, dim}});
      out.push_back({LayerName(l, "self_attn.v_proj.weight"), {kv, dim}});
    }
    if (c.qkv_bias) {
      out.push_back({LayerName(l, "self_attn.q_proj.bias"), {q}});
      out.push_back({LayerName(l, "self_attn.k_proj.bias"), {kv}});
      out.push_back({LayerName(l, "self_attn.v_proj.bias"), {kv}});
    }
    if (c.qk_norm) {
      out.push_back({LayerName(l, "self_attn.q_norm.weight"), {c.head_dim}});
      out.push_back({LayerName(l, "self_attn.k_norm.weight"), {c.head_dim}});
    }
    if (!c.mla()) {
      out.push_back({LayerName(l, "self_attn.o_proj.weight"), {dim, q}});
    }
    out.push_back({LayerName(l, "post_attention_layernorm.weight"), {dim}});
    if (c.moe_layer(l)) {
      const int64_t width = c.moe_hidden_dim;
      out.push_back({RouterName(c, l), {c.n_experts, dim}});
      if (c.moe_topk == MoeTopk::kNoAuxTc) {
        out.push_back({LayerName(l, "mlp.gate.e_score_correction_bias"), {c.n_experts}, true});
      }
      for (int e = 0; e < c.n_experts; ++e) {
        const std::array<std::string, 3> names = ExpertNames(c, l, e);
        out.push_back({names[0], {width, dim}});
        out.push_back({names[1], {width, dim}});
        out.push_back({names[2], {dim, width}});
      }
      if (c.n_shared_experts > 0) {
        const int64_t shared = width * c.n_shared_experts;
        out.push_back({LayerName(l, "mlp.shared_experts.gate_proj.weight"), {shared, dim}});
        out.push_back({LayerName(l, "mlp.shared_experts.up_proj.weight"), {shared, dim}});
        out.push_back({LayerName(l, "mlp.shared_experts.down_proj.weight"), {dim, shared}});
      }
      continue;
    }
    out.push_back({LayerName(l, "mlp.gate_proj.weight"), {hidden, dim}});
    out.push_back({LayerName(l, "mlp.up_proj.weight"), {hidden, dim}});
    out.push_back({LayerName(l, "mlp.down_proj.weight"), {dim, hidden}});
  }
  out.push_back({"model.norm.weight", {dim}});
  if (!c.shared_classifier) {
    out.push_back({"lm_head.weight", {vocab, dim}});
  }
  return out;
}

absl::StatusOr<HfModel> HfModel::Load(absl::string_view dir) {
  const absl::Time start = absl::Now();
  PD_ASSIGN_OR_RETURN(ModelConfig config, LoadHfConfig(dir));
  PD_ASSIGN_OR_RETURN(WeightSet weights, WeightSet::Open(dir));
  PD_ASSIGN_OR_RETURN(std::optional<Fp8BlockSize> fp8, LoadFp8Quantization(dir));
  PD_ASSIGN_OR_RETURN(SafetensorsDtype dtype, CheckTensors(config, weights, dir, fp8));
  const kernels::DType actual = *ToKernelDType(dtype);
  if (actual != config.weight_dtype) {
    LOG(WARNING) << dir << ": config.json torch_dtype disagrees with the weights, which are "
                 << SafetensorsDtypeName(dtype) << "; using the weights' dtype";
    config.weight_dtype = actual;
  }
  HfModel model(std::string(dir), std::move(config), std::move(weights));
  model.BindTensors();
  model.ComputeFingerprint();
  model.stats_.total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  LOG(INFO) << "loaded Hugging Face model " << dir << " (" << model.config_.DebugString()
            << ") fingerprint=" << model.fingerprint_ << " hashed " << model.stats_.hashed_bytes
            << " bytes in " << model.stats_.hash_seconds << " s";
  return model;
}

void HfModel::BindTensors() {
  // CheckTensors guaranteed presence; a failure here is a programming error.
  auto get = [this](const std::string& name) {
    const TensorView* v = weights_.Find(name);
    CHECK(v != nullptr) << name;
    return *v;
  };
  embed_tokens_ = get("model.embed_tokens.weight");
  norm_ = get("model.norm.weight");
  lm_head_ = config_.shared_classifier ? embed_tokens_ : get("lm_head.weight");
  layers_.resize(config_.n_layers);
  for (int l = 0; l < config_.n_layers; ++l) {
    HfLayerWeights& w = layers_[l];
    w.input_layernorm = get(LayerName(l, "input_layernorm.weight"));
    if (config_.mla()) {
      if (config_.q_lora_rank > 0) {
        w.q_a_proj = get(LayerName(l, "self_attn.q_a_proj.weight"));
        w.q_a_layernorm = get(LayerName(l, "self_attn.q_a_layernorm.weight"));
        w.q_proj = get(LayerName(l, "self_attn.q_b_proj.weight"));
      } else {
        w.q_proj = get(LayerName(l, "self_attn.q_proj.weight"));
      }
      w.kv_a_proj = get(LayerName(l, "self_attn.kv_a_proj_with_mqa.weight"));
      w.kv_a_layernorm = get(LayerName(l, "self_attn.kv_a_layernorm.weight"));
      w.kv_b_proj = get(LayerName(l, "self_attn.kv_b_proj.weight"));
    } else {
      w.q_proj = get(LayerName(l, "self_attn.q_proj.weight"));
      w.k_proj = get(LayerName(l, "self_attn.k_proj.weight"));
      w.v_proj = get(LayerName(l, "self_attn.v_proj.weight"));
    }
    w.o_proj = get(LayerName(l, "self_attn.o_proj.weight"));
    if (config_.qkv_bias) {
      w.q_bias = get(LayerName(l, "self_attn.q_proj.bias"));
      w.k_bias = get(LayerName(l, "self_attn.k_proj.bias"));
      w.v_bias = get(LayerName(l, "self_attn.v_proj.bias"));
    }
    if (config_.qk_norm) {
      w.q_norm = get(LayerName(l, "self_attn.q_norm.weight"));
      w.k_norm = get(LayerName(l, "self_attn.k_norm.weight"));
    }
    w.post_attention_layernorm = get(LayerName(l, "post_attention_layernorm.weight"));
    if (config_.moe_layer(l)) {
      w.router = get(RouterName(config_, l));
      if (config_.moe_topk == MoeTopk::kNoAuxTc) {
        w.router_bias = get(LayerName(l, "mlp.gate.e_score_correction_bias"));
      }
      w.experts.resize(static_cast<size_t>(config_.n_experts));
      for (int e = 0; e < config_.n_experts; ++e) {
        const std::array<std::string, 3> names = ExpertNames(config_, l, e);
        w.experts[e] = {get(names[0]), get(names[1]), get(names[2])};
      }
      if (config_.n_shared_experts > 0) {
        w.shared = HfLayerWeights::Expert{get(LayerName(l, "mlp.shared_experts.gate_proj.weight")),
                                          get(LayerName(l, "mlp.shared_experts.up_proj.weight")),
                                          get(LayerName(l, "mlp.shared_experts.down_proj.weight"))};
      }
      continue;
    }
    w.gate_proj = get(LayerName(l, "mlp.gate_proj.weight"));
    w.up_proj = get(LayerName(l, "mlp.up_proj.weight"));
    w.down_proj = get(LayerName(l, "mlp.down_proj.weight"));
  }
}

void HfModel::ComputeFingerprint() {
  const absl::Time start = absl::Now();
  XXH3_state_t* state = XXH3_createState();
  CHECK(state != nullptr) << "XXH3_createState: out of memory";
  CHECK_EQ(XXH3_128bits_reset(state), XXH_OK);
  static constexpr char kTag[] = "pd.hf_model.v1";
  HashUpdate(state, kTag, sizeof(kTag));
  const std::string config_bytes = CanonicalConfigBytes(config_);
  HashValue<uint64_t>(state, config_bytes.size());
  HashUpdate(state, config_bytes.data(), config_bytes.size());
  uint64_t hashed = 0;
  for (const HfTensorRequirement& req : HfRequiredTensors(config_)) {
    const TensorView* v = weights_.Find(req.name);
    CHECK(v != nullptr) << req.name;
    HashValue<uint64_t>(state, req.name.size());
    HashUpdate(state, req.name.data(), req.name.size());
    HashValue<uint8_t>(state, static_cast<uint8_t>(v->dtype));
    HashValue<uint64_t>(state, v->shape.size());
    for (int64_t d : v->shape) {
      HashValue<int64_t>(state, d);
    }
    HashValue<uint64_t>(state, v->size_bytes);
    if (v->size_bytes > 0) {
      HashUpdate(state, v->data, v->size_bytes);
    }
    hashed += v->size_bytes;
    if (v->dtype == SafetensorsDtype::kF8E4M3) {  // its block scales are part of the weight
      const std::string scale_name = Fp8ScaleName(req.name);
      const TensorView* s = weights_.Find(scale_name);
      CHECK(s != nullptr) << scale_name;
      HashValue<uint64_t>(state, scale_name.size());
      HashUpdate(state, scale_name.data(), scale_name.size());
      HashValue<uint8_t>(state, static_cast<uint8_t>(s->dtype));
      HashValue<uint64_t>(state, s->size_bytes);
      HashUpdate(state, s->data, s->size_bytes);
      hashed += s->size_bytes;
    }
  }
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
  XXH3_freeState(state);
  fingerprint_ = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(canonical.digest), sizeof(canonical)));
  stats_.hashed_bytes = hashed;
  stats_.hash_seconds = absl::ToDoubleSeconds(absl::Now() - start);
}

const HfLayerWeights& HfModel::layer(int layer) const {
  CHECK_GE(layer, 0);
  CHECK_LT(layer, config_.n_layers);
  return layers_[static_cast<size_t>(layer)];
}

}  // namespace pd::engine
