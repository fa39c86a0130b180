#include "engine/model/model_weights.h"

#include "common/base/status_macros.h"
#include "kernels/convert.h"

namespace pd::engine {

ModelWeights WeightsFromLlama2c(const Llama2cCheckpoint& checkpoint) {
  ModelWeights w;
  w.config = checkpoint.config();
  w.fingerprint = checkpoint.Fingerprint();
  w.dtype = kernels::DType::kF32;
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
  w.embedding = model.embed_tokens().data;
  w.classifier = model.lm_head().data;
  PD_ASSIGN_OR_RETURN(w.final_norm, OwnedF32(model.norm(), &w));
  w.layers.resize(w.config.n_layers);
  for (int l = 0; l < w.config.n_layers; ++l) {
    const HfLayerWeights& hl = model.layer(l);
    LayerWeights& lw = w.layers[l];
    PD_ASSIGN_OR_RETURN(lw.attn_norm, OwnedF32(hl.input_layernorm, &w));
    PD_ASSIGN_OR_RETURN(lw.ffn_norm, OwnedF32(hl.post_attention_layernorm, &w));
    lw.wq = hl.q_proj.data;
    lw.wk = hl.k_proj.data;
    lw.wv = hl.v_proj.data;
    lw.wo = hl.o_proj.data;
    lw.w_gate = hl.gate_proj.data;
    lw.w_up = hl.up_proj.data;
    lw.w_down = hl.down_proj.data;
    if (hl.q_bias.has_value()) {
      PD_ASSIGN_OR_RETURN(lw.bq, OwnedF32(*hl.q_bias, &w));
      PD_ASSIGN_OR_RETURN(lw.bk, OwnedF32(*hl.k_bias, &w));
      PD_ASSIGN_OR_RETURN(lw.bv, OwnedF32(*hl.v_bias, &w));
    }
  }
  return w;
}

}  // namespace pd::engine
