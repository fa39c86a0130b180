// ModelWeights: one kernel-ready view of a Llama-family model's weights, whichever file format
// they came from (llama2.c checkpoint, Hugging Face safetensors).
//
// Large matrices stay where the loader mapped them (no copies); small vectors the kernels need
// in f32 (norm weights, biases) are converted once into storage owned here. The loader object
// must outlive the ModelWeights. QuantizeWeightsInt8 derives a view whose linear matrices are
// int8 copies with per-row scales (owned by it), for W8A8 matmuls (kernels/matmul_params.h).
// Immutable after construction: thread-safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/model_config.h"
#include "kernels/types.h"

namespace pd::engine {

// One expert of a mixture-of-experts layer: a SwiGLU MLP of width moe_hidden_dim.
struct ExpertWeights {
  const void* w_gate = nullptr;          // [moe_hidden_dim][dim], of ModelWeights::dtype
  const void* w_up = nullptr;            // [moe_hidden_dim][dim]
  const void* w_down = nullptr;          // [dim][moe_hidden_dim]
  const float* w_gate_scales = nullptr;  // int8: [moe_hidden_dim]
  const float* w_up_scales = nullptr;    // int8: [moe_hidden_dim]
  const float* w_down_scales = nullptr;  // int8: [dim]
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  const void* wq = nullptr;          // [q_dim][dim], of ModelWeights::dtype
  const void* wk = nullptr;          // [kv_dim][dim]
  const void* wv = nullptr;          // [kv_dim][dim]
  const void* wo = nullptr;          // [dim][q_dim]
  const float* bq = nullptr;         // [q_dim] or nullptr (Qwen2 has q/k/v biases)
  const float* bk = nullptr;         // [kv_dim] or nullptr
  const float* bv = nullptr;         // [kv_dim] or nullptr
  const float* q_norm = nullptr;     // [head_dim] or nullptr (Qwen3: ModelConfig::qk_norm)
  const float* k_norm = nullptr;     // [head_dim] or nullptr
  const float* ffn_norm = nullptr;   // [dim]
  const void* w_gate = nullptr;      // [hidden_dim][dim]
  const void* w_up = nullptr;        // [hidden_dim][dim]
  const void* w_down = nullptr;      // [dim][hidden_dim]
  // Per-output-row scales of the matrices above when ModelWeights::dtype is kI8, else nullptr.
  const float* wq_scales = nullptr;      // [q_dim]
  const float* wk_scales = nullptr;      // [kv_dim]
  const float* wv_scales = nullptr;      // [kv_dim]
  const float* wo_scales = nullptr;      // [dim]
  const float* w_gate_scales = nullptr;  // [hidden_dim]
  const float* w_up_scales = nullptr;    // [hidden_dim]
  const float* w_down_scales = nullptr;  // [dim]
  // Mixture of experts (ModelConfig::moe()): the dense w_gate / w_up / w_down are unset; the
  // router ([n_experts][dim], of dtype) and n_experts experts take their place.
  const void* router = nullptr;
  const float* router_scales = nullptr;  // int8: [n_experts]
  const float* router_bias = nullptr;    // DeepSeek-V3's selection bias [n_experts], or nullptr
  std::vector<ExpertWeights> experts;
  // DeepSeek's shared experts (n_shared_experts > 0 on a mixture-of-experts layer): one SwiGLU
  // MLP of width moe_hidden_dim * n_shared_experts, of dtype; else nullptr.
  const void* w_shared_gate = nullptr;  // [shared width][dim]
  const void* w_shared_up = nullptr;    // [shared width][dim]
  const void* w_shared_down = nullptr;  // [dim][shared width]
  const float* w_shared_gate_scales = nullptr;
  const float* w_shared_up_scales = nullptr;
  const float* w_shared_down_scales = nullptr;
  // Multi-head latent attention (ModelConfig::mla()): wk / wv are unset; wq is q_proj, or q_b_proj
  // ([q_dim][q_lora_rank]) after wq_a and q_a_norm; wo is [dim][n_heads * v_head_dim].
  const void* wq_a = nullptr;           // [q_lora_rank][dim], of dtype, or nullptr
  const float* wq_a_scales = nullptr;   // int8: [q_lora_rank]
  const float* q_a_norm = nullptr;      // [q_lora_rank]
  const void* wkv_a = nullptr;          // [kv_lora_rank + qk_rope_head_dim][dim], of dtype
  const float* wkv_a_scales = nullptr;  // int8: [kv_lora_rank + qk_rope_head_dim]
  const float* kv_a_norm = nullptr;     // [kv_lora_rank]
  // kv_b_proj in f32 whatever dtype the matrices have ([n_heads * (qk_nope_head_dim +
  // v_head_dim)][kv_lora_rank]): decode absorbs it into the query and the output per head
  // (LlamaForward's MLA), reading it in both directions; never quantized.
  const float* wkv_b = nullptr;
  // Each head's W_UK (its first qk_nope_head_dim rows of wkv_b) transposed, f32
  // [n_heads][kv_lora_rank][qk_nope_head_dim]: the absorption's matrix.
  const float* wuk_t = nullptr;
};

struct ModelWeights {
  ModelConfig config;
  // The loader's model fingerprint (hex), with "+w8" appended by QuantizeWeightsInt8: workers
  // pair only when they run the same weights, quantized the same way.
  std::string fingerprint;
  // Storage type of every linear matrix (wq ... w_down, classifier): f32, bf16, f16, or kI8 with
  // per-row f32 scales (the *_scales pointers).
  kernels::DType dtype = kernels::DType::kF32;
  // Storage type of the embedding table (gathered row by row, never a MatMul operand): f32,
  // bf16 or f16. Equals dtype unless the matrices were quantized.
  kernels::DType embedding_dtype = kernels::DType::kF32;
  const void* embedding = nullptr;           // [vocab][dim], of embedding_dtype
  const void* classifier = nullptr;          // [vocab][dim]; == embedding when shared (then
                                             // dtype == embedding_dtype)
  const float* classifier_scales = nullptr;  // [vocab] when dtype is kI8, else nullptr
  const float* final_norm = nullptr;         // [dim]
  std::vector<LayerWeights> layers;          // n_layers
  // Owned f32 copies backing some of the pointers above (norms, biases of bf16/f16 models).
  std::vector<std::unique_ptr<float[]>> owned;
  // One anonymous mapping, advised into transparent huge pages, backing the matrices (and int8
  // scales) made by QuantizeWeightsInt8 or CopyWeightsToHugePages.
  std::shared_ptr<void> mapped;
};

// Bytes of the linear matrices (with their scales) and of the embedding table: what a forward
// pass streams per decode step, and what a weight dtype changes. A shared classifier counts once.
// With experts, every expert counts (what the weights occupy).
int64_t MatrixWeightBytes(const ModelWeights& w);
// What one token's decode step reads of the same: with experts, the router and
// n_experts_per_tok experts per layer instead of all of them (the active parameters); equals
// MatrixWeightBytes for a dense model.
int64_t ActiveMatrixWeightBytes(const ModelWeights& w);

// Views into a llama2.c checkpoint (f32, no copies). `checkpoint` must outlive the result.
ModelWeights WeightsFromLlama2c(const Llama2cCheckpoint& checkpoint);

// Views into a Hugging Face model (matrices in the checkpoint's dtype, no copies; norm weights
// and biases converted to f32). `model` must outlive the result. Internal if a conversion fails.
absl::StatusOr<ModelWeights> WeightsFromHf(const HfModel& model);

// W8A8 weights (kernels/matmul_params.h): every linear matrix of `src` (wq, wk, wv, wo, w_gate,
// w_up, w_down, the experts', MLA's wq_a and wkv_a, classifier; not MLA's f32 wkv_b) quantized per
// output row to int8 with f32 scales, all owned by the result (in huge pages, as
// CopyWeightsToHugePages); a classifier tied to the embedding gets its own int8 copy. The embedding
// (a gather), norms and biases stay views of src's storage: src, and whatever it views, must
// outlive the result. The fingerprint is src's with "+w8" appended. InvalidArgument if src is
// already int8 or its matrices are not f32, bf16 or f16; ResourceExhausted when the mapping fails.
absl::StatusOr<ModelWeights> QuantizeWeightsInt8(const ModelWeights& src);

// The same weights with every linear matrix (wq ... w_down, classifier; a tied classifier with
// the embedding, which stays tied) copied into one anonymous mapping advised into transparent
// huge pages, owned by the result. Same bytes, same layout, same fingerprint: only the pages
// change. A decode step streams every matrix once; with 4 KiB pages (a mapped checkpoint) that
// is a TLB miss every 4 KiB, with 2 MiB pages one per 2 MiB (docs/benchmarks.md, "Weights in
// huge pages": ~1.13x batch-1 decode on this project's VM). Norms and biases stay views of
// src's storage: src, and whatever it views, must outlive the result. ResourceExhausted when
// the mapping fails.
absl::StatusOr<ModelWeights> CopyWeightsToHugePages(const ModelWeights& src);

// Whether madvise(MADV_HUGEPAGE) can give this process transparent huge pages: the kernel has
// them and /sys/kernel/mm/transparent_hugepage/enabled is not "never".
bool TransparentHugePagesAvailable();

}  // namespace pd::engine
