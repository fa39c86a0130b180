// Parameters of the rotary position embedding (RoPE) op. Plain structs shared by every backend
// (included by .cu files: keep them free of Abseil and glog).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// Which elements of a head form a rotated pair (i in [0, head_dim / 2)):
//   kInterleaved: (x[2i], x[2i+1])        llama2.c / Meta's original checkpoints (GPT-J style)
//   kRotateHalf:  (x[i], x[i + head_dim/2]) Hugging Face Llama (GPT-NeoX style)
// Both rotate pair i by angle pos * inv_freq[i]: (a, b) -> (a cos - b sin, a sin + b cos).
// Largest head_dim Rope accepts (the CPU kernel keeps one cos/sin table on the stack).
inline constexpr int64_t kMaxRopeHeadDim = 1024;

enum class RopeStyle : uint8_t { kInterleaved = 0, kRotateHalf = 1 };

// Rotates q and k in place for tokens at the given positions. The angle is computed in double
// (pos * inv_freq[i]) and its cos/sin rounded to f32, so long positions lose no accuracy.
struct RopeParams {
  float* q = nullptr;  // [num_tokens][q_token_stride]; each token's [num_heads][head_dim]
  float* k = nullptr;  // [num_tokens][k_token_stride]; each token's [num_kv_heads][head_dim]
  const int32_t* positions = nullptr;  // [num_tokens], each >= 0
  const float* inv_freq = nullptr;     // [head_dim / 2], from ComputeRopeInvFreq (kernels/rope.h)
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;        // even
  int64_t q_token_stride = 0;  // elements between tokens of q, >= num_heads * head_dim
  int64_t k_token_stride = 0;  // elements between tokens of k, >= num_kv_heads * head_dim
  RopeStyle style = RopeStyle::kRotateHalf;
};

// Llama 3.1 "rope_type": "llama3" frequency scaling (Hugging Face rope_scaling). Defaults are
// the published Llama 3.1 / 3.2 values.
struct Llama3RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Inputs of ComputeRopeInvFreq: inv_freq[i] = theta^(-2i / head_dim), then the llama3 scaling.
struct RopeFreqConfig {
  int64_t head_dim = 0;    // even, > 0
  double theta = 10000.0;  // rope_theta (Llama 2: 1e4, Llama 3: 5e5)
  Llama3RopeScaling llama3;
};

}  // namespace pd::kernels
