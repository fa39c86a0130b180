#include "engine/runtime/model_runtime.h"

#include <sys/stat.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/memory/device_kv_pool.h"
#include "engine/memory/tp_kv_pool.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/llama2c_tokenizer.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/type_names.h"

namespace pd::engine {

namespace {

// --kv_blocks 0 on cuda: the blocks that fit gpu_memory_fraction of the device's total memory,
// less what is in use now (the CUDA context, the weights just uploaded, other processes), the
// forward pass's scratch and a reserve for what cuBLAS and CUDA graphs allocate later.
// The draft model's forward pass: one row per sequence (DraftProposer), prompts caught up
// within the step's tokens.
ForwardOptions DraftForwardOptions(const ModelRuntimeConfig& config) {
  return {config.scheduler.max_batch_tokens, config.scheduler.max_running};
}

// With a draft model (its weights already uploaded, `draft`), its scratch counts too, and each
// block of the model's pool comes with one of the draft's (`draft_layout`): the two pools get
// the same number of blocks.
absl::StatusOr<int64_t> AutoKvBlocks(const ModelRuntimeConfig& config, const ModelWeights& weights,
                                     const kvcache::KvLayout& layout, const kernels::OpContext& ctx,
                                     const ModelWeights* draft = nullptr,
                                     const kvcache::KvLayout* draft_layout = nullptr) {
  ForwardOptions options{config.scheduler.max_batch_tokens, config.scheduler.ForwardMaxSeqs()};
  options.tensor_parallel = config.tensor_parallel;
  PD_ASSIGN_OR_RETURN(int64_t scratch,
                      LlamaForward::ScratchBytes(
                          &weights, {nullptr, layout.dtype, 1, config.block_size}, ctx, options));
  int64_t block_bytes = layout.block_bytes();
  if (draft != nullptr) {
    PD_ASSIGN_OR_RETURN(
        const int64_t draft_scratch,
        LlamaForward::ScratchBytes(draft, {nullptr, layout.dtype, 1, config.block_size}, ctx,
                                   DraftForwardOptions(config)));
    scratch += draft_scratch;
    block_bytes += draft_layout->block_bytes();
  }
  PD_ASSIGN_OR_RETURN(const kernels::DeviceMemoryInfo mem, kernels::QueryDeviceMemory(ctx.device));
  const AutoPoolSize size = AutoPoolBlocks(mem.total_bytes, mem.free_bytes,
                                           config.gpu_memory_fraction, scratch, block_bytes);
  LOG(INFO) << "--kv_blocks 0: " << size.blocks << " blocks of " << block_bytes << " bytes"
            << (draft != nullptr ? " (the model's and the draft's)" : "") << " (GPU "
            << (mem.total_bytes >> 20) << " MiB, " << (mem.free_bytes >> 20)
            << " MiB free after the weights, fraction " << config.gpu_memory_fraction
            << ", forward scratch " << (scratch >> 20) << " MiB, reserve "
            << (kGpuReserveBytes >> 20) << " MiB)";
  if (size.blocks < kMinAutoKvBlocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--kv_blocks 0: only ", size.budget_bytes, " bytes left for the KV pool (GPU total ",
        mem.total_bytes, ", free ", mem.free_bytes, ", fraction ", config.gpu_memory_fraction,
        ", forward scratch ", scratch, ", reserve ", kGpuReserveBytes, "): fewer than ",
        kMinAutoKvBlocks, " blocks of ", block_bytes,
        " bytes; raise --gpu_memory_fraction, lower --max_batch_tokens, or set --kv_blocks"));
  }
  return size.blocks;
}

}  // namespace

AutoPoolSize AutoPoolBlocks(int64_t total_bytes, int64_t free_bytes, double fraction,
                            int64_t scratch_bytes, int64_t block_bytes) {
  const int64_t used = total_bytes - free_bytes;
  const int64_t budget = static_cast<int64_t>(static_cast<double>(total_bytes) * fraction) - used -
                         scratch_bytes - kGpuReserveBytes;
  AutoPoolSize s;
  s.budget_bytes = budget > 0 ? budget : 0;
  s.blocks = block_bytes > 0 ? s.budget_bytes / block_bytes : 0;
  return s;
}

absl::Status ModelRuntimeConfig::Validate() const {
  if (model.empty()) {
    return absl::InvalidArgumentError("--model is empty");
  }
  if (kv_blocks < 0 || (kv_blocks == 0 && device != kernels::Device::kCuda)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_blocks must be > 0 (or 0 = fill the GPU, with --device cuda), got ", kv_blocks));
  }
  if (!(gpu_memory_fraction > 0.0 && gpu_memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_memory_fraction must be in (0, 1], got ", gpu_memory_fraction));
  }
  if (block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_size must be in [1, 1024], got ", block_size));
  }
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 0, got ", threads));
  }
  if (tensor_parallel < 1 || tensor_parallel > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel must be in [1, 64], got ", tensor_parallel));
  }
  if (tp_rank_pools && tensor_parallel < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp_kv_pools=per_rank needs --tensor_parallel of 2 or more, got ", tensor_parallel));
  }
  if (weight_dtype == WeightDType::kInt8 && !kernels::SupportsMatMul(device, kernels::DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat("--weight_dtype int8 is not supported on ",
                                                   DeviceName(device),
                                                   " in this build (no int8 MatMul for it)"));
  }
  if (scheduler.speculative == "draft" && draft_model.empty()) {
    return absl::InvalidArgumentError(
        "--speculative=draft needs --draft_model (a smaller model "
        "with the model's tokenizer)");
  }
  if (!draft_model.empty() && scheduler.speculative != "draft") {
    return absl::InvalidArgumentError(absl::StrCat("--draft_model is set but --speculative is \"",
                                                   scheduler.speculative, "\" (not \"draft\")"));
  }
  if (draft_kv_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--draft_kv_blocks must be >= 0 (0 = as many as --kv_blocks), got ", draft_kv_blocks));
  }
  if (draft_weight_dtype == WeightDType::kInt8 &&
      !kernels::SupportsMatMul(device, kernels::DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat("--draft_weight_dtype int8 is not supported on ",
                                                   DeviceName(device),
                                                   " in this build (no int8 MatMul for it)"));
  }
  if (!kernels::SupportsAttention(device, kv_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_dtype ", kernels::DTypeName(kv_dtype),
                                                   " is not supported on ", DeviceName(device),
                                                   " in this build"));
  }
  return scheduler.Validate();
}

ModelRuntime::~ModelRuntime() = default;

absl::StatusOr<kernels::Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") {
    return kernels::Device::kCpu;
  }
  if (name == "cuda") {
    return kernels::Device::kCuda;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be cpu or cuda, got \"", name, "\""));
}

absl::StatusOr<bool> ParseTpKvPools(absl::string_view name) {
  if (name == "shared") return false;
  if (name == "per_rank") return true;
  return absl::InvalidArgumentError(
      absl::StrCat("--tp_kv_pools must be shared or per_rank, got \"", name, "\""));
}

absl::string_view DeviceName(kernels::Device device) {
  return device == kernels::Device::kCuda ? "cuda" : "cpu";
}

DeviceBatchLimits BatchLimitsFor(kernels::Device device) {
  if (device == kernels::Device::kCuda) {
    return {2048, 256};
  }
  return {256, 32};
}

namespace {

// Replaces *weights by `make(*weights)` (int8 quantization, or the copy into huge pages); the
// loaded weights move to *loaded, which the new ones still view (norms, biases, maybe the
// embedding). Logs what was done, how long it took and the matrix bytes before and after.
absl::Status ReplaceWeightsAtLoad(ModelWeights* weights, ModelWeights* loaded,
                                  absl::StatusOr<ModelWeights> (*make)(const ModelWeights&),
                                  absl::string_view done, absl::string_view note) {
  const absl::Time start = absl::Now();
  PD_ASSIGN_OR_RETURN(ModelWeights made, make(*weights));
  constexpr double kMiB = 1 << 20;
  LOG(INFO) << "weights " << done << " in " << absl::ToDoubleMilliseconds(absl::Now() - start)
            << " ms: matrices and embedding " << MatrixWeightBytes(*weights) / kMiB << " MiB ("
            << kernels::DTypeName(weights->dtype) << ") -> " << MatrixWeightBytes(made) / kMiB
            << " MiB (" << kernels::DTypeName(made.dtype) << ", embedding "
            << kernels::DTypeName(made.embedding_dtype) << ")" << note;
  *loaded = std::move(*weights);  // moves keep the owned arrays (and the views into them) valid
  *weights = std::move(made);
  return absl::OkStatus();
}

// The draft model's weights (config.draft_model), their owner kept in *hf or *ckpt, quantized
// to int8 when asked (the loaded ones then in *loaded).
absl::Status LoadDraftWeights(const ModelRuntimeConfig& config, std::unique_ptr<HfModel>* hf,
                              std::unique_ptr<Llama2cCheckpoint>* ckpt, ModelWeights* loaded,
                              ModelWeights* weights) {
  struct stat st;
  if (::stat(config.draft_model.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("--draft_model ", config.draft_model, " does not exist"));
  }
  if (S_ISDIR(st.st_mode)) {
    PD_ASSIGN_OR_RETURN(HfModel model, HfModel::Load(config.draft_model));
    *hf = std::make_unique<HfModel>(std::move(model));
    PD_ASSIGN_OR_RETURN(*weights, WeightsFromHf(**hf));
  } else {
    PD_ASSIGN_OR_RETURN(Llama2cCheckpoint c, Llama2cCheckpoint::Load(config.draft_model));
    *ckpt = std::make_unique<Llama2cCheckpoint>(std::move(c));
    *weights = WeightsFromLlama2c(**ckpt);
  }
  if (config.draft_weight_dtype == WeightDType::kInt8) {
    PD_RETURN_IF_ERROR(ReplaceWeightsAtLoad(weights, loaded, &QuantizeWeightsInt8,
                                            "(draft) quantized to int8", ""));
  }
  return absl::OkStatus();
}

}  // namespace

kvcache::KvLayout KvLayoutForModel(const ModelConfig& c, int64_t block_size,
                                   kernels::DType kv_dtype) {
  return {c.n_layers, c.cache_kv_heads(), c.cache_head_dim(), block_size, kv_dtype};
}

absl::StatusOr<std::unique_ptr<ModelRuntime>> ModelRuntime::Create(ModelRuntimeConfig config) {
  PD_RETURN_IF_ERROR(config.Validate());
  // Before loading anything: "this build has no CUDA" / "no CUDA device" are startup errors.
  PD_RETURN_IF_ERROR(kernels::CheckDeviceAvailable(config.device));
  std::unique_ptr<ModelRuntime> rt(new ModelRuntime());
  struct stat st;
  if (::stat(config.model.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model ", config.model, " does not exist"));
  }
  if (S_ISDIR(st.st_mode)) {
    PD_ASSIGN_OR_RETURN(HfModel model, HfModel::Load(config.model));
    rt->hf_ = std::make_unique<HfModel>(std::move(model));
    PD_ASSIGN_OR_RETURN(rt->weights_, WeightsFromHf(*rt->hf_));
    const std::string tok_path =
        config.tokenizer.empty() ? absl::StrCat(config.model, "/tokenizer.json") : config.tokenizer;
    PD_ASSIGN_OR_RETURN(HfTokenizer tok, HfTokenizer::Load(tok_path));
    rt->tokenizer_ = std::make_unique<HfTokenizer>(std::move(tok));
  } else {
    if (config.tokenizer.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", config.model,
                       " is a llama2.c checkpoint: pass its tokenizer.bin with --tokenizer"));
    }
    PD_ASSIGN_OR_RETURN(Llama2cCheckpoint ckpt, Llama2cCheckpoint::Load(config.model));
    rt->llama2c_ = std::make_unique<Llama2cCheckpoint>(std::move(ckpt));
    rt->weights_ = WeightsFromLlama2c(*rt->llama2c_);
    PD_ASSIGN_OR_RETURN(Llama2cTokenizer tok,
                        Llama2cTokenizer::Load(config.tokenizer, rt->weights_.config.vocab_size));
    rt->tokenizer_ = std::make_unique<Llama2cTokenizer>(std::move(tok));
  }
  if (config.weight_dtype == WeightDType::kInt8) {
    PD_RETURN_IF_ERROR(ReplaceWeightsAtLoad(&rt->weights_, &rt->loaded_weights_,
                                            &QuantizeWeightsInt8, "quantized to int8", ""));
  } else if (config.huge_page_weights && config.device == kernels::Device::kCpu) {
    if (TransparentHugePagesAvailable()) {
      PD_RETURN_IF_ERROR(ReplaceWeightsAtLoad(
          &rt->weights_, &rt->loaded_weights_, &CopyWeightsToHugePages, "copied into huge pages",
          "; --huge_page_weights=false decodes from the mapping"));
    } else {
      LOG(INFO) << "transparent huge pages are off on this machine "
                   "(/sys/kernel/mm/transparent_hugepage/enabled): weights stay mapped";
    }
  }
  rt->layout_ = KvLayoutForModel(rt->weights_.config, config.block_size, config.kv_dtype);
  const bool with_draft = !config.draft_model.empty();
  kvcache::KvLayout draft_layout;
  if (with_draft) {
    PD_RETURN_IF_ERROR(LoadDraftWeights(config, &rt->draft_hf_, &rt->draft_llama2c_,
                                        &rt->draft_loaded_weights_, &rt->draft_weights_));
    if (rt->draft_weights_.config.vocab_size != rt->weights_.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--draft_model ", config.draft_model, " has a vocabulary of ",
          rt->draft_weights_.config.vocab_size, " tokens, --model ", config.model, " of ",
          rt->weights_.config.vocab_size, ": a draft model must share the model's tokenizer"));
    }
    draft_layout = KvLayoutForModel(rt->draft_weights_.config, config.block_size, config.kv_dtype);
  }
  // The block-hash seed names the cache dtype: blocks of different dtypes never match.
  config.scheduler.kv_dtype = std::string(kernels::DTypeName(config.kv_dtype));
  const bool on_cuda = config.device == kernels::Device::kCuda;
  kernels::OpContext ctx;
  ctx.device = config.device;
  const ModelWeights* forward_weights = &rt->weights_;
  std::vector<KvPoolView> rank_pools;  // tp_rank_pools: each rank's pool, for the forward pass
  if (on_cuda) {
    PD_ASSIGN_OR_RETURN(rt->stream_, kernels::DeviceStream::Create(config.device));
    ctx.stream = rt->stream_.handle();
    PD_ASSIGN_OR_RETURN(rt->device_weights_, DeviceWeights::Upload(rt->weights_, ctx));
    forward_weights = &rt->device_weights_->weights();
    if (with_draft) {
      PD_ASSIGN_OR_RETURN(rt->draft_device_weights_,
                          DeviceWeights::Upload(rt->draft_weights_, ctx));
    }
    if (config.kv_blocks == 0) {
      PD_ASSIGN_OR_RETURN(config.kv_blocks,
                          AutoKvBlocks(config, *forward_weights, rt->layout_, ctx,
                                       with_draft ? &rt->draft_device_weights_->weights() : nullptr,
                                       with_draft ? &draft_layout : nullptr));
    }
    PD_ASSIGN_OR_RETURN(rt->memory_,
                        memory::DeviceKvPool::Create(rt->layout_, config.kv_blocks, config.device));
  } else if (config.tp_rank_pools && config.tensor_parallel > 1) {
    PD_ASSIGN_OR_RETURN(TpPlan plan,
                        PlanTensorParallel(rt->weights_.config, config.tensor_parallel));
    std::vector<memory::TpKvPool::RankHeads> heads;
    for (const TpPoolHeads& h : PoolHeadsOfRanks(rt->weights_.config, plan)) {
      heads.push_back({h.begin, h.count});
    }
    // Faulted in at creation: otherwise the first copy into a block (a hand-off's arrival, a
    // tier restore) pays for its pages, three times the copy itself as measured
    // (docs/benchmarks.md, "Tensor parallelism on the CPU").
    memory::HostKvPoolOptions rank_options;
    rank_options.populate = true;
    PD_ASSIGN_OR_RETURN(
        std::unique_ptr<memory::TpKvPool> ranks,
        memory::TpKvPool::CreateHost(rt->layout_, config.kv_blocks, heads, rank_options));
    for (int r = 0; r < ranks->num_ranks(); ++r) {
      rank_pools.push_back(
          {ranks->rank(r)->base(), rt->layout_.dtype, config.kv_blocks, config.block_size});
    }
    rt->memory_ = std::move(ranks);
  } else {
    memory::HostKvPoolOptions pool_options;
    pool_options.allocator = config.pool_allocator;
    PD_ASSIGN_OR_RETURN(rt->pool_,
                        memory::HostKvPool::Create(rt->layout_, config.kv_blocks, pool_options));
    rt->memory_ = std::make_unique<memory::HostKvPoolMemory>(rt->pool_.get());
  }
  // Both hooks run on the scheduler thread between steps, so no forward pass is writing the
  // block. A device pool copies it out with cudaMemcpyAsync and waits (into page-locked shared
  // memory when the tier client has an unbound slot). A failed copy loses only the tier offer.
  memory::KvPoolMemory* pool = rt->memory_.get();
  const auto copy_hook =
      [pool](std::function<void(const BlockHash&, ModelRuntimeConfig::CopyBlockTo)> offer,
             const char* what) {
        return [pool, offer = std::move(offer), what](const BlockHash& hash, BlockId block) {
          offer(hash, [&](uint8_t* dst) {
            absl::Status s = pool->ReadBlock(block, dst);
            if (!s.ok()) {
              LOG_EVERY_N(WARNING, 100)
                  << what << " block " << block.value() << " not offered to the tiers: " << s;
            }
            return s.ok();
          });
        };
      };
  kvcache::BlockPool::EvictionHook hook;
  if (config.on_evict) {
    hook = copy_hook(config.on_evict, "evicted");
  }
  kvcache::BlockPool::StoreHook store_hook;
  if (config.on_store) {
    store_hook = copy_hook(config.on_store, "committed");
  }
  PD_ASSIGN_OR_RETURN(rt->kv_, kvcache::KvCacheManager::Create(
                                   {config.kv_blocks, config.block_size}, config.kv_listener,
                                   std::move(hook), std::move(store_hook)));
  if (!on_cuda) {
    const int threads =
        config.threads > 0 ? config.threads : std::max(1u, std::thread::hardware_concurrency());
    rt->parallel_ = std::make_unique<ParallelFor>(ParallelFor::Options{threads});
    ctx.parallel = rt->parallel_.get();
  }
  ForwardOptions forward_options{config.scheduler.max_batch_tokens,
                                 config.scheduler.ForwardMaxSeqs()};
  forward_options.tensor_parallel = config.tensor_parallel;
  forward_options.tp_rank_pools = std::move(rank_pools);
  PD_ASSIGN_OR_RETURN(rt->forward_, LlamaForward::Create(forward_weights,
                                                         {rt->memory_->base(), rt->layout_.dtype,
                                                          config.kv_blocks, config.block_size},
                                                         ctx, forward_options));
  PD_ASSIGN_OR_RETURN(rt->scheduler_,
                      Scheduler::Create(config.scheduler, rt->forward_.get(), rt->kv_.get(),
                                        rt->tokenizer_.get(), rt->weights_.fingerprint));
  if (with_draft) {
    if (config.draft_kv_blocks == 0) config.draft_kv_blocks = config.kv_blocks;
    void* draft_base = nullptr;
    const ModelWeights* draft_weights = &rt->draft_weights_;
    if (on_cuda) {
      PD_ASSIGN_OR_RETURN(
          rt->draft_memory_,
          memory::DeviceKvPool::Create(draft_layout, config.draft_kv_blocks, config.device));
      draft_base = rt->draft_memory_->base();
      draft_weights = &rt->draft_device_weights_->weights();
    } else {
      PD_ASSIGN_OR_RETURN(rt->draft_pool_,
                          memory::HostKvPool::Create(draft_layout, config.draft_kv_blocks));
      draft_base = rt->draft_pool_->base();
    }
    PD_ASSIGN_OR_RETURN(rt->draft_forward_,
                        LlamaForward::Create(draft_weights,
                                             {draft_base, draft_layout.dtype,
                                              config.draft_kv_blocks, config.block_size},
                                             ctx, DraftForwardOptions(config)));
    PD_RETURN_IF_ERROR(
        rt->scheduler_->UseDraftModel(rt->draft_forward_.get(), config.draft_kv_blocks));
    LOG(INFO) << "draft model " << config.draft_model << " (" << rt->draft_weights_.config.n_layers
              << " layers, dim " << rt->draft_weights_.config.dim << ", weights "
              << kernels::DTypeName(rt->draft_weights_.dtype) << "), its kv pool "
              << config.draft_kv_blocks << " blocks (" << (draft_layout.block_bytes() >> 10)
              << " KiB each)";
  }
  rt->config_ = std::move(config);
  return rt;
}

int64_t ModelRuntime::OfferRunningBlocks() {
  if (!config_.on_evict) {
    return 0;
  }
  int64_t offered = 0;
  scheduler_->ForEachRunningBlock([&](const BlockHash& hash, BlockId block) {
    config_.on_evict(hash, [&](uint8_t* dst) { return memory_->ReadBlock(block, dst).ok(); });
    ++offered;
  });
  return offered;
}

std::string ModelRuntime::Describe() const {
  const ModelConfig& c = weights_.config;
  return absl::StrCat(
      "model ", config_.model, " (", ArchitectureName(c.architecture), ", ", c.n_layers,
      " layers, dim ", c.dim, ", vocab ", c.vocab_size, ", context ", c.seq_len, ", weights ",
      kernels::DTypeName(weights_.dtype), ", fingerprint ", weights_.fingerprint.substr(0, 12),
      weights_.dtype == kernels::DType::kI8 ? "+w8" : "", "), kv pool ", config_.kv_blocks,
      " blocks x ", config_.block_size, " tokens (", memory_->size_bytes() >> 20, " MiB) on ",
      DeviceName(config_.device),
      config_.tensor_parallel > 1 ? absl::StrCat(", tensor parallel x", config_.tensor_parallel)
                                  : "");
}

}  // namespace pd::engine
