#include "engine/model/tensor_parallel.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/types.h"

namespace pd::engine {
namespace {

// Whether some layer's MLP is the dense one (of width hidden_dim).
bool HasDenseMlp(const ModelConfig& c) { return !c.moe() || c.first_dense_layers > 0; }

}  // namespace

absl::StatusOr<TpPlan> PlanTensorParallel(const ModelConfig& config, int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", size, " must be >= 1"));
  }
  if (config.n_heads % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel ", size, " does not divide the model's ", config.n_heads, " query heads"));
  }
  if (!config.mla() && config.n_kv_heads % size != 0 && size % config.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel ", size, " and the model's ", config.n_kv_heads,
        " KV heads: one must divide the other (KV heads are split, or shared by ranks)"));
  }
  if (HasDenseMlp(config) && config.hidden_dim % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_parallel ", size, " does not divide the MLP width ", config.hidden_dim));
  }
  if (config.moe() && config.moe_hidden_dim % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", size,
                                                   " does not divide the experts' width ",
                                                   config.moe_hidden_dim));
  }
  if (config.vocab_size < size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", size, " exceeds the ",
                                                   config.vocab_size, "-token vocabulary"));
  }
  TpPlan plan;
  plan.size = size;
  // MLA caches one latent entry per token that every head reads: every rank reads all of it
  // and the first writes it.
  plan.shared_kv = config.mla() ? size > 1 : size > config.n_kv_heads;
  plan.pool_kv_heads = config.cache_kv_heads();
  // hidden_dim is unused when every MLP is a mixture of experts: it is kept whole.
  const int32_t heads = config.n_heads / size;
  const int32_t width = HasDenseMlp(config) ? config.hidden_dim / size : config.hidden_dim;
  for (int r = 0; r < size; ++r) {
    TpRankPlan p;
    p.rank = r;
    p.size = size;
    p.head_begin = r * heads;
    p.num_heads = heads;
    if (config.mla()) {
      p.kv_head_begin = 0;
      p.num_kv_heads = config.cache_kv_heads();
      p.writes_kv = r == 0;
    } else if (plan.shared_kv) {
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
    p.expert_begin = r * (config.moe_hidden_dim / size);
    p.expert_width = config.moe_hidden_dim / size;
    const int64_t v = config.vocab_size;
    p.vocab_begin = v * r / size;
    p.vocab_count = v * (r + 1) / size - p.vocab_begin;
    plan.ranks.push_back(p);
  }
  return plan;
}

std::vector<TpPoolHeads> PoolHeadsOfRanks(const ModelConfig& config, const TpPlan& plan) {
  std::vector<TpPoolHeads> heads;
  for (const TpRankPlan& r : plan.ranks) {
    if (config.mla()) {
      heads.push_back({0, config.cache_kv_heads()});
    } else {
      heads.push_back({r.kv_head_begin, r.num_kv_heads});
    }
  }
  return heads;
}

ModelConfig ShardConfig(const ModelConfig& config, const TpRankPlan& rank) {
  ModelConfig c = config;
  c.n_heads = rank.num_heads;
  // MLA's n_kv_heads is n_heads (nothing reads it: the cache is the latent, cache_kv_heads()).
  c.n_kv_heads = config.mla() ? rank.num_heads : rank.num_kv_heads;
  c.kv_dim = c.n_kv_heads * config.head_dim;
  c.hidden_dim = rank.hidden_width;
  if (config.moe()) c.moe_hidden_dim = rank.expert_width;
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
  // MLA: wq's inputs are q_lora_rank wide after q_a_proj; each head's rows of kv_b_proj are
  // [nope | v] wide, its W_UK^T [kv_lora_rank][nope], its o_proj columns v_head_dim wide.
  const int64_t q_in = c.mla() && c.q_lora_rank > 0 ? c.q_lora_rank : c.dim;
  const int64_t kv_rank = c.kv_lora_rank;
  const int64_t out0 = c.mla() ? p.head_begin * int64_t{c.v_head_dim} : q0;
  const int64_t out_cols = c.mla() ? p.num_heads * int64_t{c.v_head_dim} : q_rows;
  const int64_t e0 = p.expert_begin, ew = p.expert_width, dim = c.dim;
  const int64_t shared = int64_t{c.moe_hidden_dim} * c.n_shared_experts;
  const int64_t s0 = e0 * c.n_shared_experts, sw = ew * c.n_shared_experts;
  for (const LayerWeights& l : full.layers) {
    LayerWeights s;
    s.attn_norm = l.attn_norm;
    s.ffn_norm = l.ffn_norm;
    s.q_norm = l.q_norm;
    s.k_norm = l.k_norm;
    s.wq = Rows(l.wq, q0, q_in, full.dtype);
    s.wk = Rows(l.wk, kv0, dim, full.dtype);
    s.wv = Rows(l.wv, kv0, dim, full.dtype);
    s.bq = RowsF32(l.bq, q0);
    s.bk = RowsF32(l.bk, kv0);
    s.bv = RowsF32(l.bv, kv0);
    s.wq_scales = RowsF32(l.wq_scales, q0);
    s.wk_scales = RowsF32(l.wk_scales, kv0);
    s.wv_scales = RowsF32(l.wv_scales, kv0);
    s.wo = Columns(*w, l.wo, dim, c.attn_out_dim(), out0, out_cols, full.dtype);
    s.wo_scales = l.wo_scales;  // per output row: the whole row's scale serves every slice
    // MLA's latent projections are computed whole on every rank (the cache entry every head
    // reads); its per-head matrices are sliced by head.
    s.wq_a = l.wq_a;
    s.wq_a_scales = l.wq_a_scales;
    s.q_a_norm = l.q_a_norm;
    s.wkv_a = l.wkv_a;
    s.wkv_a_scales = l.wkv_a_scales;
    s.kv_a_norm = l.kv_a_norm;
    if (l.wkv_b != nullptr) {
      s.wkv_b = l.wkv_b + p.head_begin * int64_t{c.qk_nope_head_dim + c.v_head_dim} * kv_rank;
    }
    if (l.wuk_t != nullptr) s.wuk_t = l.wuk_t + p.head_begin * kv_rank * c.qk_nope_head_dim;
    s.w_gate = Rows(l.w_gate, h0, dim, full.dtype);
    s.w_up = Rows(l.w_up, h0, dim, full.dtype);
    s.w_gate_scales = RowsF32(l.w_gate_scales, h0);
    s.w_up_scales = RowsF32(l.w_up_scales, h0);
    if (l.w_down != nullptr) {
      s.w_down = Columns(*w, l.w_down, dim, c.hidden_dim, h0, p.hidden_width, full.dtype);
    }
    s.w_down_scales = l.w_down_scales;
    // Mixture of experts: the router is computed whole on every rank (every rank routes the
    // same tokens to the same experts); each expert and the shared experts are split by
    // columns as the dense MLP is.
    s.router = l.router;
    s.router_scales = l.router_scales;
    s.router_bias = l.router_bias;
    for (const ExpertWeights& x : l.experts) {
      ExpertWeights e;
      e.w_gate = Rows(x.w_gate, e0, dim, full.dtype);
      e.w_up = Rows(x.w_up, e0, dim, full.dtype);
      e.w_gate_scales = RowsF32(x.w_gate_scales, e0);
      e.w_up_scales = RowsF32(x.w_up_scales, e0);
      e.w_down = Columns(*w, x.w_down, dim, c.moe_hidden_dim, e0, ew, full.dtype);
      e.w_down_scales = x.w_down_scales;
      s.experts.push_back(e);
    }
    if (l.w_shared_gate != nullptr) {
      s.w_shared_gate = Rows(l.w_shared_gate, s0, dim, full.dtype);
      s.w_shared_up = Rows(l.w_shared_up, s0, dim, full.dtype);
      s.w_shared_gate_scales = RowsF32(l.w_shared_gate_scales, s0);
      s.w_shared_up_scales = RowsF32(l.w_shared_up_scales, s0);
      s.w_shared_down = Columns(*w, l.w_shared_down, dim, shared, s0, sw, full.dtype);
      s.w_shared_down_scales = l.w_shared_down_scales;
    }
    w->layers.push_back(std::move(s));
  }
  return w;
}

}  // namespace pd::engine
