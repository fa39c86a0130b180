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
  kLlama2c = 0,  // llama2.c "version 0" checkpoint (Llama 2 layout, interleaved RoPE)
  kLlama = 1,    // HF LlamaForCausalLM (Llama 2 / 3 / 3.1 / 3.2)
  kMistral = 2,  // HF MistralForCausalLM
  kQwen2 = 3,    // HF Qwen2ForCausalLM
  kQwen3 = 4,    // HF Qwen3ForCausalLM (dense): RMSNorm of each q and k head before RoPE
  kMixtral = 5,  // HF MixtralForCausalLM: Mistral attention, mixture-of-experts MLPs
  kQwen3Moe = 6, // HF Qwen3MoeForCausalLM: Qwen3 attention, mixture-of-experts MLPs
};

// "llama2c", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe".
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
  float rms_norm_eps = 1e-5f;
  bool qkv_bias = false;       // q_proj, k_proj, v_proj carry a bias (Qwen2)
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
  // The widest MLP a token passes through: hidden_dim, or moe_hidden_dim with experts.
  int32_t mlp_width() const { return moe() ? moe_hidden_dim : hidden_dim; }

  // Checks internal consistency. InvalidArgument naming the field and its value when: a size is
  // not positive; n_heads % n_kv_heads != 0; head_dim is odd; kv_dim != n_kv_heads * head_dim;
  // rope_theta or rms_norm_eps is not a positive finite number; a rope_scaling field is out of
  // range; sliding_window < 0; eos_ids is empty, eos_id != eos_ids[0], or a special id is
  // >= vocab_size; with experts, n_experts_per_tok not in [1, n_experts] or moe_hidden_dim <= 0.
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
