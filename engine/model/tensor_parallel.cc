#include "engine/model/tensor_parallel.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/types.h"

namespace pd::engine {

absl::StatusOr<TpPlan> PlanTensorParallel(const ModelConfig& config, int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", size, " must be >= 1"));
  }
  if (config.moe() && size > 1) {
    return absl::UnimplementedError(
        "tensor_parallel > 1: mixture-of-experts models are not split across ranks yet");
  }
  if (config.mla() && size > 1) {
    return absl::UnimplementedError(
        "tensor_parallel > 1: multi-head latent attention models are not split across ranks yet");
  }
  if (config.n_heads % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel ", size, " does not divide the model's ", config.n_heads, " query heads"));
  }
  if (config.n_kv_heads % size != 0 && size % config.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel ", size, " and the model's ", config.n_kv_heads,
        " KV heads: one must divide the other (KV heads are split, or shared by ranks)"));
  }
  if (config.hidden_dim % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel ", size, " does not divide the MLP width ", config.hidden_dim));
  }
  if (config.vocab_size < size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", size, " exceeds the ",
                                                   config.vocab_size, "-token vocabulary"));
  }
  TpPlan plan;
  plan.size = size;
  plan.shared_kv = size > config.n_kv_heads;
  plan.pool_kv_heads = config.n_kv_heads;
  const int32_t heads = config.n_heads / size, width = config.hidden_dim / size;
  for (int r = 0; r < size; ++r) {
    TpRankPlan p;
    p.rank = r;
    p.size = size;
    p.head_begin = r * heads;
    p.num_heads = heads;
    if (plan.shared_kv) {
      const int ranks_per_head = size / config.n_kv_heads;
      p.kv_head_begin = r / ranks_per_head;
      p.num_kv_heads = 1;
      p.writes_kv = r % ranks_per_head == 0;
    } else {
      p.num_kv_heads = config.n_kv_heads / size;
      p.kv_head_begin = r * p.num_kv_heads;
    }
    p.hidden_begin = r * width;
    p.hidden_width = width;
    const int64_t v = config.vocab_size;
    p.vocab_begin = v * r / size;
    p.vocab_count = v * (r + 1) / size - p.vocab_begin;
    plan.ranks.push_back(p);
  }
  return plan;
}

ModelConfig ShardConfig(const ModelConfig& config, const TpRankPlan& rank) {
  ModelConfig c = config;
  c.n_heads = rank.num_heads;
  c.n_kv_heads = rank.num_kv_heads;
  c.kv_dim = rank.num_kv_heads * config.head_dim;
  c.hidden_dim = rank.hidden_width;
  return c;
}

namespace {

const void* Rows(const void* base, int64_t first_row, int64_t row_elems, kernels::DType dtype) {
  if (base == nullptr) return nullptr;
  return static_cast<const char*>(base) + first_row * row_elems * kernels::DTypeSize(dtype);
}

const float* RowsF32(const float* base, int64_t first) {
  return base == nullptr ? nullptr : base + first;
}

// Columns [col_begin, col_begin + cols) of a [rows][in] matrix, copied into storage owned by `w`.
const void* Columns(ModelWeights& w, const void* base, int64_t rows, int64_t in, int64_t col_begin,
                    int64_t cols, kernels::DType dtype) {
  const int64_t elem = kernels::DTypeSize(dtype);
  const int64_t bytes = rows * cols * elem;
  auto storage = std::make_unique<float[]>(static_cast<size_t>((bytes + 3) / 4));
  char* out = reinterpret_cast<char*>(storage.get());
  const char* in_bytes = static_cast<const char*>(base);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out + r * cols * elem, in_bytes + (r * in + col_begin) * elem,
                static_cast<size_t>(cols * elem));
  }
  w.owned.push_back(std::move(storage));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ShardWeights(const ModelWeights& full,
                                                           const TpPlan& plan, int rank) {
  if (rank < 0 || rank >= plan.size || static_cast<int>(plan.ranks.size()) != plan.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel: rank ", rank, " of a ", plan.size, "-rank plan"));
  }
  const ModelConfig& c = full.config;
  if (c.moe() || c.mla()) {
    return absl::UnimplementedError("tensor parallel: MoE and MLA weights are not sharded yet");
  }
  const TpRankPlan& p = plan.ranks[static_cast<size_t>(rank)];
  auto w = std::make_unique<ModelWeights>();
  w->config = ShardConfig(c, p);
  w->fingerprint = full.fingerprint;
  w->dtype = full.dtype;
  w->embedding_dtype = full.embedding_dtype;
  w->embedding = Rows(full.embedding, p.vocab_begin, c.dim, full.embedding_dtype);
  w->classifier = Rows(full.classifier, p.vocab_begin, c.dim, full.dtype);
  w->classifier_scales = RowsF32(full.classifier_scales, p.vocab_begin);
  w->final_norm = full.final_norm;
  w->mapped = full.mapped;
  const int64_t hd = c.head_dim;
  const int64_t q0 = p.head_begin * hd, q_rows = int64_t{p.num_heads} * hd;
  const int64_t kv0 = p.kv_head_begin * hd;
  const int64_t h0 = p.hidden_begin;
  for (const LayerWeights& l : full.layers) {
    LayerWeights s;
    s.attn_norm = l.attn_norm;
    s.ffn_norm = l.ffn_norm;
    s.q_norm = l.q_norm;
    s.k_norm = l.k_norm;
    s.wq = Rows(l.wq, q0, c.dim, full.dtype);
    s.wk = Rows(l.wk, kv0, c.dim, full.dtype);
    s.wv = Rows(l.wv, kv0, c.dim, full.dtype);
    s.bq = RowsF32(l.bq, q0);
    s.bk = RowsF32(l.bk, kv0);
    s.bv = RowsF32(l.bv, kv0);
    s.wq_scales = RowsF32(l.wq_scales, q0);
    s.wk_scales = RowsF32(l.wk_scales, kv0);
    s.wv_scales = RowsF32(l.wv_scales, kv0);
    s.wo = Columns(*w, l.wo, c.dim, c.q_dim(), q0, q_rows, full.dtype);
    s.wo_scales = l.wo_scales;  // per output row: the whole row's scale serves every slice
    s.w_gate = Rows(l.w_gate, h0, c.dim, full.dtype);
    s.w_up = Rows(l.w_up, h0, c.dim, full.dtype);
    s.w_gate_scales = RowsF32(l.w_gate_scales, h0);
    s.w_up_scales = RowsF32(l.w_up_scales, h0);
    s.w_down = Columns(*w, l.w_down, c.dim, c.hidden_dim, h0, p.hidden_width, full.dtype);
    s.w_down_scales = l.w_down_scales;
    w->layers.push_back(std::move(s));
  }
  return w;
}

}  // namespace pd::engine
