// tp_pool_bench: the per-rank pools' block copies (memory::TpKvPool::ReadBlock gathers a block
// from the ranks into the TP = 1 layout, WriteBlock scatters one to them: what a per-rank worker
// adds to every block it sends, receives, spills or restores) against memcpy of the same bytes,
// measured in the same run (docs/benchmarks.md, "Tensor parallelism on the CPU").
//
//   build/engine/bench/tp_pool_bench --benchmark_repetitions=3
//   --benchmark_report_aggregates_only=true
//
// The block is the `small` preset's (12 layers, 4 KV heads of 64, 16 tokens; f32: 384 KiB, i8:
// 100 KiB with its scales). 64 blocks a pass (one 1,024-token prompt), the pools and the
// buffers touched before timing; bytes_per_second counts the block bytes copied once.
#include <cstring>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/memory/tp_kv_pool.h"

namespace pd::memory {
namespace {

constexpr int64_t kBlocks = 64;

kvcache::KvLayout Layout(kernels::DType dtype) {
  return kvcache::KvLayout{
      .num_layers = 12, .num_kv_heads = 4, .head_dim = 64, .block_size = 16, .dtype = dtype};
}

kernels::DType DTypeOf(int64_t arg) {
  return arg == 0 ? kernels::DType::kF32 : kernels::DType::kI8;
}

std::unique_ptr<TpKvPool> MakePool(const kvcache::KvLayout& layout, int ranks) {
  std::vector<TpKvPool::RankHeads> heads;
  const int64_t per = layout.num_kv_heads / ranks;
  for (int r = 0; r < ranks; ++r) heads.push_back({r * per, per});
  HostKvPoolOptions options;
  options.populate = true;
  return *TpKvPool::CreateHost(layout, kBlocks, heads, options);
}

// memcpy of the same bytes between two touched buffers: the ceiling.
void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(Layout(DTypeOf(state.range(0))).block_bytes());
  std::vector<uint8_t> a(bytes * kBlocks, 1), b(bytes * kBlocks, 2);
  for (auto _ : state) {
    for (int64_t i = 0; i < kBlocks; ++i) {
      std::memcpy(b.data() + i * bytes, a.data() + i * bytes, bytes);
    }
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes) * kBlocks);
}

// Gather (ReadBlock) or scatter (WriteBlock) of 64 blocks over `ranks` ranks.
void Copy(benchmark::State& state, bool gather) {
  const kvcache::KvLayout layout = Layout(DTypeOf(state.range(0)));
  std::unique_ptr<TpKvPool> pool = MakePool(layout, static_cast<int>(state.range(1)));
  const size_t bytes = static_cast<size_t>(layout.block_bytes());
  std::vector<uint8_t> buffer(bytes * kBlocks, 3);
  for (int64_t i = 0; i < kBlocks; ++i) {  // every page of the ranks touched
    (void)pool->WriteBlock(BlockId(static_cast<uint32_t>(i)), buffer.data() + i * bytes);
  }
  for (auto _ : state) {
    for (int64_t i = 0; i < kBlocks; ++i) {
      const BlockId b(static_cast<uint32_t>(i));
      const absl::Status s = gather ? pool->ReadBlock(b, buffer.data() + i * bytes)
                                    : pool->WriteBlock(b, buffer.data() + i * bytes);
      if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    }
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes) * kBlocks);
}

void BM_Gather(benchmark::State& state) { Copy(state, true); }
void BM_Scatter(benchmark::State& state) { Copy(state, false); }

// Args: {dtype (0 f32, 1 i8)} for memcpy; {dtype, ranks} for the copies.
BENCHMARK(BM_Memcpy)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gather)->Args({0, 2})->Args({0, 4})->Args({1, 2})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Scatter)->Args({0, 2})->Args({0, 4})->Args({1, 2})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pd::memory

BENCHMARK_MAIN();
