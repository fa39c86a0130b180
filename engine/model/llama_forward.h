// LlamaForward: the transformer forward pass over a paged KV cache, for a batch of sequences
// each bringing some new tokens (a prefill chunk, or one token when decoding).
//
// For each sequence the new tokens sit at positions [start_pos, start_pos + n); the KV of
// positions [0, start_pos) must already be in the pool (computed earlier, reused from the
// prefix cache, or written by a remote prefill worker), and the block table must cover
// [0, start_pos + n). Forward() writes the new tokens' K/V into the pool and returns the logits
// of each sequence's last new token.
//
// Exactness: every kernel computes a row independently of the other rows in the batch, so a
// sequence's logits do not depend on what it is batched with, on how its prompt is chunked, or
// on whether its prefix came from the cache (tested bitwise in llama_forward_test.cc).
//
// Devices: on kernels::Device::kCpu everything is host memory and kernels use ctx.parallel. On
// kCuda the weights (a DeviceWeights view), the pool and all scratch are device memory; each
// Forward() uploads the batch metadata, queues every layer on ctx.stream, copies the logits
// back and synchronises the stream once.
//
// Thread-compatible: one caller at a time (the scheduler thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model_weights.h"
#include "engine/model/moe_routing.h"
#include "engine/model/tensor_parallel.h"
#include "kernels/attention_params.h"
#include "kernels/device_memory.h"
#include "kernels/sampling_params.h"
#include "kernels/types.h"

namespace pd {
class ParallelFor;
}  // namespace pd

namespace pd::engine {

class Collective;

// The KV block pool the forward pass reads and writes, in the layout of docs/architecture.md,
// "KV layout" ([layer][K|V][kv_head][token][head_dim] per block): `num_blocks` blocks from
// `base`.
struct KvPoolView {
  void* base = nullptr;
  kernels::DType dtype = kernels::DType::kF32;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
};

struct ForwardSequence {
  absl::Span<const uint32_t> tokens;      // the new tokens, >= 1
  int64_t start_pos = 0;                  // position of tokens[0]
  absl::Span<const int32_t> block_table;  // physical blocks covering [0, start_pos + n)
  // RoPE position of tokens[j] = start_pos + j + rope_offset (start_pos + j is its slot in the
  // cache), >= 0. Non-zero only under the sink + window KV policy (the scheduler), where
  // dropped blocks put slots behind text positions. Every device; decode graphs included.
  int64_t rope_offset = 0;
  // The H2O and SnapKV KV policies (engine/scheduler/compress_policy.h): when non-null, every
  // layer adds the attention weight each cached key receives from tokens[mass_from..] to
  // attention_mass[(layer * H + g) * mass_stride + slot] for kv head g, H =
  // ModelConfig::kv_score_heads() (MLA: one row per layer, every head's weight on the latent
  // entry; kernels::AttentionMass, a pass after the layer's attention), mass_stride >=
  // start_pos + n. Memory on the forward's device (kCuda: device memory; kCpu, staged or not:
  // host memory), which the caller keeps until the step's stream work is done.
  float* attention_mass = nullptr;
  int64_t mass_stride = 0;
  int64_t mass_from = 0;
};

// How ForwardSample picks one sequence's next token: kernels/sampling_params.h's rule with these
// values (temperature below kernels::kMinSamplingTemperature, 1e-5, is greedy; top_k <= 0,
// top_p 1 and min_p 0 are off), after the logit edits and the token mask.
struct SampleSpec {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;  // (0, 1]
  uint64_t seed = 0;
  uint64_t step = 0;  // index of this token within its request (the draw's counter)
  // Also return this sequence's logits row (for log-probabilities, computed on the host).
  bool want_logits = false;
  // Structured output: the tokens this sequence may take, a bitmask of (vocab_size + 31) / 32
  // words on the host (bit t of word t / 32 = token t allowed); null = every token. Masked
  // tokens are never sampled, and their logits come back NaN (logprob -inf). Must stay valid
  // for the call.
  const uint32_t* allowed = nullptr;
  float min_p = 0.0f;  // [0, 1] (after the fields above: keeps their brace initialisers valid)
  // Logit bias and penalties (kernels::LogitEdit), applied to this sequence's logits row before
  // the mask and the sampler, at most one per token id, each id < vocab_size; empty = none (no
  // cost). The returned logits row (want_logits) has them applied. A step with any edits runs
  // kernel by kernel, never as a decode graph (the edits' count changes every step). Must stay
  // valid for the call.
  absl::Span<const kernels::LogitEdit> edits;
};

struct ForwardOptions {
  int64_t max_batch_tokens = 256;  // bound on the sum of new tokens per Forward() call
  int64_t max_seqs = 64;           // bound on sequences per call
  // Keep inv_freq and the batch metadata in the scratch allocation and upload them every
  // call, as on kCuda (where this is always so), also on kCpu: tests run the CUDA path's
  // staging on the host. Results are bitwise the same either way.
  bool staged_metadata = false;
  // Decode steps (every sequence one new token) as device graphs (issue #16 item 2): on kCuda
  // the step's kernels are captured once per (number of sequences, Forward or ForwardSample)
  // and replayed, one launch instead of hundreds. The batch metadata and sampling inputs are
  // uploaded into fixed buffers before each replay. A failed capture turns graphs off for the
  // object's life (logged) and the step runs kernel by kernel. On kCpu graphs apply only with
  // staged_metadata, emulated by replaying the step's code (kernels::DeviceGraph), so tests
  // check the capture and replay logic bitwise.
  bool decode_graphs = true;
  // Tensor parallelism (engine/model/tensor_parallel.h; docs/engine.md, "Tensor parallelism"):
  // N > 1 splits the model over N ranks, threads of this process that share the KV pool (each
  // rank its KV heads' rows; the pool keeps the TP = 1 layout), or each with a pool of its own
  // (tp_rank_pools, below). ctx.parallel's threads are
  // divided between the ranks: each gets its own team of max(1, threads / N). kCpu without
  // staged_metadata only (Unimplemented otherwise); any KV dtype, dense, mixture-of-experts and
  // MLA models, and the H2O and SnapKV policies' calls (ranks sharing a KV head, N >
  // n_kv_heads, take turns scoring it and its first rank moves it); InvalidArgument when N does
  // not split the model (PlanTensorParallel). Logits agree with N = 1 within float rounding (the
  // row-parallel sums are added in a different order), the same bits run to run.
  int32_t tensor_parallel = 1;
  // Per-rank KV pools (docs/engine.md, "Per-rank pools"; memory::TpKvPool): with N > 1, empty
  // (the ranks share the pool passed to Create, each its heads' rows of the TP = 1 layout) or
  // one view per rank, of the pool's dtype, block size and number of blocks, holding only the
  // heads TpPoolHeads gives that rank (its KV heads; MLA: the whole latent entry). Then each
  // rank writes and reads its own pool, ranks sharing a KV head each keep a copy (no barrier
  // between writing and attending), and the pool passed to Create is not read (its base may be
  // null). Logits and the KV gathered back into the TP = 1 layout are bitwise the shared
  // pool's. InvalidArgument when the count or a view's geometry differs.
  std::vector<KvPoolView> tp_rank_pools;
};

// Counts of decode graphs (ForwardOptions::decode_graphs).
struct GraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  bool off = false;  // a capture failed: graphs are off for good
};

class LlamaForward {
 public:
  // `weights` must outlive the object; the pool must match the model (num_kv_heads, head_dim
  // and layers come from weights->config). On kCuda, `weights` and `pool.base` must be device
  // memory (DeviceWeights, DeviceKvPool) and ctx.stream a stream of the current device (or
  // nullptr). InvalidArgument for inconsistent geometry; Unimplemented when a kernel does not
  // support the weight or cache dtype on ctx.device, for an MLA model's yarn mscale unequal to
  // mscale_all_dim off the CPU, or the build has no CUDA (naming
  // PD_ENABLE_CUDA); FailedPrecondition "no CUDA device"; ResourceExhausted when the scratch
  // memory does not fit.
  static absl::StatusOr<std::unique_ptr<LlamaForward>> Create(const ModelWeights* weights,
                                                              KvPoolView pool,
                                                              kernels::OpContext ctx,
                                                              ForwardOptions options);
  ~LlamaForward();

  // Bytes of ctx.device memory Create would allocate for its scratch (activations, logits,
  // workspaces, metadata) with these arguments; pool.base may be null. The runtime sizes a GPU
  // KV pool from what is left. Errors as Create, without allocating.
  static absl::StatusOr<int64_t> ScratchBytes(const ModelWeights* weights, KvPoolView pool,
                                              kernels::OpContext ctx, ForwardOptions options);

  // Runs the batch; `logits` is [batch.size()][vocab_size()]. Errors found before any compute
  // (the pool is then untouched): InvalidArgument for an empty sequence, a token id >= vocab, a
  // block table that does not cover the sequence or names a block outside the pool, too many tokens
  // or sequences for the options; OutOfRange when a position reaches the model's context length.
  // On kCuda, Internal for a failed launch, copy or synchronisation (naming the CUDA error); the
  // pool contents of the batch's new positions are then undefined.
  absl::Status Forward(absl::Span<const ForwardSequence> batch, float* logits);

  // Forward() and then the next token of every sequence, sampled where the logits are (issue
  // #16 item 3): on kCuda only the token ids, and the logits rows of sequences with
  // want_logits, come back to the host (not batch x vocab floats). `specs` and `tokens` have
  // batch.size() entries; `logits` is [batch.size()][vocab_size()], written only in the rows
  // with want_logits (may be nullptr when none asks). Tokens equal kernels::Sample's for each
  // logits row on the same device (CPU and CUDA differ only as kernels/sampling.h says; greedy
  // never). Errors as Forward(), plus InvalidArgument for a spec with a NaN temperature, a
  // top_p outside (0, 1], a min_p outside [0, 1] or an edit of a token outside the vocabulary
  // (found before any compute), or a null `logits` a spec needs.
  //
  // `masks_ready` (may be null): called once before the specs' `allowed` masks are read, so a
  // caller can compute them while the step runs. On kCpu (without staged_metadata) that is
  // after the classifier, right before the masks are applied: the layers run meanwhile. On
  // kCuda (and staged) it is before the step is queued (the masks are uploaded with the other
  // sampling inputs, ahead of a decode graph's launch). Not called when the call fails before
  // any compute; the caller must not rely on it being called.
  absl::Status ForwardSample(absl::Span<const ForwardSequence> batch,
                             absl::Span<const SampleSpec> specs, int32_t* tokens, float* logits,
                             const std::function<void()>& masks_ready = nullptr);

  // Copies the K/V of cache positions [0, num_tokens) of the blocks `src` (logical order) into
  // the same positions of the blocks `dst`, every layer, with the keys rotated `delta` RoPE
  // positions further (R(delta) R(p) k = R(p + delta) k): the values are read back to f32
  // (kernels::ReadKv), the keys rotated (kernels::Rope) and both written again (kernels::WriteKv,
  // which re-quantizes a quantized cache). The sink + window policy keeps its sink tokens'
  // pristine blocks and rebuilds their live copies from them with this after each dropped
  // block, so a key is rotated once from its original, never repeatedly. `src` and `dst` must
  // not share a block. On kCuda (and with staged_metadata) the tables and positions are
  // uploaded into a small piece of the scratch; the call synchronises the stream once at the
  // end. InvalidArgument for bad ids or sizes (more blocks than a sequence's table holds,
  // ceil(seq_len / block_size)); on kCuda, Internal for a failed launch, copy or
  // synchronisation, the pool's `dst` blocks then undefined.
  absl::Status CopyBlocksShifted(absl::Span<const int32_t> src, absl::Span<const int32_t> dst,
                                 int64_t num_tokens, int64_t delta);

  // The H2O and SnapKV KV policies' compaction: writes the kept cache rows into the blocks
  // `dst` (logical order), each (layer, kv head) on its own: its row i in `dst` is row
  // keep[(layer * H + g) * num_keep + i] (a cache slot, H = ModelConfig::kv_score_heads(); MLA:
  // one list per layer, for the whole latent entry) of the blocks `src`, K and V
  // and for a quantized cache their scales, byte for byte (nothing is re-rounded; keys keep
  // the RoPE rotation of their text position). `dst` must cover num_keep slots and share no
  // block with `src`. kernels::GatherKvRows on every device (staged: the ids uploaded first,
  // the stream synchronised after). InvalidArgument for bad ids, sizes or slots.
  absl::Status GatherKvRows(absl::Span<const int32_t> src, absl::Span<const int32_t> dst,
                            absl::Span<const int32_t> keep, int64_t num_keep);

  int64_t vocab_size() const { return config_.vocab_size; }
  kernels::Device device() const { return ctx_.device; }
  // The device and stream the steps run on (the memory of ForwardSequence::attention_mass).
  const kernels::OpContext& context() const { return ctx_; }
  // Whether the kernels read their metadata from device-layout buffers (kCuda, or kCpu with
  // staged_metadata): ForwardSequence::attention_mass then lives in a kernels::DeviceBuffer.
  bool staged() const { return Staged(); }
  const ForwardOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }
  // Bytes of one KV block of this model at the pool's dtype.
  int64_t block_bytes() const;
  // Decode graphs captured and replayed (with tensor parallelism, rank 0's: every rank makes
  // the same choices).
  GraphStats graph_stats() const;
  // Mixture of experts: token-expert assignments since creation, [layer][expert] flattened
  // (n_layers * n_experts entries; empty for a dense model). Read between steps.
  const std::vector<int64_t>& expert_tokens() const;
  // Tensor parallelism: each rank's cumulative nanoseconds waiting for its peers in
  // collectives (Collective::WaitNanos), rank order; empty at tensor_parallel 1.
  std::vector<int64_t> tp_wait_nanos() const;

 private:
  LlamaForward(const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx,
               ForwardOptions options);
  absl::Status Validate(absl::Span<const ForwardSequence> batch) const;
  // Validates and prepares the batch, stages the sampling inputs (specs non-empty), then queues
  // the step (QueueStep, or a decode graph's replay): logits_tmp_ holds the logits in slot
  // order, and with specs d_tokens_ the tokens; not yet synchronised.
  absl::Status Step(absl::Span<const ForwardSequence> batch, absl::Span<const SampleSpec> specs);
  // Every layer, the final norm, the classifier and (sample) the sampler for the prepared
  // batch of num_tokens rows. For a decode step it reads only fixed buffers: what a graph holds.
  absl::Status QueueStep(int64_t num_tokens, bool sample, bool masked, bool edited);
  // kCpu without staged_metadata: the masks of the step's specs, copied into mask_ by
  // QueueStep once masks_ready_ returned (ForwardSample's masks_ready). Null otherwise.
  absl::Span<const SampleSpec> deferred_masks_;
  const std::function<void()>* masks_ready_ = nullptr;
  // Applies edits_ to the num_seqs rows of logits_tmp_ (QueueStep, before the mask).
  absl::Status ApplyEdits(int64_t num_seqs);
  // Whether the prepared batch runs as a decode graph (a step with logit edits never does).
  bool GraphEligible(int64_t num_tokens, bool edited) const;
  absl::Status Layer(int layer, int64_t num_tokens);
  // The attention block of a layer (x_ += its output; xb_ holds the normalized input): grouped-
  // query attention over the paged cache, or multi-head latent attention (config_.mla(); any
  // device).
  absl::Status Attention(int layer, int64_t num_tokens);
  absl::Status MlaAttention(int layer, int64_t num_tokens);
  // Writes the step's new K and V rows (token_stride apart) into the pool at their positions.
  absl::Status WriteNewKv(const float* k, const float* v, int64_t token_stride,
                          const kernels::KvCacheView& cache, int64_t num_tokens);
  // The MLP block of a mixture-of-experts layer (config_.moe()): routes the tokens on the host
  // (moe_routing.h; staged: the router logits come down first, a stream sync per layer), runs
  // each expert's SwiGLU MLP over the tokens routed to it (gathered by CopyBlocks), and adds
  // the weighted outputs (ScaledScatterAdd, in expert order) to x_. The same kernels on every
  // device, so the staged host path is the CUDA path's bitwise check.
  absl::Status MoeMlp(int layer, int64_t num_tokens);
  // y (+)= x w^T + bias; w_scales: the per-row scales of int8 weights, else nullptr.
  absl::Status MatMul(const float* x, const void* w, const float* w_scales, const float* bias,
                      float* y, int64_t num_rows, int64_t in, int64_t out, bool accumulate);
  // A rank of a tensor-parallel group: its plan and its handle on the group's collectives.
  struct TpRankInit {
    TpRankPlan plan;
    Collective* comm = nullptr;
    bool shared_kv = false;
    int32_t pool_kv_heads = 0;
    bool own_pool = false;  // ForwardOptions::tp_rank_pools: the pool holds only its heads
  };
  static absl::StatusOr<std::unique_ptr<LlamaForward>> CreateImpl(
      const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx, ForwardOptions options,
      bool allocate, const TpRankInit* tp = nullptr);
  // options.tensor_parallel > 1: the group's coordinator (Create; measure_only: ScratchBytes,
  // the ranks' scratch summed, returned without a group).
  static absl::StatusOr<std::unique_ptr<LlamaForward>> CreateTensorParallel(
      const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx, ForwardOptions options,
      bool measure_only);

  // Tensor parallelism. The object the caller holds is the group's coordinator: it has no
  // scratch of its own and runs each call on every rank at once (rank 0 on the calling thread,
  // the others on the group's threads), returning rank 0's result; a rank that fails aborts the
  // group's collectives, so none waits for it. A rank (tp_comm_ set) runs the usual step with
  // its shard's sizes, plus the collectives: the embedding of its vocabulary rows and the
  // row-parallel attention and MLP outputs all-reduced, the classifier's columns all-gathered.
  struct TpGroup;
  std::unique_ptr<TpGroup> tp_group_;
  TpRankPlan tp_;
  Collective* tp_comm_ = nullptr;
  bool tp_shared_kv_ = false;
  // The model's KV heads (what the H2O/SnapKV mass rows and a gather's kept slots count).
  int32_t tp_pool_kv_heads_ = 0;
  // The rank's pool holds only its heads (tp_rank_pools), at 0, 1, ...: it reads the pool as a
  // TP = 1 forward pass of its shard would, and writes every head it reads.
  bool tp_own_pool_ = false;
  // A row-parallel matmul's partial sums [max_batch_tokens][dim]; the classifier's columns of
  // this rank's vocabulary [max_seqs][vocab_count]: scratch on ctx.device, as the collectives
  // run on the device's buffers.
  float *tp_partial_ = nullptr, *tp_logits_ = nullptr;
  // The embedding's (vocabulary row, token) pairs of this rank's rows, [rows][tokens] (host),
  // and their device copy (staged; else the host vector's data).
  std::vector<int32_t> tp_embed_ids_;
  int32_t* d_tp_embed_ids_ = nullptr;
  absl::Status RunRanks(const std::function<absl::Status(LlamaForward&)>& fn);
  // x_ = the embedding of the step's tokens: this rank's vocabulary rows, zeros elsewhere,
  // all-reduced.
  absl::Status TpEmbed(int64_t num_tokens);
  // x_ += the sum over ranks of tp_partial_ (num_tokens rows).
  absl::Status TpAddReduced(int64_t num_tokens);
  // Measures the scratch (scratch_bytes_), then unless measure_only allocates scratch_ on
  // ctx_.device and points the scratch pointers into it.
  absl::Status AllocateScratch(bool measure_only);
  // Whether the kernels read the metadata from the scratch (kCuda, or kCpu with
  // staged_metadata) rather than from the host vectors.
  bool Staged() const { return ctx_.device != kernels::Device::kCpu || options_.staged_metadata; }
  // Lays out the batch in slots, builds and (kCuda) uploads its metadata (token ids, positions,
  // tables, lengths; QueueStep embeds the tokens); returns the number of token rows.
  absl::StatusOr<int64_t> PrepareBatch(absl::Span<const ForwardSequence> batch);
  kernels::KvCacheView CacheView(int layer) const;

  const ModelWeights* weights_;
  const ModelConfig& config_;
  const KvPoolView pool_;
  const kernels::OpContext ctx_;
  const ForwardOptions options_;

  // Per-call layout of the batch. Single-token sequences come first (contiguous, one
  // DecodeAttention call for all of them), then multi-token ones (one PrefillAttention each).
  struct Slot {
    int64_t batch_index;  // index into the caller's batch
    int64_t first_token;  // row of its first new token in the activation buffers
    int64_t num_tokens;
    int64_t start_pos;
  };
  std::vector<Slot> slots_;
  // Per slot: the batch's ForwardSequence::attention_mass fields (AccumulateMass).
  struct MassTarget {
    float* mass = nullptr;
    int64_t stride = 0;
    int64_t from = 0;
  };
  std::vector<MassTarget> slot_mass_;
  bool any_mass_ = false;
  // kernels::AttentionMass after a layer's attention for the slots that ask, reading the keys
  // from the cache. Ranks sharing a KV head take turns (AccumulateMassOfSlots between
  // barriers). MLA: the absorbed queries (mla_query_) against whole latent entries, with the
  // attention's `mla_scale`, into the layer's one row.
  absl::Status AccumulateMass(int layer, float mla_scale = 0.0f);
  absl::Status AccumulateMassOfSlots(int layer, float mla_scale);
  int64_t num_decode_slots_ = 0;
  // AttentionMass's workspace (staged: scratch) and GatherKvRows's uploaded ids (staged: grown
  // on demand).
  float* mass_stats_ = nullptr;
  kernels::DeviceBuffer gather_ids_;

  // Scratch on ctx.device, sized for options_.max_batch_tokens rows (activations) / max_seqs
  // (tables, logits): one allocation, the pointers below point into it.
  kernels::DeviceBuffer scratch_;
  int64_t scratch_bytes_ = 0;
  float *x_ = nullptr, *xb_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *att_ = nullptr, *gate_ = nullptr, *up_ = nullptr;
  float* logits_tmp_ = nullptr;  // [max_seqs][vocab], slot order
  // Mixture of experts: router logits [tokens][n_experts], one expert's gathered inputs
  // and outputs [tokens][dim], the weighted sum of the experts' outputs [tokens][dim].
  float *router_logits_ = nullptr, *moe_in_ = nullptr, *moe_out_ = nullptr, *moe_sum_ = nullptr;
  MoeRouting routing_;
  // The routing packed by expert (host; its tokens and weights, experts one after another), the
  // router logits brought to the host (staged), and the packed routing's device copy (staged;
  // else the host vectors' data).
  std::vector<int32_t> moe_rows_host_;
  std::vector<float> moe_weights_host_, router_logits_host_;
  int32_t* d_moe_rows_ = nullptr;
  float* d_moe_weights_ = nullptr;
  // MLA: q_a_proj's output [tokens][q_lora_rank], the new cache entries
  // [tokens][kv_lora_rank + qk_rope_head_dim], the heads' rope parts [tokens][n_heads][rope],
  // the queries in latent space [tokens][n_heads][latent] and their weighted latents
  // [tokens][n_heads][kv_lora_rank].
  float *mla_qa_ = nullptr, *mla_latent_ = nullptr, *mla_qpe_ = nullptr;
  float *mla_query_ = nullptr, *mla_sum_ = nullptr;
  std::vector<int64_t> expert_tokens_;
  void* workspace_ = nullptr;  // matmul and decode attention workspace (device memory on kCuda)
  int64_t workspace_bytes_ = 0;
  const float* inv_freq_ = nullptr;  // [head_dim / 2]
  // ForwardSample's per-slot sampling inputs and the sampled tokens: the host vectors on kCpu
  // (without staged_metadata), device copies in the scratch otherwise; sample_ws_: the CPU
  // sampler's workspace.
  std::vector<float> temperature_, top_p_;
  std::vector<int32_t> top_k_, slot_tokens_;
  std::vector<uint64_t> seeds_, steps_;
  float *d_temperature_ = nullptr, *d_top_p_ = nullptr;
  int32_t *d_top_k_ = nullptr, *d_tokens_ = nullptr;
  uint64_t *d_seeds_ = nullptr, *d_steps_ = nullptr;
  std::vector<uint8_t> sample_ws_;
  // Token masks in slot order ([max_seqs][mask_words_], all ones for unmasked rows), staged like
  // the sampling inputs; used when some row of the step has SampleSpec::allowed.
  int64_t mask_words_ = 0;
  std::vector<uint32_t> mask_;
  uint32_t* d_mask_ = nullptr;
  // min_p per slot, staged like temperature_.
  std::vector<float> min_p_;
  float* d_min_p_ = nullptr;
  // The step's logit edits, every row's in slot order, and each edit's slot. Staged steps upload
  // them in chunks of kEditChunk into d_edits_ / d_edit_rows_ (fixed scratch, so a long edit
  // list never allocates), applying each chunk before the next overwrites it (one stream).
  std::vector<kernels::LogitEdit> edits_;
  std::vector<int32_t> edit_rows_;
  kernels::LogitEdit* d_edits_ = nullptr;
  int32_t* d_edit_rows_ = nullptr;
  int64_t edit_chunk_ = 0;

  // The decode attention's DecodeAttentionParams::max_context_len for the prepared batch.
  int64_t decode_bound_ = 0;
  // Decode graphs, captured on first use, by (sequences, ForwardSample, decode_bound_, masks).
  struct GraphKey {
    int64_t num_seqs;
    bool sample;
    int64_t decode_bound;
    bool masked;
    bool operator<(const GraphKey& o) const {
      return std::tie(num_seqs, sample, decode_bound, masked) <
             std::tie(o.num_seqs, o.sample, o.decode_bound, o.masked);
    }
  };
  std::map<GraphKey, kernels::DeviceGraph> graphs_;
  GraphStats graph_stats_;

  // Batch metadata, built on the host each call; the d_* pointers are what the kernels read:
  // the host vectors themselves on kCpu, device copies (uploaded once per Forward) on kCuda.
  // positions_ is [2][max_batch_tokens]: the rows' cache slots, then their RoPE positions
  // (slot + rope_offset). Both halves go up in one copy each step and d_rope_positions_ is a
  // fixed pointer (d_positions_ + max_batch_tokens), so a decode graph, which bakes in its
  // pointers, serves sequences with and without offsets alike: the sink + window policy keeps
  // its graphs for one copy of at most 4 * max_batch_tokens more bytes per step.
  std::vector<float> inv_freq_host_;
  std::vector<int32_t> positions_, token_seq_, token_ids_, block_tables_, context_lens_;
  const int32_t* d_rope_positions_ = nullptr;
  // CopyBlocksShifted's index arrays when staged: [2][max_blocks_per_seq_] block tables, then
  // [2][max_batch_tokens] slots and RoPE shifts.
  int32_t* d_shift_ = nullptr;
  int32_t *d_positions_ = nullptr, *d_token_seq_ = nullptr, *d_token_ids_ = nullptr,
          *d_block_tables_ = nullptr, *d_context_lens_ = nullptr;
  int64_t max_blocks_per_seq_ = 0;
};

}  // namespace pd::engine
