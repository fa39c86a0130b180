#include "engine/model/llama_forward.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/type_names.h"

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
    return absl::InvalidArgumentError(
        absl::StrCat("kv pool: base must be set and num_blocks, block_size > 0, got ",
                     pool.num_blocks, ", ", pool.block_size));
  }
  if (options.max_batch_tokens <= 0 || options.max_seqs <= 0 ||
      options.max_seqs > options.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward options: need 0 < max_seqs <= max_batch_tokens, got ",
                     options.max_seqs, " and ", options.max_batch_tokens));
  }
  // Unimplemented naming PD_ENABLE_CUDA in builds without CUDA, FailedPrecondition without a
  // device: said before the kernel checks, which would only say "no kernels".
  PD_RETURN_IF_ERROR(kernels::CheckDeviceAvailable(ctx.device));
  if (!kernels::SupportsMatMul(ctx.device, weights->dtype) ||
      !kernels::SupportsAttention(ctx.device, pool.dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        "no kernels on this device for weight dtype ", kernels::DTypeName(weights->dtype),
        " with kv dtype ", kernels::DTypeName(pool.dtype)));
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
  PD_ASSIGN_OR_RETURN(f->inv_freq_host_, kernels::ComputeRopeInvFreq(rope));

  const int64_t t = options.max_batch_tokens;
  f->positions_.resize(t);
  f->token_seq_.resize(t);
  f->max_blocks_per_seq_ = (c.seq_len + pool.block_size - 1) / pool.block_size;
  f->block_tables_.resize(options.max_seqs * f->max_blocks_per_seq_);
  f->context_lens_.resize(options.max_seqs);

  // One workspace for the largest matmul of any layer at the largest batch.
  const int64_t shapes[][3] = {{t, c.dim, c.q_dim()},    {t, c.dim, c.kv_dim},
                               {t, c.q_dim(), c.dim},    {t, c.dim, c.hidden_dim},
                               {t, c.hidden_dim, c.dim}, {options.max_seqs, c.dim, c.vocab_size}};
  for (const auto& s : shapes) {
    kernels::MatMulParams p;
    p.num_rows = s[0];
    p.in_features = s[1];
    p.out_features = s[2];
    p.x_row_stride = s[1];
    p.y_row_stride = s[2];
    p.w_dtype = weights->dtype;
    f->workspace_bytes_ = std::max(f->workspace_bytes_, kernels::MatMulWorkspaceBytes(ctx, p));
  }
  // Decode attention's split partials (CUDA) share it: the ops run one at a time on one stream.
  kernels::DecodeAttentionParams decode;
  decode.num_seqs = options.max_seqs;
  decode.num_heads = c.n_heads;
  decode.max_blocks_per_seq = f->max_blocks_per_seq_;
  decode.cache = f->CacheView(0);
  f->workspace_bytes_ =
      std::max(f->workspace_bytes_, kernels::DecodeAttentionWorkspaceBytes(ctx, decode));
  PD_RETURN_IF_ERROR(f->AllocateScratch());
  return f;
}

absl::Status LlamaForward::AllocateScratch() {
  const ModelConfig& c = config_;
  const int64_t t = options_.max_batch_tokens;
  const int64_t wide = std::max<int64_t>(c.dim, c.q_dim());
  const bool on_device = ctx_.device != kernels::Device::kCpu || options_.staged_metadata;
  void *inv_freq = nullptr, *positions = nullptr, *token_seq = nullptr, *tables = nullptr,
       *lens = nullptr;
  // Pass 0 measures, pass 1 carves the allocation in the same order; pieces start 256-byte
  // aligned, empty pieces are nullptr.
  for (int pass = 0; pass < 2; ++pass) {
    int64_t offset = 0;
    auto carve = [&](int64_t bytes) -> void* {
      if (bytes == 0) {
        return nullptr;
      }
      void* p = pass == 0 ? nullptr : scratch_.as<uint8_t>() + offset;
      offset += (bytes + 255) / 256 * 256;
      return p;
    };
    x_ = static_cast<float*>(carve(t * c.dim * 4));
    xb_ = static_cast<float*>(carve(t * wide * 4));
    q_ = static_cast<float*>(carve(t * c.q_dim() * 4));
    k_ = static_cast<float*>(carve(t * c.kv_dim * 4));
    v_ = static_cast<float*>(carve(t * c.kv_dim * 4));
    att_ = static_cast<float*>(carve(t * c.q_dim() * 4));
    gate_ = static_cast<float*>(carve(t * c.hidden_dim * 4));
    up_ = static_cast<float*>(carve(t * c.hidden_dim * 4));
    logits_tmp_ = static_cast<float*>(carve(options_.max_seqs * int64_t{c.vocab_size} * 4));
    workspace_ = carve(workspace_bytes_);
    if (on_device) {
      inv_freq = carve(static_cast<int64_t>(inv_freq_host_.size()) * 4);
      positions = carve(static_cast<int64_t>(positions_.size()) * 4);
      token_seq = carve(static_cast<int64_t>(token_seq_.size()) * 4);
      tables = carve(static_cast<int64_t>(block_tables_.size()) * 4);
      lens = carve(static_cast<int64_t>(context_lens_.size()) * 4);
    }
    if (pass == 0) {
      PD_ASSIGN_OR_RETURN(scratch_, kernels::DeviceBuffer::Allocate(ctx_.device, offset));
    }
  }
  if (!on_device) {
    inv_freq_ = inv_freq_host_.data();
    d_positions_ = positions_.data();
    d_token_seq_ = token_seq_.data();
    d_block_tables_ = block_tables_.data();
    d_context_lens_ = context_lens_.data();
    return absl::OkStatus();
  }
  inv_freq_ = static_cast<const float*>(inv_freq);
  d_positions_ = static_cast<int32_t*>(positions);
  d_token_seq_ = static_cast<int32_t*>(token_seq);
  d_block_tables_ = static_cast<int32_t*>(tables);
  d_context_lens_ = static_cast<int32_t*>(lens);
  PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, inv_freq, inv_freq_host_.data(),
                                        static_cast<int64_t>(inv_freq_host_.size()) * 4));
  return kernels::SynchronizeStream(ctx_);
}

int64_t LlamaForward::block_bytes() const {
  return kernels::DenseKvBlockBytes(pool_.dtype, config_.n_layers, config_.n_kv_heads,
                                    pool_.block_size, config_.head_dim);
}

kernels::KvCacheView LlamaForward::CacheView(int layer) const {
  return kernels::DenseKvCacheView(pool_.base, pool_.dtype, pool_.num_blocks, config_.n_layers,
                                   config_.n_kv_heads, pool_.block_size, config_.head_dim, layer);
}

absl::Status LlamaForward::Validate(absl::Span<const ForwardSequence> batch) const {
  if (batch.empty() || static_cast<int64_t>(batch.size()) > options_.max_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: batch of ", batch.size(), " sequences, limit ", options_.max_seqs));
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
    if (seq.rope_offset != 0) {
      if (ctx_.device != kernels::Device::kCpu || options_.staged_metadata) {
        return absl::UnimplementedError(
            "forward: rope_offset (the sink + window KV policy) runs on kCpu only for now (#18)");
      }
      if (seq.rope_offset < 0 || end + seq.rope_offset > std::numeric_limits<int32_t>::max()) {
        return absl::OutOfRangeError(absl::StrCat("forward: sequence ", s, " rope offset ",
                                                  seq.rope_offset, " out of range"));
      }
    }
    if (end > config_.seq_len) {
      return absl::OutOfRangeError(absl::StrCat("forward: sequence ", s, " reaches position ", end,
                                                ", beyond the context of ", config_.seq_len));
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
                                                       ", outside the pool of ", pool_.num_blocks));
      }
    }
    for (uint32_t token : seq.tokens) {
      if (token >= static_cast<uint32_t>(config_.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: token id ", token, " >= vocab size ", config_.vocab_size));
      }
    }
    total += n;
  }
  if (total > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward: ", total, " tokens in the batch, limit ", options_.max_batch_tokens));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::MatMul(const float* x, const void* w, const float* w_scales,
                                  const float* bias, float* y, int64_t num_rows, int64_t in,
                                  int64_t out, bool accumulate) {
  kernels::MatMulParams p;
  p.x = x;
  p.w = w;
  p.w_scales = w_scales;
  p.bias = bias;
  p.y = y;
  p.num_rows = num_rows;
  p.in_features = in;
  p.out_features = out;
  p.x_row_stride = in;
  p.y_row_stride = out;
  p.w_dtype = weights_->dtype;
  p.accumulate = accumulate;
  p.workspace = workspace_;
  p.workspace_bytes = workspace_bytes_;
  return kernels::MatMul(ctx_, p);
}

absl::Status LlamaForward::CopyBlocksShifted(absl::Span<const int32_t> src,
                                             absl::Span<const int32_t> dst, int64_t num_tokens,
                                             int64_t delta) {
  const ModelConfig& c = config_;
  if (ctx_.device != kernels::Device::kCpu || options_.staged_metadata) {
    return absl::UnimplementedError("forward: CopyBlocksShifted runs on kCpu only for now (#18)");
  }
  const int64_t needed = (num_tokens + pool_.block_size - 1) / pool_.block_size;
  if (num_tokens <= 0 || delta < 0 || delta > std::numeric_limits<int32_t>::max() ||
      static_cast<int64_t>(src.size()) < needed || static_cast<int64_t>(dst.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward: CopyBlocksShifted of ", num_tokens, " tokens by ", delta, " needs ", needed,
        " source and destination blocks, got ", src.size(), " and ", dst.size()));
  }
  for (int64_t i = 0; i < needed; ++i) {
    for (int64_t j = 0; j < needed; ++j) {
      if (src[i] == dst[j]) {
        return absl::InvalidArgumentError(absl::StrCat("forward: CopyBlocksShifted: block ", src[i],
                                                       " is source and destination"));
      }
    }
  }
  // Chunks of at most max_batch_tokens rows through the k_/v_ scratch; q_ carries the keys
  // through Rope (it rotates its "q" rows, the keys here, and no kv rows).
  std::vector<int32_t> pos, shifted;
  for (int64_t first = 0; first < num_tokens; first += options_.max_batch_tokens) {
    const int64_t n = std::min(options_.max_batch_tokens, num_tokens - first);
    pos.resize(n);
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(first));
    shifted.assign(n, static_cast<int32_t>(delta));
    for (int l = 0; l < c.n_layers; ++l) {
      kernels::ReadKvParams read;
      read.k = q_;
      read.v = v_;
      read.k_token_stride = c.kv_dim;
      read.v_token_stride = c.kv_dim;
      read.cache = CacheView(l);
      read.num_tokens = n;
      read.positions = pos.data();
      read.block_tables = src.data();
      read.max_blocks_per_seq = needed;
      PD_RETURN_IF_ERROR(kernels::ReadKv(ctx_, read));
      kernels::RopeParams rope;
      rope.q = q_;
      rope.positions = shifted.data();
      rope.inv_freq = inv_freq_;
      rope.num_tokens = n;
      rope.num_heads = c.n_kv_heads;
      rope.num_kv_heads = 0;
      rope.head_dim = c.head_dim;
      rope.q_token_stride = c.kv_dim;
      rope.style = RopeStyleOf(c.rope_form);
      PD_RETURN_IF_ERROR(kernels::Rope(ctx_, rope));
      kernels::WriteKvParams write;
      write.k = q_;
      write.v = v_;
      write.k_token_stride = c.kv_dim;
      write.v_token_stride = c.kv_dim;
      write.cache = read.cache;
      write.num_tokens = n;
      write.positions = pos.data();
      write.block_tables = dst.data();
      write.max_blocks_per_seq = needed;
      PD_RETURN_IF_ERROR(kernels::WriteKv(ctx_, write));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LlamaForward::PrepareBatch(absl::Span<const ForwardSequence> batch) {
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
  bool offsets = false;
  rope_positions_.resize(positions_.size());
  const int64_t dsize = kernels::DTypeSize(weights_->embedding_dtype);
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
      rope_positions_[row] = static_cast<int32_t>(slot.start_pos + j + seq.rope_offset);
      offsets = offsets || seq.rope_offset != 0;
      token_seq_[row] = static_cast<int32_t>(i);
      kernels::ConvertParams embed;  // on kCuda: a device row of the device embedding
      embed.in = static_cast<const uint8_t*>(weights_->embedding) +
                 static_cast<int64_t>(seq.tokens[j]) * c.dim * dsize;
      embed.out = &x_[row * c.dim];
      embed.n = c.dim;
      embed.in_dtype = weights_->embedding_dtype;
      embed.out_dtype = DType::kF32;
      PD_RETURN_IF_ERROR(kernels::Convert(ctx_, embed));
    }
  }
  d_rope_positions_ = offsets ? rope_positions_.data() : d_positions_;  // (Validate: kCpu)
  if (ctx_.device != kernels::Device::kCpu || options_.staged_metadata) {
    // The kernels read these from device memory. Pageable sources: CUDA has staged them by the
    // time each call returns, so the host vectors may be rebuilt by the next Forward().
    const int64_t num_seqs = static_cast<int64_t>(slots_.size());
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_positions_, positions_.data(), row * 4));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_token_seq_, token_seq_.data(), row * 4));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_block_tables_, block_tables_.data(),
                                          num_seqs * max_blocks_per_seq_ * 4));
    PD_RETURN_IF_ERROR(
        kernels::CopyAsync(ctx_, d_context_lens_, context_lens_.data(), num_seqs * 4));
  }
  return row;
}

absl::Status LlamaForward::Forward(absl::Span<const ForwardSequence> batch, float* logits) {
  PD_RETURN_IF_ERROR(Validate(batch));
  const ModelConfig& c = config_;
  PD_ASSIGN_OR_RETURN(const int64_t num_tokens, PrepareBatch(batch));

  for (int l = 0; l < c.n_layers; ++l) {
    PD_RETURN_IF_ERROR(Layer(l, num_tokens));
  }

  // Final norm and classifier for each sequence's last new token, in slot order. Compacted in
  // place: slot i's last row is >= i and beyond every earlier destination row, so the copies
  // (in order; on one stream on kCuda) never read a row already overwritten.
  const int64_t num_seqs = static_cast<int64_t>(slots_.size());
  const int64_t row_bytes = c.dim * static_cast<int64_t>(sizeof(float));
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t last = slots_[i].first_token + slots_[i].num_tokens - 1;
    if (last != i) {
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, &x_[i * c.dim], &x_[last * c.dim], row_bytes));
    }
  }
  PD_RETURN_IF_ERROR(
      RmsNormRows(ctx_, x_, weights_->final_norm, xb_, num_seqs, c.dim, c.rms_norm_eps));
  // MatMul with the classifier weights (the same dtype as every matrix).
  PD_RETURN_IF_ERROR(MatMul(xb_, weights_->classifier, weights_->classifier_scales, nullptr,
                            logits_tmp_, num_seqs, c.dim, c.vocab_size, /*accumulate=*/false));
  const int64_t vocab_bytes = c.vocab_size * static_cast<int64_t>(sizeof(float));
  for (int64_t i = 0; i < num_seqs; ++i) {
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, logits + slots_[i].batch_index * c.vocab_size,
                                          &logits_tmp_[i * c.vocab_size], vocab_bytes));
  }
  // The one synchronisation of the step (a no-op on kCpu): the logits are on the host after it,
  // and a fault of any kernel of the step surfaces here.
  return kernels::SynchronizeStream(ctx_);
}

absl::Status LlamaForward::Layer(int layer, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  const int64_t q_dim = c.q_dim();

  // Attention block.
  PD_RETURN_IF_ERROR(RmsNormRows(ctx_, x_, w.attn_norm, xb_, num_tokens, c.dim, c.rms_norm_eps));
  PD_RETURN_IF_ERROR(MatMul(xb_, w.wq, w.wq_scales, w.bq, q_, num_tokens, c.dim, q_dim, false));
  PD_RETURN_IF_ERROR(MatMul(xb_, w.wk, w.wk_scales, w.bk, k_, num_tokens, c.dim, c.kv_dim, false));
  PD_RETURN_IF_ERROR(MatMul(xb_, w.wv, w.wv_scales, w.bv, v_, num_tokens, c.dim, c.kv_dim, false));

  kernels::RopeParams rope;
  rope.q = q_;
  rope.k = k_;
  rope.positions = d_rope_positions_;
  rope.inv_freq = inv_freq_;
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
  write.k = k_;
  write.v = v_;
  write.k_token_stride = c.kv_dim;
  write.v_token_stride = c.kv_dim;
  write.cache = cache;
  write.num_tokens = num_tokens;
  write.positions = d_positions_;
  write.token_seq = d_token_seq_;
  write.block_tables = d_block_tables_;
  write.num_seqs = static_cast<int64_t>(slots_.size());
  write.max_blocks_per_seq = max_blocks_per_seq_;
  PD_RETURN_IF_ERROR(kernels::WriteKv(ctx_, write));

  if (num_decode_slots_ > 0) {
    kernels::DecodeAttentionParams d;
    d.q = q_;
    d.out = att_;
    d.q_seq_stride = q_dim;
    d.out_seq_stride = q_dim;
    d.cache = cache;
    d.block_tables = d_block_tables_;
    d.max_blocks_per_seq = max_blocks_per_seq_;
    d.context_lens = d_context_lens_;
    d.num_seqs = num_decode_slots_;
    d.num_heads = c.n_heads;
    d.workspace = workspace_;
    d.workspace_bytes = workspace_bytes_;
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
    p.block_table = d_block_tables_ + i * max_blocks_per_seq_;
    p.num_table_blocks = max_blocks_per_seq_;
    p.start_pos = slot.start_pos;
    p.num_tokens = slot.num_tokens;
    p.num_heads = c.n_heads;
    PD_RETURN_IF_ERROR(kernels::PrefillAttention(ctx_, p));
  }
  // x += attn Wo
  PD_RETURN_IF_ERROR(MatMul(att_, w.wo, w.wo_scales, nullptr, x_, num_tokens, q_dim, c.dim, true));

  // MLP block: x += W_down (silu(W_gate xb) * (W_up xb)).
  PD_RETURN_IF_ERROR(RmsNormRows(ctx_, x_, w.ffn_norm, xb_, num_tokens, c.dim, c.rms_norm_eps));
  PD_RETURN_IF_ERROR(MatMul(xb_, w.w_gate, w.w_gate_scales, nullptr, gate_, num_tokens, c.dim,
                            c.hidden_dim, false));
  PD_RETURN_IF_ERROR(
      MatMul(xb_, w.w_up, w.w_up_scales, nullptr, up_, num_tokens, c.dim, c.hidden_dim, false));
  kernels::SiluMulParams silu;
  silu.gate = gate_;
  silu.up = up_;
  silu.out = gate_;
  silu.num_rows = num_tokens;
  silu.dim = c.hidden_dim;
  silu.gate_row_stride = c.hidden_dim;
  silu.up_row_stride = c.hidden_dim;
  silu.out_row_stride = c.hidden_dim;
  PD_RETURN_IF_ERROR(kernels::SiluMul(ctx_, silu));
  return MatMul(gate_, w.w_down, w.w_down_scales, nullptr, x_, num_tokens, c.hidden_dim, c.dim,
                true);
}

}  // namespace pd::engine
