// Hugging Face config.json / generation_config.json <-> ModelConfig.
//
// Supported architectures (config "architectures"[0], or "model_type" when that list is absent):
//   LlamaForCausalLM ("llama"), MistralForCausalLM ("mistral"), Qwen2ForCausalLM ("qwen2").
// Required fields: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// vocab_size. Optional fields take the defaults of the transformers config class of the
// architecture (num_key_value_heads = num_attention_heads, except Mistral 8 and Qwen2 32;
// head_dim = hidden_size / num_attention_heads; rms_norm_eps 1e-6; rope_theta 10000;
// tie_word_embeddings false; max_position_embeddings 2048 / 131072 / 32768; bos/eos 1/2 for
// Llama and Mistral, none for Qwen2). Newer configs that move rope_theta and the rope type into
// "rope_parameters" are read too; "dtype" is accepted as a synonym of "torch_dtype".
//
// The result always has rope_form kRotateHalf (HF checkpoints store q/k permuted for it) and
// qkv_bias = (architecture == kQwen2). weight_dtype comes from torch_dtype (float32, bfloat16,
// float16; f32 when absent) and is only a hint: HfModel::Load replaces it with the dtype the
// safetensors actually hold.
//
// All functions are pure and thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"

namespace pd::engine {

// Parses config.json text; when `generation_config_json` is non-empty, its eos_token_id (an int
// or a list of ints) replaces the config's, and its bos_token_id (when present and not null)
// replaces the config's. `source` names the input in error messages (usually the path).
// Errors (each message names the source, the field and the value):
//   InvalidArgument  not JSON or not an object; an unsupported architecture / model_type (named,
//                    with the supported list); a required field missing; a field of the wrong
//                    JSON type or out of range; hidden_size not divisible by num_attention_heads
//                    (without an explicit head_dim); no eos_token_id anywhere; any
//                    ModelConfig::Validate() failure;
//   Unimplemented    a supported architecture using a feature we do not run: hidden_act other
//                    than silu, attention_bias / mlp_bias (Llama), use_sliding_window (Qwen2),
//                    a rope_scaling type other than llama3 / default.
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view config_json,
                                          absl::string_view generation_config_json = {},
                                          absl::string_view source = "config.json");

// Reads `dir`/config.json and, if it exists, `dir`/generation_config.json, then ParseHfConfig.
// Errors: NotFound when config.json is missing (PermissionDenied etc. as MappedFile::Open);
// otherwise as ParseHfConfig.
absl::StatusOr<ModelConfig> LoadHfConfig(absl::string_view dir);

// config.json text describing `config` (the inverse of ParseHfConfig for the fields it reads).
// InvalidArgument when config.architecture is kLlama2c or the config does not Validate().
absl::StatusOr<std::string> HfConfigJson(const ModelConfig& config);

// generation_config.json text: bos_token_id (when the model has one) and eos_token_id (an int
// for one id, a list for several).
std::string HfGenerationConfigJson(const ModelConfig& config);

}  // namespace pd::engine
