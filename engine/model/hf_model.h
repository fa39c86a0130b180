// HfModel: a Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Mixtral / Qwen3-MoE / DeepSeek-V2 /
// DeepSeek-V3 checkpoint directory, loaded zero-copy.
//
// Directory layout: config.json (+ optional generation_config.json, see hf_config.h) and either
// model.safetensors or model.safetensors.index.json with its shards (see safetensors.h).
// tokenizer.json is not read here (HfTokenizer::Load).
//
// Load() checks that every tensor the architecture needs exists with the shape the config
// implies, and that all of them share one dtype in {F32, BF16, F16}; config().weight_dtype is
// that dtype (a disagreeing torch_dtype in config.json is logged and overridden). Tensors the
// architecture does not use (e.g. rotary inv_freq buffers, lm_head.weight of a tied model) are
// ignored. Tensor names (N = layer):
//   model.embed_tokens.weight                          [vocab_size, dim]
//   model.layers.N.input_layernorm.weight              [dim]
//   model.layers.N.self_attn.q_proj.weight             [q_dim, dim]      (+ .bias [q_dim], Qwen2)
//   model.layers.N.self_attn.k_proj.weight             [kv_dim, dim]     (+ .bias [kv_dim], Qwen2)
//   model.layers.N.self_attn.v_proj.weight             [kv_dim, dim]     (+ .bias [kv_dim], Qwen2)
//   model.layers.N.self_attn.o_proj.weight             [dim, q_dim]
//   model.layers.N.post_attention_layernorm.weight     [dim]
//   model.layers.N.mlp.gate_proj.weight                [hidden_dim, dim]
//   model.layers.N.mlp.up_proj.weight                  [hidden_dim, dim]
//   model.layers.N.mlp.down_proj.weight                [dim, hidden_dim]
//     (Qwen3: self_attn.q_norm.weight / k_norm.weight [head_dim] too. Mixtures of experts,
//     instead of the mlp: the router model.layers.N.block_sparse_moe.gate.weight (Mixtral) /
//     mlp.gate.weight (Qwen3-MoE) [n_experts, dim], and per expert E
//     block_sparse_moe.experts.E.w1 / w3 / w2.weight (Mixtral) or mlp.experts.E.gate_proj /
//     up_proj / down_proj.weight (Qwen3-MoE), [moe_hidden_dim, dim] x 2 and [dim, moe_hidden_dim].
//     DeepSeek: attention is MLA's self_attn.q_proj (or q_a_proj, q_a_layernorm, q_b_proj),
//     kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj (shapes in HfLayerWeights);
//     layers from first_k_dense_replace on have Qwen3-MoE's expert names, plus
//     mlp.shared_experts.gate_proj / up_proj / down_proj.weight and, V3,
//     mlp.gate.e_score_correction_bias [n_experts].)
//   model.norm.weight                                  [dim]
//   lm_head.weight                                     [vocab_size, dim] (absent when tied)
// Matrices are row-major [out][in] (torch nn.Linear). q_proj/k_proj rows are in the rotate-half
// RoPE order (config().rope_form == kRotateHalf).
//
// Fingerprint(): 32 lower-case hex chars, XXH3-128 over "pd.hf_model.v1", CanonicalConfigBytes
// of config(), then for every required tensor in the order above: its name, dtype, shape and
// every data byte. Unused tensors and the file layout (sharding, header order) do not change it.
// Cost: Load() reads every weight byte once (streaming XXH3). Measured here on the 1b preset
// (2.47 GB bf16): 0.17-0.28 s with the file in the page cache (memory speed), 1.6 s after
// evicting it (disk read through the mapping). load_stats() reports it for every load.
//
// Ownership: the model owns the mappings; views stay valid while it (or the object it was moved
// into) lives. Thread-safety: immutable after Load(); const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace pd::engine {

// One tensor the architecture needs: its HF name and expected shape.
struct HfTensorRequirement {
  std::string name;
  std::vector<int64_t> shape;
  // A small vector the engine converts to f32 (DeepSeek-V3's e_score_correction_bias, stored
  // f32 beside bf16 matrices): any of F32/BF16/F16, not held to the matrices' dtype.
  bool any_float = false;
};

// Every tensor `config` needs, in the fingerprint order of the file comment (per layer, then the
// final norm, then lm_head.weight unless shared_classifier). `config` must be a valid HF config.
std::vector<HfTensorRequirement> HfRequiredTensors(const ModelConfig& config);

// The weights of one decoder layer (views into the mapping; see the file comment for shapes).
struct HfLayerWeights {
  TensorView input_layernorm;
  TensorView q_proj;  // MLA with q_lora_rank: q_b_proj, [n_heads * head_dim][q_lora_rank]
  TensorView k_proj;  // unset with MLA
  TensorView v_proj;  // unset with MLA
  TensorView o_proj;  // MLA: [dim][n_heads * v_head_dim]
  // MLA (config().mla()): q_a_proj [q_lora_rank][dim] and q_a_layernorm [q_lora_rank] (set iff
  // q_lora_rank > 0), kv_a_proj_with_mqa [kv_lora_rank + qk_rope_head_dim][dim],
  // kv_a_layernorm [kv_lora_rank], kv_b_proj [n_heads * (qk_nope_head_dim + v_head_dim)]
  // [kv_lora_rank].
  std::optional<TensorView> q_a_proj;
  std::optional<TensorView> q_a_layernorm;
  TensorView kv_a_proj;
  TensorView kv_a_layernorm;
  TensorView kv_b_proj;
  std::optional<TensorView> q_bias;  // set iff config().qkv_bias
  std::optional<TensorView> k_bias;
  std::optional<TensorView> v_bias;
  std::optional<TensorView> q_norm;  // [head_dim], set iff config().qk_norm
  std::optional<TensorView> k_norm;
  TensorView post_attention_layernorm;
  TensorView gate_proj;  // dense MLP (unset with experts)
  TensorView up_proj;
  TensorView down_proj;
  // Mixture of experts (config().moe()): the router [n_experts][dim] and each expert's SwiGLU
  // matrices (Mixtral's w1 / w3 / w2 as gate / up / down).
  TensorView router;
  // DeepSeek-V3 (topk_method noaux_tc): the selection bias e_score_correction_bias [n_experts].
  std::optional<TensorView> router_bias;
  struct Expert {
    TensorView gate_proj;  // [moe_hidden_dim][dim]
    TensorView up_proj;    // [moe_hidden_dim][dim]
    TensorView down_proj;  // [dim][moe_hidden_dim]
  };
  std::vector<Expert> experts;
  // DeepSeek's shared experts, one SwiGLU MLP of width moe_hidden_dim * n_shared_experts (set
  // iff n_shared_experts > 0 on a mixture-of-experts layer).
  std::optional<Expert> shared;
};

struct HfModelLoadStats {
  uint64_t hashed_bytes = 0;  // tensor bytes read for the fingerprint
  double hash_seconds = 0;    // wall time of the fingerprint
  double total_seconds = 0;   // wall time of Load()
};

class HfModel {
 public:
  // Loads `dir`. Errors:
  //   NotFound          config.json or the weights are missing;
  //   InvalidArgument   config.json invalid or unsupported (hf_config.h); a corrupt safetensors
  //                     file or index (safetensors.h); a required tensor missing ("missing tensor
  //                     <name>"), with the wrong shape (names expected and actual) or dtype
  //                     (names both), or a dtype other than F32/BF16/F16;
  //   Unimplemented     an architecture feature we do not run (hf_config.h);
  //   others            as MappedFile::Open.
  static absl::StatusOr<HfModel> Load(absl::string_view dir);

  HfModel(HfModel&&) noexcept = default;
  HfModel& operator=(HfModel&&) noexcept = default;
  HfModel(const HfModel&) = delete;
  HfModel& operator=(const HfModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& Fingerprint() const { return fingerprint_; }
  const HfModelLoadStats& load_stats() const { return stats_; }
  const std::string& dir() const { return dir_; }

  const TensorView& embed_tokens() const { return embed_tokens_; }  // [vocab_size, dim]
  const TensorView& norm() const { return norm_; }                  // [dim]
  // [vocab_size, dim]; the embedding itself when config().shared_classifier.
  const TensorView& lm_head() const { return lm_head_; }
  // `layer` must be in [0, n_layers) (CHECK).
  const HfLayerWeights& layer(int layer) const;

  // Every tensor of the checkpoint, including unused ones.
  const WeightSet& weights() const { return weights_; }

 private:
  HfModel(std::string dir, ModelConfig config, WeightSet weights)
      : dir_(std::move(dir)), config_(std::move(config)), weights_(std::move(weights)) {}
  void BindTensors();  // after CheckTensors succeeded
  void ComputeFingerprint();

  std::string dir_;
  ModelConfig config_;
  WeightSet weights_;
  std::string fingerprint_;
  HfModelLoadStats stats_;
  TensorView embed_tokens_;
  TensorView norm_;
  TensorView lm_head_;
  std::vector<HfLayerWeights> layers_;
};

}  // namespace pd::engine
