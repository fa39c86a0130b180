// Benchmarks of the CPU kernels at Llama-3.2-1B shapes (hidden 2048, intermediate 8192, vocab
// 128256, 32 heads / 8 kv heads of 64), plus a STREAM-style triad giving the memory bandwidth
// the memory-bound kernels (GEMV, decode attention) should be compared with.
//
// Counters: bytes_per_second (weights or KV bytes read per call) for memory-bound kernels,
// FLOPS (2 * m * n * k) for GEMM. Threads: /1 runs on the caller, /2 a ParallelFor of 2.
// Decode-like benchmarks cycle through enough copies of the weights (>= 256 MiB) that every call
// reads from DRAM, as a real forward pass over all layers does; "Hot" variants reuse one copy.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/threads/parallel_for.h"
#include "kernels/attention.h"
#include "kernels/attention_mass.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/isa.h"
#include "kernels/half.h"
#include "kernels/latent_attention.h"
#include "kernels/logprobs.h"
#include "kernels/matmul.h"
#include "kernels/sampling.h"

namespace pd::kernels {
namespace {

// One team per thread count, kept for the whole run (as the engine would).
OpContext Context(int threads) {
  static std::map<int, std::unique_ptr<ParallelFor>> teams;
  OpContext ctx;
  if (threads > 1) {
    auto& team = teams[threads];
    if (team == nullptr) {
      ParallelFor::Options o;
      o.num_threads = threads;
      team = std::make_unique<ParallelFor>(o);
    }
    ctx.parallel = team.get();
  }
  return ctx;
}

std::vector<uint8_t> RandomBytesAs(int64_t n, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// ---- STREAM triad: a = b + s * c ----------------------------------------------------------------
void BM_Triad(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = int64_t{64} << 20;  // 3 arrays of 256 MiB
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 3.0f);
  const OpContext ctx = Context(threads);
  for (auto _ : state) {
    auto body = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        a[i] = b[i] + 3.0f * c[i];
      }
    };
    if (ctx.parallel != nullptr) {
      ctx.parallel->Run(n, body);
    } else {
      body(0, n);
    }
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * n * 4);
}
BENCHMARK(BM_Triad)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- GEMV (decode): y[out] = W[out][in] x
// --------------------------------------------------------- Args: out, in, dtype, threads, hot (1 =
// one weight copy, L3-resident when small).
void BM_Gemv(benchmark::State& state) {
  const int64_t out = state.range(0), in = state.range(1);
  const DType dtype = static_cast<DType>(state.range(2));
  const OpContext ctx = Context(static_cast<int>(state.range(3)));
  const bool hot = state.range(4) != 0;
  const int64_t w_bytes = out * in * DTypeSize(dtype);
  const int64_t copies = hot ? 1 : std::max<int64_t>(1, (int64_t{256} << 20) / w_bytes + 1);
  std::vector<std::vector<uint8_t>> weights;
  for (int64_t c = 0; c < copies; ++c) {
    weights.push_back(RandomBytesAs(out * in, dtype, static_cast<uint32_t>(c)));
  }
  std::vector<float> x(in, 0.5f), y(out);
  MatMulParams p;
  p.x = x.data();
  p.y = y.data();
  p.num_rows = 1;
  p.in_features = in;
  p.out_features = out;
  p.x_row_stride = in;
  p.y_row_stride = out;
  p.w_dtype = dtype;
  int64_t i = 0;
  for (auto _ : state) {
    p.w = weights[i++ % copies].data();
    benchmark::DoNotOptimize(MatMul(ctx, p));
  }
  state.SetBytesProcessed(state.iterations() * w_bytes);
}

void GemvArgs(benchmark::internal::Benchmark* b) {
  const std::pair<int64_t, int64_t> shapes[] = {
      {2048, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};
  for (auto [out, in] : shapes) {
    for (int dtype : {0, 1}) {  // f32, bf16
      for (int threads : {1, 2}) {
        b->Args({out, in, dtype, threads, 0});
      }
    }
  }
  b->Args({2048, 2048, 1, 2, 1});  // hot: 8 MiB of bf16 stays in L3
  b->ArgNames({"out", "in", "bf16", "threads", "hot"});
}
BENCHMARK(BM_Gemv)->Apply(GemvArgs)->Unit(benchmark::kMicrosecond)->UseRealTime();

// ---- MatMul with few/many rows: the direct kernel vs sgemm (tunes kDirectMaxRows) ---------------
// Args: m, out, in, dtype, threads, path (0 = dispatch's choice, 1 = direct, 2 = sgemm), isa
// (2 = AVX-512, 1 = AVX2; clamped to what the CPU has).
void BM_MatMul(benchmark::State& state) {
  const int64_t m = state.range(0), out = state.range(1), in = state.range(2);
  const DType dtype = static_cast<DType>(state.range(3));
  const OpContext ctx = Context(static_cast<int>(state.range(4)));
  const int path = static_cast<int>(state.range(5));
  cpu::SetIsaForTest(static_cast<cpu::Isa>(state.range(6)));
  std::vector<uint8_t> w = RandomBytesAs(out * in, dtype, 1);
  std::vector<float> x(m * in, 0.5f), y(m * out);
  MatMulParams p;
  p.x = x.data();
  p.w = w.data();
  p.y = y.data();
  p.num_rows = m;
  p.in_features = in;
  p.out_features = out;
  p.x_row_stride = in;
  p.y_row_stride = out;
  p.w_dtype = dtype;
  std::vector<uint8_t> workspace(cpu::MatMulGemmWorkspaceBytesForTest(ctx, p));
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  for (auto _ : state) {
    if (path == 1) {
      cpu::MatMulDirectForTest(ctx, p);
    } else if (path == 2) {
      cpu::MatMulGemmForTest(ctx, p);
    } else {
      benchmark::DoNotOptimize(MatMul(ctx, p));
    }
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(static_cast<double>(2 * m * out * in),
                                               benchmark::Counter::kIsIterationInvariantRate);
  cpu::SetIsaForTest(cpu::DetectedIsa());
}

void MatMulSmallArgs(benchmark::internal::Benchmark* b) {
  for (int64_t m : {2, 4, 8, 16, 32}) {
    for (int dtype : {0, 1}) {
      for (int path : {1, 2}) {
        b->Args({m, 2048, 2048, dtype, 2, path, 2});
      }
    }
  }
  b->ArgNames({"m", "out", "in", "bf16", "threads", "path", "isa"});
}
BENCHMARK(BM_MatMul)
    ->Name("BM_MatMulSmallM")
    ->Apply(MatMulSmallArgs)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void GemmArgs(benchmark::internal::Benchmark* b) {
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
  for (int64_t m : {128, 512}) {
    for (auto [out, in] : shapes) {
      for (int dtype : {0, 1}) {
        b->Args({m, out, in, dtype, 2, 0, 2});
      }
    }
  }
  // Both paths and ISAs on one shape, and one thread, to compare and check the scaling.
  for (int path : {1, 2}) {
    for (int isa : {1, 2}) {
      b->Args({512, 2048, 2048, 0, 2, path, isa});
      b->Args({512, 2048, 2048, 1, 2, path, isa});
    }
  }
  b->Args({512, 2048, 2048, 0, 1, 0, 2});
  b->ArgNames({"m", "out", "in", "bf16", "threads", "path", "isa"});
}
BENCHMARK(BM_MatMul)
    ->Name("BM_Gemm")
    ->Apply(GemmArgs)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- int8 vs bf16 weights at the 1b preset's decode and prefill shapes -------------------------
// Args: m, out, in, dtype (1 = bf16, 3 = int8), threads. Cold weights (copies >= 256 MiB, so
// every call reads them from DRAM, as a forward pass over all layers does); bytes_per_second
// counts the weight bytes read per call (int8: codes plus scales), FLOPS 2 * m * n * k.
void BM_MatMulWeightDType(benchmark::State& state) {
  const int64_t m = state.range(0), out = state.range(1), in = state.range(2);
  const DType dtype = static_cast<DType>(state.range(3));
  const OpContext ctx = Context(static_cast<int>(state.range(4)));
  const bool i8 = dtype == DType::kI8;
  const int64_t w_bytes = out * in * DTypeSize(dtype) + (i8 ? out * 4 : 0);
  const int64_t copies = std::max<int64_t>(1, (int64_t{256} << 20) / w_bytes + 1);
  std::vector<std::vector<uint8_t>> weights;
  std::vector<std::vector<float>> scales(copies);
  for (int64_t c = 0; c < copies; ++c) {
    if (i8) {
      const std::vector<uint8_t> f = RandomBytesAs(out * in, DType::kF32, static_cast<uint32_t>(c));
      weights.emplace_back(out * in);
      scales[c].resize(out);
      QuantizeRowsInt8(reinterpret_cast<const float*>(f.data()), out, in,
                       reinterpret_cast<int8_t*>(weights.back().data()), scales[c].data());
    } else {
      weights.push_back(RandomBytesAs(out * in, dtype, static_cast<uint32_t>(c)));
    }
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(m * in), y(m * out);
  for (float& v : x) {
    v = dist(rng);
  }
  MatMulParams p;
  p.x = x.data();
  p.y = y.data();
  p.num_rows = m;
  p.in_features = in;
  p.out_features = out;
  p.x_row_stride = in;
  p.y_row_stride = out;
  p.w_dtype = dtype;
  std::vector<uint8_t> workspace(MatMulWorkspaceBytes(ctx, p));
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  int64_t i = 0;
  for (auto _ : state) {
    const int64_t c = i++ % copies;
    p.w = weights[c].data();
    p.w_scales = i8 ? scales[c].data() : nullptr;
    benchmark::DoNotOptimize(MatMul(ctx, p));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * w_bytes);
  state.counters["FLOPS"] = benchmark::Counter(static_cast<double>(2 * m * out * in),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void WeightDTypeArgs(benchmark::internal::Benchmark* b) {
  const std::pair<int64_t, int64_t> shapes[] = {{8192, 2048}, {2048, 8192}};
  for (int64_t m : {1, 16, 128}) {
    for (auto [out, in] : shapes) {
      for (int dtype : {1, 3}) {
        for (int threads : {1, 2}) {
          b->Args({m, out, in, dtype, threads});
        }
      }
    }
  }
  b->ArgNames({"m", "out", "in", "dtype", "threads"});
}
BENCHMARK(BM_MatMulWeightDType)
    ->Apply(WeightDTypeArgs)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- Decode attention: B sequences of ctx tokens, Llama-3.2-1B heads ----------------------------
// A paged pool of `batch` sequences of `context` tokens in cache `dtype` (shuffled block tables)
// and the DecodeAttention parameters over it; shared by the benchmarks below.
struct DecodeAttentionSetup {
  static constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 64, kBlock = 16, kLayers = 1;

  DecodeAttentionSetup(int64_t batch, int64_t context, DType dtype)
      : blocks_per_seq((context + kBlock - 1) / kBlock),
        num_blocks(batch * blocks_per_seq),
        block_bytes(DenseKvBlockBytes(dtype, kLayers, kKvHeads, kBlock, kHeadDim)),
        tables(num_blocks),
        lens(batch, static_cast<int32_t>(context)),
        q(batch * kHeads * kHeadDim, 0.1f),
        out(q.size()) {
    if (IsQuantizedKvDType(dtype)) {
      // Codes from random N(0, 1) rows (no NaN codes), scales of an N(0, 0.02) row.
      const KvCacheView probe =
          DenseKvCacheView(nullptr, dtype, num_blocks, kLayers, kKvHeads, kBlock, kHeadDim, 0);
      std::mt19937 rng(3);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      pool.resize(num_blocks * block_bytes);
      const std::vector<float> scales(kLayers * 2 * kKvHeads * kBlock, 0.02f / 32.0f);
      for (int64_t b = 0; b < num_blocks; ++b) {
        uint8_t* blk = pool.data() + b * block_bytes;
        for (int64_t i = 0; i < probe.scale_offset; ++i) {
          const float x = dist(rng) * 32.0f;
          blk[i] = dtype == DType::kI8
                       ? static_cast<uint8_t>(static_cast<int8_t>(std::clamp(x, -127.0f, 127.0f)))
                       : F32ToE4M3(x);
        }
        std::memcpy(blk + probe.scale_offset, scales.data(), scales.size() * sizeof(float));
      }
    } else {
      pool = RandomBytesAs(num_blocks * kLayers * 2 * kKvHeads * kBlock * kHeadDim, dtype, 3);
    }
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(4));
    p.q = q.data();
    p.out = out.data();
    p.q_seq_stride = kHeads * kHeadDim;
    p.out_seq_stride = kHeads * kHeadDim;
    p.cache =
        DenseKvCacheView(pool.data(), dtype, num_blocks, kLayers, kKvHeads, kBlock, kHeadDim, 0);
    p.block_tables = tables.data();
    p.max_blocks_per_seq = blocks_per_seq;
    p.context_lens = lens.data();
    p.num_seqs = batch;
    p.num_heads = kHeads;
  }

  const int64_t blocks_per_seq;
  const int64_t num_blocks;
  const int64_t block_bytes;
  std::vector<uint8_t> pool;
  std::vector<int32_t> tables;
  std::vector<int32_t> lens;
  std::vector<float> q, out;
  DecodeAttentionParams p;
};

// bf16 cache. Args: batch, context, threads.
void BM_DecodeAttention(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  const OpContext ctx = Context(static_cast<int>(state.range(2)));
  const DecodeAttentionSetup s(batch, context, DType::kBF16);
  for (auto _ : state) {
    benchmark::DoNotOptimize(DecodeAttention(ctx, s.p));
  }
  state.SetBytesProcessed(state.iterations() * batch * context * DecodeAttentionSetup::kKvHeads *
                          DecodeAttentionSetup::kHeadDim * 2 * 2);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{1, 16}, {512, 4096}, {1, 2}})
    ->ArgNames({"batch", "context", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// By KV dtype, the quantized caches vs bf16/f32, one thread. Args: batch, context, dtype
// (kernels/types.h: 0 f32, 1 bf16, 2 f16, 3 i8, 4 fp8_e4m3, 5 i4). bytes_per_second counts the KV
// bytes read (codes plus scales for the quantized dtypes).
void BM_DecodeAttentionKvDType(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1);
  const DecodeAttentionSetup s(batch, context, static_cast<DType>(state.range(2)));
  const OpContext ctx = Context(1);
  if (!DecodeAttention(ctx, s.p).ok()) {
    state.SkipWithError("decode attention rejected the parameters");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(DecodeAttention(ctx, s.p));
  }
  state.SetBytesProcessed(state.iterations() * batch * s.blocks_per_seq * s.block_bytes);
}
BENCHMARK(BM_DecodeAttentionKvDType)
    ->ArgsProduct({{1, 16}, {512, 4096}, {0, 1, 3, 4, 5}})
    ->ArgNames({"batch", "context", "dtype"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- The H2O / SnapKV score pass after one decode step ------------------------------------------
// AttentionMass for one sequence's decode token (32 query heads over 8 kv heads of 64, keys read
// from the cache as DecodeAttention reads them), to set beside BM_DecodeAttention/batch:1 of the
// same context and threads: what scoring adds to the attention it follows. Args: context,
// dtype (0 f32: keys read in place; 1 bf16: widened), threads.
void BM_AttentionMass(benchmark::State& state) {
  const int64_t context = state.range(0);
  const DecodeAttentionSetup s(1, context, static_cast<DType>(state.range(1)));
  const OpContext ctx = Context(static_cast<int>(state.range(2)));
  std::vector<float> mass(DecodeAttentionSetup::kKvHeads * context, 0.0f);
  AttentionMassParams p;
  p.q = s.q.data();
  p.q_token_stride = DecodeAttentionSetup::kHeads * DecodeAttentionSetup::kHeadDim;
  p.cache = &s.p.cache;
  p.block_table = s.tables.data();
  p.num_table_blocks = s.blocks_per_seq;
  p.start_pos = context - 1;
  p.num_tokens = 1;
  p.num_heads = DecodeAttentionSetup::kHeads;
  p.num_kv_heads = DecodeAttentionSetup::kKvHeads;
  p.head_dim = DecodeAttentionSetup::kHeadDim;
  p.mass = mass.data();
  p.mass_head_stride = context;
  if (!AttentionMass(ctx, p).ok()) {
    state.SkipWithError("attention mass rejected the parameters");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(AttentionMass(ctx, p));
  }
  state.SetItemsProcessed(state.iterations() * context * DecodeAttentionSetup::kHeads);
}
BENCHMARK(BM_AttentionMass)
    ->ArgsProduct({{512, 4096}, {0, 1}, {1, 2}})
    ->ArgNames({"context", "dtype", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- MLA decode attention (LatentAttention): DeepSeek-V2-Lite's heads ---------------------------
// B sequences of `context` tokens, each one query token at its last position scoring every
// cached [c | k_rope] entry (kv_lora_rank 512 + rope 64 = 576 elements, cut into 2 pieces of
// 144 as ModelConfig::cache_kv_heads does) with 16 query heads, bf16 cache, shuffled block
// tables. bytes_per_second counts the cache bytes read (each entry once per step, as a
// memory-bound kernel should), to set beside BM_Triad and BM_DecodeAttention.
// Args: batch, context, threads.
void BM_LatentAttention(benchmark::State& state) {
  constexpr int64_t kHeads = 16, kRank = 512, kPieces = 2, kPiece = 144, kBlock = 16;
  const int64_t batch = state.range(0), context = state.range(1);
  const OpContext ctx = Context(static_cast<int>(state.range(2)));
  const int64_t entry = 2 * kPieces * kPiece, blocks_per_seq = (context + kBlock - 1) / kBlock;
  const int64_t num_blocks = batch * blocks_per_seq;
  std::vector<uint8_t> pool = RandomBytesAs(num_blocks * kBlock * entry, DType::kBF16, 5);
  std::vector<int32_t> tables(num_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(6));
  std::vector<int32_t> positions(batch, static_cast<int32_t>(context - 1)), seqs(batch);
  std::iota(seqs.begin(), seqs.end(), 0);
  std::vector<float> q(batch * kHeads * entry, 0.05f), out(batch * kHeads * kRank);
  LatentAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.q_token_stride = kHeads * entry;
  p.out_token_stride = kHeads * kRank;
  p.cache = DenseKvCacheView(pool.data(), DType::kBF16, num_blocks, 1, kPieces, kBlock, kPiece, 0);
  p.value_dim = kRank;
  p.num_heads = kHeads;
  p.num_tokens = batch;
  p.positions = positions.data();
  p.token_seq = seqs.data();
  p.block_tables = tables.data();
  p.num_seqs = batch;
  p.max_blocks_per_seq = blocks_per_seq;
  if (!LatentAttention(ctx, p).ok()) {
    state.SkipWithError("latent attention rejected the parameters");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(LatentAttention(ctx, p));
  }
  state.SetBytesProcessed(state.iterations() * batch * context * entry * 2);
}
BENCHMARK(BM_LatentAttention)
    ->ArgsProduct({{1, 16}, {512, 4096}, {1, 2}})
    ->ArgNames({"batch", "context", "threads"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- Sampling one Llama-3 vocabulary row --------------------------------------------------------
// Args: top_k (0 = off), top_p * 100.
void BM_Sample(benchmark::State& state) {
  const int64_t vocab = 128256;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) {
    v = dist(rng);
  }
  const float temperature = 0.8f, top_p = static_cast<float>(state.range(1)) / 100.0f;
  const int32_t top_k = static_cast<int32_t>(state.range(0));
  const uint64_t seed = 1;
  uint64_t step = 0;
  int32_t token = 0;
  SamplingParams p;
  p.logits = logits.data();
  p.out_tokens = &token;
  p.num_seqs = 1;
  p.vocab_size = vocab;
  p.logits_stride = vocab;
  p.temperature = &temperature;
  p.top_k = &top_k;
  p.top_p = &top_p;
  p.seeds = &seed;
  p.steps = &step;
  std::vector<uint8_t> workspace(SamplingWorkspaceBytes(OpContext{}, p));
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(Sample(OpContext{}, p));
    ++step;
  }
}
BENCHMARK(BM_Sample)
    ->Args({0, 100})
    ->Args({50, 100})
    ->Args({0, 90})
    ->Args({50, 90})
    ->ArgNames({"top_k", "top_p"})
    ->Unit(benchmark::kMicrosecond);

// ---- Log-probabilities of one Llama-3 vocabulary row ------------------------------------------
// Args: top_n, isa (0 scalar, 1 avx2, 2 avx512; clamped to what the CPU runs).
void BM_LogProbs(benchmark::State& state) {
  const int64_t vocab = 128256;
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) {
    v = dist(rng);
  }
  const int32_t top_n = static_cast<int32_t>(state.range(0));
  const int32_t token = 17;
  float token_logprob = 0.0f;
  std::vector<int32_t> ids(kMaxTopLogprobs);
  std::vector<float> logprobs(kMaxTopLogprobs);
  LogProbsParams p;
  p.logits = logits.data();
  p.num_seqs = 1;
  p.vocab_size = vocab;
  p.logits_stride = vocab;
  p.tokens = &token;
  p.out_token_logprobs = &token_logprob;
  p.top_n = top_n;
  p.out_top_ids = ids.data();
  p.out_top_logprobs = logprobs.data();
  cpu::SetIsaForTest(static_cast<cpu::Isa>(state.range(1)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(LogProbs(OpContext{}, p));
  }
  cpu::SetIsaForTest(cpu::DetectedIsa());
  state.SetBytesProcessed(state.iterations() * vocab * 4);
}
BENCHMARK(BM_LogProbs)
    ->ArgsProduct({{0, 5, 20}, {0, 1, 2}})
    ->ArgNames({"top_n", "isa"})
    ->Unit(benchmark::kMicrosecond);

// ---- ParallelFor fork-join cost (empty chunks) -------------------------------------------------
// Args: spin in microseconds.
void BM_ParallelForEmpty(benchmark::State& state) {
  ParallelFor::Options o;
  o.num_threads = 2;
  o.spin = absl::Microseconds(state.range(0));
  ParallelFor team(o);
  for (auto _ : state) {
    team.Run(2, [](int64_t b, int64_t) { benchmark::DoNotOptimize(b); });
  }
}
BENCHMARK(BM_ParallelForEmpty)->Arg(0)->Arg(20)->Arg(100)->ArgName("spin_us")->UseRealTime();

}  // namespace
}  // namespace pd::kernels

BENCHMARK_MAIN();
