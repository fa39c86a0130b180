// ModelConfig: the architecture hyper-parameters of a decoder-only Llama-family transformer,
// shared by every loader (llama2.c checkpoints, Hugging Face safetensors directories).
//
// Field names follow llama2.c; the Hugging Face config.json name of each field is given in its
// comment. Defaults are the fixed llama2.c conventions, so the llama2.c loader only fills the
// header fields; the Hugging Face parser (hf_config.h) sets every field explicitly.
//
// Value type; thread-compatible.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/types.h"

namespace pd::engine {

// Which model family the weights belong to. Decides tensor names and small structural
// differences (Qwen2: q/k/v biases), not the hyper-parameters.
enum class Architecture : uint8_t {
  kLlama2c = 0,   // llama2.c "version 0" checkpoint (Llama 2 layout, interleaved RoPE)
  kLlama = 1,     // HF LlamaForCausalLM (Llama 2 / 3 / 3.1 / 3.2)
  kMistral = 2,   // HF MistralForCausalLM
  kQwen2 = 3,     // HF Qwen2ForCausalLM
  kQwen3 = 4,     // HF Qwen3ForCausalLM (dense): RMSNorm of each q and k head before RoPE
  kMixtral = 5,   // HF MixtralForCausalLM: Mistral attention, mixture-of-experts MLPs
  kQwen3Moe = 6,  // HF Qwen3MoeForCausalLM: Qwen3 attention, mixture-of-experts MLPs
  // HF DeepseekV2ForCausalLM / DeepseekV3ForCausalLM: multi-head latent attention (MLA), dense
  // MLPs in the first layers and DeepSeek's mixture of experts (shared experts, group-limited
  // top-k; V3: sigmoid scores with a selection bias) in the others.
  kDeepseekV2 = 7,
  kDeepseekV3 = 8,
};

// How a mixture of experts scores its experts and picks each token's top k
// (engine/model/moe_routing.h).
enum class MoeScoring : uint8_t {
  kSoftmax = 0,  // softmax over the router logits (Mixtral, Qwen3-MoE, DeepSeek-V2)
  kSigmoid = 1,  // sigmoid of each logit (DeepSeek-V3)
};
enum class MoeTopk : uint8_t {
  kGreedy = 0,        // the top k scores
  kGroupLimited = 1,  // DeepSeek-V2: the top k within the topk_group groups of highest max score
  kNoAuxTc = 2,       // DeepSeek-V3: scores + selection bias; groups ranked by their top-2 sum
};

// "llama2c", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v2",
// "deepseek_v3".
absl::string_view ArchitectureName(Architecture architecture);

// Which elements of a head form a rotated RoPE pair (i in [0, head_dim / 2)):
//   kInterleaved: (x[2i], x[2i + 1])           llama2.c and Meta's original checkpoints
//   kRotateHalf:  (x[i], x[i + head_dim / 2])  Hugging Face checkpoints (permuted q/k weights)
enum class RopeForm : uint8_t { kInterleaved = 0, kRotateHalf = 1 };

// Hugging Face `rope_scaling` with "rope_type": "llama3" (Llama 3.1 / 3.2): long wavelengths are
// divided by `factor`, short ones kept, the band between interpolated.
struct Llama3RopeScaling {
  float factor = 8.0f;                              // > 0
  float low_freq_factor = 1.0f;                     // > 0
  float high_freq_factor = 4.0f;                    // > low_freq_factor
  int32_t original_max_position_embeddings = 8192;  // > 0

  friend bool operator==(const Llama3RopeScaling&, const Llama3RopeScaling&) = default;
};

// DeepSeek's `rope_scaling` with "type": "yarn" (DeepseekV2YarnRotaryEmbedding): the rotated
// dims' frequencies blend between the original ones and the ones divided by `factor` over the
// dims between the correction range of beta_fast and beta_slow rotations in
// original_max_position_embeddings; the rotated q and k are scaled by
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) and, when mscale_all_dim is set, the
// attention scale by mscale(factor, mscale_all_dim)^2, with mscale(s, m) = 0.1 m ln(s) + 1
// (1 for s <= 1). MLA models only.
struct YarnRopeScaling {
  float factor = 1.0f;                              // > 0
  int32_t original_max_position_embeddings = 4096;  // > 0
  float beta_fast = 32.0f;                          // > 0
  float beta_slow = 1.0f;                           // > 0
  float mscale = 1.0f;                              // >= 0
  float mscale_all_dim = 0.0f;                      // >= 0; 0 = unset

  friend bool operator==(const YarnRopeScaling&, const YarnRopeScaling&) = default;
};

struct ModelConfig {
  // A bos_id meaning "this model has no beginning-of-sequence token".
  static constexpr uint32_t kNoToken = std::numeric_limits<uint32_t>::max();

  Architecture architecture = Architecture::kLlama2c;
  int32_t dim = 0;         // residual stream width (hidden_size)
  int32_t hidden_dim = 0;  // FFN inner width (intermediate_size)
  int32_t n_layers = 0;    // num_hidden_layers
  int32_t n_heads = 0;     // query heads (num_attention_heads)
  // Key/value heads (num_key_value_heads); grouped-query attention when < n_heads.
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // rows of the embedding and of the classifier
  int32_t seq_len = 0;     // maximum context length in tokens (max_position_embeddings)
  // The output classifier is the token embedding (tie_word_embeddings; llama2.c: header
  // vocab_size > 0).
  bool shared_classifier = true;
  // Per-head width. dim / n_heads unless the HF config sets head_dim explicitly, so
  // n_heads * head_dim (q_dim()) may differ from dim.
  int32_t head_dim = 0;
  int32_t kv_dim = 0;  // n_kv_heads * head_dim
  float rope_theta = 10000.0f;
  RopeForm rope_form = RopeForm::kInterleaved;
  std::optional<Llama3RopeScaling> rope_scaling;  // absent = plain RoPE
  std::optional<YarnRopeScaling> yarn;            // DeepSeek's yarn (MLA only); absent = none
  float rms_norm_eps = 1e-5f;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj carry a bias (Qwen2)
  // Each head of q and of k is RMS-normalized (weights [head_dim], rms_norm_eps) after the
  // projection and before RoPE (Qwen3).
  bool qk_norm = false;
  // Mixture of experts (Mixtral, Qwen3-MoE); n_experts == 0: every MLP is dense. Otherwise every
  // layer's MLP is n_experts SwiGLU experts of width moe_hidden_dim, of which each token goes
  // to n_experts_per_tok: softmax over the router's logits, the top k, their probabilities as
  // weights, renormalized to sum 1 when moe_norm_topk (engine/model/moe_routing.h).
  int32_t n_experts = 0;          // num_local_experts (Mixtral), num_experts (Qwen3-MoE)
  int32_t n_experts_per_tok = 0;  // num_experts_per_tok
  int32_t moe_hidden_dim = 0;     // intermediate_size (Mixtral), moe_intermediate_size (Qwen3-MoE)
  bool moe_norm_topk = false;     // Mixtral: true; Qwen3-MoE: norm_topk_prob
  // DeepSeek's routing (defaults: Mixtral's and Qwen3-MoE's rule). The chosen experts' scores
  // are the weights: divided by their sum (+ 1e-20) when moe_norm_topk, then multiplied by
  // moe_routed_scale (routed_scaling_factor; DeepSeek-V2 applies it only without normalization,
  // so its parser sets 1 there).
  MoeScoring moe_scoring = MoeScoring::kSoftmax;  // scoring_func
  MoeTopk moe_topk = MoeTopk::kGreedy;            // topk_method
  int32_t moe_n_group = 1;                        // n_group: experts in equal groups
  int32_t moe_topk_group = 1;                     // topk_group: groups a token may use
  float moe_routed_scale = 1.0f;                  // routed_scaling_factor
  // A SwiGLU MLP of width moe_hidden_dim * n_shared_experts that every token passes through,
  // added to the routed experts' sum (n_shared_experts; 0 = none).
  int32_t n_shared_experts = 0;
  // Layers [0, first_dense_layers) have a dense MLP of width hidden_dim (first_k_dense_replace).
  int32_t first_dense_layers = 0;
  // Multi-head latent attention (DeepSeek; kv_lora_rank > 0): a token's cache entry is the
  // RMS-normalized latent c (kv_lora_rank) and one RoPE key shared by all heads
  // (qk_rope_head_dim); each head's key is [W_UK c ; k_rope] and its value W_UV c. head_dim is
  // the query head's width, qk_nope_head_dim + qk_rope_head_dim (docs/engine.md, "MLA").
  int32_t q_lora_rank = 0;  // 0: q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
  int32_t kv_lora_rank = 0;
  int32_t qk_nope_head_dim = 0;
  int32_t qk_rope_head_dim = 0;  // rotated (interleaved pairs); the rest of a head is not
  int32_t v_head_dim = 0;
  int32_t sliding_window = 0;  // attention window in tokens (Mistral v0.1); 0 = full attention
  uint32_t bos_id = 1;         // bos_token_id, or kNoToken
  // The primary end-of-sequence id: eos_ids[0].
  uint32_t eos_id = 2;
  // Every id that ends generation (Llama 3 instruct lists several); non-empty.
  std::vector<uint32_t> eos_ids = {2};
  // Storage type of the weights (llama2.c: always f32; HF: what the safetensors hold).
  kernels::DType weight_dtype = kernels::DType::kF32;

  // Width of the concatenated query heads: n_heads * head_dim.
  int64_t q_dim() const { return static_cast<int64_t>(n_heads) * head_dim; }
  bool moe() const { return n_experts > 0; }
  // Whether layer `layer`'s MLP is the mixture of experts (else the dense one).
  bool moe_layer(int layer) const { return moe() && layer >= first_dense_layers; }
  // Whether any layer has experts (with first_dense_layers = n_layers, none does).
  bool has_moe_layers() const { return moe() && first_dense_layers < n_layers; }
  // The widest MLP a token passes through: hidden_dim, the experts' moe_hidden_dim, the shared
  // experts' width.
  int32_t mlp_width() const;
  bool mla() const { return kv_lora_rank > 0; }
  // Elements RoPE rotates per head: head_dim, or qk_rope_head_dim with MLA.
  int32_t rope_dim() const { return mla() ? qk_rope_head_dim : head_dim; }
  // Width of the attention output that o_proj reads: q_dim(), or n_heads * v_head_dim (MLA).
  int64_t attn_out_dim() const {
    return mla() ? static_cast<int64_t>(n_heads) * v_head_dim : q_dim();
  }
  // MLA: elements of a token's cache entry, kv_lora_rank + qk_rope_head_dim.
  int32_t mla_latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  // The KV cache's geometry (KvLayoutForModel): n_kv_heads heads of head_dim, or for MLA the
  // latent entry cut into the K and V halves of cache_kv_heads() heads of cache_head_dim() each
  // (the fewest heads whose pieces fit the attention ops' 256 elements), so a block holds
  // exactly the latent bytes and every cluster path carries it as any other block.
  int32_t cache_kv_heads() const;
  int32_t cache_head_dim() const;
  // Rows of attention scores per layer the H2O and SnapKV KV policies keep: one per KV head,
  // or one for MLA's latent (every head attends the same entry).
  int32_t kv_score_heads() const { return mla() ? 1 : n_kv_heads; }

  // Checks internal consistency. InvalidArgument naming the field and its value when: a size is
  // not positive; n_heads % n_kv_heads != 0; head_dim is odd; kv_dim != n_kv_heads * head_dim;
  // rope_theta or rms_norm_eps is not a positive finite number; a rope_scaling field is out of
  // range; sliding_window < 0; eos_ids is empty, eos_id != eos_ids[0], or a special id is
  // >= vocab_size; with experts, n_experts_per_tok not in [1, n_experts] or moe_hidden_dim <= 0,
  // groups that do not divide the experts or leave fewer than k; with MLA, a rank or head width
  // out of range or head_dim != qk_nope_head_dim + qk_rope_head_dim.
  absl::Status Validate() const;

  // One line with every field, for logs and error messages.
  std::string DebugString() const;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Canonical little-endian encoding of every field of `config`, tagged and versioned
// ("pd.model_config.v1"), for fingerprints: equal bytes iff equal configs. Stable across
// machines and builds; changing it changes every fingerprint, so bump the version tag.
std::string CanonicalConfigBytes(const ModelConfig& config);

// Appended to a model's fingerprint when its linear matrices run as int8 (QuantizeWeightsInt8 on
// the workers, ModelFront for pd-router and pd-tierd): int8 and unquantized workers never pair.
inline constexpr char kInt8FingerprintSuffix[] = "+w8";

}  // namespace pd::engine
