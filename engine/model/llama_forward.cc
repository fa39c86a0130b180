#include "engine/model/llama_forward.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace pd::engine {
namespace {

using kernels::DType;

kernels::RopeStyle RopeStyleOf(RopeForm form) {
  return form == RopeForm::kInterleaved ? kernels::RopeStyle::kInterleaved
                                        : kernels::RopeStyle::kRotateHalf;
}

absl::Status RmsNormRows(const kernels::OpContext& ctx, const float* in, const float* weight,
                         float* out, int64_t rows, int64_t dim, float eps) {
  kernels::RmsNormParams p;
  p.in = in;
  p.weight = weight;
  p.out = out;
  p.num_rows = rows;
  p.dim = dim;
  p.in_row_stride = dim;
  p.out_row_stride = dim;
  p.eps = eps;
  return kernels::RmsNorm(ctx, p);
}

}  // namespace

LlamaForward::LlamaForward(const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx,
                           ForwardOptions options)
    : weights_(weights), config_(weights->config), pool_(pool), ctx_(ctx), options_(options) {}

absl::StatusOr<std::unique_ptr<LlamaForward>> LlamaForward::Create(const ModelWeights* weights,
                                                                   KvPoolView pool,
                                                                   kernels::OpContext ctx,
                                                                   ForwardOptions options) {
  PD_RETURN_IF_ERROR(weights->config.Validate());
  if (pool.base == nullptr || pool.num_blocks <= 0 || pool.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv pool: base must be set and num_blocks, block_size > 0, got ", pool.num_blocks, ", ",
        pool.block_size));
  }
  if (options.max_batch_tokens <= 0 || options.max_seqs <= 0 ||
      options.max_seqs > options.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward options: need 0 < max_seqs <= max_batch_tokens, got ",
                     options.max_seqs, " and ", options.max_batch_tokens));
  }
  if (ctx.device != kernels::Device::kCpu) {
    // The activations below are host vectors; the CUDA kernels exist (kernels/cuda) but the
    // device-memory forward pass does not yet.
    return absl::UnimplementedError(
        "llama forward: only the cpu device is implemented (the cuda forward pass is issue #9 "
        "item 2)");
  }
  if (!kernels::SupportsMatMul(ctx.device, weights->dtype) ||
      !kernels::SupportsAttention(ctx.device, pool.dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        "no kernels on this device for weight dtype ", static_cast<int>(weights->dtype),
        " with kv dtype ", static_cast<int>(pool.dtype)));
  }
  std::unique_ptr<LlamaForward> f(new LlamaForward(weights, pool, ctx, options));
  const ModelConfig& c = f->config_;
  kernels::RopeFreqConfig rope;
  rope.head_dim = c.head_dim;
  rope.theta = c.rope_theta;
  if (c.rope_scaling.has_value()) {
    rope.llama3.enabled = true;
    rope.llama3.factor = c.rope_scaling->factor;
    rope.llama3.low_freq_factor = c.rope_scaling->low_freq_factor;
    rope.llama3.high_freq_factor = c.rope_scaling->high_freq_factor;
    rope.llama3.original_max_position_embeddings = c.rope_scaling->original_max_position_embeddings;
  }
  PD_ASSIGN_OR_RETURN(f->inv_freq_, kernels::ComputeRopeInvFreq(rope));

  const int64_t t = options.max_batch_tokens;
  const int64_t wide = std::max<int64_t>(c.dim, c.q_dim());
  f->x_.resize(t * c.dim);
  f->xb_.resize(t * wide);
  f->q_.resize(t * c.q_dim());
  f->k_.resize(t * c.kv_dim);
  f->v_.resize(t * c.kv_dim);
  f->att_.resize(t * c.q_dim());
  f->gate_.resize(t * c.hidden_dim);
  f->up_.resize(t * c.hidden_dim);
  f->positions_.resize(t);
  f->token_seq_.resize(t);
  f->max_blocks_per_seq_ = (c.seq_len + pool.block_size - 1) / pool.block_size;
  f->block_tables_.resize(options.max_seqs * f->max_blocks_per_seq_);
  f->context_lens_.resize(options.max_seqs);
  f->logits_tmp_.resize(options.max_seqs * static_cast<int64_t>(c.vocab_size));

  // One workspace for the largest matmul of any layer at the largest batch.
  int64_t workspace = 0;
  const int64_t shapes[][3] = {{t, c.dim, c.q_dim()},      {t, c.dim, c.kv_dim},
                               {t, c.q_dim(), c.dim},      {t, c.dim, c.hidden_dim},
                               {t, c.hidden_dim, c.dim},   {options.max_seqs, c.dim, c.vocab_size}};
  for (const auto& s : shapes) {
    kernels::MatMulParams p;
    p.num_rows = s[0];
    p.in_features = s[1];
    p.out_features = s[2];
    p.x_row_stride = s[1];
    p.y_row_stride = s[2];
    p.w_dtype = weights->dtype;
    workspace = std::max(workspace, kernels::MatMulWorkspaceBytes(ctx, p));
  }
  f->workspace_.resize(workspace);
  return f;
}

int64_t LlamaForward::block_bytes() const {
  return static_cast<int64_t>(config_.n_layers) * 2 * config_.kv_dim * pool_.block_size *
         kernels::DTypeSize(pool_.dtype);
}

kernels::KvCacheView LlamaForward::CacheView(int layer) const {
  return kernels::DenseKvCacheView(pool_.base, pool_.dtype, pool_.num_blocks, config_.n_layers,
                                   config_.n_kv_heads, pool_.block_size, config_.head_dim, layer);
}

absl::Status LlamaForward::Validate(absl::Span<const ForwardSequence> batch) const {
  if (batch.empty() || static_cast<int64_t>(batch.size()) > options_.max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("forward: batch of ", batch.size(),
                                                   " sequences, limit ", options_.max_seqs));
  }
  int64_t total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSequence& seq = batch[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0 || seq.start_pos < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: sequence ", s, " has no new tokens or a negative start"));
    }
    const int64_t end = seq.start_pos + n;
    if (end > config_.seq_len) {
      return absl::OutOfRangeError(absl::StrCat("forward: sequence ", s, " reaches position ",
                                                end, ", beyond the context of ", config_.seq_len));
    }
    const int64_t needed = (end + pool_.block_size - 1) / pool_.block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < needed) {
      return absl::InvalidArgumentError(absl::StrCat("forward: sequence ", s, " needs ", needed,
                                                     " blocks, table has ",
                                                     seq.block_table.size()));
    }
    for (int64_t b = 0; b < needed; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= pool_.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("forward: sequence ", s, " block ", b,
                                                       " is ", seq.block_table[b],
                                                       ", outside the pool of ",
                                                       pool_.num_blocks));
      }
    }
    for (uint32_t token : seq.tokens) {
      if (token >= static_cast<uint32_t>(config_.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrCat("forward: token id ", token,
                                                       " >= vocab size ", config_.vocab_size));
      }
    }
    total += n;
  }
  if (total > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", total, " tokens in the batch, limit ",
                                                   options_.max_batch_tokens));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::MatMul(const float* x, const void* w, const float* bias, float* y,
                                  int64_t num_rows, int64_t in, int64_t out, bool accumulate) {
  kernels::MatMulParams p;
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.num_rows = num_rows;
  p.in_features = in;
  p.out_features = out;
  p.x_row_stride = in;
  p.y_row_stride = out;
  p.w_dtype = weights_->dtype;
  p.accumulate = accumulate;
  p.workspace = workspace_.empty() ? nullptr : workspace_.data();
  p.workspace_bytes = static_cast<int64_t>(workspace_.size());
  return kernels::MatMul(ctx_, p);
}

absl::Status LlamaForward::Forward(absl::Span<const ForwardSequence> batch, float* logits) {
  PD_RETURN_IF_ERROR(Validate(batch));
  const ModelConfig& c = config_;

  // Lay out the batch: single-token sequences first, so their queries are contiguous rows.
  slots_.clear();
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t s = 0; s < batch.size(); ++s) {
      const bool single = batch[s].tokens.size() == 1;
      if (single == (pass == 0)) {
        slots_.push_back({static_cast<int64_t>(s), 0, static_cast<int64_t>(batch[s].tokens.size()),
                          batch[s].start_pos});
      }
    }
    if (pass == 0) {
      num_decode_slots_ = static_cast<int64_t>(slots_.size());
    }
  }
  int64_t row = 0;
  const int64_t dsize = kernels::DTypeSize(weights_->dtype);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    const ForwardSequence& seq = batch[slot.batch_index];
    slot.first_token = row;
    int32_t* table = &block_tables_[i * max_blocks_per_seq_];
    std::fill(table, table + max_blocks_per_seq_, 0);
    const int64_t used = std::min<int64_t>(seq.block_table.size(), max_blocks_per_seq_);
    std::copy(seq.block_table.begin(), seq.block_table.begin() + used, table);
    context_lens_[i] = static_cast<int32_t>(slot.start_pos + slot.num_tokens);
    for (int64_t j = 0; j < slot.num_tokens; ++j, ++row) {
      positions_[row] = static_cast<int32_t>(slot.start_pos + j);
      token_seq_[row] = static_cast<int32_t>(i);
      kernels::ConvertParams embed;
      embed.in = static_cast<const uint8_t*>(weights_->embedding) +
                 static_cast<int64_t>(seq.tokens[j]) * c.dim * dsize;
      embed.out = &x_[row * c.dim];
      embed.n = c.dim;
      embed.in_dtype = weights_->dtype;
      embed.out_dtype = DType::kF32;
      PD_RETURN_IF_ERROR(kernels::Convert(ctx_, embed));
    }
  }
  const int64_t num_tokens = row;

  for (int l = 0; l < c.n_layers; ++l) {
    PD_RETURN_IF_ERROR(Layer(l, num_tokens));
  }

  // Final norm and classifier for each sequence's last new token, in slot order. Compacted in
  // place: slot i's last row is >= i and beyond every earlier destination row.
  const int64_t num_seqs = static_cast<int64_t>(slots_.size());
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t last = slots_[i].first_token + slots_[i].num_tokens - 1;
    std::memmove(&x_[i * c.dim], &x_[last * c.dim], c.dim * sizeof(float));
  }
  PD_RETURN_IF_ERROR(RmsNormRows(ctx_, x_.data(), weights_->final_norm, xb_.data(), num_seqs,
                                 c.dim, c.rms_norm_eps));
  // MatMul with the classifier weights (the same dtype as every matrix).
  PD_RETURN_IF_ERROR(MatMul(xb_.data(), weights_->classifier, nullptr, logits_tmp_.data(),
                            num_seqs, c.dim, c.vocab_size, /*accumulate=*/false));
  for (int64_t i = 0; i < num_seqs; ++i) {
    std::memcpy(logits + slots_[i].batch_index * c.vocab_size, &logits_tmp_[i * c.vocab_size],
                c.vocab_size * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::Layer(int layer, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  const int64_t q_dim = c.q_dim();

  // Attention block.
  PD_RETURN_IF_ERROR(
      RmsNormRows(ctx_, x_.data(), w.attn_norm, xb_.data(), num_tokens, c.dim, c.rms_norm_eps));
  PD_RETURN_IF_ERROR(MatMul(xb_.data(), w.wq, w.bq, q_.data(), num_tokens, c.dim, q_dim, false));
  PD_RETURN_IF_ERROR(MatMul(xb_.data(), w.wk, w.bk, k_.data(), num_tokens, c.dim, c.kv_dim, false));
  PD_RETURN_IF_ERROR(MatMul(xb_.data(), w.wv, w.bv, v_.data(), num_tokens, c.dim, c.kv_dim, false));

  kernels::RopeParams rope;
  rope.q = q_.data();
  rope.k = k_.data();
  rope.positions = positions_.data();
  rope.inv_freq = inv_freq_.data();
  rope.num_tokens = num_tokens;
  rope.num_heads = c.n_heads;
  rope.num_kv_heads = c.n_kv_heads;
  rope.head_dim = c.head_dim;
  rope.q_token_stride = q_dim;
  rope.k_token_stride = c.kv_dim;
  rope.style = RopeStyleOf(c.rope_form);
  PD_RETURN_IF_ERROR(kernels::Rope(ctx_, rope));

  const kernels::KvCacheView cache = CacheView(layer);
  kernels::WriteKvParams write;
  write.k = k_.data();
  write.v = v_.data();
  write.k_token_stride = c.kv_dim;
  write.v_token_stride = c.kv_dim;
  write.cache = cache;
  write.num_tokens = num_tokens;
  write.positions = positions_.data();
  write.token_seq = token_seq_.data();
  write.block_tables = block_tables_.data();
  write.num_seqs = static_cast<int64_t>(slots_.size());
  write.max_blocks_per_seq = max_blocks_per_seq_;
  PD_RETURN_IF_ERROR(kernels::WriteKv(ctx_, write));

  if (num_decode_slots_ > 0) {
    kernels::DecodeAttentionParams d;
    d.q = q_.data();
    d.out = att_.data();
    d.q_seq_stride = q_dim;
    d.out_seq_stride = q_dim;
    d.cache = cache;
    d.block_tables = block_tables_.data();
    d.max_blocks_per_seq = max_blocks_per_seq_;
    d.context_lens = context_lens_.data();
    d.num_seqs = num_decode_slots_;
    d.num_heads = c.n_heads;
    PD_RETURN_IF_ERROR(kernels::DecodeAttention(ctx_, d));
  }
  for (size_t i = num_decode_slots_; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    kernels::PrefillAttentionParams p;
    p.q = &q_[slot.first_token * q_dim];
    p.out = &att_[slot.first_token * q_dim];
    p.q_token_stride = q_dim;
    p.out_token_stride = q_dim;
    p.cache = cache;
    p.block_table = &block_tables_[i * max_blocks_per_seq_];
    p.num_table_blocks = max_blocks_per_seq_;
    p.start_pos = slot.start_pos;
    p.num_tokens = slot.num_tokens;
    p.num_heads = c.n_heads;
    PD_RETURN_IF_ERROR(kernels::PrefillAttention(ctx_, p));
  }
  // x += attn Wo
  PD_RETURN_IF_ERROR(MatMul(att_.data(), w.wo, nullptr, x_.data(), num_tokens, q_dim, c.dim, true));

  // MLP block: x += W_down (silu(W_gate xb) * (W_up xb)).
  PD_RETURN_IF_ERROR(
      RmsNormRows(ctx_, x_.data(), w.ffn_norm, xb_.data(), num_tokens, c.dim, c.rms_norm_eps));
  PD_RETURN_IF_ERROR(
      MatMul(xb_.data(), w.w_gate, nullptr, gate_.data(), num_tokens, c.dim, c.hidden_dim, false));
  PD_RETURN_IF_ERROR(
      MatMul(xb_.data(), w.w_up, nullptr, up_.data(), num_tokens, c.dim, c.hidden_dim, false));
  kernels::SiluMulParams silu;
  silu.gate = gate_.data();
  silu.up = up_.data();
  silu.out = gate_.data();
  silu.num_rows = num_tokens;
  silu.dim = c.hidden_dim;
  silu.gate_row_stride = c.hidden_dim;
  silu.up_row_stride = c.hidden_dim;
  silu.out_row_stride = c.hidden_dim;
  PD_RETURN_IF_ERROR(kernels::SiluMul(ctx_, silu));
  return MatMul(gate_.data(), w.w_down, nullptr, x_.data(), num_tokens, c.hidden_dim, c.dim, true);
}

}  // namespace pd::engine
