#include "engine/model/device_weights.h"

#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pd::engine {
namespace {

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One tensor to upload: where it is on the host, how many bytes, and the view field to point
// at its device copy.
struct Piece {
  const void* src;
  int64_t bytes;
  std::function<void(const void*)> point_at;  // sets the view's field to the device copy
  int64_t offset = 0;
};

// Multi-head latent attention's matrices of one layer (model_weights.h): the query's
// projections, kv_a_proj with its norm, kv_b_proj and its per-head transposed W_UK (f32 whatever
// the dtype), o_proj, and with int8 matrices their scales. `add` is Upload's.
template <typename Add>
absl::Status AddMla(const ModelConfig& c, const LayerWeights& h, int64_t w, bool i8,
                    const std::string& at, Add& add, LayerWeights* o) {
  constexpr int64_t f = sizeof(float);
  const int64_t dim = c.dim, q = c.q_dim(), lora = c.q_lora_rank, rank = c.kv_lora_rank;
  const int64_t latent = c.mla_latent_dim(), heads = c.n_heads;
  const bool q_lora = lora > 0;
  PD_RETURN_IF_ERROR(add(h.wq_a, lora * dim * w, &o->wq_a, q_lora, "q_a_proj" + at));
  PD_RETURN_IF_ERROR(add(h.q_a_norm, lora * f, &o->q_a_norm, q_lora, "q_a_layernorm" + at));
  PD_RETURN_IF_ERROR(add(h.wq, q * (q_lora ? lora : dim) * w, &o->wq, true, "wq" + at));
  PD_RETURN_IF_ERROR(add(h.wkv_a, latent * dim * w, &o->wkv_a, true, "kv_a_proj" + at));
  PD_RETURN_IF_ERROR(add(h.kv_a_norm, rank * f, &o->kv_a_norm, true, "kv_a_layernorm" + at));
  PD_RETURN_IF_ERROR(add(h.wkv_b, heads * (c.qk_nope_head_dim + c.v_head_dim) * rank * f, &o->wkv_b,
                         true, "kv_b_proj" + at));
  PD_RETURN_IF_ERROR(
      add(h.wuk_t, heads * rank * c.qk_nope_head_dim * f, &o->wuk_t, true, "W_UK^T" + at));
  PD_RETURN_IF_ERROR(add(h.wo, dim * c.attn_out_dim() * w, &o->wo, true, "wo" + at));
  if (i8) {
    PD_RETURN_IF_ERROR(add(h.wq_a_scales, lora * f, &o->wq_a_scales, q_lora, "q_a scales" + at));
    PD_RETURN_IF_ERROR(add(h.wq_scales, q * f, &o->wq_scales, true, "wq scales" + at));
    PD_RETURN_IF_ERROR(add(h.wkv_a_scales, latent * f, &o->wkv_a_scales, true, "kv_a scales" + at));
    PD_RETURN_IF_ERROR(add(h.wo_scales, dim * f, &o->wo_scales, true, "wo scales" + at));
  }
  return absl::OkStatus();
}

// A mixture-of-experts layer's MLP (model_weights.h): the router, each routed expert's SwiGLU
// matrices and the shared experts' (when the config has them), with int8 matrices their scales.
// The router's selection bias is not uploaded (routing runs on the host). `add` is Upload's.
template <typename Add>
absl::Status AddExperts(const ModelConfig& c, const LayerWeights& h, int64_t w, bool i8,
                        const std::string& at, Add& add, LayerWeights* o) {
  constexpr int64_t f = sizeof(float);
  const int64_t dim = c.dim, width = c.moe_hidden_dim, experts = c.n_experts;
  if (static_cast<int64_t>(h.experts.size()) != experts) {
    return absl::InvalidArgumentError(absl::StrCat("device weights: ", h.experts.size(), " experts",
                                                   at, ", config says ", experts));
  }
  PD_RETURN_IF_ERROR(add(h.router, experts * dim * w, &o->router, true, "router" + at));
  if (i8) {
    PD_RETURN_IF_ERROR(
        add(h.router_scales, experts * f, &o->router_scales, true, "router scales" + at));
  }
  o->experts.resize(h.experts.size());
  for (size_t e = 0; e < h.experts.size(); ++e) {
    const ExpertWeights& x = h.experts[e];
    ExpertWeights& y = o->experts[e];
    const std::string of = absl::StrCat(" of expert ", e, at);
    PD_RETURN_IF_ERROR(add(x.w_gate, width * dim * w, &y.w_gate, true, "w_gate" + of));
    PD_RETURN_IF_ERROR(add(x.w_up, width * dim * w, &y.w_up, true, "w_up" + of));
    PD_RETURN_IF_ERROR(add(x.w_down, dim * width * w, &y.w_down, true, "w_down" + of));
    if (i8) {
      PD_RETURN_IF_ERROR(
          add(x.w_gate_scales, width * f, &y.w_gate_scales, true, "w_gate scales" + of));
      PD_RETURN_IF_ERROR(add(x.w_up_scales, width * f, &y.w_up_scales, true, "w_up scales" + of));
      PD_RETURN_IF_ERROR(
          add(x.w_down_scales, dim * f, &y.w_down_scales, true, "w_down scales" + of));
    }
  }
  if (c.n_shared_experts > 0) {
    const int64_t shared = width * c.n_shared_experts;
    PD_RETURN_IF_ERROR(
        add(h.w_shared_gate, shared * dim * w, &o->w_shared_gate, true, "shared w_gate" + at));
    PD_RETURN_IF_ERROR(
        add(h.w_shared_up, shared * dim * w, &o->w_shared_up, true, "shared w_up" + at));
    PD_RETURN_IF_ERROR(
        add(h.w_shared_down, dim * shared * w, &o->w_shared_down, true, "shared w_down" + at));
    if (i8) {
      PD_RETURN_IF_ERROR(add(h.w_shared_gate_scales, shared * f, &o->w_shared_gate_scales, true,
                             "shared w_gate scales" + at));
      PD_RETURN_IF_ERROR(add(h.w_shared_up_scales, shared * f, &o->w_shared_up_scales, true,
                             "shared w_up scales" + at));
      PD_RETURN_IF_ERROR(add(h.w_shared_down_scales, dim * f, &o->w_shared_down_scales, true,
                             "shared w_down scales" + at));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(
    const ModelWeights& host, const kernels::OpContext& ctx) {
  const ModelConfig& c = host.config;
  PD_RETURN_IF_ERROR(c.Validate());
  if (static_cast<int64_t>(host.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("device weights: ", host.layers.size(), " layers, config says ", c.n_layers));
  }
  std::unique_ptr<DeviceWeights> d(new DeviceWeights());
  ModelWeights& v = d->view_;
  v.config = c;
  v.fingerprint = host.fingerprint;
  v.dtype = host.dtype;
  v.embedding_dtype = host.embedding_dtype;
  v.layers.resize(c.n_layers);

  const int64_t w = kernels::DTypeSize(host.dtype);
  const int64_t e = kernels::DTypeSize(host.embedding_dtype);
  const int64_t f = sizeof(float);
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim, hidden = c.hidden_dim;
  std::vector<Piece> pieces;
  // `required` tensors must be present; optional ones (biases) stay null when absent.
  auto add = [&pieces](const void* src, int64_t bytes, auto** field, bool required,
                       absl::string_view name) -> absl::Status {
    if (src == nullptr) {
      if (required) {
        return absl::InvalidArgumentError(absl::StrCat("device weights: ", name, " is missing"));
      }
      return absl::OkStatus();
    }
    using Field = std::remove_pointer_t<decltype(field)>;  // const float* or const void*
    pieces.push_back({src, bytes, [field](const void* p) { *field = static_cast<Field>(p); }});
    return absl::OkStatus();
  };
  PD_RETURN_IF_ERROR(add(host.embedding, c.vocab_size * dim * e, &v.embedding, true, "embedding"));
  if (host.classifier != host.embedding) {
    PD_RETURN_IF_ERROR(
        add(host.classifier, c.vocab_size * dim * w, &v.classifier, true, "classifier"));
  }
  // int8 matrices: their per-row scales (kernels/matmul_params.h), required then.
  const bool i8 = host.dtype == kernels::DType::kI8;
  if (i8) {
    PD_RETURN_IF_ERROR(add(host.classifier_scales, c.vocab_size * f, &v.classifier_scales, true,
                           "classifier scales"));
  }
  PD_RETURN_IF_ERROR(add(host.final_norm, dim * f, &v.final_norm, true, "final norm"));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& h = host.layers[l];
    LayerWeights& o = v.layers[l];
    const std::string at = absl::StrCat(" of layer ", l);
    PD_RETURN_IF_ERROR(add(h.attn_norm, dim * f, &o.attn_norm, true, "attn_norm" + at));
    if (c.mla()) {
      PD_RETURN_IF_ERROR(AddMla(c, h, w, i8, at, add, &o));
    } else {
      PD_RETURN_IF_ERROR(add(h.wq, q * dim * w, &o.wq, true, "wq" + at));
      PD_RETURN_IF_ERROR(add(h.wk, kv * dim * w, &o.wk, true, "wk" + at));
      PD_RETURN_IF_ERROR(add(h.wv, kv * dim * w, &o.wv, true, "wv" + at));
      PD_RETURN_IF_ERROR(add(h.wo, dim * q * w, &o.wo, true, "wo" + at));
      if (i8) {
        PD_RETURN_IF_ERROR(add(h.wq_scales, q * f, &o.wq_scales, true, "wq scales" + at));
        PD_RETURN_IF_ERROR(add(h.wk_scales, kv * f, &o.wk_scales, true, "wk scales" + at));
        PD_RETURN_IF_ERROR(add(h.wv_scales, kv * f, &o.wv_scales, true, "wv scales" + at));
        PD_RETURN_IF_ERROR(add(h.wo_scales, dim * f, &o.wo_scales, true, "wo scales" + at));
      }
    }
    PD_RETURN_IF_ERROR(add(h.bq, q * f, &o.bq, false, "bq" + at));
    PD_RETURN_IF_ERROR(add(h.bk, kv * f, &o.bk, false, "bk" + at));
    PD_RETURN_IF_ERROR(add(h.bv, kv * f, &o.bv, false, "bv" + at));
    PD_RETURN_IF_ERROR(add(h.q_norm, c.head_dim * f, &o.q_norm, false, "q_norm" + at));
    PD_RETURN_IF_ERROR(add(h.k_norm, c.head_dim * f, &o.k_norm, false, "k_norm" + at));
    PD_RETURN_IF_ERROR(add(h.ffn_norm, dim * f, &o.ffn_norm, true, "ffn_norm" + at));
    if (c.moe_layer(l)) {
      PD_RETURN_IF_ERROR(AddExperts(c, h, w, i8, at, add, &o));
      if (h.router_bias != nullptr) {
        // Routing runs on the host (LlamaForward::MoeMlp): the selection bias stays there, in a
        // copy this object owns.
        d->router_bias_.emplace_back(h.router_bias, h.router_bias + c.n_experts);
        o.router_bias = d->router_bias_.back().data();
      }
      continue;
    }
    PD_RETURN_IF_ERROR(add(h.w_gate, hidden * dim * w, &o.w_gate, true, "w_gate" + at));
    PD_RETURN_IF_ERROR(add(h.w_up, hidden * dim * w, &o.w_up, true, "w_up" + at));
    PD_RETURN_IF_ERROR(add(h.w_down, dim * hidden * w, &o.w_down, true, "w_down" + at));
    if (i8) {
      PD_RETURN_IF_ERROR(
          add(h.w_gate_scales, hidden * f, &o.w_gate_scales, true, "w_gate scales" + at));
      PD_RETURN_IF_ERROR(add(h.w_up_scales, hidden * f, &o.w_up_scales, true, "w_up scales" + at));
      PD_RETURN_IF_ERROR(
          add(h.w_down_scales, dim * f, &o.w_down_scales, true, "w_down scales" + at));
    }
  }
  int64_t total = 0;
  for (Piece& p : pieces) {
    p.offset = total;
    total += AlignUp(p.bytes);
  }
  PD_ASSIGN_OR_RETURN(d->buffer_, kernels::DeviceBuffer::Allocate(ctx.device, total));
  uint8_t* base = d->buffer_.as<uint8_t>();
  for (const Piece& p : pieces) {
    p.point_at(base + p.offset);
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx, base + p.offset, p.src, p.bytes));
  }
  if (host.classifier == host.embedding) {
    v.classifier = v.embedding;
  }
  // Host sources may be pageable mmapped files: wait before returning so the caller may unmap.
  PD_RETURN_IF_ERROR(kernels::SynchronizeStream(ctx));
  return d;
}

}  // namespace pd::engine
