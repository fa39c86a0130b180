// Benchmarks of the CPU engine (LlamaForward over the paged KV pool) on the `1b` preset
// (Llama-3.2-1B shape, bf16 weights, f32 KV cache, block size 16), each reported as a fraction of
// a ceiling measured in the same run, right before the timed loop and with the same threads:
//
//   BM_Decode/batch/threads    one token per sequence per step; every sequence has a 128-token
//                              prompt in the cache and decodes positions 128..191 in turn.
//                              bytes read per step = all weight bytes (the tied embedding counted
//                              once, as the classifier) + the K and V of every context token of
//                              every sequence, all layers. Ceiling: STREAM triad a = b + s * c
//                              over three 1 GiB f32 arrays (the median of 5 passes, counting
//                              3 * 4 bytes per element as STREAM does).
//   BM_Decode/batch/threads/weights
//                              weights 0: the preset's bf16 matrices in the mapped checkpoint
//                              (4 KiB pages); 1: int8 (QuantizeWeightsInt8: W8A8, per-row scales,
//                              in huge pages; bytes = int8 codes + f32 scales + KV); 2: the bf16
//                              matrices copied into transparent huge pages
//                              (CopyWeightsToHugePages: what pd-worker runs on a CPU).
//                              BM_DecodeKvDType and BM_Prefill run weights 0.
//   BM_DecodeKvDType/kv_dtype/context/threads
//                              batch-1 decode with a `context`-token cache of each KV dtype
//                              (random K/V); bytes read = weights + that cache. Same ceiling.
//   BM_Prefill/tokens/threads  one sequence of `tokens` new tokens from position 0. FLOPs =
//                              2 * (layer matmul parameters) * tokens + 2 * vocab * dim (the
//                              classifier runs on the last token only) + causal attention
//                              (4 * head_dim * tokens * (tokens + 1) / 2 per head and layer;
//                              MLA: 2 * (latent + kv_lora_rank) in place of 4 * head_dim).
//                              Ceiling: the best of kernels::MatMul at m = 512, in = out = 2048,
//                              bf16 weights (the dispatched kernel and both CPU paths, best of 5).
//
// Mixture-of-experts models (--model_dir of a mixtral or qwen3_moe checkpoint): a decode step
// reads the router and only the experts its tokens were routed to, so its bytes are every
// non-expert weight byte + (distinct (layer, expert) pairs the step used, from
// LlamaForward::expert_tokens) * one expert's bytes + the KV: the active-weight roofline.
// Counter experts_per_layer: the distinct experts a decode step read per layer, on average.
//
// Counters: tok_per_s; GBps (decode) or GFLOPps (achieved; decode reports its GFLOPps too);
// triad_GBps or gemm_GFLOPps (ceiling); ratio (achieved / ceiling; issue #3 targets >= 0.6 for
// decode at batch 1, >= 0.5 for prefill).
//
// Usage: engine_bench [--model_dir=DIR] [benchmark flags]. Without --model_dir the 1b preset is
// generated into a temporary directory (about 10 s, 2.47 GB) and removed at exit; make a
// reusable one with `pd-make-model --preset 1b --out DIR`.
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "common/log/log.h"
#include "common/threads/parallel_for.h"
#include "engine/kvcache/kv_layout.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/model/hf_model.h"
#include "engine/model/llama_forward.h"
#include "engine/model/model_weights.h"
#include "engine/tools/make_model.h"
#include "kernels/attention.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/type_names.h"

namespace pd::engine {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kPromptTokens = 128;
constexpr int64_t kDecodeSteps = 64;  // positions kPromptTokens .. kPromptTokens + 63, cycled
constexpr int64_t kMaxDecodeBatch = 16;
constexpr int64_t kMaxPrefillTokens = 512;

std::string g_model_dir;      // from --model_dir, or the generated temporary model
std::string g_generated_dir;  // the temporary directory to remove at exit, if any

std::string GenerateModel();

void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "engine_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// ---- The model, the KV pool and one forward pass per thread count, built once ----------------
struct Engine {
  std::unique_ptr<HfModel> model;
  ModelWeights weights;
  std::unique_ptr<memory::HostKvPool> pool;
  int64_t weight_bytes = 0;         // every weight byte a decode step reads
  int64_t layer_matmul_params = 0;  // parameters of the per-layer linear layers, all layers
  int64_t kv_bytes_per_token = 0;   // K and V of one token, all layers, at the pool dtype
  // Mixture of experts: one expert's matrices (as stored; int8 codes + scales), counted in
  // weight_bytes / weight_bytes_i8 for every expert of every layer.
  int64_t expert_bytes = 0;
  int64_t expert_bytes_i8 = 0;
  // Blocks: [0, 16 * decode_blocks) for the decode sequences (decode_blocks each), then the
  // prefill sequence's.
  int64_t decode_blocks = 0;
  int64_t prefill_first_block = 0;
  std::map<int, std::unique_ptr<ParallelFor>> teams;
  std::map<int, std::unique_ptr<LlamaForward>> forwards;
  bool prompts_prefilled = false;
  // int8 weights (QuantizeWeightsInt8 of `weights`), made at first use, and their forwards.
  std::unique_ptr<ModelWeights> weights_i8;
  int64_t weight_bytes_i8 = 0;  // int8 codes and f32 scales a decode step reads
  std::map<int, std::unique_ptr<LlamaForward>> forwards_i8;
  // The bf16 matrices in huge pages (CopyWeightsToHugePages of `weights`), made at first use.
  std::unique_ptr<ModelWeights> weights_huge;
  std::map<int, std::unique_ptr<LlamaForward>> forwards_huge;
};

Engine& GetEngine() {
  static Engine* engine = [] {
    auto* e = new Engine();
    if (g_model_dir.empty()) g_generated_dir = GenerateModel();
    std::fprintf(stderr, "engine_bench: loading %s\n", g_model_dir.c_str());
    absl::StatusOr<HfModel> model = HfModel::Load(g_model_dir);
    if (!model.ok()) Die("load " + g_model_dir, model.status());
    e->model = std::make_unique<HfModel>(*std::move(model));
    absl::StatusOr<ModelWeights> weights = WeightsFromHf(*e->model);
    if (!weights.ok()) Die("weights", weights.status());
    e->weights = *std::move(weights);
    const ModelConfig& c = e->weights.config;
    const int64_t dsize = kernels::DTypeSize(e->weights.embedding_dtype);
    for (const HfTensorRequirement& t : HfRequiredTensors(c)) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      e->weight_bytes += n * dsize;
    }
    // Per token: attention, and the dense MLP or the router and the chosen experts.
    // (Summed over the layers: DeepSeek's first layers are dense, the rest have experts and
    // a shared expert.)
    int64_t mlp_params = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      mlp_params +=
          c.moe_layer(l)
              ? static_cast<int64_t>(c.n_experts) * c.dim +
                    static_cast<int64_t>(c.n_experts_per_tok + c.n_shared_experts) * 3 *
                        c.moe_hidden_dim * c.dim
              : 3 * static_cast<int64_t>(c.hidden_dim) * c.dim;
    }
    // MLA: q (or q_a and q_b), kv_a, kv_b (absorbed into the query and the output) and o_proj.
    const int64_t attention_params =
        c.mla() ? (c.q_lora_rank > 0 ? int64_t{c.q_lora_rank} * (c.dim + c.q_dim())
                                     : c.q_dim() * c.dim) +
                      int64_t{c.mla_latent_dim()} * c.dim +
                      int64_t{c.n_heads} * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank +
                      c.attn_out_dim() * c.dim
                : 2 * c.q_dim() * c.dim + 2 * static_cast<int64_t>(c.kv_dim) * c.dim;
    e->layer_matmul_params = static_cast<int64_t>(c.n_layers) * attention_params + mlp_params;
    if (c.moe()) {
      e->expert_bytes = 3 * static_cast<int64_t>(c.moe_hidden_dim) * c.dim * dsize;
      e->expert_bytes_i8 =
          3 * static_cast<int64_t>(c.moe_hidden_dim) * c.dim + 4 * (2 * c.moe_hidden_dim + c.dim);
    }
    const kvcache::KvLayout layout{c.n_layers, c.cache_kv_heads(), c.cache_head_dim(),
                                   kBlockSize, kernels::DType::kF32};
    e->kv_bytes_per_token = layout.block_bytes() / kBlockSize;
    e->decode_blocks = (kPromptTokens + kDecodeSteps + kBlockSize - 1) / kBlockSize;
    e->prefill_first_block = kMaxDecodeBatch * e->decode_blocks;
    const int64_t num_blocks = e->prefill_first_block + kMaxPrefillTokens / kBlockSize;
    memory::HostKvPoolOptions pool_options;
    pool_options.populate = true;
    absl::StatusOr<std::unique_ptr<memory::HostKvPool>> pool =
        memory::HostKvPool::Create(layout, num_blocks, pool_options);
    if (!pool.ok()) Die("kv pool", pool.status());
    e->pool = *std::move(pool);
    std::fprintf(stderr,
                 "engine_bench: %d layers, dim %d, vocab %d; %.3f GB of weights, %.1f M layer "
                 "matmul params; kv pool %lld blocks (%zu MiB)\n",
                 c.n_layers, c.dim, c.vocab_size, e->weight_bytes / 1e9,
                 e->layer_matmul_params / 1e6, static_cast<long long>(num_blocks),
                 e->pool->size_bytes() >> 20);
    return e;
  }();
  return *engine;
}

ParallelFor* Team(int threads) {
  auto& team = GetEngine().teams[threads];
  if (team == nullptr) {
    ParallelFor::Options o;
    o.num_threads = threads;
    team = std::make_unique<ParallelFor>(o);
  }
  return team.get();
}

kernels::OpContext Context(int threads) {
  kernels::OpContext ctx;
  ctx.parallel = Team(threads);
  return ctx;
}

// The quantized copy of the weights (W8A8, --weight_dtype int8), made once.
const ModelWeights& WeightsI8() {
  Engine& e = GetEngine();
  if (e.weights_i8 == nullptr) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ModelWeights> w = QuantizeWeightsInt8(e.weights);
    if (!w.ok()) Die("quantize weights", w.status());
    e.weights_i8 = std::make_unique<ModelWeights>(*std::move(w));
    const ModelConfig& c = e.weights.config;
    if (c.moe()) {
      // Every matrix and scale, every expert (the decode step counts the experts it read).
      e.weight_bytes_i8 = MatrixWeightBytes(*e.weights_i8);
      return *e.weights_i8;
    }
    // One f32 scale per output row: q, k, v, o, gate, up, down of every layer; the classifier.
    const int64_t scale_rows = static_cast<int64_t>(c.n_layers) *
                                   (c.q_dim() + 2 * c.kv_dim + 2 * c.dim + 2 * c.hidden_dim) +
                               c.vocab_size;
    e.weight_bytes_i8 =
        e.layer_matmul_params + static_cast<int64_t>(c.vocab_size) * c.dim + 4 * scale_rows;
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start;
    std::fprintf(stderr, "engine_bench: int8 weights in %.1f s, %.3f GB read per decode step\n",
                 dt.count(), e.weight_bytes_i8 / 1e9);
  }
  return *e.weights_i8;
}

// The bf16 matrices copied into huge pages (what pd-worker runs on a CPU), made once.
const ModelWeights& WeightsHuge() {
  Engine& e = GetEngine();
  if (e.weights_huge == nullptr) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ModelWeights> w = CopyWeightsToHugePages(e.weights);
    if (!w.ok()) Die("huge-page weights", w.status());
    e.weights_huge = std::make_unique<ModelWeights>(*std::move(w));
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start;
    std::fprintf(stderr, "engine_bench: weights copied into huge pages in %.1f s%s\n", dt.count(),
                 TransparentHugePagesAvailable() ? "" : " (huge pages are off on this machine)");
  }
  return *e.weights_huge;
}

// Which weights a benchmark runs (the `weights` argument of BM_Decode).
enum class Weights { kMapped = 0, kInt8 = 1, kHugePages = 2 };

LlamaForward* Forward(int threads, Weights which = Weights::kMapped) {
  Engine& e = GetEngine();
  auto& forward = which == Weights::kInt8        ? e.forwards_i8[threads]
                  : which == Weights::kHugePages ? e.forwards_huge[threads]
                                                 : e.forwards[threads];
  if (forward == nullptr) {
    ForwardOptions options;
    options.max_batch_tokens = kMaxPrefillTokens;
    options.max_seqs = kMaxDecodeBatch;
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        which == Weights::kInt8        ? &WeightsI8()
        : which == Weights::kHugePages ? &WeightsHuge()
                                       : &e.weights,
        {e.pool->base(), kernels::DType::kF32, e.pool->num_blocks(), kBlockSize}, Context(threads),
        options);
    if (!f.ok()) Die("forward", f.status());
    forward = *std::move(f);
  }
  return forward.get();
}

std::vector<uint32_t> RandomTokens(int64_t n, uint32_t seed) {
  const int64_t vocab = GetEngine().weights.config.vocab_size;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<uint32_t> tokens(n);
  for (uint32_t& t : tokens) t = static_cast<uint32_t>(dist(rng));
  return tokens;
}

std::vector<int32_t> DecodeTable(int64_t seq) {
  const Engine& e = GetEngine();
  std::vector<int32_t> table(e.decode_blocks);
  for (int64_t b = 0; b < e.decode_blocks; ++b) {
    table[b] = static_cast<int32_t>(seq * e.decode_blocks + b);
  }
  return table;
}

// Prefills sequence 0's 128-token prompt for real, then copies its blocks to sequences 1..15:
// each decode sequence then reads its own (identical) prompt KV from its own blocks, as 16
// different prompts would, for 1/16 of the prefill time.
void PrefillPrompts() {
  Engine& e = GetEngine();
  if (e.prompts_prefilled) return;
  std::fprintf(stderr, "engine_bench: prefilling the %lld-token decode prompt\n",
               static_cast<long long>(kPromptTokens));
  const std::vector<uint32_t> prompt = RandomTokens(kPromptTokens, 1);
  const std::vector<int32_t> table = DecodeTable(0);
  ForwardSequence seq{prompt, 0, table};
  std::vector<float> logits(e.weights.config.vocab_size);
  const absl::Status status = Forward(2)->Forward({seq}, logits.data());
  if (!status.ok()) Die("prefill prompt", status);
  const int64_t prompt_blocks = kPromptTokens / kBlockSize;  // whole blocks (128 = 8 x 16)
  for (int64_t s = 1; s < kMaxDecodeBatch; ++s) {
    for (int64_t b = 0; b < prompt_blocks; ++b) {
      std::memcpy(e.pool->BlockData(BlockId(static_cast<uint32_t>(s * e.decode_blocks + b))),
                  e.pool->BlockData(BlockId(static_cast<uint32_t>(b))), e.pool->block_bytes());
    }
  }
  e.prompts_prefilled = true;
}

// ---- Ceilings
// ------------------------------------------------------------------------------------

// STREAM triad over three 1 GiB arrays with `threads` threads: the median of `passes` passes, in
// bytes/s (3 * 4 bytes per element, no write-allocate traffic counted, as STREAM reports).
double TriadBytesPerSecond(int threads, int passes = 5) {
  constexpr int64_t n = int64_t{256} << 20;  // 1 GiB of f32 per array
  static std::vector<float>* arrays = [] {
    std::fprintf(stderr, "engine_bench: allocating the triad arrays (3 x 1 GiB)\n");
    return new std::vector<float>[3] {
      std::vector<float>(n, 1.0f), std::vector<float>(n, 2.0f), std::vector<float>(n, 3.0f)
    };
  }();
  float* a = arrays[0].data();
  const float* b = arrays[1].data();
  const float* c = arrays[2].data();
  ParallelFor* team = Team(threads);
  std::vector<double> rates;
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    team->Run(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        a[i] = b[i] + 3.0f * c[i];
      }
    });
    benchmark::DoNotOptimize(a);
    benchmark::ClobberMemory();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start;
    rates.push_back(3.0 * 4.0 * static_cast<double>(n) / dt.count());
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// The best FLOP/s of kernels::MatMul at m = 512, in = out = 2048, bf16 weights with `threads`
// threads: the dispatched kernel and both CPU paths (direct, sgemm), best single call of 5 each.
// Attention flops per query and cached key, per layer: q.k and p.v per head, or MLA's
// absorbed scores over the latent entry and the weighted sum of its kv_lora_rank part (the
// form MLA uses in prefill too).
double AttentionFlopsPerKey(const ModelConfig& c) {
  return c.mla() ? 2.0 * (c.mla_latent_dim() + c.kv_lora_rank) * c.n_heads
                 : 4.0 * c.head_dim * c.n_heads;
}

double GemmPeakFlopsPerSecond(int threads) {
  constexpr int64_t m = 512, in = 2048, out = 2048;
  const kernels::OpContext ctx = Context(threads);
  std::vector<uint16_t> w(out * in);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (uint16_t& v : w) v = kernels::F32ToBf16(dist(rng));
  std::vector<float> x(m * in, 0.5f), y(m * out);
  kernels::MatMulParams p;
  p.x = x.data();
  p.w = w.data();
  p.y = y.data();
  p.num_rows = m;
  p.in_features = in;
  p.out_features = out;
  p.x_row_stride = in;
  p.y_row_stride = out;
  p.w_dtype = kernels::DType::kBF16;
  std::vector<uint8_t> workspace(
      std::max<int64_t>(kernels::cpu::MatMulGemmWorkspaceBytesForTest(ctx, p),
                        kernels::MatMulWorkspaceBytes(ctx, p)));
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  double best = 0;
  for (int path = 0; path < 3; ++path) {
    for (int call = 0; call < 6; ++call) {  // call 0 warms up
      const auto start = std::chrono::steady_clock::now();
      if (path == 0) {
        const absl::Status status = kernels::MatMul(ctx, p);
        if (!status.ok()) Die("gemm peak", status);
      } else if (path == 1) {
        kernels::cpu::MatMulDirectForTest(ctx, p);
      } else {
        kernels::cpu::MatMulGemmForTest(ctx, p);
      }
      benchmark::ClobberMemory();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start;
      if (call > 0) best = std::max(best, 2.0 * m * in * out / dt.count());
    }
  }
  return best;
}

// ---- Decode ----------------------------------------------------------------------------------
// Args: batch, threads, weights (0 = the preset's bf16 as mapped, 1 = int8 W8A8, 2 = bf16 in
// huge pages).
void BM_Decode(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const auto which = static_cast<Weights>(state.range(2));
  const bool int8 = which == Weights::kInt8;
  Engine& e = GetEngine();
  PrefillPrompts();
  LlamaForward* forward = Forward(threads, which);
  const int64_t weight_bytes = int8 ? e.weight_bytes_i8 : e.weight_bytes;
  std::vector<std::vector<int32_t>> tables(batch);
  for (int64_t s = 0; s < batch; ++s) tables[s] = DecodeTable(s);
  const std::vector<uint32_t> tokens = RandomTokens(batch * kDecodeSteps, 2);
  std::vector<ForwardSequence> seqs(batch);
  std::vector<float> logits(batch * forward->vocab_size());
  const ModelConfig& c = e.weights.config;
  const int64_t vocab = c.vocab_size;
  int64_t step = 0;
  double flops = 0;
  // Mixture of experts: the experts' bytes are counted per step, for the experts it used.
  const int64_t expert_bytes = int8 ? e.expert_bytes_i8 : e.expert_bytes;
  int64_t moe_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) moe_layers += c.moe_layer(l) ? 1 : 0;
  const int64_t fixed_bytes = weight_bytes - moe_layers * c.n_experts * expert_bytes;
  const double attention_flops_per_key = AttentionFlopsPerKey(c);
  std::vector<int64_t> experts_before;
  double experts_read = 0;
  auto run_step = [&]() -> int64_t {  // returns the bytes the step read
    const int64_t pos = kPromptTokens + step % kDecodeSteps;
    for (int64_t s = 0; s < batch; ++s) {
      seqs[s] = {absl::MakeConstSpan(&tokens[(step % kDecodeSteps) * batch + s], 1), pos,
                 tables[s]};
    }
    if (moe_layers > 0) experts_before = forward->expert_tokens();
    const absl::Status status = forward->Forward(seqs, logits.data());
    if (!status.ok()) Die("decode step", status);
    ++step;
    flops += static_cast<double>(batch) *
             (2.0 * static_cast<double>(e.layer_matmul_params + vocab * c.dim) +
              attention_flops_per_key * c.n_layers * static_cast<double>(pos + 1));
    int64_t weights_read = weight_bytes;
    if (moe_layers > 0) {
      int64_t used = 0;
      const std::vector<int64_t>& after = forward->expert_tokens();
      for (size_t i = 0; i < after.size(); ++i) used += after[i] > experts_before[i] ? 1 : 0;
      experts_read += static_cast<double>(used) / static_cast<double>(moe_layers);
      weights_read = fixed_bytes + used * expert_bytes;
    }
    return weights_read + batch * (pos + 1) * e.kv_bytes_per_token;
  };
  run_step();  // warm-up: pages, caches, thread team
  run_step();
  step = 0;
  flops = 0;
  experts_read = 0;
  const double triad = TriadBytesPerSecond(threads);
  double bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    bytes += static_cast<double>(run_step());
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  const double achieved = bytes / seconds.count();
  state.counters["tok_per_s"] = static_cast<double>(batch * state.iterations()) / seconds.count();
  state.counters["GBps"] = achieved / 1e9;
  state.counters["triad_GBps"] = triad / 1e9;
  state.counters["ratio"] = achieved / triad;
  // Compute done per second (matmuls and attention), to compare with the prefill GEMM ceiling:
  // large batches become compute bound on few cores.
  state.counters["GFLOPps"] = flops / seconds.count() / 1e9;
  if (moe_layers > 0) {
    state.counters["experts_per_layer"] = experts_read / static_cast<double>(state.iterations());
  }
}
BENCHMARK(BM_Decode)
    ->ArgsProduct({{1, 16}, {2, 1}, {0, 2}})
    ->ArgNames({"batch", "threads", "weights"})
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// int8 weights at batch 1 (issue #18: against llama.cpp q8_0, 2 threads).
BENCHMARK(BM_Decode)
    ->ArgsProduct({{1}, {2, 1}, {1}})
    ->ArgNames({"batch", "threads", "weights"})
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- Decode by KV dtype at long context --------------------------------------------------
// Args: KV dtype (kernels::DType value), context tokens, threads. One sequence whose cache
// holds `context` tokens of random K/V (written through kernels::WriteKv, so quantized
// caches hold real codes and scales; decode speed does not depend on the values, and a real
// 8k-token prefill would take minutes here), decoding the token at position `context` again
// and again. bytes read per step = all weight bytes + (context + 1) tokens of K and V at the
// cache dtype. Ceiling: the STREAM triad, as BM_Decode.
void BM_DecodeKvDType(benchmark::State& state) {
  const auto dtype = static_cast<kernels::DType>(state.range(0));
  const int64_t context = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  Engine& e = GetEngine();
  const ModelConfig& c = e.weights.config;
  const kvcache::KvLayout layout{c.n_layers, c.cache_kv_heads(), c.cache_head_dim(), kBlockSize,
                                 dtype};
  const int64_t num_blocks = context / kBlockSize + 1;
  memory::HostKvPoolOptions pool_options;
  pool_options.populate = true;
  absl::StatusOr<std::unique_ptr<memory::HostKvPool>> pool =
      memory::HostKvPool::Create(layout, num_blocks, pool_options);
  if (!pool.ok()) Die("kv pool", pool.status());
  const kernels::OpContext ctx = Context(threads);
  std::vector<int32_t> table(num_blocks);
  for (int64_t b = 0; b < num_blocks; ++b) table[b] = static_cast<int32_t>(b);
  {  // The context's K/V, every layer, 512 tokens at a time.
    constexpr int64_t kChunk = 512;
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(kChunk * c.kv_dim), v(kChunk * c.kv_dim);
    std::vector<int32_t> pos(kChunk);
    for (int64_t first = 0; first < context; first += kChunk) {
      const int64_t n = std::min(kChunk, context - first);
      for (int64_t j = 0; j < n; ++j) pos[j] = static_cast<int32_t>(first + j);
      for (int l = 0; l < c.n_layers; ++l) {
        for (float& x : k) x = dist(rng);
        for (float& x : v) x = dist(rng);
        kernels::WriteKvParams w;
        w.k = k.data();
        w.v = v.data();
        w.k_token_stride = c.kv_dim;
        w.v_token_stride = c.kv_dim;
        w.cache = kernels::DenseKvCacheView((*pool)->base(), dtype, num_blocks, c.n_layers,
                                            c.cache_kv_heads(), kBlockSize, c.cache_head_dim(), l);
        w.num_tokens = n;
        w.positions = pos.data();
        w.block_tables = table.data();
        w.max_blocks_per_seq = num_blocks;
        const absl::Status status = kernels::WriteKv(ctx, w);
        if (!status.ok()) Die("fill the context", status);
      }
    }
  }
  ForwardOptions options;
  options.max_batch_tokens = 16;
  options.max_seqs = 1;
  absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
      &e.weights, {(*pool)->base(), dtype, num_blocks, kBlockSize}, ctx, options);
  if (!f.ok()) Die("forward", f.status());
  const std::vector<uint32_t> tokens = RandomTokens(kDecodeSteps, 4);
  std::vector<float> logits(c.vocab_size);
  int64_t step = 0;
  auto run_step = [&] {
    const ForwardSequence seq{absl::MakeConstSpan(&tokens[step % kDecodeSteps], 1), context, table};
    const absl::Status status = (*f)->Forward({seq}, logits.data());
    if (!status.ok()) Die("decode step", status);
    ++step;
  };
  run_step();  // warm-up
  run_step();
  const double triad = TriadBytesPerSecond(threads);
  const double step_bytes = static_cast<double>(e.weight_bytes) +
                            static_cast<double>(context + 1) * layout.block_bytes() / kBlockSize;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    run_step();
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  const double achieved = step_bytes * static_cast<double>(state.iterations()) / seconds.count();
  state.SetLabel(std::string(kernels::DTypeName(dtype)));
  state.counters["tok_per_s"] = static_cast<double>(state.iterations()) / seconds.count();
  state.counters["GBps"] = achieved / 1e9;
  state.counters["triad_GBps"] = triad / 1e9;
  state.counters["ratio"] = achieved / triad;
  state.counters["kv_MiB"] =
      static_cast<double>(context + 1) * layout.block_bytes() / kBlockSize / (1 << 20);
}
BENCHMARK(BM_DecodeKvDType)
    ->ArgsProduct(
        {{static_cast<int64_t>(kernels::DType::kF32), static_cast<int64_t>(kernels::DType::kBF16),
          static_cast<int64_t>(kernels::DType::kF16), static_cast<int64_t>(kernels::DType::kI8),
          static_cast<int64_t>(kernels::DType::kF8E4M3)},
         {128, 8192},
         {2}})
    ->ArgNames({"kv_dtype", "context", "threads"})
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- Prefill ---------------------------------------------------------------------------------
// Args: tokens, threads.
void BM_Prefill(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  Engine& e = GetEngine();
  const ModelConfig& c = e.weights.config;
  LlamaForward* forward = Forward(threads);
  const std::vector<uint32_t> tokens = RandomTokens(n, 3);
  std::vector<int32_t> table((n + kBlockSize - 1) / kBlockSize);
  for (size_t b = 0; b < table.size(); ++b) {
    table[b] = static_cast<int32_t>(e.prefill_first_block + static_cast<int64_t>(b));
  }
  const ForwardSequence seq{tokens, 0, table};
  std::vector<float> logits(forward->vocab_size());
  auto run = [&] {
    const absl::Status status = forward->Forward({seq}, logits.data());
    if (!status.ok()) Die("prefill", status);
  };
  if (n <= 128) run();  // warm-up (the long one is warm enough after the GEMM peak below)
  const double flops =
      2.0 * static_cast<double>(e.layer_matmul_params) * static_cast<double>(n) +
      2.0 * c.vocab_size * c.dim +
      AttentionFlopsPerKey(c) * c.n_layers * static_cast<double>(n) * (n + 1) / 2.0;
  const double peak = GemmPeakFlopsPerSecond(threads);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    run();
  }
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  const double per_second = static_cast<double>(state.iterations()) / seconds.count();
  state.counters["tok_per_s"] = static_cast<double>(n) * per_second;
  state.counters["GFLOPps"] = flops * per_second / 1e9;
  state.counters["gemm_GFLOPps"] = peak / 1e9;
  state.counters["ratio"] = flops * per_second / peak;
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{512, 128}, {2, 1}})
    ->ArgNames({"tokens", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Generates the 1b preset into a fresh temporary directory; returns the directory to remove.
std::string GenerateModel() {
  char tmpl[] = "/tmp/engine_bench_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    Die("mkdtemp", absl::InternalError(std::strerror(errno)));
  }
  const std::string tmp = tmpl;
  MakeModelOptions options;
  options.out_dir = tmp + "/1b";
  options.preset = "1b";
  int last_quarter = -1;
  options.progress = [&last_quarter](uint64_t done, uint64_t total) {
    const int quarter = total == 0 ? 4 : static_cast<int>(4 * done / total);
    if (quarter != last_quarter) {
      last_quarter = quarter;
      std::fprintf(stderr, "engine_bench: writing the 1b preset: %d%%\n", 25 * quarter);
    }
  };
  std::fprintf(stderr,
               "engine_bench: no --model_dir: generating the 1b preset into %s (~10 s, 2.47 GB; "
               "removed at exit)\n",
               options.out_dir.c_str());
  absl::StatusOr<MakeModelResult> result = MakeModel(options);
  if (!result.ok()) {
    std::filesystem::remove_all(tmp);
    Die("make model", result.status());
  }
  std::fprintf(stderr, "engine_bench: %.2f GB written in %.1f s\n", result->weight_bytes / 1e9,
               result->total_seconds);
  g_model_dir = options.out_dir;
  return tmp;
}

}  // namespace
}  // namespace pd::engine

int main(int argc, char** argv) {
  pd::InitLogging(argv[0]);
  // Strip our own flag before Google Benchmark sees the command line.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--model_dir=")) {
      pd::engine::g_model_dir = argv[i] + std::strlen("--model_dir=");
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!pd::engine::g_generated_dir.empty()) {
    std::filesystem::remove_all(pd::engine::g_generated_dir);
  }
  return 0;
}
