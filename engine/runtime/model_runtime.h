// ModelRuntime: everything one worker needs to run a model, built from a path: the weights
// (a Hugging Face directory or a llama2.c checkpoint), the tokenizer, the KV pool (host memory,
// or device memory with --device cuda), the KV cache manager, the forward pass, the CPU thread
// team (cpu) or CUDA stream (cuda) and the scheduler.
//
// Used by pd-generate and pd-worker. Thread-compatible: the scheduler is driven by one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/threads/parallel_for.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/memory/kv_pool_memory.h"
#include "engine/model/device_weights.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/model/tokenizer.h"
#include "engine/runtime/model_front.h"
#include "engine/scheduler/scheduler.h"
#include "kernels/device_memory.h"

namespace pd::engine {

struct ModelRuntimeConfig {
  // A Hugging Face model directory (config.json, model.safetensors[.index.json],
  // tokenizer.json) or a llama2.c checkpoint file (then `tokenizer` is its tokenizer.bin).
  std::string model;
  std::string tokenizer;
  // KV pool size in blocks; 0 (cuda only) = as many as fit gpu_memory_fraction of the device's
  // memory after the weights, the forward pass's scratch and kGpuReserveBytes.
  int64_t kv_blocks = 1024;
  double gpu_memory_fraction = 0.9;  // (0, 1]: share of the GPU's total memory pdserve may use
  int64_t block_size = 16;           // tokens per block
  int threads = 0;                   // CPU threads for kernels; 0 = all cores (unused on cuda)
  // --tensor_parallel: the model split over this many ranks (ForwardOptions::tensor_parallel:
  // CPU ranks sharing the KV pool, whose layout stays TP = 1's; threads divided between them).
  // 1 = off. Not with --kv_policy when N exceeds the model's KV heads yet.
  int tensor_parallel = 1;
  // --tp_kv_pools=per_rank: with tensor_parallel > 1, each rank keeps the KV of its heads in a
  // pool of its own (memory::TpKvPool; ForwardOptions::tp_rank_pools), as ranks on separate
  // GPUs must, instead of sharing one. kv_memory() then copies blocks in the TP = 1 layout
  // (tiers, restores) and has no single base: the worker's KV hand-off registers it staged
  // (disagg::KvHandoff::RegisterStagedPool). CPU only so far. False = one shared pool.
  bool tp_rank_pools = false;
  // Where the weights, the KV pool and the forward pass live (--device cpu|cuda). On cuda the
  // weights are uploaded once and the pool is device memory of the current CUDA device.
  kernels::Device device = kernels::Device::kCpu;
  // Dtype of the KV cache (--kv_dtype). It is part of the KV layout every peer checks (prefill
  // and decode workers, the node's tiers) and of the block-hash seed (scheduler.kv_dtype is set
  // from it), so caches of different dtypes never mix. The device must support it.
  kernels::DType kv_dtype = kernels::DType::kF32;
  // --weight_dtype (engine/runtime/model_front.h): int8 quantizes the linear matrices at load.
  WeightDType weight_dtype = WeightDType::kAuto;
  // --huge_page_weights: on the CPU, copy the checkpoint's matrices out of its mapping (4 KiB
  // pages) into transparent huge pages at load (CopyWeightsToHugePages): the same bytes, faster
  // decode, the mapped checkpoint left as reclaimable page cache. Skipped where the kernel
  // gives no huge pages, on CUDA, and for int8 weights (quantized into huge pages anyway).
  bool huge_page_weights = true;
  SchedulerConfig scheduler;
  // Speculative decoding with a draft model (scheduler.speculative "draft"): the draft's path
  // (a Hugging Face directory or a llama2.c checkpoint, with the model's tokenizer: its
  // vocabulary must be the model's), its weights (--draft_weight_dtype: int8 quantizes its
  // matrices at load, a quantized copy of the model makes a draft), and its own KV pool's
  // blocks (of block_size tokens, kv_dtype; 0 = as many as the model's pool). On the model's
  // device.
  std::string draft_model;
  WeightDType draft_weight_dtype = WeightDType::kAuto;
  int64_t draft_kv_blocks = 0;
  // Receives the KV cache's stored/removed events (e.g. the worker's KV event publisher); null
  // = none. Not owned; must outlive the runtime.
  kvcache::KvEventListener* kv_listener = nullptr;
  // Called with a cached block's hash right before the pool reuses the block (LRU eviction),
  // e.g. to offer it to the node's DRAM tier: `copy_to(dst)` copies the block's bytes to host
  // memory at `dst` (from a device pool with cudaMemcpyAsync, waited for) and says whether it
  // worked; valid only during the call. Runs on the scheduler thread inside an allocation:
  // return quickly. Empty = none.
  using CopyBlockTo = absl::FunctionRef<bool(uint8_t* dst)>;
  std::function<void(const BlockHash& hash, CopyBlockTo copy_to)> on_evict;
  // The same, called right after a block is newly committed to the prefix cache (its KV is
  // computed: a prompt block after prefill, a generated one when it fills), e.g. to write it
  // through to the node's DRAM tier at once rather than at eviction. Empty = none.
  std::function<void(const BlockHash& hash, CopyBlockTo copy_to)> on_store;
  // Where the KV pool's bytes come from (e.g. the KV transport's AllocateHost, so peers write
  // into it fastest); empty = an anonymous mapping with transparent huge pages.
  memory::PoolMemoryAllocator pool_allocator;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// "cpu" -> kCpu, "cuda" -> kCuda; InvalidArgument naming --device otherwise.
absl::StatusOr<kernels::Device> ParseDevice(absl::string_view name);
// --tp_kv_pools: "shared" -> false, "per_rank" -> true (ModelRuntimeConfig::tp_rank_pools);
// InvalidArgument naming the flag otherwise.
absl::StatusOr<bool> ParseTpKvPools(absl::string_view name);
// "cpu" or "cuda".
absl::string_view DeviceName(kernels::Device device);

// The scheduler's batch limits that suit a device (issue #16 item 7), for pd-worker's
// --max_batch_tokens / --max_running left at 0. CPU: 256 tokens and 32 sequences per step, a
// step's worth for a few cores. CUDA: 2048 tokens (chunked prefill mixed into decode steps) and
// 256 sequences: a GPU decode step reads all the weights once, so it needs hundreds of sequences
// to be worth it.
struct DeviceBatchLimits {
  int64_t max_batch_tokens = 0;
  int64_t max_running = 0;
};
DeviceBatchLimits BatchLimitsFor(kernels::Device device);

// --kv_blocks 0 on cuda: the pool gets fraction x the GPU's total memory, less what is in use
// after the weights are uploaded (total - free), the forward pass's scratch and this reserve
// (cuBLAS workspaces, CUDA graphs and the transport's buffers allocate later), in whole blocks.
inline constexpr int64_t kGpuReserveBytes = int64_t{1} << 30;
inline constexpr int64_t kMinAutoKvBlocks = 16;  // fewer: a startup error naming the numbers
struct AutoPoolSize {
  int64_t budget_bytes = 0;
  int64_t blocks = 0;
};
AutoPoolSize AutoPoolBlocks(int64_t total_bytes, int64_t free_bytes, double fraction,
                            int64_t scratch_bytes, int64_t block_bytes);

// The KV layout a worker of this model uses for `block_size`-token blocks of `kv_dtype`.
// pd-tierd derives its pool geometry from the same function, so a worker's layout and its
// node's tiers agree by construction.
kvcache::KvLayout KvLayoutForModel(const ModelConfig& config, int64_t block_size,
                                   kernels::DType kv_dtype = kernels::DType::kF32);

class ModelRuntime {
 public:
  // Errors: NotFound for a missing model or tokenizer file, InvalidArgument for a malformed
  // one (naming the file and the problem), ResourceExhausted when the KV pool cannot be mapped
  // or allocated. With device cuda: Unimplemented naming PD_ENABLE_CUDA in a build without
  // CUDA, FailedPrecondition "no CUDA device" where none is usable (both before the model is
  // loaded), Internal for a failed upload.
  static absl::StatusOr<std::unique_ptr<ModelRuntime>> Create(ModelRuntimeConfig config);
  ~ModelRuntime();

  Scheduler* scheduler() { return scheduler_.get(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelConfig& model_config() const { return weights_.config; }
  const std::string& fingerprint() const { return weights_.fingerprint; }
  const kvcache::KvLayout& kv_layout() const { return layout_; }
  // KV pool blocks: config.kv_blocks, or the size --kv_blocks 0 chose.
  int64_t kv_blocks() const { return config_.kv_blocks; }
  // The host pool (device cpu), or nullptr on device cuda and with per-rank pools: use
  // kv_memory() for block copies.
  memory::HostKvPool* kv_pool() { return pool_.get(); }
  // The pool's bytes on either device (registration with the transport, block copies).
  memory::KvPoolMemory* kv_memory() { return memory_.get(); }
  kernels::Device device() const { return config_.device; }
  kvcache::KvCacheManager* kv_cache() { return kv_.get(); }
  // Drain (the worker's SIGTERM): offers the full computed blocks of every running
  // generation to the node's tiers through config.on_evict, as if they were evicted, so that
  // the worker each stream moves to restores them instead of computing them again. Engine
  // loop thread (between steps). Returns how many blocks were offered; 0 without on_evict.
  int64_t OfferRunningBlocks();
  // One line describing the model and the pool, for startup logs.
  std::string Describe() const;

 private:
  ModelRuntime() = default;

  ModelRuntimeConfig config_;
  std::unique_ptr<Llama2cCheckpoint> llama2c_;
  std::unique_ptr<HfModel> hf_;
  // With weight_dtype int8 or huge-page weights: the loaded weights, which weights_ still views
  // (norms, biases, maybe the embedding). Empty otherwise.
  ModelWeights loaded_weights_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  kvcache::KvLayout layout_;
  std::unique_ptr<memory::HostKvPool> pool_;       // device cpu
  kernels::DeviceStream stream_;                   // device cuda: the forward pass's stream
  std::unique_ptr<DeviceWeights> device_weights_;  // device cuda
  // A view of pool_, the DeviceKvPool, or (tp_rank_pools) the ranks' TpKvPool.
  std::unique_ptr<memory::KvPoolMemory> memory_;
  std::unique_ptr<kvcache::KvCacheManager> kv_;
  std::unique_ptr<ParallelFor> parallel_;  // device cpu
  std::unique_ptr<LlamaForward> forward_;
  // The draft model (config.draft_model), as the model above: its owner, weights, pool (host:
  // draft_pool_ and a view of it; cuda: a DeviceKvPool) and forward pass.
  std::unique_ptr<Llama2cCheckpoint> draft_llama2c_;
  std::unique_ptr<HfModel> draft_hf_;
  ModelWeights draft_loaded_weights_;
  ModelWeights draft_weights_;
  std::unique_ptr<DeviceWeights> draft_device_weights_;
  std::unique_ptr<memory::HostKvPool> draft_pool_;
  std::unique_ptr<memory::KvPoolMemory> draft_memory_;
  std::unique_ptr<LlamaForward> draft_forward_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace pd::engine
