// MakeModel: writes a complete random-weight Hugging Face model directory (the library behind
// pd-make-model, callable from tests).
//
// Output (in options.out_dir): config.json, generation_config.json, tokenizer.json (a trained
// byte-level BPE, tokenizer_builder.h), tokenizer_config.json, model.safetensors. Loadable by
// HfModel::Load / HfTokenizer::Load and by transformers.
//
// Weights are a pure function of (seed, tensor name, element index): element i of tensor `name`
// is center + amplitude * u, where u in (-1, 1) comes from 24 bits of SplitMix64 at counter i of
// the stream keyed by XXH3-64(name, seed), computed exactly in f32 and rounded to the storage
// dtype (RNE, kernels/half.h). Same seed -> same bytes on any machine. Initialisation keeps
// activations near unit scale: matrices (embedding included) have standard deviation
// 1 / sqrt(fan_in) (amplitude sqrt(3 / fan_in)), norm weights are 1 +- 0.1, biases +- 0.1.
//
// Presets (head_dim = hidden / heads; BOS/EOS from TokenizerLayout):
//   tiny   hidden 64, 2 layers, 4 heads, 2 kv heads, intermediate 172, vocab 512,
//          max_pos 512, untied, theta 1e4, f32                                  (~0.16 M params)
//   small  hidden 768, 12 layers, 12 heads, 4 kv heads, intermediate 2304, vocab 8192,
//          max_pos 2048, untied, theta 1e4, bf16                                (~95 M params)
//   (with --arch mixtral or qwen3_moe any preset gets 8 experts, 2 per token, unless overridden;
//   with deepseek_v2 / deepseek_v3, MLA and DeepSeek's experts as MakeModelOptions says)
//   1b     Llama-3.2-1B shape: hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate 8192,
//          vocab 128256, max_pos 131072, tied, theta 5e5, llama3 rope_scaling (32, 1, 4, 8192),
//          bf16                                                                 (~1.24 B params)
//   8b     Llama-3.1-8B shape: hidden 4096, 32 layers, 32 heads, 8 kv heads, intermediate 14336,
//          vocab 128256, max_pos 131072, untied, theta 5e5, llama3 rope_scaling (8, 1, 4, 8192),
//          bf16 (16 GB written: for sizing, such as KV bytes per token)      (~8.03 B params)
// All presets use rms_norm_eps 1e-5 and architecture llama unless overridden.
//
// Thread-compatible: MakeModel writes files; run one per directory.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"

namespace pd::engine {

struct MakeModelOptions {
  std::string out_dir;          // created (with parents) when missing
  std::string preset = "tiny";  // tiny | small | 1b | 8b
  uint64_t seed = 0;
  std::optional<kernels::DType> dtype;  // preset's when unset
  // kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen3Moe, kDeepseekV2 or kDeepseekV3; preset's
  // (llama)
  std::optional<Architecture> architecture;
  // Shape overrides; 0 / unset = the preset's value.
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // 0 = hidden_size / num_heads
  int32_t vocab_size = 0;
  int32_t max_position_embeddings = 0;
  std::optional<bool> tie_word_embeddings;
  // Mixture of experts (kMixtral, kQwen3Moe only; 0 / unset = the defaults: 8 experts, 2 per
  // token; Mixtral's experts are intermediate_size wide, Qwen3-MoE's moe_intermediate_size =
  // intermediate_size / 4 and norm_topk_prob true, as Qwen3-30B-A3B).
  int32_t num_experts = 0;
  int32_t num_experts_per_tok = 0;
  int32_t moe_intermediate_size = 0;
  std::optional<bool> norm_topk_prob;
  // DeepSeek (kDeepseekV2, kDeepseekV3; 0 / unset = the defaults). MLA: qk_nope_head_dim =
  // v_head_dim = head_dim (or hidden_size / num_heads), qk_rope_head_dim = half of that,
  // kv_lora_rank = 4 x qk_nope_head_dim, no q_lora_rank (q_proj). Experts: 8 routed (2 per
  // token) of width intermediate_size / 4, one shared, the first layer dense; V2 greedy softmax
  // routing, V3 sigmoid with a selection bias in (0, 0.1), 4 groups of which 2 may be used,
  // renormalized and scaled by 2.5. first_k_dense_replace = num_layers makes every MLP dense.
  int32_t q_lora_rank = 0;
  int32_t kv_lora_rank = 0;
  int32_t qk_rope_head_dim = 0;
  std::optional<int32_t> n_shared_experts;
  std::optional<int32_t> first_k_dense_replace;
  // > 0: write every linear projection (attention, MLP, experts; not the embedding, lm_head or
  // routers) as block-scaled fp8 E4M3 with blocks of fp8_block x fp8_block and power-of-two
  // weight_scale_inv, and config.json's quantization_config (engine/model/fp8_block.h): the
  // format of DeepSeek-V3's and Qwen3-FP8's checkpoints.
  int32_t fp8_block = 0;
  // A target for a draft: the output projections (o_proj, down_proj, experts' w2 included) of
  // layers scaled_layers_from and later are multiplied by layer_output_scale, so those layers
  // add little to the residual stream. The same options with num_layers = scaled_layers_from
  // (and scale 1) write exactly this model's first layers, embedding, norm and classifier: a
  // draft that proposes what this model would write most of the time, and less often as the
  // scale grows (docs/engine.md, "Speculative decoding"). Scale in [0, 1]; 1 = off.
  float layer_output_scale = 1.0f;
  int32_t scaled_layers_from = 0;
  // An existing non-empty out_dir is an error unless set; then our files are overwritten (and a
  // stale model.safetensors.index.json removed), other files are left alone.
  bool force = false;
  // Called after every chunk of weight data with (bytes written, total bytes); may be empty.
  std::function<void(uint64_t, uint64_t)> progress;

  // InvalidArgument when out_dir is empty, the preset is unknown, an override is negative,
  // layer_output_scale is outside [0, 1], or the architecture is kLlama2c.
  absl::Status Validate() const;
};

// The preset's config. InvalidArgument naming the preset and the known ones.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view preset);

// The preset with the options' overrides applied, special ids from the tokenizer layout, and
// Validate()d. InvalidArgument when hidden_size is not a multiple of num_heads, vocab_size is
// below kMinTokenizerVocab, scaled_layers_from is not below the layer count while a scale is
// set, or the result does not validate.
absl::StatusOr<ModelConfig> ResolveMakeModelConfig(const MakeModelOptions& options);

struct MakeModelResult {
  ModelConfig config;
  uint64_t num_parameters = 0;
  uint64_t weight_bytes = 0;  // tensor data in model.safetensors
  double weight_seconds = 0;  // time spent generating and writing weights
  double total_seconds = 0;
};

// Writes the model directory. Errors: as Validate / ResolveMakeModelConfig; AlreadyExists when
// out_dir exists, is not empty and force is false; FailedPrecondition when out_dir exists and is
// not a directory; PermissionDenied / NotFound / ResourceExhausted from creating the directory
// or writing files (message names the path).
absl::StatusOr<MakeModelResult> MakeModel(const MakeModelOptions& options);

// "f32" | "bf16" | "f16". InvalidArgument naming the value otherwise.
absl::StatusOr<kernels::DType> ParseDTypeName(absl::string_view name);
// "llama" | "mistral" | "qwen2" | "qwen3" | "mixtral" | "qwen3_moe" | "deepseek_v2" |
// "deepseek_v3". InvalidArgument naming the value otherwise.
absl::StatusOr<Architecture> ParseArchitectureName(absl::string_view name);

// Element `index` of tensor `name` before rounding to the storage dtype (see the file comment).
// Exposed so tests can check bytes without re-implementing the generator.
float GeneratedWeight(uint64_t seed, absl::string_view name, uint64_t index, float center,
                      float amplitude);

}  // namespace pd::engine
