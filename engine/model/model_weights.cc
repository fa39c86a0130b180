#include "engine/model/model_weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/model/fp8_block.h"
#include "kernels/convert.h"
#include "kernels/matmul_params.h"
#include "kernels/type_names.h"

namespace pd::engine {

ModelWeights WeightsFromLlama2c(const Llama2cCheckpoint& checkpoint) {
  ModelWeights w;
  w.config = checkpoint.config();
  w.fingerprint = checkpoint.Fingerprint();
  w.dtype = kernels::DType::kF32;
  w.embedding_dtype = kernels::DType::kF32;
  w.embedding = checkpoint.token_embedding();
  w.classifier = checkpoint.wcls();
  w.final_norm = checkpoint.rms_final();
  w.layers.resize(w.config.n_layers);
  for (int l = 0; l < w.config.n_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    lw.attn_norm = checkpoint.rms_att(l);
    lw.wq = checkpoint.wq(l);
    lw.wk = checkpoint.wk(l);
    lw.wv = checkpoint.wv(l);
    lw.wo = checkpoint.wo(l);
    lw.ffn_norm = checkpoint.rms_ffn(l);
    lw.w_gate = checkpoint.w1(l);
    lw.w_up = checkpoint.w3(l);
    lw.w_down = checkpoint.w2(l);
  }
  return w;
}

namespace {

// A converted f32 copy of a small tensor (norm weight, bias), owned by `w`.
absl::StatusOr<const float*> OwnedF32(const TensorView& t, ModelWeights* w) {
  const std::optional<kernels::DType> dtype = ToKernelDType(t.dtype);
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError("weights: a norm or bias tensor is not f32, bf16 or f16");
  }
  const int64_t n = t.num_elements();
  auto copy = std::make_unique<float[]>(n);
  kernels::ConvertParams p;
  p.in = t.data;
  p.out = copy.get();
  p.n = n;
  p.in_dtype = *dtype;
  p.out_dtype = kernels::DType::kF32;
  PD_RETURN_IF_ERROR(kernels::Convert(kernels::OpContext{}, p));
  w->owned.push_back(std::move(copy));
  return w->owned.back().get();
}

}  // namespace

absl::StatusOr<ModelWeights> WeightsFromHf(const HfModel& model) {
  ModelWeights w;
  w.config = model.config();
  w.fingerprint = model.Fingerprint();
  w.dtype = w.config.weight_dtype;
  w.embedding_dtype = w.config.weight_dtype;
  // Block-scaled fp8 tensors (fp8_block.h) are dequantized into owned storage of w.dtype, once
  // each (a tied classifier is the embedding's copy); the others stay views.
  PD_ASSIGN_OR_RETURN(std::optional<Fp8BlockSize> fp8, LoadFp8Quantization(model.dir()));
  absl::flat_hash_map<const void*, std::string> names;
  absl::flat_hash_map<const void*, const void*> dequantized;
  if (fp8.has_value()) {
    for (const auto& [name, view] : model.weights().tensors()) names[view.data] = name;
  }
  auto dequantize = [&](const TensorView& t, kernels::DType dtype) -> absl::StatusOr<const void*> {
    auto it = names.find(t.data);
    const TensorView* scale =
        it == names.end() ? nullptr : model.weights().Find(Fp8ScaleName(it->second));
    if (!fp8.has_value() || scale == nullptr) {
      return absl::InvalidArgumentError("weights: an fp8 tensor without its block scales");
    }
    PD_RETURN_IF_ERROR(CheckFp8Scale(it->second, t, *scale, *fp8));
    const int64_t bytes = t.num_elements() * kernels::DTypeSize(dtype);
    auto storage = std::make_unique<float[]>(static_cast<size_t>((bytes + 3) / 4));
    DequantizeFp8Block(t, *scale, *fp8, dtype, storage.get());
    w.owned.push_back(std::move(storage));
    return static_cast<const void*>(w.owned.back().get());
  };
  auto matrix = [&](const TensorView& t) -> absl::StatusOr<const void*> {
    if (t.dtype != SafetensorsDtype::kF8E4M3 || t.data == nullptr) return t.data;
    auto it = dequantized.find(t.data);
    if (it != dequantized.end()) return it->second;
    PD_ASSIGN_OR_RETURN(const void* out, dequantize(t, w.dtype));
    dequantized[t.data] = out;
    return out;
  };
  auto owned_f32 = [&](const TensorView& t) -> absl::StatusOr<const float*> {
    if (t.dtype != SafetensorsDtype::kF8E4M3) return OwnedF32(t, &w);
    PD_ASSIGN_OR_RETURN(const void* out, dequantize(t, kernels::DType::kF32));
    return static_cast<const float*>(out);
  };
  PD_ASSIGN_OR_RETURN(w.embedding, matrix(model.embed_tokens()));
  PD_ASSIGN_OR_RETURN(w.classifier, matrix(model.lm_head()));
  PD_ASSIGN_OR_RETURN(w.final_norm, OwnedF32(model.norm(), &w));
  w.layers.resize(w.config.n_layers);
  for (int l = 0; l < w.config.n_layers; ++l) {
    const HfLayerWeights& hl = model.layer(l);
    LayerWeights& lw = w.layers[l];
    PD_ASSIGN_OR_RETURN(lw.attn_norm, OwnedF32(hl.input_layernorm, &w));
    PD_ASSIGN_OR_RETURN(lw.ffn_norm, OwnedF32(hl.post_attention_layernorm, &w));
    PD_ASSIGN_OR_RETURN(lw.wq, matrix(hl.q_proj));
    PD_ASSIGN_OR_RETURN(lw.wk, matrix(hl.k_proj));
    PD_ASSIGN_OR_RETURN(lw.wv, matrix(hl.v_proj));
    PD_ASSIGN_OR_RETURN(lw.wo, matrix(hl.o_proj));
    if (w.config.mla()) {
      if (hl.q_a_proj.has_value()) {
        PD_ASSIGN_OR_RETURN(lw.wq_a, matrix(*hl.q_a_proj));
        PD_ASSIGN_OR_RETURN(lw.q_a_norm, OwnedF32(*hl.q_a_layernorm, &w));
      }
      PD_ASSIGN_OR_RETURN(lw.wkv_a, matrix(hl.kv_a_proj));
      PD_ASSIGN_OR_RETURN(lw.kv_a_norm, OwnedF32(hl.kv_a_layernorm, &w));
      PD_ASSIGN_OR_RETURN(lw.wkv_b, owned_f32(hl.kv_b_proj));
      const ModelConfig& c = w.config;
      const int64_t rank = c.kv_lora_rank, nope = c.qk_nope_head_dim;
      auto wuk_t = std::make_unique<float[]>(int64_t{c.n_heads} * rank * nope);
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const float* w_uk = lw.wkv_b + h * (nope + c.v_head_dim) * rank;
        for (int64_t n = 0; n < nope; ++n) {
          for (int64_t r = 0; r < rank; ++r) wuk_t[(h * rank + r) * nope + n] = w_uk[n * rank + r];
        }
      }
      lw.wuk_t = wuk_t.get();
      w.owned.push_back(std::move(wuk_t));
    }
    if (w.config.moe_layer(l)) {
      PD_ASSIGN_OR_RETURN(lw.router, matrix(hl.router));
      if (hl.router_bias.has_value()) {
        PD_ASSIGN_OR_RETURN(lw.router_bias, OwnedF32(*hl.router_bias, &w));
      }
      if (hl.shared.has_value()) {
        PD_ASSIGN_OR_RETURN(lw.w_shared_gate, matrix(hl.shared->gate_proj));
        PD_ASSIGN_OR_RETURN(lw.w_shared_up, matrix(hl.shared->up_proj));
        PD_ASSIGN_OR_RETURN(lw.w_shared_down, matrix(hl.shared->down_proj));
      }
      lw.experts.resize(hl.experts.size());
      for (size_t e = 0; e < hl.experts.size(); ++e) {
        PD_ASSIGN_OR_RETURN(lw.experts[e].w_gate, matrix(hl.experts[e].gate_proj));
        PD_ASSIGN_OR_RETURN(lw.experts[e].w_up, matrix(hl.experts[e].up_proj));
        PD_ASSIGN_OR_RETURN(lw.experts[e].w_down, matrix(hl.experts[e].down_proj));
      }
    } else {
      PD_ASSIGN_OR_RETURN(lw.w_gate, matrix(hl.gate_proj));
      PD_ASSIGN_OR_RETURN(lw.w_up, matrix(hl.up_proj));
      PD_ASSIGN_OR_RETURN(lw.w_down, matrix(hl.down_proj));
    }
    if (hl.q_bias.has_value()) {
      PD_ASSIGN_OR_RETURN(lw.bq, OwnedF32(*hl.q_bias, &w));
      PD_ASSIGN_OR_RETURN(lw.bk, OwnedF32(*hl.k_bias, &w));
      PD_ASSIGN_OR_RETURN(lw.bv, OwnedF32(*hl.v_bias, &w));
    }
    if (hl.q_norm.has_value()) {
      PD_ASSIGN_OR_RETURN(lw.q_norm, OwnedF32(*hl.q_norm, &w));
      PD_ASSIGN_OR_RETURN(lw.k_norm, OwnedF32(*hl.k_norm, &w));
    }
  }
  return w;
}

namespace {

// The linear matrices of one layer, in order, as (rows, cols) and their fields.
struct LayerMatrix {
  int64_t rows, cols;
  const void* LayerWeights::*weight;
  const float* LayerWeights::*scales;
};

std::vector<LayerMatrix> LayerMatrices(const ModelConfig& c, int layer) {
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim, hidden = c.hidden_dim;
  std::vector<LayerMatrix> out;
  if (c.mla()) {
    const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : dim;
    if (c.q_lora_rank > 0) {
      out.push_back({c.q_lora_rank, dim, &LayerWeights::wq_a, &LayerWeights::wq_a_scales});
    }
    out.push_back({q, q_in, &LayerWeights::wq, &LayerWeights::wq_scales});
    out.push_back({c.mla_latent_dim(), dim, &LayerWeights::wkv_a, &LayerWeights::wkv_a_scales});
    out.push_back({dim, c.attn_out_dim(), &LayerWeights::wo, &LayerWeights::wo_scales});
  } else {
    out = {{q, dim, &LayerWeights::wq, &LayerWeights::wq_scales},
           {kv, dim, &LayerWeights::wk, &LayerWeights::wk_scales},
           {kv, dim, &LayerWeights::wv, &LayerWeights::wv_scales},
           {dim, q, &LayerWeights::wo, &LayerWeights::wo_scales}};
  }
  if (c.moe_layer(layer)) {
    out.push_back({c.n_experts, dim, &LayerWeights::router, &LayerWeights::router_scales});
    if (c.n_shared_experts > 0) {
      const int64_t shared = int64_t{c.moe_hidden_dim} * c.n_shared_experts;
      out.push_back(
          {shared, dim, &LayerWeights::w_shared_gate, &LayerWeights::w_shared_gate_scales});
      out.push_back({shared, dim, &LayerWeights::w_shared_up, &LayerWeights::w_shared_up_scales});
      out.push_back(
          {dim, shared, &LayerWeights::w_shared_down, &LayerWeights::w_shared_down_scales});
    }
  } else {
    out.push_back({hidden, dim, &LayerWeights::w_gate, &LayerWeights::w_gate_scales});
    out.push_back({hidden, dim, &LayerWeights::w_up, &LayerWeights::w_up_scales});
    out.push_back({dim, hidden, &LayerWeights::w_down, &LayerWeights::w_down_scales});
  }
  return out;
}

// The matrices of one expert (moe() only), as LayerMatrix is for a layer.
struct ExpertMatrix {
  int64_t rows, cols;
  const void* ExpertWeights::*weight;
  const float* ExpertWeights::*scales;
};

std::vector<ExpertMatrix> ExpertMatrices(const ModelConfig& c) {
  if (!c.moe()) return {};
  const int64_t dim = c.dim, width = c.moe_hidden_dim;
  return {{width, dim, &ExpertWeights::w_gate, &ExpertWeights::w_gate_scales},
          {width, dim, &ExpertWeights::w_up, &ExpertWeights::w_up_scales},
          {dim, width, &ExpertWeights::w_down, &ExpertWeights::w_down_scales}};
}

// MatrixWeightBytes with `experts` experts counted per layer (moe() only).
int64_t WeightBytes(const ModelWeights& w, int64_t experts) {
  const ModelConfig& c = w.config;
  const bool i8 = w.dtype == kernels::DType::kI8;
  // One matrix of `rows` x `cols`, plus its scales when int8.
  auto matrix = [&](int64_t rows, int64_t cols) {
    return rows * cols * kernels::DTypeSize(w.dtype) + (i8 ? rows * 4 : 0);
  };
  const int64_t dim = c.dim;
  int64_t total = int64_t{c.vocab_size} * dim * kernels::DTypeSize(w.embedding_dtype);
  if (w.classifier != w.embedding) {
    total += matrix(c.vocab_size, dim);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    for (const LayerMatrix& m : LayerMatrices(c, l)) total += matrix(m.rows, m.cols);
    if (c.mla()) {  // the f32 kv_b_proj
      total += int64_t{c.n_heads} * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank * 4;
    }
    if (c.moe_layer(l)) {
      for (const ExpertMatrix& m : ExpertMatrices(c)) total += experts * matrix(m.rows, m.cols);
    }
  }
  return total;
}

}  // namespace

int64_t MatrixWeightBytes(const ModelWeights& w) { return WeightBytes(w, w.config.n_experts); }

int64_t ActiveMatrixWeightBytes(const ModelWeights& w) {
  return WeightBytes(w, w.config.n_experts_per_tok);
}

namespace {

// Pieces carved one after the other out of one anonymous mapping advised into transparent huge
// pages: Reserve every piece, Map once, then Take them in the same order.
class HugePageArena {
 public:
  void Reserve(int64_t bytes) { bytes_ += Round(bytes); }

  // Maps the reserved bytes; `out->mapped` owns the mapping.
  absl::Status Map(ModelWeights* out) {
    constexpr int64_t kHuge = int64_t{2} << 20;
    const int64_t size = std::max<int64_t>(kHuge, (bytes_ + kHuge - 1) / kHuge * kHuge);
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("weights: cannot map ", size, " bytes of memory: ", std::strerror(errno)));
    }
    // Best effort: without huge pages the weights work the same, a little slower.
    (void)::madvise(base, size, MADV_HUGEPAGE);
    out->mapped = std::shared_ptr<void>(base, [size](void* p) { ::munmap(p, size); });
    next_ = static_cast<uint8_t*>(base);
    return absl::OkStatus();
  }

  void* Take(int64_t bytes) {
    void* p = next_;
    next_ += Round(bytes);
    return p;
  }

 private:
  static int64_t Round(int64_t bytes) { return (bytes + 63) / 64 * 64; }  // cache-line aligned

  int64_t bytes_ = 0;
  uint8_t* next_ = nullptr;
};

// Calls reserve(rows, cols) for the classifier, then for each layer's matrices in LayerMatrices
// order and its experts' in ExpertMatrices order: the order in which QuantizeWeightsInt8 and
// CopyWeightsToHugePages Take them.
template <typename Reserve>
void ReserveMatrices(const ModelConfig& c, Reserve reserve) {
  reserve(c.vocab_size, c.dim);
  const std::vector<ExpertMatrix> experts = ExpertMatrices(c);
  for (int l = 0; l < c.n_layers; ++l) {
    for (const LayerMatrix& m : LayerMatrices(c, l)) reserve(m.rows, m.cols);
    if (!c.moe_layer(l)) continue;
    for (int e = 0; e < c.n_experts; ++e) {
      for (const ExpertMatrix& m : experts) reserve(m.rows, m.cols);
    }
  }
}

// Rows converted to f32 per step of QuantizeMatrix (bounds its scratch to ~4 MiB).
constexpr int64_t kQuantizeChunkElements = int64_t{1} << 20;

// An int8 copy of matrix `src` ([rows][cols] of `dtype`) with per-row scales, in the arena.
absl::Status QuantizeMatrix(const void* src, kernels::DType dtype, int64_t rows, int64_t cols,
                            HugePageArena* arena, const void** q, const float** scales) {
  auto* codes_i8 = static_cast<int8_t*>(arena->Take(rows * cols));
  auto* row_scales = static_cast<float*>(arena->Take(rows * 4));
  const int64_t chunk_rows = std::max<int64_t>(1, kQuantizeChunkElements / cols);
  std::vector<float> f32;
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r);
    const void* in = static_cast<const uint8_t*>(src) + r * cols * kernels::DTypeSize(dtype);
    const float* values = static_cast<const float*>(in);
    if (dtype != kernels::DType::kF32) {
      f32.resize(n * cols);
      kernels::ConvertParams p;
      p.in = in;
      p.out = f32.data();
      p.n = n * cols;
      p.in_dtype = dtype;
      p.out_dtype = kernels::DType::kF32;
      PD_RETURN_IF_ERROR(kernels::Convert(kernels::OpContext{}, p));
      values = f32.data();
    }
    kernels::QuantizeRowsInt8(values, n, cols, codes_i8 + r * cols, row_scales + r);
  }
  *q = codes_i8;
  *scales = row_scales;
  return absl::OkStatus();
}

absl::Status CheckLayers(const ModelWeights& src, absl::string_view what) {
  if (static_cast<int64_t>(src.layers.size()) != src.config.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", src.layers.size(), " layers, config says ", src.config.n_layers));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> QuantizeWeightsInt8(const ModelWeights& src) {
  if (src.dtype != kernels::DType::kF32 && src.dtype != kernels::DType::kBF16 &&
      src.dtype != kernels::DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantize weights: matrices are ", kernels::DTypeName(src.dtype),
                     "; int8 quantization takes f32, bf16 or f16 weights"));
  }
  PD_RETURN_IF_ERROR(CheckLayers(src, "quantize weights"));
  const ModelConfig& c = src.config;
  ModelWeights w;
  w.config = c;
  w.fingerprint = absl::StrCat(src.fingerprint, kInt8FingerprintSuffix);
  w.dtype = kernels::DType::kI8;
  w.embedding_dtype = src.embedding_dtype;
  w.embedding = src.embedding;
  w.final_norm = src.final_norm;
  HugePageArena arena;
  ReserveMatrices(c, [&](int64_t rows, int64_t cols) {
    arena.Reserve(rows * cols);  // codes
    arena.Reserve(rows * 4);     // scales
  });
  PD_RETURN_IF_ERROR(arena.Map(&w));
  // A tied classifier is the embedding table, stored as embedding_dtype (== dtype).
  PD_RETURN_IF_ERROR(QuantizeMatrix(src.classifier, src.dtype, c.vocab_size, c.dim, &arena,
                                    &w.classifier, &w.classifier_scales));
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& s = src.layers[l];
    LayerWeights& o = w.layers[l];
    o = s;  // norms, biases (views), then the matrices and their scales replaced
    for (const LayerMatrix& m : LayerMatrices(c, l)) {
      PD_RETURN_IF_ERROR(QuantizeMatrix(s.*m.weight, src.dtype, m.rows, m.cols, &arena,
                                        &(o.*m.weight), &(o.*m.scales)));
    }
    for (size_t e = 0; e < s.experts.size(); ++e) {
      for (const ExpertMatrix& m : ExpertMatrices(c)) {
        PD_RETURN_IF_ERROR(QuantizeMatrix(s.experts[e].*m.weight, src.dtype, m.rows, m.cols, &arena,
                                          &(o.experts[e].*m.weight), &(o.experts[e].*m.scales)));
      }
    }
  }
  return w;
}

absl::StatusOr<ModelWeights> CopyWeightsToHugePages(const ModelWeights& src) {
  PD_RETURN_IF_ERROR(CheckLayers(src, "huge-page weights"));
  const ModelConfig& c = src.config;
  const bool i8 = src.dtype == kernels::DType::kI8;
  const int64_t size = kernels::DTypeSize(src.dtype);
  const bool tied = src.classifier == src.embedding;
  HugePageArena arena;
  ReserveMatrices(c, [&](int64_t rows, int64_t cols) {
    arena.Reserve(rows * cols * size);
    if (i8) arena.Reserve(rows * 4);
  });
  ModelWeights w;
  PD_RETURN_IF_ERROR(arena.Map(&w));
  // Copies a matrix (and its scales when int8) into the arena.
  auto copy = [&](const void* m, const float* scales, int64_t rows, int64_t cols,
                  const float** scales_out) -> const void* {
    void* dst = arena.Take(rows * cols * size);
    std::memcpy(dst, m, rows * cols * size);
    if (i8) {
      auto* s = static_cast<float*>(arena.Take(rows * 4));
      std::memcpy(s, scales, rows * 4);
      *scales_out = s;
    }
    return dst;
  };
  w.config = c;
  w.fingerprint = src.fingerprint;
  w.dtype = src.dtype;
  w.embedding_dtype = src.embedding_dtype;
  w.final_norm = src.final_norm;
  w.classifier =
      copy(src.classifier, src.classifier_scales, c.vocab_size, c.dim, &w.classifier_scales);
  // Tied: the copy serves the gather too (same dtype, same rows).
  w.embedding = tied ? w.classifier : src.embedding;
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& s = src.layers[l];
    LayerWeights& o = w.layers[l];
    o = s;  // norms, biases (views), then the matrices replaced
    for (const LayerMatrix& m : LayerMatrices(c, l)) {
      o.*m.weight = copy(s.*m.weight, s.*m.scales, m.rows, m.cols, &(o.*m.scales));
    }
    for (size_t e = 0; e < s.experts.size(); ++e) {
      for (const ExpertMatrix& m : ExpertMatrices(c)) {
        o.experts[e].*m.weight = copy(s.experts[e].*m.weight, s.experts[e].*m.scales, m.rows,
                                      m.cols, &(o.experts[e].*m.scales));
      }
    }
  }
  return w;
}

bool TransparentHugePagesAvailable() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(f, line) && line.find("[never]") == std::string::npos;
}

}  // namespace pd::engine
