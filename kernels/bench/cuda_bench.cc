// Benchmarks of the CUDA kernels at Llama-3.2-1B shapes (hidden 2048, intermediate 8192, vocab
// 128256, 32 heads / 8 kv heads of 64, bf16 KV cache of 16-token blocks). For a GPU node: each
// benchmark reports "no CUDA device" and is skipped elsewhere. Time is measured with CUDA events
// around the queued calls (manual time), so it is device time, not launch overhead.
//
// Counters: bytes_per_second (KV or weight bytes read per call) for memory-bound kernels,
// FLOPS (2 * m * n * k) for the prefill GEMM.
//   build/kernels/bench/cuda_bench --benchmark_repetitions=3
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/attention.h"
#include "kernels/copy.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/half.h"
#include "kernels/latent_attention.h"
#include "kernels/matmul.h"
#include "kernels/sampling.h"

namespace pd::kernels {
namespace {

constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 64, kBlockSize = 16;
constexpr int64_t kHidden = 2048, kIntermediate = 8192, kVocab = 128256;

OpContext Cuda() {
  OpContext ctx;
  ctx.device = Device::kCuda;
  return ctx;
}

// Device memory for one benchmark run, filled with small random bf16/f32 bit patterns.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes, uint32_t seed = 1) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      return;
    }
    std::vector<uint16_t> host(bytes / 2);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    for (uint16_t& h : host) {
      h = F32ToBf16(dist(rng));
    }
    (void)cudaMemcpy(ptr_, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() {
    if (ptr_ != nullptr) {
      cudaFree(ptr_);
    }
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

template <typename T>
void Upload(const DeviceBytes& d, const std::vector<T>& host) {
  (void)cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
}

// Runs `call` once per iteration between CUDA events and reports the device time; skips the
// benchmark when a call fails.
template <typename Call>
void TimeOnDevice(benchmark::State& state, Call&& call) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start);
    const absl::Status s = call();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

bool NoDevice(benchmark::State& state) {
  if (cuda::VisibleDeviceCount() == 0) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

// Batched decode: Arg(0) sequences of Arg(1) tokens each, one layer.
void BM_CudaDecodeAttention(benchmark::State& state) {
  if (NoDevice(state)) {
    return;
  }
  const int64_t seqs = state.range(0), ctx_len = state.range(1);
  const int64_t blocks_per_seq = ctx_len / kBlockSize, num_blocks = seqs * blocks_per_seq;
  const KvCacheView view =
      DenseKvCacheView(nullptr, DType::kBF16, num_blocks, 1, kKvHeads, kBlockSize, kHeadDim, 0);
  DeviceBytes pool(num_blocks * view.block_stride * 2), q(seqs * kHeads * kHeadDim * 4, 2),
      out(seqs * kHeads * kHeadDim * 4), tables(num_blocks * 4), lens(seqs * 4);
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  Upload(tables, table);
  Upload(lens, std::vector<int32_t>(seqs, static_cast<int32_t>(ctx_len)));
  DecodeAttentionParams p;
  p.q = q.as<float>();
  p.out = out.as<float>();
  p.q_seq_stride = p.out_seq_stride = kHeads * kHeadDim;
  p.cache = view;
  p.cache.base = pool.get();
  p.block_tables = tables.as<int32_t>();
  p.max_blocks_per_seq = blocks_per_seq;
  p.context_lens = lens.as<int32_t>();
  p.num_seqs = seqs;
  p.num_heads = kHeads;
  // The split partials: not counted in the bytes below (written and read back once, they are
  // ~1/30 of the K/V bytes at head_dim 64 with 4 query heads per kv head).
  const int64_t ws_bytes = DecodeAttentionWorkspaceBytes(Cuda(), p);
  DeviceBytes ws(static_cast<size_t>(ws_bytes));
  p.workspace = ws.get();
  p.workspace_bytes = ws_bytes;
  TimeOnDevice(state, [&] { return DecodeAttention(Cuda(), p); });
  state.SetBytesProcessed(state.iterations() * seqs * ctx_len * kKvHeads * kHeadDim * 2 * 2);
}
BENCHMARK(BM_CudaDecodeAttention)
    ->Args({1, 1024})
    ->Args({32, 1024})
    ->Args({32, 8192})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// MLA decode (LatentAttention) at DeepSeek-V3's shapes: Arg(0) sequences of Arg(1) tokens, one
// query token each at its last position, 128 heads scoring every cached 576-element entry
// (kv_lora_rank 512 + rope 64, cut into 2 pieces of 144), bf16 cache, one layer.
// bytes_per_second counts the cache bytes read once per step.
void BM_CudaLatentAttention(benchmark::State& state) {
  if (NoDevice(state)) {
    return;
  }
  constexpr int64_t kMlaHeads = 128, kRank = 512, kPieces = 2, kPiece = 144;
  const int64_t seqs = state.range(0), ctx_len = state.range(1);
  const int64_t entry = 2 * kPieces * kPiece, blocks_per_seq = ctx_len / kBlockSize;
  const int64_t num_blocks = seqs * blocks_per_seq;
  const KvCacheView view =
      DenseKvCacheView(nullptr, DType::kBF16, num_blocks, 1, kPieces, kBlockSize, kPiece, 0);
  DeviceBytes pool(num_blocks * view.block_stride * 2), q(seqs * kMlaHeads * entry * 4, 2),
      out(seqs * kMlaHeads * kRank * 4), tables(num_blocks * 4), positions(seqs * 4),
      token_seq(seqs * 4);
  std::vector<int32_t> table(num_blocks), seq_of(seqs);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  std::iota(seq_of.begin(), seq_of.end(), 0);
  Upload(tables, table);
  Upload(positions, std::vector<int32_t>(seqs, static_cast<int32_t>(ctx_len - 1)));
  Upload(token_seq, seq_of);
  LatentAttentionParams p;
  p.q = q.as<float>();
  p.out = out.as<float>();
  p.q_token_stride = kMlaHeads * entry;
  p.out_token_stride = kMlaHeads * kRank;
  p.cache = view;
  p.cache.base = pool.get();
  p.value_dim = kRank;
  p.num_heads = kMlaHeads;
  p.num_tokens = seqs;
  p.positions = positions.as<int32_t>();
  p.token_seq = token_seq.as<int32_t>();
  p.block_tables = tables.as<int32_t>();
  p.num_seqs = seqs;
  p.max_blocks_per_seq = blocks_per_seq;
  TimeOnDevice(state, [&] { return LatentAttention(Cuda(), p); });
  state.SetBytesProcessed(state.iterations() * seqs * ctx_len * entry * 2);
}
BENCHMARK(BM_CudaLatentAttention)
    ->Args({1, 1024})
    ->Args({32, 1024})
    ->Args({32, 8192})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Causal prefill of Arg(0) tokens from position 0, one layer; Arg(1) 1 = the tensor-core
// kernel (issue #16 item 5), 0 = the exact one.
void BM_CudaPrefillAttention(benchmark::State& state) {
  if (NoDevice(state)) {
    return;
  }
  const int64_t tokens = state.range(0), num_blocks = tokens / kBlockSize;
  const KvCacheView view =
      DenseKvCacheView(nullptr, DType::kBF16, num_blocks, 1, kKvHeads, kBlockSize, kHeadDim, 0);
  DeviceBytes pool(num_blocks * view.block_stride * 2), q(tokens * kHeads * kHeadDim * 4, 2),
      out(tokens * kHeads * kHeadDim * 4), table(num_blocks * 4);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  Upload(table, ids);
  PrefillAttentionParams p;
  p.q = q.as<float>();
  p.out = out.as<float>();
  p.q_token_stride = p.out_token_stride = kHeads * kHeadDim;
  p.cache = view;
  p.cache.base = pool.get();
  p.block_table = table.as<int32_t>();
  p.num_table_blocks = num_blocks;
  p.num_tokens = tokens;
  p.num_heads = kHeads;
  p.tensor_cores = state.range(1) != 0;
  TimeOnDevice(state, [&] { return PrefillAttention(Cuda(), p); });
  state.counters["FLOPS"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 4.0 * kHeads * kHeadDim * tokens * tokens / 2,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CudaPrefillAttention)
    ->Args({512, 1})
    ->Args({2048, 1})
    ->Args({2048, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// y[rows][8192] = x[rows][2048] w^T, bf16 weights (the up projection); rows 1 is the GEMV.
void BM_CudaMatMulBf16(benchmark::State& state) {
  if (NoDevice(state)) {
    return;
  }
  const int64_t rows = state.range(0);
  MatMulParams p;
  p.num_rows = rows;
  p.in_features = kHidden;
  p.out_features = kIntermediate;
  p.x_row_stride = kHidden;
  p.y_row_stride = kIntermediate;
  p.w_dtype = DType::kBF16;
  DeviceBytes x(rows * kHidden * 4, 2), w(kIntermediate * kHidden * 2), y(rows * kIntermediate * 4);
  const int64_t ws_bytes = MatMulWorkspaceBytes(Cuda(), p);
  DeviceBytes ws(static_cast<size_t>(ws_bytes > 0 ? ws_bytes : 2));
  p.x = x.as<float>();
  p.w = w.get();
  p.y = y.as<float>();
  p.workspace = ws.get();
  p.workspace_bytes = ws_bytes;
  TimeOnDevice(state, [&] { return MatMul(Cuda(), p); });
  state.SetBytesProcessed(state.iterations() * kIntermediate * kHidden * 2);
  state.counters["FLOPS"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * rows * kHidden * kIntermediate,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CudaMatMulBf16)->Arg(1)->Arg(512)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Arg(0) rows over the Llama 3 vocabulary: greedy (Arg(1) = 0) or top-k 50, top-p 0.9.
void BM_CudaSample(benchmark::State& state) {
  if (NoDevice(state)) {
    return;
  }
  const int64_t seqs = state.range(0);
  const bool greedy = state.range(1) == 0;
  DeviceBytes logits(seqs * kVocab * 4, 2), out(seqs * 4), temp(seqs * 4), top_k(seqs * 4),
      top_p(seqs * 4), seeds(seqs * 8), steps(seqs * 8);
  Upload(temp, std::vector<float>(seqs, 0.8f));
  Upload(top_k, std::vector<int32_t>(seqs, 50));
  Upload(top_p, std::vector<float>(seqs, 0.9f));
  SamplingParams p;
  p.logits = logits.as<float>();
  p.out_tokens = out.as<int32_t>();
  p.num_seqs = seqs;
  p.vocab_size = p.logits_stride = kVocab;
  if (!greedy) {
    p.temperature = temp.as<float>();
    p.top_k = top_k.as<int32_t>();
    p.top_p = top_p.as<float>();
    p.seeds = seeds.as<uint64_t>();
    p.steps = steps.as<uint64_t>();
  }
  TimeOnDevice(state, [&] { return Sample(Cuda(), p); });
  state.SetBytesProcessed(state.iterations() * seqs * kVocab * 4);
}
BENCHMARK(BM_CudaSample)
    ->Args({32, 0})
    ->Args({32, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Gathers Arg(0) blocks of 2 MiB (a Llama-3-8B bf16 block) from a device pool into a device
// staging buffer (Arg(1) = 0) or into pinned host memory (Arg(1) = 1, the tiering path).
void BM_CudaCopyBlocks(benchmark::State& state) {
  if (NoDevice(state)) {
    return;
  }
  const int64_t copies = state.range(0), block_bytes = int64_t{2} << 20;
  const int64_t pool_blocks = 2 * copies;
  DeviceBytes pool(pool_blocks * block_bytes), staging(copies * block_bytes), ids(copies * 4);
  std::vector<int32_t> order(copies);
  for (int64_t i = 0; i < copies; ++i) {
    order[i] = static_cast<int32_t>(2 * i + 1);
  }
  Upload(ids, order);
  void* pinned = nullptr;
  if (state.range(1) == 1 && cudaMallocHost(&pinned, copies * block_bytes) != cudaSuccess) {
    state.SkipWithError("cudaMallocHost failed");
    return;
  }
  CopyBlocksParams p{pool.get(),
                     state.range(1) == 1 ? pinned : staging.get(),
                     ids.as<int32_t>(),
                     nullptr,
                     copies,
                     block_bytes,
                     block_bytes,
                     block_bytes,
                     pool_blocks,
                     copies};
  TimeOnDevice(state, [&] { return CopyBlocks(Cuda(), p); });
  state.SetBytesProcessed(state.iterations() * copies * block_bytes);
  if (pinned != nullptr) {
    cudaFreeHost(pinned);
  }
}
BENCHMARK(BM_CudaCopyBlocks)
    ->Args({64, 0})
    ->Args({64, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pd::kernels

BENCHMARK_MAIN();
