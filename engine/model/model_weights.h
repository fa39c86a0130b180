// ModelWeights: one kernel-ready view of a Llama-family model's weights, whichever file format
// they came from (llama2.c checkpoint, Hugging Face safetensors).
//
// Large matrices stay where the loader mapped them (no copies); small vectors the kernels need
// in f32 (norm weights, biases) are converted once into storage owned here. The loader object
// must outlive the ModelWeights. Immutable after construction: thread-safe to share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/model_config.h"
#include "kernels/types.h"

namespace pd::engine {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  const void* wq = nullptr;          // [q_dim][dim], of ModelWeights::dtype
  const void* wk = nullptr;          // [kv_dim][dim]
  const void* wv = nullptr;          // [kv_dim][dim]
  const void* wo = nullptr;          // [dim][q_dim]
  const float* bq = nullptr;         // [q_dim] or nullptr (Qwen2 has q/k/v biases)
  const float* bk = nullptr;         // [kv_dim] or nullptr
  const float* bv = nullptr;         // [kv_dim] or nullptr
  const float* ffn_norm = nullptr;   // [dim]
  const void* w_gate = nullptr;      // [hidden_dim][dim]
  const void* w_up = nullptr;        // [hidden_dim][dim]
  const void* w_down = nullptr;      // [dim][hidden_dim]
};

struct ModelWeights {
  ModelConfig config;
  std::string fingerprint;                      // the loader's model fingerprint (hex)
  kernels::DType dtype = kernels::DType::kF32;  // storage type of every matrix
  const void* embedding = nullptr;              // [vocab][dim]
  const void* classifier = nullptr;             // [vocab][dim]; == embedding when shared
  const float* final_norm = nullptr;            // [dim]
  std::vector<LayerWeights> layers;             // n_layers
  // Owned f32 copies backing some of the pointers above (norms, biases of bf16/f16 models).
  std::vector<std::unique_ptr<float[]>> owned;
};

// Views into a llama2.c checkpoint (f32, no copies). `checkpoint` must outlive the result.
ModelWeights WeightsFromLlama2c(const Llama2cCheckpoint& checkpoint);

// Views into a Hugging Face model (matrices in the checkpoint's dtype, no copies; norm weights
// and biases converted to f32). `model` must outlive the result. Internal if a conversion fails.
absl::StatusOr<ModelWeights> WeightsFromHf(const HfModel& model);

}  // namespace pd::engine
