#include "engine/model/model_config.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/attention_params.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "CanonicalConfigBytes assumes a little-endian host");

bool PositiveFinite(float v) { return std::isfinite(v) && v > 0.0f; }

template <typename T>
void AppendRaw(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

}  // namespace

absl::string_view ArchitectureName(Architecture architecture) {
  switch (architecture) {
    case Architecture::kLlama2c:
      return "llama2c";
    case Architecture::kLlama:
      return "llama";
    case Architecture::kMistral:
      return "mistral";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kMixtral:
      return "mixtral";
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
    case Architecture::kDeepseekV2:
      return "deepseek_v2";
    case Architecture::kDeepseekV3:
      return "deepseek_v3";
  }
  return "unknown";
}

int32_t ModelConfig::mlp_width() const {
  if (!moe()) return hidden_dim;
  int32_t width = std::max(moe_hidden_dim, moe_hidden_dim * std::max(1, n_shared_experts));
  return first_dense_layers > 0 ? std::max(width, hidden_dim) : width;
}

int32_t ModelConfig::cache_kv_heads() const {
  if (!mla()) return n_kv_heads;
  const int32_t latent = mla_latent_dim();
  if (latent <= 0 || latent % 2 != 0) return 1;  // invalid (Validate says so)
  for (int32_t heads = 1;; ++heads) {            // ends: heads = latent / 2 gives pieces of 1
    if (latent % (2 * heads) == 0 && latent / (2 * heads) <= kernels::kMaxAttentionHeadDim) {
      return heads;
    }
  }
}

int32_t ModelConfig::cache_head_dim() const {
  return mla() ? mla_latent_dim() / (2 * cache_kv_heads()) : head_dim;
}

absl::Status ModelConfig::Validate() const {
  auto invalid = [this](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid model config (", DebugString(), "): ", why));
  };
  const std::pair<const char*, int32_t> sizes[] = {
      {"dim", dim},         {"hidden_dim", hidden_dim}, {"n_layers", n_layers},
      {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads}, {"vocab_size", vocab_size},
      {"seq_len", seq_len}, {"head_dim", head_dim},
  };
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return invalid(absl::StrCat(name, " is ", value, ", must be positive"));
    }
  }
  if (n_heads % n_kv_heads != 0) {
    return invalid(
        absl::StrCat("n_heads ", n_heads, " is not a multiple of n_kv_heads ", n_kv_heads));
  }
  if (head_dim % 2 != 0) {
    return invalid(absl::StrCat("head_dim ", head_dim, " is odd; rotary pairs need it even"));
  }
  if (q_dim() > std::numeric_limits<int32_t>::max() ||
      static_cast<int64_t>(kv_dim) != static_cast<int64_t>(n_kv_heads) * head_dim) {
    return invalid(absl::StrCat("kv_dim ", kv_dim, " != n_kv_heads * head_dim, or q_dim ", q_dim(),
                                " overflows"));
  }
  if (!PositiveFinite(rope_theta)) {
    return invalid(absl::StrCat("rope_theta ", rope_theta, " must be positive and finite"));
  }
  if (!PositiveFinite(rms_norm_eps)) {
    return invalid(absl::StrCat("rms_norm_eps ", rms_norm_eps, " must be positive and finite"));
  }
  if (rope_scaling.has_value()) {
    const Llama3RopeScaling& s = *rope_scaling;
    if (!PositiveFinite(s.factor) || !PositiveFinite(s.low_freq_factor) ||
        !PositiveFinite(s.high_freq_factor) || s.high_freq_factor <= s.low_freq_factor ||
        s.original_max_position_embeddings <= 0) {
      return invalid(
          absl::StrCat("rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings > 0; got factor ",
                       s.factor, ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ",
                       s.high_freq_factor, ", original_max_position_embeddings ",
                       s.original_max_position_embeddings));
    }
  }
  if (n_experts < 0) {
    return invalid(absl::StrCat("n_experts ", n_experts, " is negative"));
  }
  if (n_experts > 0) {
    if (n_experts_per_tok < 1 || n_experts_per_tok > n_experts) {
      return invalid(
          absl::StrCat("n_experts_per_tok ", n_experts_per_tok, " is not in [1, ", n_experts, "]"));
    }
    if (moe_hidden_dim <= 0) {
      return invalid(absl::StrCat("moe_hidden_dim ", moe_hidden_dim, " must be positive"));
    }
    if (moe_n_group < 1 || n_experts % moe_n_group != 0 || moe_topk_group < 1 ||
        moe_topk_group > moe_n_group ||
        static_cast<int64_t>(moe_topk_group) * (n_experts / moe_n_group) < n_experts_per_tok) {
      return invalid(absl::StrCat(
          "n_group ", moe_n_group, " must divide n_experts ", n_experts, " and topk_group ",
          moe_topk_group, " groups must hold n_experts_per_tok ", n_experts_per_tok, " experts"));
    }
    if (moe_topk == MoeTopk::kNoAuxTc && n_experts / moe_n_group < 2) {
      return invalid("topk_method noaux_tc ranks groups by their top 2: groups need 2 experts");
    }
    if (!std::isfinite(moe_routed_scale) || moe_routed_scale <= 0.0f || n_shared_experts < 0 ||
        first_dense_layers < 0 || first_dense_layers > n_layers ||
        static_cast<int64_t>(moe_hidden_dim) * std::max(1, n_shared_experts) >
            std::numeric_limits<int32_t>::max()) {
      return invalid(absl::StrCat("routed_scaling_factor ", moe_routed_scale,
                                  " must be positive, n_shared_experts ", n_shared_experts,
                                  " >= 0 and first_dense_layers ", first_dense_layers,
                                  " in [0, n_layers]"));
    }
  }
  if (kv_lora_rank < 0) {
    return invalid(absl::StrCat("kv_lora_rank ", kv_lora_rank, " is negative"));
  }
  if (mla()) {
    constexpr int32_t kMaxWidth = 64 * 1024;  // keeps every sum below far from overflow
    if (q_lora_rank < 0 || q_lora_rank > kMaxWidth || kv_lora_rank > kMaxWidth ||
        qk_nope_head_dim <= 0 || qk_nope_head_dim > kMaxWidth || qk_rope_head_dim <= 0 ||
        qk_rope_head_dim > kMaxWidth || qk_rope_head_dim % 2 != 0 || v_head_dim <= 0 ||
        v_head_dim > kMaxWidth || head_dim != qk_nope_head_dim + qk_rope_head_dim ||
        mla_latent_dim() % 2 != 0) {
      return invalid(absl::StrCat(
          "MLA needs q_lora_rank >= 0, positive qk_nope_head_dim, v_head_dim and an even "
          "qk_rope_head_dim, head_dim = qk_nope_head_dim + qk_rope_head_dim, and an even "
          "kv_lora_rank + qk_rope_head_dim, with every width at most 65536; got q_lora_rank ",
          q_lora_rank, ", kv_lora_rank ", kv_lora_rank, ", qk_nope_head_dim ", qk_nope_head_dim,
          ", qk_rope_head_dim ", qk_rope_head_dim, ", v_head_dim ", v_head_dim, ", head_dim ",
          head_dim));
    }
    if (sliding_window > 0) {
      return invalid("MLA with a sliding window is not supported");
    }
  }
  if (yarn.has_value()) {
    const YarnRopeScaling& y = *yarn;
    if (!mla() || rope_scaling.has_value() || !PositiveFinite(y.factor) ||
        y.original_max_position_embeddings <= 0 || !PositiveFinite(y.beta_fast) ||
        !PositiveFinite(y.beta_slow) || !std::isfinite(y.mscale) || y.mscale < 0.0f ||
        !std::isfinite(y.mscale_all_dim) || y.mscale_all_dim < 0.0f) {
      return invalid(absl::StrCat(
          "yarn rope scaling needs an MLA model without llama3 scaling, factor, beta_fast, "
          "beta_slow and original_max_position_embeddings > 0, mscale and mscale_all_dim >= 0; "
          "got factor ",
          y.factor, ", original_max_position_embeddings ", y.original_max_position_embeddings,
          ", beta_fast ", y.beta_fast, ", beta_slow ", y.beta_slow, ", mscale ", y.mscale,
          ", mscale_all_dim ", y.mscale_all_dim));
    }
  }
  if (sliding_window < 0) {
    return invalid(absl::StrCat("sliding_window ", sliding_window, " is negative"));
  }
  if (eos_ids.empty()) {
    return invalid("eos_ids is empty");
  }
  if (eos_id != eos_ids[0]) {
    return invalid(absl::StrCat("eos_id ", eos_id, " != eos_ids[0] ", eos_ids[0]));
  }
  for (uint32_t id : eos_ids) {
    if (id >= static_cast<uint32_t>(vocab_size)) {
      return invalid(absl::StrCat("eos id ", id, " is >= vocab_size ", vocab_size));
    }
  }
  if (bos_id != kNoToken && bos_id >= static_cast<uint32_t>(vocab_size)) {
    return invalid(absl::StrCat("bos_id ", bos_id, " is >= vocab_size ", vocab_size));
  }
  return absl::OkStatus();
}

std::string ModelConfig::DebugString() const {
  std::string out = absl::StrCat(
      "architecture=", ArchitectureName(architecture), " dim=", dim, " hidden_dim=", hidden_dim,
      " n_layers=", n_layers, " n_heads=", n_heads, " n_kv_heads=", n_kv_heads,
      " vocab_size=", vocab_size, " seq_len=", seq_len,
      " shared_classifier=", shared_classifier ? "true" : "false", " head_dim=", head_dim,
      " kv_dim=", kv_dim, " rope_theta=", rope_theta,
      " rope_form=", rope_form == RopeForm::kInterleaved ? "interleaved" : "rotate_half");
  if (rope_scaling.has_value()) {
    absl::StrAppend(&out, " rope_scaling=llama3(factor=", rope_scaling->factor,
                    ",low=", rope_scaling->low_freq_factor,
                    ",high=", rope_scaling->high_freq_factor,
                    ",original=", rope_scaling->original_max_position_embeddings, ")");
  }
  absl::StrAppend(
      &out, " rms_norm_eps=", rms_norm_eps, " qkv_bias=", qkv_bias ? "true" : "false",
      " qk_norm=", qk_norm ? "true" : "false",
      n_experts > 0
          ? absl::StrCat(" n_experts=", n_experts, " n_experts_per_tok=", n_experts_per_tok,
                         " moe_hidden_dim=", moe_hidden_dim,
                         " moe_norm_topk=", moe_norm_topk ? "true" : "false")
          : std::string(),
      n_experts > 0 && (moe_scoring != MoeScoring::kSoftmax || moe_topk != MoeTopk::kGreedy ||
                        moe_n_group != 1 || moe_topk_group != 1 || moe_routed_scale != 1.0f ||
                        n_shared_experts != 0 || first_dense_layers != 0)
          ? absl::StrCat(" moe_scoring=", static_cast<int>(moe_scoring),
                         " moe_topk=", static_cast<int>(moe_topk), " n_group=", moe_n_group,
                         " topk_group=", moe_topk_group, " routed_scale=", moe_routed_scale,
                         " n_shared_experts=", n_shared_experts,
                         " first_dense_layers=", first_dense_layers)
          : std::string(),
      mla() ? absl::StrCat(" q_lora_rank=", q_lora_rank, " kv_lora_rank=", kv_lora_rank,
                           " qk_nope_head_dim=", qk_nope_head_dim,
                           " qk_rope_head_dim=", qk_rope_head_dim, " v_head_dim=", v_head_dim)
            : std::string(),
      " sliding_window=", sliding_window, " bos_id=");
  if (bos_id == kNoToken) {
    out += "none";
  } else {
    absl::StrAppend(&out, bos_id);
  }
  absl::StrAppend(&out, " eos_ids=[", absl::StrJoin(eos_ids, ","), "]",
                  " weight_dtype=", kernels::DTypeName(weight_dtype));
  return out;
}

std::string CanonicalConfigBytes(const ModelConfig& c) {
  std::string out;
  static constexpr char kTag[] = "pd.model_config.v1";
  out.append(kTag, sizeof(kTag));  // includes the NUL, which ends the tag unambiguously
  AppendRaw<uint8_t>(&out, static_cast<uint8_t>(c.architecture));
  for (int32_t v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
                    c.seq_len, c.head_dim, c.kv_dim, c.sliding_window}) {
    AppendRaw<int32_t>(&out, v);
  }
  AppendRaw<uint8_t>(&out, c.shared_classifier ? 1 : 0);
  AppendRaw<uint32_t>(&out, std::bit_cast<uint32_t>(c.rope_theta));
  AppendRaw<uint8_t>(&out, static_cast<uint8_t>(c.rope_form));
  AppendRaw<uint8_t>(&out, c.rope_scaling.has_value() ? 1 : 0);
  if (c.rope_scaling.has_value()) {
    AppendRaw<uint32_t>(&out, std::bit_cast<uint32_t>(c.rope_scaling->factor));
    AppendRaw<uint32_t>(&out, std::bit_cast<uint32_t>(c.rope_scaling->low_freq_factor));
    AppendRaw<uint32_t>(&out, std::bit_cast<uint32_t>(c.rope_scaling->high_freq_factor));
    AppendRaw<int32_t>(&out, c.rope_scaling->original_max_position_embeddings);
  }
  AppendRaw<uint32_t>(&out, std::bit_cast<uint32_t>(c.rms_norm_eps));
  AppendRaw<uint8_t>(&out, c.qkv_bias ? 1 : 0);
  AppendRaw<uint32_t>(&out, c.bos_id);
  AppendRaw<uint32_t>(&out, static_cast<uint32_t>(c.eos_ids.size()));
  for (uint32_t id : c.eos_ids) {
    AppendRaw<uint32_t>(&out, id);
  }
  AppendRaw<uint8_t>(&out, static_cast<uint8_t>(c.weight_dtype));
  if (c.n_experts > 0) {  // appended only with experts: dense models' bytes are unchanged
    for (int32_t v : {c.n_experts, c.n_experts_per_tok, c.moe_hidden_dim}) {
      AppendRaw<int32_t>(&out, v);
    }
    AppendRaw<uint8_t>(&out, c.moe_norm_topk ? 1 : 0);
    // DeepSeek's routing, appended only when it differs from the defaults (Mixtral's and
    // Qwen3-MoE's bytes are unchanged).
    if (c.moe_scoring != MoeScoring::kSoftmax || c.moe_topk != MoeTopk::kGreedy ||
        c.moe_n_group != 1 || c.moe_topk_group != 1 || c.moe_routed_scale != 1.0f ||
        c.n_shared_experts != 0 || c.first_dense_layers != 0) {
      AppendRaw<uint8_t>(&out, static_cast<uint8_t>(c.moe_scoring));
      AppendRaw<uint8_t>(&out, static_cast<uint8_t>(c.moe_topk));
      for (int32_t v :
           {c.moe_n_group, c.moe_topk_group, c.n_shared_experts, c.first_dense_layers}) {
        AppendRaw<int32_t>(&out, v);
      }
      AppendRaw<uint32_t>(&out, std::bit_cast<uint32_t>(c.moe_routed_scale));
    }
  }
  if (c.mla()) {  // appended only with MLA
    for (int32_t v :
         {c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim}) {
      AppendRaw<int32_t>(&out, v);
    }
  }
  return out;
}

}  // namespace pd::engine
