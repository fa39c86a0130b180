#include "engine/model/llama_forward.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "common/threads/parallel_for.h"
#include "engine/model/device_weights.h"
#include "engine/parallel/collective.h"
#include "kernels/attention.h"
#include "kernels/attention_mass.h"
#include "kernels/convert.h"
#include "kernels/copy.h"
#include "kernels/elementwise.h"
#include "kernels/latent_attention.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

using kernels::DType;

kernels::RopeStyle RopeStyleOf(RopeForm form) {
  return form == RopeForm::kInterleaved ? kernels::RopeStyle::kInterleaved
                                        : kernels::RopeStyle::kRotateHalf;
}

// gate = silu(gate) * up, over `rows` rows of `width` (the SwiGLU of an MLP or an expert).
absl::Status SiluMulRows(const kernels::OpContext& ctx, float* gate, const float* up, int64_t rows,
                         int64_t width) {
  kernels::SiluMulParams p;
  p.gate = gate;
  p.up = up;
  p.out = gate;
  p.num_rows = rows;
  p.dim = width;
  p.gate_row_stride = width;
  p.up_row_stride = width;
  p.out_row_stride = width;
  return kernels::SiluMul(ctx, p);
}

// DeepSeek's yarn magnitude correction: 0.1 m ln(s) + 1, or 1 for s <= 1.
double YarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// DeepSeek's yarn inverse frequencies (DeepseekV2YarnRotaryEmbedding), computed in double:
// dims below the correction range keep theta^(-2i/d), dims above it are divided by factor, a
// linear ramp blends the range between.
std::vector<float> YarnInvFreq(int64_t dim, double theta, const YarnRopeScaling& y) {
  const double factor = y.factor, old = y.original_max_position_embeddings;
  auto correction = [&](double rotations) {
    return static_cast<double>(dim) * std::log(old / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  const double low = std::max(std::floor(correction(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction(y.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> out(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double extra = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    out[i] = static_cast<float>(extra / factor * ramp + extra * (1.0 - ramp));
  }
  return out;
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

// rows rows of `width` floats from src (src_stride floats apart) to dst (dst_stride apart), on
// the context's device: one CopyBlocks of identity-indexed "blocks".
absl::Status CopyStrided(const kernels::OpContext& ctx, const float* src, int64_t src_stride,
                         float* dst, int64_t dst_stride, int64_t width, int64_t rows) {
  kernels::CopyBlocksParams p;
  p.src = src;
  p.dst = dst;
  p.num_copies = rows;
  p.block_bytes = width * 4;
  p.src_block_stride_bytes = src_stride * 4;
  p.dst_block_stride_bytes = dst_stride * 4;
  p.src_num_blocks = p.dst_num_blocks = rows;
  return kernels::CopyBlocks(ctx, p);
}

}  // namespace

// A tensor-parallel group (the coordinator's): the shards, each rank's thread team and
// forward pass, and the threads running ranks 1.. (rank 0 runs on the caller's thread).
struct LlamaForward::TpGroup {
  TpPlan plan;
  std::unique_ptr<ShmCollectiveGroup> comm;
  std::vector<std::unique_ptr<ModelWeights>> shards;
  std::vector<std::unique_ptr<DeviceWeights>> uploads;  // the shards' copies (staged metadata)
  std::vector<std::unique_ptr<ParallelFor>> teams;
  std::vector<std::unique_ptr<LlamaForward>> ranks;

  // Handing a call to the rank threads: `seq` counts posted calls, `remaining` the ranks 1..
  // still running the current one. Both sides spin (kSpin) before sleeping on `cv`, so
  // back-to-back steps skip the wake-ups; `mu` orders the sleeps with the wake-ups.
  static constexpr auto kSpin = std::chrono::microseconds(200);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<uint64_t> seq{0};
  std::atomic<int> remaining{0};
  bool stop = false;                                                // guarded by mu
  const std::function<absl::Status(LlamaForward&)>* job = nullptr;  // set before seq moves
  std::vector<absl::Status> results;  // one per rank, each written by its rank
  std::vector<std::thread> threads;

  // Spins until done() or kSpin passed (yielding the core now and then when there are more
  // busy threads than cores); then done(). Sleeping between steps costs more than the spin: a
  // futex wake-up takes tens of microseconds in a VM, and Linux tends to wake the sleeper on
  // the waker's core, so two ranks end up sharing one (measured: stories260K decode at TP 2
  // ran 4x slower with a 50 us spin than with 200 us).
  bool oversubscribed = false;  // more threads than cores: spinners yield
  template <typename Done>
  bool SpinFor(Done done) const {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0;; ++i) {
      if (done()) return true;
      if ((i & 63) != 63) continue;
      if (std::chrono::steady_clock::now() > until) return done();
      if (oversubscribed) std::this_thread::yield();
    }
  }

  void RankLoop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      if (!SpinFor([&] { return seq.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || seq.load(std::memory_order_acquire) != seen; });
        if (stop) return;
      }
      seen = seq.load(std::memory_order_acquire);
      absl::Status s = (*job)(*ranks[static_cast<size_t>(rank)]);
      if (!s.ok()) comm->rank(rank)->Abort();
      results[static_cast<size_t>(rank)] = std::move(s);
      if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }

  ~TpGroup() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (std::thread& t : threads) t.join();
  }
};

LlamaForward::LlamaForward(const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx,
                           ForwardOptions options)
    : weights_(weights), config_(weights->config), pool_(pool), ctx_(ctx), options_(options) {}

LlamaForward::~LlamaForward() = default;

GraphStats LlamaForward::graph_stats() const {
  return tp_group_ != nullptr ? tp_group_->ranks.front()->graph_stats_ : graph_stats_;
}

const std::vector<int64_t>& LlamaForward::expert_tokens() const {
  // Every rank routes the same tokens (the router is whole on each): rank 0's counts are all.
  return tp_group_ != nullptr ? tp_group_->ranks.front()->expert_tokens_ : expert_tokens_;
}

std::vector<int64_t> LlamaForward::tp_wait_nanos() const {
  std::vector<int64_t> out;
  if (tp_group_ == nullptr) return out;
  for (int r = 0; r < tp_group_->comm->size(); ++r) {
    out.push_back(tp_group_->comm->rank(r)->WaitNanos());
  }
  return out;
}

absl::Status LlamaForward::RunRanks(const std::function<absl::Status(LlamaForward&)>& fn) {
  TpGroup& g = *tp_group_;
  const size_t n = g.ranks.size();
  g.results.assign(n, absl::OkStatus());
  g.job = &fn;
  g.remaining.store(static_cast<int>(n) - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(g.mu);
    g.seq.fetch_add(1, std::memory_order_acq_rel);
  }
  g.cv.notify_all();
  absl::Status first = fn(*g.ranks[0]);
  if (!first.ok()) g.comm->rank(0)->Abort();
  if (!g.SpinFor([&g] { return g.remaining.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(g.mu);
    g.cv.wait(lock, [&g] { return g.remaining.load(std::memory_order_acquire) == 0; });
  }
  g.job = nullptr;
  if (g.comm->aborted()) g.comm->Reset();  // every rank is out of its collectives
  // The failure itself (the lowest rank's), not the Aborted it caused in its peers.
  g.results[0] = std::move(first);
  for (const absl::Status& s : g.results) {
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) return s;
  }
  for (const absl::Status& s : g.results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaForward>> LlamaForward::CreateTensorParallel(
    const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx, ForwardOptions options,
    bool measure_only) {
  const int n = options.tensor_parallel;
  if (ctx.device != kernels::Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor_parallel ", n, ": tensor parallelism runs on the CPU only so far (no NCCL ranks)"));
  }
  PD_ASSIGN_OR_RETURN(TpPlan plan, PlanTensorParallel(weights->config, n));
  const std::vector<KvPoolView>& own = options.tp_rank_pools;
  if (!own.empty()) {
    if (own.size() != static_cast<size_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", n, ": ", own.size(),
                                                     " per-rank KV pools, need one per rank"));
    }
    for (size_t r = 0; r < own.size(); ++r) {
      if (own[r].dtype != pool.dtype || own[r].block_size != pool.block_size ||
          own[r].num_blocks != pool.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor_parallel ", n, ": rank ", r, "'s KV pool (", own[r].num_blocks, " blocks of ",
            own[r].block_size, " tokens, ", kernels::DTypeName(own[r].dtype),
            ") differs from the worker's (", pool.num_blocks, " of ", pool.block_size, ", ",
            kernels::DTypeName(pool.dtype), ")"));
      }
    }
  }
  ForwardOptions rank_options = options;
  rank_options.tensor_parallel = 1;
  rank_options.tp_rank_pools.clear();
  const int threads = ctx.parallel != nullptr ? ctx.parallel->num_threads() : 1;
  std::unique_ptr<LlamaForward> f(new LlamaForward(weights, pool, ctx, options));
  auto g = std::make_unique<TpGroup>();
  g->plan = plan;
  const int team_threads = std::max(1, threads / n);
  g->oversubscribed =
      static_cast<unsigned>(n * team_threads) > std::max(1u, std::thread::hardware_concurrency());
  g->comm = std::make_unique<ShmCollectiveGroup>(
      n, options.max_batch_tokens * int64_t{weights->config.dim}, g->oversubscribed);
  int64_t scratch = 0;
  for (int r = 0; r < n; ++r) {
    TpRankInit init;
    init.plan = plan.ranks[static_cast<size_t>(r)];
    init.comm = g->comm->rank(r);
    init.shared_kv = plan.shared_kv;
    init.pool_kv_heads = plan.pool_kv_heads;
    init.own_pool = !own.empty();
    const KvPoolView rank_pool = own.empty() ? pool : own[static_cast<size_t>(r)];
    if (measure_only) {
      ModelWeights sizes;  // the sizes are all CreateImpl reads when it does not allocate
      sizes.config = ShardConfig(weights->config, init.plan);
      sizes.dtype = weights->dtype;
      PD_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> rank,
                          CreateImpl(&sizes, rank_pool, ctx, rank_options, false, &init));
      scratch += rank->scratch_bytes_;
      continue;
    }
    PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> shard, ShardWeights(*weights, plan, r));
    ParallelFor::Options team;
    team.num_threads = team_threads;
    team.name = absl::StrCat("pd-tp", r);
    g->teams.push_back(std::make_unique<ParallelFor>(team));
    kernels::OpContext rank_ctx = ctx;
    rank_ctx.parallel = g->teams.back().get();
    const ModelWeights* rank_weights = shard.get();
    if (options.staged_metadata) {
      // The device path's layout: each rank's shard uploaded on its own (on the host here).
      PD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> up,
                          DeviceWeights::Upload(*shard, rank_ctx));
      rank_weights = &up->weights();
      g->uploads.push_back(std::move(up));
    }
    PD_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> rank,
                        CreateImpl(rank_weights, rank_pool, rank_ctx, rank_options, true, &init));
    scratch += rank->scratch_bytes_;
    g->shards.push_back(std::move(shard));
    g->ranks.push_back(std::move(rank));
  }
  f->scratch_bytes_ = scratch;
  if (measure_only) return f;
  for (int r = 1; r < n; ++r) {
    TpGroup* group = g.get();
    g->threads.emplace_back([group, r] { group->RankLoop(r); });
  }
  f->tp_group_ = std::move(g);
  return f;
}

absl::StatusOr<std::unique_ptr<LlamaForward>> LlamaForward::Create(const ModelWeights* weights,
                                                                   KvPoolView pool,
                                                                   kernels::OpContext ctx,
                                                                   ForwardOptions options) {
  if (options.tensor_parallel != 1) {
    return CreateTensorParallel(weights, pool, ctx, options, /*measure_only=*/false);
  }
  return CreateImpl(weights, pool, ctx, options, /*allocate=*/true);
}

absl::StatusOr<int64_t> LlamaForward::ScratchBytes(const ModelWeights* weights, KvPoolView pool,
                                                   kernels::OpContext ctx, ForwardOptions options) {
  if (options.tensor_parallel != 1) {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> f,
                        CreateTensorParallel(weights, pool, ctx, options, /*measure_only=*/true));
    return f->scratch_bytes_;
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> f,
                      CreateImpl(weights, pool, ctx, options, /*allocate=*/false));
  return f->scratch_bytes_;
}

absl::StatusOr<std::unique_ptr<LlamaForward>> LlamaForward::CreateImpl(
    const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx, ForwardOptions options,
    bool allocate, const TpRankInit* tp) {
  PD_RETURN_IF_ERROR(weights->config.Validate());
  if ((allocate && pool.base == nullptr) || pool.num_blocks <= 0 || pool.block_size <= 0) {
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
  const ModelConfig& config = weights->config;
  if (config.mla() && config.yarn.has_value() && ctx.device != kernels::Device::kCpu &&
      YarnMscale(config.yarn->factor, config.yarn->mscale) !=
          YarnMscale(config.yarn->factor, config.yarn->mscale_all_dim)) {
    // The rotated parts' scale is applied on the host (DeepSeek's published configs have
    // mscale == mscale_all_dim, which makes it 1).
    return absl::UnimplementedError(
        absl::StrCat(ArchitectureName(config.architecture), ": yarn mscale ", config.yarn->mscale,
                     " != mscale_all_dim ", config.yarn->mscale_all_dim,
                     " scales MLA's rotated parts on the CPU only so far"));
  }
  if (config.mla() && config.mla_latent_dim() > kernels::kMaxLatentEntryDim) {
    // Said at load rather than by every step's attention.
    return absl::UnimplementedError(
        absl::StrCat(ArchitectureName(config.architecture), ": an MLA cache entry of ",
                     config.mla_latent_dim(), " elements (kv_lora_rank ", config.kv_lora_rank,
                     " + qk_rope_head_dim ", config.qk_rope_head_dim, ") is above the ",
                     kernels::kMaxLatentEntryDim, " the latent attention kernels support"));
  }
  std::unique_ptr<LlamaForward> f(new LlamaForward(weights, pool, ctx, options));
  const ModelConfig& c = f->config_;
  if (tp != nullptr) {
    f->tp_ = tp->plan;
    f->tp_comm_ = tp->comm;
    f->tp_shared_kv_ = tp->shared_kv;
    f->tp_pool_kv_heads_ = tp->pool_kv_heads;
    f->tp_own_pool_ = tp->own_pool;
    // In a pool of its own a rank writes (and moves) every head it reads; ranks sharing a KV
    // head each keep a copy, so none waits for another's write.
    if (tp->own_pool) f->tp_.writes_kv = true;
  }
  if (c.moe()) {
    f->expert_tokens_.assign(static_cast<size_t>(c.n_layers) * c.n_experts, 0);
  }
  kernels::RopeFreqConfig rope;
  rope.head_dim = c.rope_dim();
  rope.theta = c.rope_theta;
  if (c.rope_scaling.has_value()) {
    rope.llama3.enabled = true;
    rope.llama3.factor = c.rope_scaling->factor;
    rope.llama3.low_freq_factor = c.rope_scaling->low_freq_factor;
    rope.llama3.high_freq_factor = c.rope_scaling->high_freq_factor;
    rope.llama3.original_max_position_embeddings = c.rope_scaling->original_max_position_embeddings;
  }
  PD_ASSIGN_OR_RETURN(f->inv_freq_host_, kernels::ComputeRopeInvFreq(rope));
  if (c.yarn.has_value()) {
    f->inv_freq_host_ = YarnInvFreq(c.rope_dim(), c.rope_theta, *c.yarn);
  }

  const int64_t t = options.max_batch_tokens;
  f->positions_.resize(2 * t);  // [0, t) cache slots, [t, 2t) RoPE positions
  f->token_seq_.resize(t);
  f->token_ids_.resize(t);
  f->max_blocks_per_seq_ = (c.seq_len + pool.block_size - 1) / pool.block_size;
  f->block_tables_.resize(options.max_seqs * f->max_blocks_per_seq_);
  f->context_lens_.resize(options.max_seqs);
  f->temperature_.resize(options.max_seqs);
  f->top_p_.resize(options.max_seqs);
  f->top_k_.resize(options.max_seqs);
  f->slot_tokens_.resize(options.max_seqs);
  f->seeds_.resize(options.max_seqs);
  f->steps_.resize(options.max_seqs);
  f->mask_words_ = (int64_t{c.vocab_size} + 31) / 32;
  f->mask_.assign(options.max_seqs * f->mask_words_, ~0u);
  f->min_p_.resize(options.max_seqs);
  // Staged edits go up in chunks of 256 a sequence (a long penalised output's distinct tokens,
  // or a repetition penalty's prompt, take a few chunks), at least 512.
  f->edit_chunk_ = std::max<int64_t>(512, options.max_seqs * 256);
  if (ctx.device == kernels::Device::kCpu) {
    kernels::SamplingParams sp;  // the most any call needs: every row sampling
    sp.num_seqs = options.max_seqs;
    sp.vocab_size = sp.logits_stride = c.vocab_size;
    sp.temperature = f->temperature_.data();
    f->sample_ws_.resize(kernels::SamplingWorkspaceBytes(ctx, sp));
  }

  // One workspace for the largest matmul of any layer at the largest batch.
  const int64_t width = c.mlp_width();
  const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : c.dim;
  const int64_t shapes[][3] = {{t, c.dim, c.q_dim()},
                               {t, c.dim, c.kv_dim},
                               {t, c.q_dim(), c.dim},
                               {t, c.dim, width},
                               {t, width, c.dim},
                               {options.max_seqs, c.dim, c.vocab_size},
                               {t, c.dim, std::max(c.n_experts, 1)},
                               // MLA: q_a_proj, q_b_proj, kv_a_proj_with_mqa, o_proj
                               {t, c.dim, std::max(c.q_lora_rank, 1)},
                               {t, q_in, c.q_dim()},
                               {t, c.dim, std::max(c.mla_latent_dim(), 1)},
                               {t, c.attn_out_dim(), c.dim}};
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
  PD_RETURN_IF_ERROR(f->AllocateScratch(/*measure_only=*/!allocate));
  return f;
}

absl::Status LlamaForward::AllocateScratch(bool measure_only) {
  const ModelConfig& c = config_;
  const int64_t t = options_.max_batch_tokens;
  const int64_t wide = std::max<int64_t>(c.dim, c.q_dim());
  const bool on_device = Staged();
  void *inv_freq = nullptr, *positions = nullptr, *token_seq = nullptr, *tables = nullptr,
       *lens = nullptr, *token_ids = nullptr, *temperature = nullptr, *top_p = nullptr,
       *top_k = nullptr, *tokens = nullptr, *seeds = nullptr, *steps = nullptr, *shift = nullptr,
       *mask = nullptr, *min_p = nullptr, *edits = nullptr, *edit_rows = nullptr;
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
    att_ = static_cast<float*>(carve(t * std::max(c.q_dim(), c.attn_out_dim()) * 4));
    gate_ = static_cast<float*>(carve(t * c.mlp_width() * 4));
    up_ = static_cast<float*>(carve(t * c.mlp_width() * 4));
    if (c.moe()) {
      router_logits_ = static_cast<float*>(carve(t * c.n_experts * 4));
      moe_in_ = static_cast<float*>(carve(t * c.dim * 4));
      moe_out_ = static_cast<float*>(carve(t * c.dim * 4));
      moe_sum_ = static_cast<float*>(carve(t * c.dim * 4));
      if (on_device) {  // the packed routing: every token's top_k experts
        d_moe_rows_ = static_cast<int32_t*>(carve(t * c.n_experts_per_tok * 4));
        d_moe_weights_ = static_cast<float*>(carve(t * c.n_experts_per_tok * 4));
      }
    }
    if (c.mla()) {
      mla_qa_ = static_cast<float*>(carve(t * std::max(c.q_lora_rank, 1) * 4));
      mla_latent_ = static_cast<float*>(carve(t * int64_t{c.mla_latent_dim()} * 4));
      mla_qpe_ = static_cast<float*>(carve(t * int64_t{c.n_heads} * c.qk_rope_head_dim * 4));
      mla_query_ = static_cast<float*>(carve(t * int64_t{c.n_heads} * c.mla_latent_dim() * 4));
      mla_sum_ = static_cast<float*>(carve(t * int64_t{c.n_heads} * c.kv_lora_rank * 4));
    }
    logits_tmp_ = static_cast<float*>(carve(options_.max_seqs * int64_t{c.vocab_size} * 4));
    if (tp_comm_ != nullptr) {
      tp_partial_ = static_cast<float*>(carve(t * c.dim * 4));
      tp_logits_ = static_cast<float*>(carve(options_.max_seqs * tp_.vocab_count * 4));
      if (on_device) d_tp_embed_ids_ = static_cast<int32_t*>(carve(2 * t * 4));
    }
    workspace_ = carve(workspace_bytes_);
    if (on_device) {
      inv_freq = carve(static_cast<int64_t>(inv_freq_host_.size()) * 4);
      positions = carve(static_cast<int64_t>(positions_.size()) * 4);
      token_seq = carve(static_cast<int64_t>(token_seq_.size()) * 4);
      token_ids = carve(static_cast<int64_t>(token_ids_.size()) * 4);
      tables = carve(static_cast<int64_t>(block_tables_.size()) * 4);
      lens = carve(static_cast<int64_t>(context_lens_.size()) * 4);
      const int64_t seqs = options_.max_seqs;
      temperature = carve(seqs * 4);
      top_p = carve(seqs * 4);
      top_k = carve(seqs * 4);
      tokens = carve(seqs * 4);
      seeds = carve(seqs * 8);
      steps = carve(seqs * 8);
      mask = carve(static_cast<int64_t>(mask_.size()) * 4);
      min_p = carve(seqs * 4);
      edits = carve(edit_chunk_ * static_cast<int64_t>(sizeof(kernels::LogitEdit)));
      edit_rows = carve(edit_chunk_ * 4);
      shift = carve((2 * max_blocks_per_seq_ + 2 * t) * 4);  // CopyBlocksShifted's metadata
      // AttentionMass's rows (max, sum) for a chunk (kCuda; the staged host path carves it too).
      mass_stats_ = static_cast<float*>(
          carve(kernels::AttentionMassWorkspaceFloats(t, int64_t{c.n_heads}) * 4));
    }
    if (pass == 0) {
      scratch_bytes_ = offset;
      if (measure_only) {
        return absl::OkStatus();
      }
      PD_ASSIGN_OR_RETURN(scratch_, kernels::DeviceBuffer::Allocate(ctx_.device, offset));
    }
  }
  if (!on_device) {
    inv_freq_ = inv_freq_host_.data();
    d_positions_ = positions_.data();
    d_rope_positions_ = positions_.data() + t;
    d_token_seq_ = token_seq_.data();
    d_token_ids_ = token_ids_.data();
    d_block_tables_ = block_tables_.data();
    d_context_lens_ = context_lens_.data();
    d_temperature_ = temperature_.data();
    d_top_p_ = top_p_.data();
    d_top_k_ = top_k_.data();
    d_tokens_ = slot_tokens_.data();
    d_seeds_ = seeds_.data();
    d_steps_ = steps_.data();
    d_mask_ = mask_.data();
    d_min_p_ = min_p_.data();
    return absl::OkStatus();  // edits: ApplyEdits passes the host vectors
  }
  inv_freq_ = static_cast<const float*>(inv_freq);
  d_positions_ = static_cast<int32_t*>(positions);
  d_rope_positions_ = d_positions_ + t;
  d_shift_ = static_cast<int32_t*>(shift);
  d_token_seq_ = static_cast<int32_t*>(token_seq);
  d_token_ids_ = static_cast<int32_t*>(token_ids);
  d_block_tables_ = static_cast<int32_t*>(tables);
  d_context_lens_ = static_cast<int32_t*>(lens);
  d_temperature_ = static_cast<float*>(temperature);
  d_top_p_ = static_cast<float*>(top_p);
  d_top_k_ = static_cast<int32_t*>(top_k);
  d_tokens_ = static_cast<int32_t*>(tokens);
  d_seeds_ = static_cast<uint64_t*>(seeds);
  d_steps_ = static_cast<uint64_t*>(steps);
  d_mask_ = static_cast<uint32_t*>(mask);
  d_min_p_ = static_cast<float*>(min_p);
  d_edits_ = static_cast<kernels::LogitEdit*>(edits);
  d_edit_rows_ = static_cast<int32_t*>(edit_rows);
  PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, inv_freq, inv_freq_host_.data(),
                                        static_cast<int64_t>(inv_freq_host_.size()) * 4));
  return kernels::SynchronizeStream(ctx_);
}

int64_t LlamaForward::block_bytes() const {
  return kernels::DenseKvBlockBytes(pool_.dtype, config_.n_layers, config_.cache_kv_heads(),
                                    pool_.block_size, config_.cache_head_dim());
}

kernels::KvCacheView LlamaForward::CacheView(int layer) const {
  // An MLA rank reads the whole latent entry; a rank with a pool of its own all of its heads.
  if (tp_comm_ != nullptr && !config_.mla() && !tp_own_pool_) {
    // A rank's heads within the TP = 1 layout: the pool's view, its base moved to the rank's
    // first KV head (strides count elements; a quantized element is a byte) and a quantized
    // cache's scale offset moved to that head's scales (kernels::KvCacheView::first_head).
    kernels::KvCacheView v =
        kernels::DenseKvCacheView(pool_.base, pool_.dtype, pool_.num_blocks, config_.n_layers,
                                  tp_pool_kv_heads_, pool_.block_size, config_.head_dim, layer);
    const int64_t shift = tp_.kv_head_begin * v.head_stride * kernels::DTypeSize(pool_.dtype);
    v.base = static_cast<char*>(v.base) + shift;
    if (kernels::IsQuantizedKvDType(pool_.dtype)) {
      v.scale_offset += 4 * tp_.kv_head_begin * v.scale_head_stride - shift;
    }
    v.first_head = tp_.kv_head_begin;
    v.num_kv_heads = tp_.num_kv_heads;
    return v;
  }
  return kernels::DenseKvCacheView(pool_.base, pool_.dtype, pool_.num_blocks, config_.n_layers,
                                   config_.cache_kv_heads(), pool_.block_size,
                                   config_.cache_head_dim(), layer);
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
    if (seq.rope_offset < 0 || end + seq.rope_offset > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(
          absl::StrCat("forward: sequence ", s, " rope offset ", seq.rope_offset, " out of range"));
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
    if (seq.attention_mass != nullptr) {
      if (seq.mass_stride < end || seq.mass_from < 0 || seq.mass_from >= n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "forward: sequence ", s, " attention mass stride ", seq.mass_stride, " / from ",
            seq.mass_from, " do not fit its ", end, " positions and ", n, " new tokens"));
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
  if (tp_group_ != nullptr) {
    return RunRanks(
        [&](LlamaForward& r) { return r.CopyBlocksShifted(src, dst, num_tokens, delta); });
  }
  const ModelConfig& c = config_;
  if (c.mla()) {
    return absl::UnimplementedError(
        "copy blocks shifted: a multi-head latent attention cache cannot be re-rotated (the sink "
        "+ window KV policy does not support MLA models)");
  }
  const int64_t needed = (num_tokens + pool_.block_size - 1) / pool_.block_size;
  if (num_tokens <= 0 || delta < 0 || delta > std::numeric_limits<int32_t>::max() ||
      needed > max_blocks_per_seq_ || static_cast<int64_t>(src.size()) < needed ||
      static_cast<int64_t>(dst.size()) < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: CopyBlocksShifted of ", num_tokens, " tokens by ", delta, " needs ",
                     needed, " source and destination blocks (at most ", max_blocks_per_seq_,
                     "), got ", src.size(), " and ", dst.size()));
  }
  for (int64_t i = 0; i < needed; ++i) {
    // Checked here, not only by the kernels: on kCuda they read the ids from device memory.
    for (const int32_t id : {src[i], dst[i]}) {
      if (id < 0 || id >= pool_.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("forward: CopyBlocksShifted: block ", id,
                                                       " outside the pool of ", pool_.num_blocks));
      }
    }
    for (int64_t j = 0; j < needed; ++j) {
      if (src[i] == dst[j]) {
        return absl::InvalidArgumentError(absl::StrCat("forward: CopyBlocksShifted: block ", src[i],
                                                       " is source and destination"));
      }
    }
  }
  if (tp_comm_ != nullptr && !tp_.writes_kv) {
    return absl::OkStatus();  // a shared KV head: its first rank rewrites it
  }
  // The kernels' index arrays: [src table][dst table], then per chunk [slots][RoPE shifts];
  // host vectors on kCpu, uploaded into d_shift_ (the same layout) when staged.
  const bool staged = Staged();
  std::vector<int32_t> tables(src.begin(), src.begin() + needed);
  tables.insert(tables.end(), dst.begin(), dst.begin() + needed);
  const int32_t* src_table = tables.data();
  if (staged) {
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_shift_, tables.data(), 2 * needed * 4));
    src_table = d_shift_;
  }
  const int32_t* dst_table = src_table + needed;
  // Chunks of at most max_batch_tokens rows through the k_/v_ scratch; q_ carries the keys
  // through Rope (it rotates its "q" rows, the keys here, and no kv rows).
  // Every chunk's host copy stays untouched until the synchronisation at the end (CopyAsync's
  // contract); the device copies share one piece, reused in stream order.
  std::vector<int32_t> chunks(2 * num_tokens);
  for (int64_t first = 0; first < num_tokens; first += options_.max_batch_tokens) {
    const int64_t n = std::min(options_.max_batch_tokens, num_tokens - first);
    int32_t* chunk = chunks.data() + 2 * first;
    std::iota(chunk, chunk + n, static_cast<int32_t>(first));
    std::fill(chunk + n, chunk + 2 * n, static_cast<int32_t>(delta));
    const int32_t* pos = chunk;
    if (staged) {
      int32_t* d_chunk = d_shift_ + 2 * max_blocks_per_seq_;
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_chunk, chunk, 2 * n * 4));
      pos = d_chunk;
    }
    const int32_t* shifted = pos + n;
    for (int l = 0; l < c.n_layers; ++l) {
      kernels::ReadKvParams read;
      read.k = q_;
      read.v = v_;
      read.k_token_stride = c.kv_dim;
      read.v_token_stride = c.kv_dim;
      read.cache = CacheView(l);
      read.num_tokens = n;
      read.positions = pos;
      read.block_tables = src_table;
      read.max_blocks_per_seq = needed;
      PD_RETURN_IF_ERROR(kernels::ReadKv(ctx_, read));
      kernels::RopeParams rope;
      rope.q = q_;
      rope.positions = shifted;
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
      write.positions = pos;
      write.block_tables = dst_table;
      write.max_blocks_per_seq = needed;
      PD_RETURN_IF_ERROR(kernels::WriteKv(ctx_, write));
    }
  }
  // A fault of these kernels surfaces here, as the copy's error (a no-op on kCpu).
  return kernels::SynchronizeStream(ctx_);
}

absl::StatusOr<int64_t> LlamaForward::PrepareBatch(absl::Span<const ForwardSequence> batch) {
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
  const int64_t t = options_.max_batch_tokens;
  slot_mass_.assign(slots_.size(), MassTarget());
  any_mass_ = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    const ForwardSequence& seq = batch[slot.batch_index];
    if (seq.attention_mass != nullptr) {
      slot_mass_[i] = {seq.attention_mass, seq.mass_stride, seq.mass_from};
      any_mass_ = true;
    }
    slot.first_token = row;
    int32_t* table = &block_tables_[i * max_blocks_per_seq_];
    std::fill(table, table + max_blocks_per_seq_, 0);
    const int64_t used = std::min<int64_t>(seq.block_table.size(), max_blocks_per_seq_);
    std::copy(seq.block_table.begin(), seq.block_table.begin() + used, table);
    context_lens_[i] = static_cast<int32_t>(slot.start_pos + slot.num_tokens);
    for (int64_t j = 0; j < slot.num_tokens; ++j, ++row) {
      positions_[row] = static_cast<int32_t>(slot.start_pos + j);
      positions_[t + row] = static_cast<int32_t>(slot.start_pos + j + seq.rope_offset);
      token_seq_[row] = static_cast<int32_t>(i);
      token_ids_[row] = static_cast<int32_t>(seq.tokens[j]);  // embedded by QueueStep
    }
  }
  // The decode attention's context bound: the longest decode context rounded up to a power of
  // two (at least 256, at most the table), so the split grid (and a decode graph) changes only
  // when a context doubles.
  int64_t longest = 0;
  for (int64_t i = 0; i < num_decode_slots_; ++i) {
    longest = std::max<int64_t>(longest, context_lens_[i]);
  }
  decode_bound_ = 256;
  while (decode_bound_ < longest) {
    decode_bound_ *= 2;
  }
  decode_bound_ = std::min(decode_bound_, max_blocks_per_seq_ * pool_.block_size);
  if (Staged()) {
    // The kernels read these from device memory. Pageable sources: CUDA has staged them by the
    // time each call returns, so the host vectors may be rebuilt by the next Forward(). The
    // cache slots and the RoPE positions go in one copy (the unused tail of the slots too): the
    // RoPE positions are always uploaded, so a decode graph may read them (see the header).
    const int64_t num_seqs = static_cast<int64_t>(slots_.size());
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_positions_, positions_.data(), (t + row) * 4));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_token_seq_, token_seq_.data(), row * 4));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_token_ids_, token_ids_.data(), row * 4));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_block_tables_, block_tables_.data(),
                                          num_seqs * max_blocks_per_seq_ * 4));
    PD_RETURN_IF_ERROR(
        kernels::CopyAsync(ctx_, d_context_lens_, context_lens_.data(), num_seqs * 4));
  }
  return row;
}

bool LlamaForward::GraphEligible(int64_t num_tokens, bool edited) const {
  const int64_t n = static_cast<int64_t>(slots_.size());
  // Not with expert layers (their routing syncs with the host mid-step), nor when a sequence
  // scores its keys (AttentionMass's launch shape is the step's key count).
  return Staged() && options_.decode_graphs && !graph_stats_.off && num_decode_slots_ == n &&
         num_tokens == n && !edited && !config_.has_moe_layers() && !any_mass_;
}

absl::Status LlamaForward::ApplyEdits(int64_t num_seqs) {
  kernels::LogitEditParams e;
  e.logits = logits_tmp_;
  e.num_seqs = num_seqs;
  e.vocab_size = e.logits_stride = config_.vocab_size;
  const int64_t total = static_cast<int64_t>(edits_.size());
  if (!Staged()) {
    e.edits = edits_.data();
    e.rows = edit_rows_.data();
    e.num_edits = total;
    return kernels::ApplyLogitEdits(ctx_, e);
  }
  // Chunk by chunk through the fixed buffers: on one stream, a chunk's kernel has run before
  // the next upload overwrites its inputs.
  for (int64_t first = 0; first < total; first += edit_chunk_) {
    const int64_t n = std::min(edit_chunk_, total - first);
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_edits_, &edits_[first],
                                          n * static_cast<int64_t>(sizeof(kernels::LogitEdit))));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_edit_rows_, &edit_rows_[first], n * 4));
    e.edits = d_edits_;
    e.rows = d_edit_rows_;
    e.num_edits = n;
    PD_RETURN_IF_ERROR(kernels::ApplyLogitEdits(ctx_, e));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::QueueStep(int64_t num_tokens, bool sample, bool masked, bool edited) {
  const ModelConfig& c = config_;
  // Embedding: the token rows gathered by id (one CopyBlocks; into xb_, free until the first
  // norm, unless the table is f32), then widened to f32 into x_ (one Convert).
  const DType edtype = weights_->embedding_dtype;
  const int64_t row_in_bytes = c.dim * kernels::DTypeSize(edtype);
  if (tp_comm_ != nullptr) {
    PD_RETURN_IF_ERROR(TpEmbed(num_tokens));
  } else {
    kernels::CopyBlocksParams gather;
    gather.src = weights_->embedding;
    gather.dst = edtype == DType::kF32 ? static_cast<void*>(x_) : static_cast<void*>(xb_);
    gather.src_ids = d_token_ids_;
    gather.num_copies = num_tokens;
    gather.block_bytes = row_in_bytes;
    gather.src_block_stride_bytes = gather.dst_block_stride_bytes = row_in_bytes;
    gather.src_num_blocks = c.vocab_size;
    gather.dst_num_blocks = num_tokens;
    PD_RETURN_IF_ERROR(kernels::CopyBlocks(ctx_, gather));
    if (edtype != DType::kF32) {
      kernels::ConvertParams widen;
      widen.in = xb_;
      widen.out = x_;
      widen.n = num_tokens * c.dim;
      widen.in_dtype = edtype;
      widen.out_dtype = DType::kF32;
      PD_RETURN_IF_ERROR(kernels::Convert(ctx_, widen));
    }
  }
  for (int l = 0; l < c.n_layers; ++l) {
    PD_RETURN_IF_ERROR(Layer(l, num_tokens));
  }
  // Final norm and classifier for each sequence's last new token, in slot order. Compacted in
  // place: slot i's last row is >= i and beyond every earlier destination row, so the copies
  // (in order; on one stream on kCuda) never read a row already overwritten. (None in a
  // decode step: slot i's only row is row i.)
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
  // MatMul with the classifier weights (the same dtype as every matrix). A tensor-parallel rank
  // computes its vocabulary's columns, which every rank gathers.
  if (tp_comm_ != nullptr) {
    PD_RETURN_IF_ERROR(MatMul(xb_, weights_->classifier, weights_->classifier_scales, nullptr,
                              tp_logits_, num_seqs, c.dim, tp_.vocab_count, false));
    PD_RETURN_IF_ERROR(tp_comm_->AllGatherColumns(tp_logits_, num_seqs, tp_.vocab_count,
                                                  tp_.vocab_begin, logits_tmp_, c.vocab_size));
  } else {
    PD_RETURN_IF_ERROR(MatMul(xb_, weights_->classifier, weights_->classifier_scales, nullptr,
                              logits_tmp_, num_seqs, c.dim, c.vocab_size, /*accumulate=*/false));
  }
  if (!sample) {
    return absl::OkStatus();
  }
  if (edited) {
    PD_RETURN_IF_ERROR(ApplyEdits(num_seqs));
  }
  if (masked && !deferred_masks_.empty()) {
    // kCpu: the caller's masks are complete once masks_ready_ returns (ForwardSample).
    if (masks_ready_ != nullptr && *masks_ready_ != nullptr) (*masks_ready_)();
    for (int64_t i = 0; i < num_seqs; ++i) {
      const SampleSpec& sp = deferred_masks_[static_cast<size_t>(slots_[i].batch_index)];
      if (sp.allowed != nullptr) {
        std::memcpy(&mask_[i * mask_words_], sp.allowed, mask_words_ * 4);
      } else {
        std::fill_n(&mask_[i * mask_words_], mask_words_, ~0u);
      }
    }
  }
  if (masked) {
    kernels::TokenMaskParams m;
    m.logits = logits_tmp_;
    m.mask = d_mask_;
    m.num_seqs = num_seqs;
    m.vocab_size = m.logits_stride = c.vocab_size;
    m.mask_stride_words = mask_words_;
    PD_RETURN_IF_ERROR(kernels::ApplyTokenMask(ctx_, m));
  }
  kernels::SamplingParams p;
  p.logits = logits_tmp_;
  p.out_tokens = d_tokens_;
  p.num_seqs = num_seqs;
  p.vocab_size = c.vocab_size;
  p.logits_stride = c.vocab_size;
  p.temperature = d_temperature_;
  p.top_k = d_top_k_;
  p.top_p = d_top_p_;
  p.min_p = d_min_p_;
  p.seeds = d_seeds_;
  p.steps = d_steps_;
  p.workspace = sample_ws_.data();
  p.workspace_bytes = static_cast<int64_t>(sample_ws_.size());
  return kernels::Sample(ctx_, p);
}

absl::Status LlamaForward::Step(absl::Span<const ForwardSequence> batch,
                                absl::Span<const SampleSpec> specs) {
  PD_RETURN_IF_ERROR(Validate(batch));
  PD_ASSIGN_OR_RETURN(const int64_t num_tokens, PrepareBatch(batch));
  const bool sample = !specs.empty();
  const int64_t n = static_cast<int64_t>(slots_.size());
  const bool staged = Staged();
  bool masked = false;
  edits_.clear();
  edit_rows_.clear();
  deferred_masks_ = {};
  if (sample) {
    for (const SampleSpec& sp : specs) masked |= sp.allowed != nullptr;
  }
  // kCpu: the masks are read right before they are applied (QueueStep), so a caller computes
  // them while the layers run. Staged: they go up with the other inputs, before the step.
  const bool defer_masks = masked && !staged;
  if (masked && !defer_masks && masks_ready_ != nullptr && *masks_ready_ != nullptr) {
    (*masks_ready_)();
  }
  if (defer_masks) deferred_masks_ = specs;
  if (sample) {  // the sampling inputs in slot order (the order of logits_tmp_'s rows)
    for (int64_t i = 0; i < n; ++i) {
      const SampleSpec& sp = specs[slots_[i].batch_index];
      temperature_[i] = sp.temperature;
      top_k_[i] = sp.top_k;
      top_p_[i] = sp.top_p;
      min_p_[i] = sp.min_p;
      seeds_[i] = sp.seed;
      steps_[i] = sp.step;
      edits_.insert(edits_.end(), sp.edits.begin(), sp.edits.end());
      edit_rows_.resize(edits_.size(), static_cast<int32_t>(i));
      if (defer_masks) continue;
      if (sp.allowed != nullptr) {
        std::memcpy(&mask_[i * mask_words_], sp.allowed, mask_words_ * 4);
      } else {
        std::fill_n(&mask_[i * mask_words_], mask_words_, ~0u);
      }
    }
    if (staged && masked) {
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_mask_, mask_.data(), n * mask_words_ * 4));
    }
    if (staged) {
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_temperature_, temperature_.data(), n * 4));
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_top_k_, top_k_.data(), n * 4));
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_top_p_, top_p_.data(), n * 4));
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_min_p_, min_p_.data(), n * 4));
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_seeds_, seeds_.data(), n * 8));
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_steps_, steps_.data(), n * 8));
    }
  }
  const bool edited = !edits_.empty();
  if (!GraphEligible(num_tokens, edited)) {
    return QueueStep(num_tokens, sample, masked, edited);
  }
  // A decode step: its work depends only on (n, sample, the decode context bound) and on
  // buffers whose contents were just uploaded, so it is captured once per shape and replayed.
  kernels::DeviceGraph& graph = graphs_[GraphKey{n, sample, decode_bound_, masked}];
  if (graph.empty()) {
    // Library state made on first use (the thread's cuBLAS handle and workspace) cannot be
    // made while the stream captures: make it now.
    PD_RETURN_IF_ERROR(kernels::PrepareMatMul(ctx_));
    absl::StatusOr<kernels::DeviceGraph> captured = kernels::DeviceGraph::Capture(
        ctx_, [this, n, sample, masked] { return QueueStep(n, sample, masked, false); });
    if (!captured.ok()) {
      // Nothing ran: fall back to launching kernel by kernel, for the rest of this object's
      // life (a capture that fails once would fail again).
      LOG(WARNING) << "forward: decode graphs off, capture of a " << n
                   << "-sequence step failed: " << captured.status();
      graph_stats_.off = true;
      return QueueStep(num_tokens, sample, masked, false);
    }
    graph = *std::move(captured);
    ++graph_stats_.captures;
  }
  ++graph_stats_.replays;
  return graph.Launch(ctx_);
}

absl::Status LlamaForward::Forward(absl::Span<const ForwardSequence> batch, float* logits) {
  if (tp_group_ != nullptr) {
    // Every rank runs the step; rank 0 returns the logits (each rank has all of them).
    return RunRanks([&](LlamaForward& r) {
      return r.tp_.rank == 0 ? r.Forward(batch, logits) : r.Step(batch, {});
    });
  }
  PD_RETURN_IF_ERROR(Step(batch, {}));
  const int64_t vocab_bytes = config_.vocab_size * static_cast<int64_t>(sizeof(float));
  for (size_t i = 0; i < slots_.size(); ++i) {
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, logits + slots_[i].batch_index * config_.vocab_size,
                                          &logits_tmp_[i * config_.vocab_size], vocab_bytes));
  }
  // The one synchronisation of the step (a no-op on kCpu): the logits are on the host after it,
  // and a fault of any kernel of the step surfaces here.
  return kernels::SynchronizeStream(ctx_);
}

absl::Status LlamaForward::ForwardSample(absl::Span<const ForwardSequence> batch,
                                         absl::Span<const SampleSpec> specs, int32_t* tokens,
                                         float* logits, const std::function<void()>& masks_ready) {
  if (tp_group_ != nullptr) {
    // Rank 0 samples (and reads the masks); the others run the same step without sampling.
    return RunRanks([&](LlamaForward& r) {
      return r.tp_.rank == 0 ? r.ForwardSample(batch, specs, tokens, logits, masks_ready)
                             : r.Step(batch, {});
    });
  }
  if (specs.size() != batch.size() || batch.empty() || tokens == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", specs.size(),
                                                   " sampling specs for a batch of ", batch.size(),
                                                   tokens == nullptr ? ", null tokens" : ""));
  }
  for (size_t s = 0; s < specs.size(); ++s) {
    const SampleSpec& sp = specs[s];
    if (std::isnan(sp.temperature) || !(sp.top_p > 0.0f && sp.top_p <= 1.0f) ||
        !(sp.min_p >= 0.0f && sp.min_p <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward: sequence ", s, " samples with temperature ", sp.temperature, ", top_p ",
          sp.top_p, " and min_p ", sp.min_p, " (need a number, (0, 1] and [0, 1])"));
    }
    for (const kernels::LogitEdit& e : sp.edits) {
      if (e.token < 0 || e.token >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("forward: sequence ", s,
                                                       " edits the logit of token ", e.token,
                                                       ", vocab_size is ", config_.vocab_size));
      }
    }
    if (sp.want_logits && logits == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: sequence ", s, " wants its logits, but logits is null"));
    }
  }
  masks_ready_ = &masks_ready;
  const absl::Status stepped = Step(batch, specs);
  masks_ready_ = nullptr;
  deferred_masks_ = {};
  PD_RETURN_IF_ERROR(stepped);
  const int64_t num_seqs = static_cast<int64_t>(slots_.size());
  const bool staged = Staged();
  if (staged) {
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, slot_tokens_.data(), d_tokens_, num_seqs * 4));
  }
  const int64_t vocab_bytes = config_.vocab_size * static_cast<int64_t>(sizeof(float));
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t b = slots_[i].batch_index;
    if (specs[b].want_logits) {
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, logits + b * config_.vocab_size,
                                            &logits_tmp_[i * config_.vocab_size], vocab_bytes));
    }
  }
  // The one synchronisation of the step: tokens (and asked-for rows) are on the host after it.
  PD_RETURN_IF_ERROR(kernels::SynchronizeStream(ctx_));
  for (int64_t i = 0; i < num_seqs; ++i) {
    tokens[slots_[i].batch_index] = slot_tokens_[i];
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::Layer(int layer, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  PD_RETURN_IF_ERROR(RmsNormRows(ctx_, x_, w.attn_norm, xb_, num_tokens, c.dim, c.rms_norm_eps));
  PD_RETURN_IF_ERROR(c.mla() ? MlaAttention(layer, num_tokens) : Attention(layer, num_tokens));

  // MLP block: x += W_down (silu(W_gate xb) * (W_up xb)).
  PD_RETURN_IF_ERROR(RmsNormRows(ctx_, x_, w.ffn_norm, xb_, num_tokens, c.dim, c.rms_norm_eps));
  if (c.moe_layer(layer)) {
    return MoeMlp(layer, num_tokens);
  }
  PD_RETURN_IF_ERROR(MatMul(xb_, w.w_gate, w.w_gate_scales, nullptr, gate_, num_tokens, c.dim,
                            c.hidden_dim, false));
  PD_RETURN_IF_ERROR(
      MatMul(xb_, w.w_up, w.w_up_scales, nullptr, up_, num_tokens, c.dim, c.hidden_dim, false));
  PD_RETURN_IF_ERROR(SiluMulRows(ctx_, gate_, up_, num_tokens, c.hidden_dim));
  if (tp_comm_ != nullptr) {  // row-parallel: this rank's columns, then the sum over ranks
    PD_RETURN_IF_ERROR(MatMul(gate_, w.w_down, w.w_down_scales, nullptr, tp_partial_, num_tokens,
                              c.hidden_dim, c.dim, false));
    return TpAddReduced(num_tokens);
  }
  return MatMul(gate_, w.w_down, w.w_down_scales, nullptr, x_, num_tokens, c.hidden_dim, c.dim,
                true);
}

absl::Status LlamaForward::WriteNewKv(const float* k, const float* v, int64_t token_stride,
                                      const kernels::KvCacheView& cache, int64_t num_tokens) {
  kernels::WriteKvParams write;
  write.k = k;
  write.v = v;
  write.k_token_stride = token_stride;
  write.v_token_stride = token_stride;
  write.cache = cache;
  write.num_tokens = num_tokens;
  write.positions = d_positions_;
  write.token_seq = d_token_seq_;
  write.block_tables = d_block_tables_;
  write.num_seqs = static_cast<int64_t>(slots_.size());
  write.max_blocks_per_seq = max_blocks_per_seq_;
  return kernels::WriteKv(ctx_, write);
}

absl::Status LlamaForward::Attention(int layer, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  const int64_t q_dim = c.q_dim();
  PD_RETURN_IF_ERROR(MatMul(xb_, w.wq, w.wq_scales, w.bq, q_, num_tokens, c.dim, q_dim, false));
  PD_RETURN_IF_ERROR(MatMul(xb_, w.wk, w.wk_scales, w.bk, k_, num_tokens, c.dim, c.kv_dim, false));
  PD_RETURN_IF_ERROR(MatMul(xb_, w.wv, w.wv_scales, w.bv, v_, num_tokens, c.dim, c.kv_dim, false));
  if (c.qk_norm) {
    // Qwen3: every head of q and of k RMS-normalized on its own (rows of head_dim), in place.
    PD_RETURN_IF_ERROR(
        RmsNormRows(ctx_, q_, w.q_norm, q_, num_tokens * c.n_heads, c.head_dim, c.rms_norm_eps));
    PD_RETURN_IF_ERROR(
        RmsNormRows(ctx_, k_, w.k_norm, k_, num_tokens * c.n_kv_heads, c.head_dim, c.rms_norm_eps));
  }

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
  if (tp_comm_ == nullptr || tp_.writes_kv) {
    PD_RETURN_IF_ERROR(WriteNewKv(k_, v_, c.kv_dim, cache, num_tokens));
  }
  if (tp_shared_kv_ && !tp_own_pool_) {
    // Ranks sharing a KV head read the rows its first rank just wrote.
    PD_RETURN_IF_ERROR(tp_comm_->Barrier());
  }

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
    d.max_context_len = decode_bound_;
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
    p.tensor_cores = true;  // kCuda, bf16 caches: within bf16 rounding (kernels/cuda/prefill_tc.h)
    PD_RETURN_IF_ERROR(kernels::PrefillAttention(ctx_, p));
  }
  if (any_mass_) {
    PD_RETURN_IF_ERROR(AccumulateMass(layer));
  }
  // x += attn Wo (row-parallel on a tensor-parallel rank: its heads' columns, then the sum)
  if (tp_comm_ != nullptr) {
    PD_RETURN_IF_ERROR(
        MatMul(att_, w.wo, w.wo_scales, nullptr, tp_partial_, num_tokens, q_dim, c.dim, false));
    return TpAddReduced(num_tokens);
  }
  return MatMul(att_, w.wo, w.wo_scales, nullptr, x_, num_tokens, q_dim, c.dim, true);
}

absl::Status LlamaForward::TpEmbed(int64_t num_tokens) {
  const int64_t dim = config_.dim;
  const DType edtype = weights_->embedding_dtype;
  const int64_t row_bytes = dim * kernels::DTypeSize(edtype);
  // This rank's rows: their vocabulary rows, then the tokens they go to.
  std::vector<int32_t>& ids = tp_embed_ids_;
  ids.clear();
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t id = int64_t{token_ids_[static_cast<size_t>(i)]} - tp_.vocab_begin;
    if (id >= 0 && id < tp_.vocab_count) ids.push_back(static_cast<int32_t>(id));
  }
  const auto owned = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t id = int64_t{token_ids_[static_cast<size_t>(i)]} - tp_.vocab_begin;
    if (id >= 0 && id < tp_.vocab_count) ids.push_back(static_cast<int32_t>(i));
  }
  // Zeros where another rank holds the row (zero bits are 0.0 in every dtype), the rows moved
  // by one CopyBlocks, then widened to f32 (zeros stay exact zeros).
  void* rows = edtype == DType::kF32 ? static_cast<void*>(x_) : static_cast<void*>(xb_);
  PD_RETURN_IF_ERROR(kernels::ZeroAsync(ctx_, rows, num_tokens * row_bytes));
  if (owned > 0) {
    const int32_t* d_ids = ids.data();
    if (Staged()) {
      PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_tp_embed_ids_, ids.data(), 2 * owned * 4));
      d_ids = d_tp_embed_ids_;
    }
    kernels::CopyBlocksParams move;
    move.src = weights_->embedding;
    move.dst = rows;
    move.src_ids = d_ids;
    move.dst_ids = d_ids + owned;
    move.num_copies = owned;
    move.block_bytes = move.src_block_stride_bytes = move.dst_block_stride_bytes = row_bytes;
    move.src_num_blocks = tp_.vocab_count;
    move.dst_num_blocks = num_tokens;
    PD_RETURN_IF_ERROR(kernels::CopyBlocks(ctx_, move));
  }
  if (edtype != DType::kF32) {
    kernels::ConvertParams widen;
    widen.in = xb_;
    widen.out = x_;
    widen.n = num_tokens * dim;
    widen.in_dtype = edtype;
    widen.out_dtype = DType::kF32;
    PD_RETURN_IF_ERROR(kernels::Convert(ctx_, widen));
  }
  // One rank holds each row: the others add zeros, so the sum is that row exactly.
  return tp_comm_->AllReduceSum(x_, num_tokens * dim);
}

absl::Status LlamaForward::TpAddReduced(int64_t num_tokens) {
  const int64_t n = num_tokens * config_.dim;
  PD_RETURN_IF_ERROR(tp_comm_->AllReduceSum(tp_partial_, n));
  return kernels::Add(ctx_, {x_, tp_partial_, x_, n});
}

absl::Status LlamaForward::AccumulateMass(int layer, float mla_scale) {
  if (tp_shared_kv_) {
    // Ranks sharing a KV head add their query heads' mass into the same row: in turns, the
    // first rank of each head first, so the adds are in head order run to run (TP 1 adds a
    // token's heads in that order too; across a chunk's tokens the order differs, float
    // rounding). Every rank meets every barrier. MLA: every rank shares the layer's one row.
    const int turns = config_.mla() ? tp_.size : tp_.size / tp_pool_kv_heads_;
    for (int turn = 0; turn < turns; ++turn) {
      if (tp_.rank % turns == turn) PD_RETURN_IF_ERROR(AccumulateMassOfSlots(layer, mla_scale));
      PD_RETURN_IF_ERROR(tp_comm_->Barrier());
    }
    return absl::OkStatus();
  }
  return AccumulateMassOfSlots(layer, mla_scale);
}

absl::Status LlamaForward::AccumulateMassOfSlots(int layer, float mla_scale) {
  const ModelConfig& c = config_;
  const kernels::KvCacheView cache = CacheView(layer);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const MassTarget& m = slot_mass_[i];
    if (m.mass == nullptr) continue;
    const Slot& slot = slots_[i];
    kernels::AttentionMassParams a;
    if (c.mla()) {
      // The absorbed queries ([tokens][heads][latent], this rank's heads) against whole
      // entries: the scores LatentAttention softmaxes, so the weights are its weights.
      const int64_t latent = c.mla_latent_dim(), row = c.n_heads * latent;
      a.q = mla_query_ + (slot.first_token + m.from) * row;
      a.q_token_stride = row;
      a.cache = &cache;
      a.block_table = (Staged() ? d_block_tables_ : block_tables_.data()) + i * max_blocks_per_seq_;
      a.latent = true;
      a.workspace = mass_stats_;
      a.num_table_blocks = max_blocks_per_seq_;
      a.start_pos = slot.start_pos + m.from;
      a.num_tokens = slot.num_tokens - m.from;
      a.num_heads = c.n_heads;
      a.num_kv_heads = 1;
      a.head_dim = latent;
      a.scale = mla_scale;
      a.mass = m.mass + int64_t{layer} * m.stride;
      a.mass_head_stride = m.stride;
      PD_RETURN_IF_ERROR(kernels::AttentionMass(ctx_, a));
      continue;
    }
    a.q = &q_[(slot.first_token + m.from) * c.q_dim()];
    a.q_token_stride = c.q_dim();
    // The keys straight from the cache (slot t of the sequence's blocks is key t).
    a.cache = &cache;
    a.block_table = (Staged() ? d_block_tables_ : block_tables_.data()) + i * max_blocks_per_seq_;
    a.workspace = mass_stats_;
    a.num_table_blocks = max_blocks_per_seq_;
    a.start_pos = slot.start_pos + m.from;
    a.num_tokens = slot.num_tokens - m.from;
    a.num_heads = c.n_heads;
    a.num_kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    // [layer][kv head][slot] over the model's KV heads: a tensor-parallel rank adds its own.
    a.mass = m.mass + (tp_comm_ != nullptr ? int64_t{layer} * tp_pool_kv_heads_ + tp_.kv_head_begin
                                           : int64_t{layer} * c.n_kv_heads) *
                          m.stride;
    a.mass_head_stride = m.stride;
    PD_RETURN_IF_ERROR(kernels::AttentionMass(ctx_, a));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::GatherKvRows(absl::Span<const int32_t> src,
                                        absl::Span<const int32_t> dst,
                                        absl::Span<const int32_t> keep, int64_t num_keep) {
  const ModelConfig& c = config_;
  if (tp_group_ != nullptr) {
    // Each rank moves its KV heads' rows (a shared head: its first rank, which writes it).
    return RunRanks([&](LlamaForward& r) { return r.GatherKvRows(src, dst, keep, num_keep); });
  }
  // keep covers the model's KV heads; a tensor-parallel rank moves its own of them. MLA: one
  // list per layer, for the whole latent entry (whose first rank moves it).
  int64_t heads = c.mla() ? 1 : tp_comm_ != nullptr ? tp_pool_kv_heads_ : c.n_kv_heads;
  const int64_t first_head = tp_comm_ != nullptr && !c.mla() ? tp_.kv_head_begin : 0;
  const int64_t bs = pool_.block_size;
  const int64_t src_slots = static_cast<int64_t>(src.size()) * bs;
  if (num_keep <= 0 || static_cast<int64_t>(dst.size()) * bs < num_keep ||
      static_cast<int64_t>(keep.size()) != c.n_layers * heads * num_keep) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: gather of ", num_keep, " rows into ", dst.size(), " blocks needs ",
                     c.n_layers * heads * num_keep, " kept slots, got ", keep.size()));
  }
  // kernels::GatherKvRows checks the ids and slots itself when they are host memory; staged,
  // they are checked here, before they go up.
  const bool check = Staged();
  for (const absl::Span<const int32_t> ids : {src, dst}) {
    for (int32_t b : check ? ids : absl::Span<const int32_t>()) {
      if (b < 0 || b >= pool_.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "forward: gather block ", b, " is outside the pool of ", pool_.num_blocks, " blocks"));
      }
    }
  }
  for (int32_t b : check ? dst : absl::Span<const int32_t>()) {
    if (std::find(src.begin(), src.end(), b) != src.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: gather block ", b, " is in both src and dst"));
    }
  }
  for (int32_t k : check ? keep : absl::Span<const int32_t>()) {
    if (k < 0 || k >= src_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: gather slot ", k, " outside the ", src_slots, " source slots"));
    }
  }
  if (tp_comm_ != nullptr && !tp_.writes_kv) return absl::OkStatus();  // a peer moves the head
  std::vector<int32_t> latent_keep;
  if (c.mla()) {
    // Every cache head of the entry (its K and V pieces) moves the layer's slots.
    heads = c.cache_kv_heads();
    latent_keep.reserve(static_cast<size_t>(c.n_layers * heads * num_keep));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int64_t h = 0; h < heads; ++h) {
        latent_keep.insert(latent_keep.end(), keep.begin() + l * num_keep,
                           keep.begin() + (l + 1) * num_keep);
      }
    }
    keep = latent_keep;
  }
  kernels::GatherKvRowsParams g;
  g.cache = CacheView(0);  // a rank's view starts at its heads
  g.num_layers = c.n_layers;
  g.num_src_blocks = static_cast<int64_t>(src.size());
  g.num_dst_blocks = static_cast<int64_t>(dst.size());
  g.num_keep = num_keep;
  g.keep_heads = heads;
  g.keep_first_head = first_head;
  if (!Staged()) {
    g.src_blocks = src.data();
    g.dst_blocks = dst.data();
    g.keep = keep.data();
    return kernels::GatherKvRows(ctx_, g);
  }
  // Staged: the ids go up in one buffer (grown on demand; a compaction is rare), and the copy
  // completes before the host's spans may change.
  const int64_t ids = g.num_src_blocks + g.num_dst_blocks + static_cast<int64_t>(keep.size());
  if (gather_ids_.size_bytes() < ids * 4) {
    PD_ASSIGN_OR_RETURN(gather_ids_, kernels::DeviceBuffer::Allocate(ctx_.device, ids * 4));
  }
  auto* up = gather_ids_.as<int32_t>();
  PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, up, src.data(), g.num_src_blocks * 4));
  PD_RETURN_IF_ERROR(
      kernels::CopyAsync(ctx_, up + g.num_src_blocks, dst.data(), g.num_dst_blocks * 4));
  PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, up + g.num_src_blocks + g.num_dst_blocks, keep.data(),
                                        static_cast<int64_t>(keep.size()) * 4));
  g.src_blocks = up;
  g.dst_blocks = up + g.num_src_blocks;
  g.keep = up + g.num_src_blocks + g.num_dst_blocks;
  PD_RETURN_IF_ERROR(kernels::GatherKvRows(ctx_, g));
  return kernels::SynchronizeStream(ctx_);
}

absl::Status LlamaForward::MoeMlp(int layer, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  const int64_t dim = c.dim, width = c.moe_hidden_dim;
  PD_RETURN_IF_ERROR(MatMul(xb_, w.router, w.router_scales, nullptr, router_logits_, num_tokens,
                            dim, c.n_experts, false));
  // Routing is the host's: staged, the logits come down (the only sync inside a step, which
  // also keeps MoE steps out of decode graphs).
  const bool staged = Staged();
  const float* logits = router_logits_;
  if (staged) {
    router_logits_host_.resize(static_cast<size_t>(num_tokens * c.n_experts));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, router_logits_host_.data(), router_logits_,
                                          num_tokens * c.n_experts * 4));
    PD_RETURN_IF_ERROR(kernels::SynchronizeStream(ctx_));
    logits = router_logits_host_.data();
  }
  RouteTokens(logits, num_tokens, c.n_experts, c.n_experts_per_tok, MoeRuleFor(c, w.router_bias),
              &routing_);
  // Packed by expert, then (staged) uploaded at once. The last layer's upload has completed:
  // the sync above came after it on the stream.
  moe_rows_host_.clear();
  moe_weights_host_.clear();
  for (int e = 0; e < c.n_experts; ++e) {
    moe_rows_host_.insert(moe_rows_host_.end(), routing_.tokens[e].begin(),
                          routing_.tokens[e].end());
    moe_weights_host_.insert(moe_weights_host_.end(), routing_.weights[e].begin(),
                             routing_.weights[e].end());
  }
  const int32_t* rows = moe_rows_host_.data();
  const float* weights = moe_weights_host_.data();
  if (staged) {
    const auto packed = static_cast<int64_t>(moe_rows_host_.size());
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_moe_rows_, rows, packed * 4));
    PD_RETURN_IF_ERROR(kernels::CopyAsync(ctx_, d_moe_weights_, weights, packed * 4));
    rows = d_moe_rows_;
    weights = d_moe_weights_;
  }
  // The weighted sum of the experts' outputs; a tensor-parallel rank sums its columns' share
  // straight into the buffer its all-reduce completes.
  float* const moe_sum = tp_comm_ != nullptr ? tp_partial_ : moe_sum_;
  PD_RETURN_IF_ERROR(kernels::ZeroAsync(ctx_, moe_sum, num_tokens * dim * 4));
  int64_t* counts = &expert_tokens_[static_cast<size_t>(layer) * c.n_experts];
  int64_t offset = 0;
  for (int e = 0; e < c.n_experts; ++e) {
    const int64_t n = routing_.assignments(e);
    if (n == 0) continue;
    counts[e] += n;
    // Its tokens' rows of xb_, gathered.
    kernels::CopyBlocksParams gather;
    gather.src = xb_;
    gather.dst = moe_in_;
    gather.src_ids = rows + offset;
    gather.num_copies = n;
    gather.block_bytes = gather.src_block_stride_bytes = gather.dst_block_stride_bytes = dim * 4;
    gather.src_num_blocks = num_tokens;
    gather.dst_num_blocks = n;
    PD_RETURN_IF_ERROR(kernels::CopyBlocks(ctx_, gather));
    const ExpertWeights& x = w.experts[e];
    PD_RETURN_IF_ERROR(
        MatMul(moe_in_, x.w_gate, x.w_gate_scales, nullptr, gate_, n, dim, width, false));
    PD_RETURN_IF_ERROR(MatMul(moe_in_, x.w_up, x.w_up_scales, nullptr, up_, n, dim, width, false));
    PD_RETURN_IF_ERROR(SiluMulRows(ctx_, gate_, up_, n, width));
    PD_RETURN_IF_ERROR(
        MatMul(gate_, x.w_down, x.w_down_scales, nullptr, moe_out_, n, width, dim, false));
    kernels::ScaledScatterAddParams add;
    add.in = moe_out_;
    add.rows = rows + offset;
    add.weights = weights + offset;
    add.out = moe_sum;
    add.num_rows = n;
    add.dim = add.in_row_stride = add.out_row_stride = dim;
    add.out_rows = num_tokens;
    PD_RETURN_IF_ERROR(kernels::ScaledScatterAdd(ctx_, add));
    offset += n;
  }
  if (w.w_shared_gate != nullptr) {
    // DeepSeek's shared experts: every token, added to the routed sum (as Hugging Face does).
    const int64_t shared = width * c.n_shared_experts;
    PD_RETURN_IF_ERROR(MatMul(xb_, w.w_shared_gate, w.w_shared_gate_scales, nullptr, gate_,
                              num_tokens, dim, shared, false));
    PD_RETURN_IF_ERROR(MatMul(xb_, w.w_shared_up, w.w_shared_up_scales, nullptr, up_, num_tokens,
                              dim, shared, false));
    PD_RETURN_IF_ERROR(SiluMulRows(ctx_, gate_, up_, num_tokens, shared));
    PD_RETURN_IF_ERROR(MatMul(gate_, w.w_shared_down, w.w_shared_down_scales, nullptr, moe_out_,
                              num_tokens, shared, dim, false));
    PD_RETURN_IF_ERROR(kernels::Add(ctx_, {moe_sum, moe_out_, moe_sum, num_tokens * dim}));
  }
  if (tp_comm_ != nullptr) return TpAddReduced(num_tokens);  // row-parallel: the ranks' sum
  return kernels::Add(ctx_, {x_, moe_sum, x_, num_tokens * dim});
}

absl::Status LlamaForward::MlaAttention(int layer, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  const int64_t heads = c.n_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t rank = c.kv_lora_rank, latent = c.mla_latent_dim(), vdim = c.v_head_dim;
  const int64_t q_dim = c.q_dim(), out_dim = c.attn_out_dim();
  // Hugging Face builds q_a_layernorm and kv_a_layernorm with RMSNorm's default epsilon, not
  // rms_norm_eps (the same value, 1e-6, in DeepSeek's published configs).
  constexpr float kLoraNormEps = 1e-6f;

  // Queries: q_proj, or q_a_proj -> RMSNorm -> q_b_proj; each head [nope | rope].
  if (w.wq_a != nullptr) {
    PD_RETURN_IF_ERROR(MatMul(xb_, w.wq_a, w.wq_a_scales, nullptr, mla_qa_, num_tokens, c.dim,
                              c.q_lora_rank, false));
    PD_RETURN_IF_ERROR(
        RmsNormRows(ctx_, mla_qa_, w.q_a_norm, mla_qa_, num_tokens, c.q_lora_rank, kLoraNormEps));
    PD_RETURN_IF_ERROR(
        MatMul(mla_qa_, w.wq, w.wq_scales, nullptr, q_, num_tokens, c.q_lora_rank, q_dim, false));
  } else {
    PD_RETURN_IF_ERROR(
        MatMul(xb_, w.wq, w.wq_scales, nullptr, q_, num_tokens, c.dim, q_dim, false));
  }
  // The cache entry: [c | k_rope] = kv_a_proj_with_mqa(x), c RMS-normalized in place.
  PD_RETURN_IF_ERROR(
      MatMul(xb_, w.wkv_a, w.wkv_a_scales, nullptr, mla_latent_, num_tokens, c.dim, latent, false));
  {
    kernels::RmsNormParams p;
    p.in = mla_latent_;
    p.weight = w.kv_a_norm;
    p.out = mla_latent_;
    p.num_rows = num_tokens;
    p.dim = rank;
    p.in_row_stride = latent;
    p.out_row_stride = latent;
    p.eps = kLoraNormEps;
    PD_RETURN_IF_ERROR(kernels::RmsNorm(ctx_, p));
  }
  // RoPE on the heads' rope parts (gathered: every head's [nope | rope] lies head_dim after the
  // previous one's, across tokens too) and the shared rope key, adjacent pairs.
  PD_RETURN_IF_ERROR(
      CopyStrided(ctx_, q_ + nope, c.head_dim, mla_qpe_, rope, rope, num_tokens * heads));
  kernels::RopeParams rp;
  rp.q = mla_qpe_;
  rp.k = mla_latent_ + rank;
  rp.positions = d_rope_positions_;
  rp.inv_freq = inv_freq_;
  rp.num_tokens = num_tokens;
  rp.num_heads = heads;
  rp.num_kv_heads = 1;
  rp.head_dim = rope;
  rp.q_token_stride = heads * rope;
  rp.k_token_stride = latent;
  rp.style = kernels::RopeStyle::kInterleaved;
  PD_RETURN_IF_ERROR(kernels::Rope(ctx_, rp));
  if (c.yarn.has_value()) {
    // yarn scales the rotated parts (Hugging Face multiplies cos and sin by the same factor).
    const auto m = static_cast<float>(YarnMscale(c.yarn->factor, c.yarn->mscale) /
                                      YarnMscale(c.yarn->factor, c.yarn->mscale_all_dim));
    if (m != 1.0f) {
      for (int64_t i = 0; i < num_tokens * heads * rope; ++i) mla_qpe_[i] *= m;
      for (int64_t t = 0; t < num_tokens; ++t) {
        float* k = mla_latent_ + t * latent + rank;
        for (int64_t d = 0; d < rope; ++d) k[d] *= m;
      }
    }
  }

  // The entry is cached as the K and V halves of cache_kv_heads() heads (ModelConfig).
  const kernels::KvCacheView cache = CacheView(layer);
  if (tp_comm_ == nullptr || tp_.writes_kv) {
    PD_RETURN_IF_ERROR(
        WriteNewKv(mla_latent_, mla_latent_ + latent / 2, latent, cache, num_tokens));
  }
  if (tp_shared_kv_ && !tp_own_pool_) {
    // Every rank computed the same entry; the first wrote it, and the others read it after.
    PD_RETURN_IF_ERROR(tp_comm_->Barrier());
  }

  // Attention in the absorbed form, for decode and prefill alike (so a token's result does not
  // depend on which path computed it): head h's query in latent space is
  // [W_UK_h^T q_nope_h | q_rope_h], scored against every cached entry [c | k_rope] (scale
  // 1 / sqrt(head_dim)); the softmax-weighted sum of the c's goes through W_UV_h. Every product
  // is a MatMul whose rows are independent of how many there are, or LatentAttention, whose
  // rows are batch invariant, so the logits are bitwise the same however the tokens are batched
  // or chunked.
  float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.yarn.has_value() && c.yarn->mscale_all_dim > 0.0f) {
    const auto m = static_cast<float>(YarnMscale(c.yarn->factor, c.yarn->mscale_all_dim));
    scale = scale * m * m;
  }
  const int64_t head_rows = nope + vdim;
  // f32 matrices (kv_b_proj and its transpose, the step's own activations): never int8.
  auto matmul = [&](const float* x, int64_t x_stride, const float* wm, float* y, int64_t y_stride,
                    int64_t rows, int64_t in, int64_t out) {
    kernels::MatMulParams p;
    p.x = x;
    p.w = wm;
    p.y = y;
    p.num_rows = rows;
    p.in_features = in;
    p.out_features = out;
    p.x_row_stride = x_stride;
    p.y_row_stride = y_stride;
    p.w_dtype = DType::kF32;
    return kernels::MatMul(ctx_, p);
  };
  const int64_t query_row = heads * latent;  // mla_query_: [tokens][heads][latent]
  for (int64_t h = 0; h < heads; ++h) {
    // The query's latent part: W_UK_h^T q_nope_h (wuk_t holds each head's W_UK transposed).
    PD_RETURN_IF_ERROR(matmul(q_ + h * c.head_dim, q_dim, w.wuk_t + h * rank * nope,
                              mla_query_ + h * latent, query_row, num_tokens, nope, rank));
  }
  // Its rope part: the rotated q_rope (one row per token and head, latent apart).
  PD_RETURN_IF_ERROR(
      CopyStrided(ctx_, mla_qpe_, rope, mla_query_ + rank, latent, rope, num_tokens * heads));
  // Every token's heads score the cached entries where they lie in the pool and sum their
  // latents (kernels/latent_attention.h: one kernel for prefill and decode, batch invariant).
  kernels::LatentAttentionParams la;
  la.q = mla_query_;
  la.q_token_stride = query_row;
  la.out = mla_sum_;
  la.out_token_stride = heads * rank;
  la.cache = cache;
  la.value_dim = rank;
  la.num_heads = heads;
  la.num_tokens = num_tokens;
  la.positions = d_positions_;
  la.token_seq = d_token_seq_;
  la.block_tables = d_block_tables_;
  la.num_seqs = static_cast<int64_t>(slots_.size());
  la.max_blocks_per_seq = max_blocks_per_seq_;
  la.scale = scale;
  PD_RETURN_IF_ERROR(kernels::LatentAttention(ctx_, la));
  if (any_mass_) {
    PD_RETURN_IF_ERROR(AccumulateMass(layer, scale));
  }
  // Each head's output: W_UV_h (the value rows of kv_b_proj) times its weighted latent.
  for (int64_t h = 0; h < heads; ++h) {
    PD_RETURN_IF_ERROR(matmul(mla_sum_ + h * rank, heads * rank,
                              w.wkv_b + (h * head_rows + nope) * rank, att_ + h * vdim, out_dim,
                              num_tokens, rank, vdim));
  }
  // x += attn Wo (row-parallel on a tensor-parallel rank: its heads' columns, then the sum)
  if (tp_comm_ != nullptr) {
    PD_RETURN_IF_ERROR(
        MatMul(att_, w.wo, w.wo_scales, nullptr, tp_partial_, num_tokens, out_dim, c.dim, false));
    return TpAddReduced(num_tokens);
  }
  return MatMul(att_, w.wo, w.wo_scales, nullptr, x_, num_tokens, out_dim, c.dim, true);
}

}  // namespace pd::engine
