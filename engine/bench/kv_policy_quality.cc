// kv_policy_quality: what each way of making the KV cache smaller costs in output quality,
// measured the same way for every KV dtype and every eviction policy (issue #35's figures;
// results and commands go to docs/benchmarks.md). The engine itself runs every row (ModelRuntime's
// scheduler), so the policies drop blocks exactly as in serving.
//
// The reference is the f32 full cache. For each prompt it generates greedily to the end of the
// model's context (ignore_eos), with every position's whole next-token distribution
// (SamplingOptions::full_distribution). Each row then
//   - is teacher-forced through the reference's tokens (SamplingOptions::forced_tokens), and
//     its distribution at every position is compared with the reference's: the mean
//     KL(reference || row), over all positions and over the second half (where every budget of
//     at most half the context has dropped tokens), and top-1 agreement (the row's most likely
//     token is the reference's, ties by ascending id as greedy sampling breaks them);
//   - generates greedily on its own: the first generated token that differs from the
//     reference's (the mean over prompts, and the earliest; "none" counts as the length).
// Rows: each KV dtype with the full cache; each eviction policy at each budget (a share of the
// model's context, in tokens kept: a sliding window keeps the last B tokens, sink + window
// the first --sink_tokens and the last B - sink, H2O the last B * --h2o_recent_percent and the
// rest by cumulative attention, SnapKV compresses the prompt to B). The policies keep whole
// blocks: up to one block (the one being filled) more than B. SnapKV only acts on prompts, so
// its rows take all but the reference's last 64 tokens as the prompt and score those 64 (the
// divergence position counts from the reference's first token all the same).
//
// Memory first (--memory_presets): for the pd-make-model presets' shapes (Llama-3.2-1B and
// Llama-3.1-8B), the KV bytes per token of each dtype and, at a --memory_context-token context,
// the blocks one sequence holds under each cache and how many sequences fit a GiB; each
// sequence's blocks are mapped as a real HostKvPool (lazily: nothing is touched) and its size
// checked against the count.
//
// Past the context (--past, a multiple of it) there is no full cache; the reference there is
// the f32 cache that keeps the most the context allows (sink + window of the whole context),
// and the rows are the policies at each budget, measured the same way.
// Not a test (nothing is asserted); deterministic for a given model.
//
//   build/engine/bench/kv_policy_quality --model=../shared/models/stories260K/stories260K.bin
//       --tokenizer=../shared/models/stories260K/tok512.bin   (one command line)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "engine/bench/story_prompts.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/runtime/model_runtime.h"
#include "engine/tools/make_model.h"
#include "kernels/type_names.h"

ABSL_FLAG(std::string, model, "", "HF model directory or llama2.c checkpoint file (required)");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer file (llama2.c: required)");
ABSL_FLAG(std::string, dtypes, "bf16,f16,i8,fp8_e4m3,i4", "KV dtypes compared with f32");
ABSL_FLAG(std::string, policies, "window,sink,h2o,snapkv",
          "eviction policies: window (sliding window), sink (sink + window), h2o (heavy hitters "
          "+ recent), snapkv (the prompt compressed once)");
ABSL_FLAG(int32_t, h2o_recent_percent, 50, "H2O: share of the budget kept as recent tokens");
ABSL_FLAG(int32_t, snapkv_window, 32, "SnapKV: the observation window (prompt tokens that vote)");
ABSL_FLAG(std::string, budgets, "25,50,75", "eviction budgets, percent of the model's context");
ABSL_FLAG(int32_t, sink_tokens, 16, "the sink + window policy's sink tokens");
ABSL_FLAG(int32_t, prompts, 8, "prompts measured (at most 8)");
ABSL_FLAG(int32_t, past, 2,
          "past-the-context section: sequences of this many contexts (0 = skip)");
ABSL_FLAG(int32_t, threads, 1, "CPU threads");
ABSL_FLAG(std::string, memory_presets, "1b,8b",
          "pd-make-model presets whose KV memory is reported (empty = skip)");
ABSL_FLAG(int64_t, memory_context, 32768, "context length of the memory section, in tokens");

namespace pd::engine {
namespace {

// One row's cache: its dtype and what it keeps (sink = window = 0: everything).
struct CacheConfig {
  kernels::DType dtype = kernels::DType::kF32;
  int64_t sink = 0;
  int64_t window = 0;
  std::string name;
  // H2O / SnapKV (SchedulerConfig::kv_policy): the budget and its recent part.
  std::string kv_policy;
  int64_t budget = 0;
  int64_t recent = 0;
};

absl::StatusOr<std::unique_ptr<ModelRuntime>> MakeRuntime(const CacheConfig& cache) {
  ModelRuntimeConfig c;
  c.model = absl::GetFlag(FLAGS_model);
  c.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  c.threads = absl::GetFlag(FLAGS_threads);
  c.kv_dtype = cache.dtype;
  c.kv_blocks = 512;
  c.scheduler.max_running = 1;
  c.scheduler.kv_sink_tokens = cache.sink;
  c.scheduler.kv_window_tokens = cache.window;
  c.scheduler.kv_policy = cache.kv_policy;
  c.scheduler.kv_budget_tokens = cache.budget;
  c.scheduler.kv_recent_tokens = cache.recent;
  return ModelRuntime::Create(c);
}

struct Run {
  int64_t peak_blocks = 0;  // the most KV blocks the sequence held
  std::vector<uint32_t> tokens;
  std::vector<std::vector<float>> dists;  // per generated token: every token's logprob
  absl::Status status;
};

Run Generate(ModelRuntime* rt, const std::vector<uint32_t>& prompt, uint32_t max_tokens,
             const std::vector<uint32_t>* forced, bool distributions) {
  Run run;
  GenerationRequest r;
  r.id = RequestId(1);
  r.prompt = prompt;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  if (forced != nullptr) r.sampling.forced_tokens = *forced;
  if (distributions) {
    r.sampling.logprobs = 0;
    r.sampling.full_distribution = true;
  }
  r.on_output = [&](GenerationOutput o) {
    run.tokens.insert(run.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    for (TokenLogprob& lp : o.logprobs) run.dists.push_back(std::move(lp.all));
    if (o.finish_reason != FinishReason::kNone) run.status = o.status;
  };
  run.status = rt->scheduler()->Submit(std::move(r));
  while (run.status.ok() && !rt->scheduler()->idle()) {
    rt->scheduler()->Step();
    run.peak_blocks = std::max(run.peak_blocks, rt->scheduler()->Stats().kv.num_blocks_used);
  }
  if (run.status.ok() && run.tokens.size() != max_tokens) {
    run.status = absl::InternalError(
        absl::StrCat(run.tokens.size(), " tokens generated of ", max_tokens, " asked"));
  }
  return run;
}

// KL(p || q) of two log-distributions; tokens p gives no mass add nothing.
double Kl(const std::vector<float>& p, const std::vector<float>& q) {
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == -std::numeric_limits<float>::infinity()) continue;
    kl += std::exp(static_cast<double>(p[i])) * (static_cast<double>(p[i]) - q[i]);
  }
  return std::max(kl, 0.0);
}

// The most likely token, the lowest id among equals (greedy sampling's choice).
size_t Top1(const std::vector<float>& d) {
  return static_cast<size_t>(std::max_element(d.begin(), d.end()) - d.begin());
}

struct Reference {
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<Run> runs;
};

struct RowResult {
  double kl_sum = 0, kl_half_sum = 0;
  int64_t positions = 0, half_positions = 0, top1 = 0;
  int64_t peak_blocks = 0;
  double diverge_sum = 0;
  int64_t diverge_min = std::numeric_limits<int64_t>::max();
  int64_t diverge_none = 0;
};

absl::StatusOr<RowResult> Measure(const CacheConfig& cache, const Reference& ref,
                                  uint32_t length) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelRuntime> rt, MakeRuntime(cache));
  RowResult r;
  // SnapKV compresses prompts: its rows take all but the reference's last 64 tokens as part of
  // the prompt (so the prompt outgrows every budget) and are scored on those 64.
  const size_t lead = cache.kv_policy == "snapkv" && length > 64 ? length - 64 : 0;
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    const Run& want = ref.runs[p];
    std::vector<uint32_t> prompt = ref.prompts[p];
    prompt.insert(prompt.end(), want.tokens.begin(), want.tokens.begin() + lead);
    const std::vector<uint32_t> rest(want.tokens.begin() + lead, want.tokens.end());
    const auto todo = static_cast<uint32_t>(length - lead);
    Run forced = Generate(rt.get(), prompt, todo, &rest, true);
    PD_RETURN_IF_ERROR(forced.status);
    forced.dists.insert(forced.dists.begin(), lead, {});
    for (size_t i = lead; i < length; ++i) {
      const double kl = Kl(want.dists[i], forced.dists[i]);
      r.kl_sum += kl;
      ++r.positions;
      if (i >= length / 2) {
        r.kl_half_sum += kl;
        ++r.half_positions;
      }
      r.top1 += Top1(forced.dists[i]) == Top1(want.dists[i]) ? 1 : 0;
    }
    const Run free = Generate(rt.get(), prompt, todo, nullptr, false);
    PD_RETURN_IF_ERROR(free.status);
    r.peak_blocks = std::max(r.peak_blocks, free.peak_blocks);
    const auto mismatch = std::mismatch(free.tokens.begin(), free.tokens.end(), rest.begin());
    const int64_t at = static_cast<int64_t>(lead) + (mismatch.first - free.tokens.begin());
    r.diverge_sum += static_cast<double>(at);
    r.diverge_min = std::min(r.diverge_min, at);
    r.diverge_none += at == static_cast<int64_t>(length) ? 1 : 0;
  }
  return r;
}

void PrintRow(const CacheConfig& cache, int64_t bytes_per_token, int64_t block_size,
              const RowResult& r, size_t prompts) {
  const int64_t held = r.peak_blocks * block_size;
  std::printf("| %s | %lld | %lld (%.1f KiB) | %.2e | %.2e | %.2f%% | %.0f | %lld | %lld of %zu |\n",
              cache.name.c_str(), static_cast<long long>(bytes_per_token),
              static_cast<long long>(held),
              static_cast<double>(held * bytes_per_token) / 1024.0,
              r.kl_sum / static_cast<double>(r.positions),
              r.kl_half_sum / static_cast<double>(std::max<int64_t>(1, r.half_positions)),
              100.0 * static_cast<double>(r.top1) / static_cast<double>(r.positions),
              r.diverge_sum / static_cast<double>(prompts), static_cast<long long>(r.diverge_min),
              static_cast<long long>(r.diverge_none), prompts);
}

absl::StatusOr<std::vector<int>> ParseBudgets(const std::string& spec) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    int b = 0;
    if (!absl::SimpleAtoi(item, &b) || b <= 0 || b > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("--budgets: \"", item, "\" is not a percentage in (0, 100]"));
    }
    out.push_back(b);
  }
  return out;
}

absl::StatusOr<std::vector<CacheConfig>> PolicyRows(int64_t context, int64_t sink,
                                                   const std::vector<int>& budgets) {
  std::vector<CacheConfig> rows;
  for (absl::string_view policy :
       absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    if (policy != "window" && policy != "sink" && policy != "h2o" && policy != "snapkv") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--policies: unknown policy \"", policy, "\" (window, sink, h2o, snapkv)"));
    }
    for (const int b : budgets) {
      const int64_t kept = context * b / 100;
      CacheConfig c;
      if (policy == "h2o" || policy == "snapkv") {
        c.kv_policy = std::string(policy);
        c.budget = kept;
        c.recent = policy == "h2o"
                       ? kept * absl::GetFlag(FLAGS_h2o_recent_percent) / 100
                       : std::min<int64_t>(absl::GetFlag(FLAGS_snapkv_window), kept - 1);
        c.name = policy == "h2o"
                     ? absl::StrCat("H2O, ", b, "% (", kept - c.recent, " heavy + ", c.recent,
                                    " recent)")
                     : absl::StrCat("SnapKV, ", b, "% of the prompt (window ", c.recent, ")");
        rows.push_back(c);
        continue;
      }
      c.sink = policy == "sink" ? sink : 0;
      c.window = kept - c.sink;
      if (c.window <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "budget ", b, "% (", kept, " tokens) leaves no window beside ", sink, " sink tokens"));
      }
      c.name = policy == "sink" ? absl::StrCat("sink + window, ", b, "% (", c.sink, " + ",
                                               c.window, ")")
                                : absl::StrCat("sliding window, ", b, "% (", c.window, ")");
      rows.push_back(c);
    }
  }
  return rows;
}

// The blocks one sequence of `context` tokens holds: all of them, or under the sink + window
// policy its sinks, its window, the block being filled and the sinks' originals
// (window_policy.h).
int64_t BlocksHeld(int64_t context, int64_t block_size, int64_t sink, int64_t window) {
  if (window == 0) return (context + block_size - 1) / block_size;
  const int64_t s = (sink + block_size - 1) / block_size;
  const int64_t w = (window + block_size - 1) / block_size;
  return std::min((context + block_size - 1) / block_size, 2 * s + w + 1);
}

absl::Status Memory(const std::vector<kernels::DType>& dtypes, const std::vector<int>& budgets,
                    int64_t sink) {
  const int64_t context = absl::GetFlag(FLAGS_memory_context);
  for (absl::string_view preset :
       absl::StrSplit(absl::GetFlag(FLAGS_memory_presets), ',', absl::SkipEmpty())) {
    MakeModelOptions o;
    o.out_dir = "/unused";
    o.preset = std::string(preset);
    PD_ASSIGN_OR_RETURN(const ModelConfig mc, ResolveMakeModelConfig(o));
    PD_ASSIGN_OR_RETURN(std::vector<CacheConfig> policies, PolicyRows(context, sink, budgets));
    std::printf(
        "\nKV memory, preset %s (%d layers, %d KV heads of %d), one sequence of a %lld-token "
        "context, block 16: sequences per GiB of pool\n\n",
        std::string(preset).c_str(), mc.n_layers, mc.n_kv_heads, mc.head_dim,
        static_cast<long long>(context));
    policies.insert(policies.begin(), CacheConfig{kernels::DType::kF32, 0, 0, "full"});
    // Columns: the dtypes (sequences per GiB); the first row their bytes per token.
    std::vector<kvcache::KvLayout> layouts;
    std::string header = "| cache | blocks held |";
    std::string rule = "|---|---|";
    std::string per_token = "| KV bytes per token | - |";
    for (const kernels::DType dtype : dtypes) {
      layouts.push_back(KvLayoutForModel(mc, 16, dtype));
      absl::StrAppend(&header, " ", kernels::DTypeName(dtype), " |");
      absl::StrAppend(&rule, "---|");
      absl::StrAppend(&per_token, " ",
                      layouts.back().block_bytes() / layouts.back().block_size, " |");
    }
    std::printf("%s\n%s\n%s\n", header.c_str(), rule.c_str(), per_token.c_str());
    for (const CacheConfig& p : policies) {
      // H2O holds its budget and the block being filled; SnapKV its prompt's budget (the
      // tokens it generates come on top).
      const int64_t blocks = p.budget > 0 ? (p.budget + 15) / 16 + (p.kv_policy == "h2o" ? 1 : 0)
                                          : BlocksHeld(context, 16, p.sink, p.window);
      std::string row = absl::StrCat("| ", p.name, " | ", blocks, " |");
      for (const kvcache::KvLayout& layout : layouts) {
        memory::HostKvPoolOptions lazy;
        lazy.huge_pages = false;
        PD_ASSIGN_OR_RETURN(std::unique_ptr<memory::HostKvPool> pool,
                            memory::HostKvPool::Create(layout, blocks, lazy));
        const auto bytes = static_cast<int64_t>(pool->size_bytes());
        if (bytes != blocks * layout.block_bytes()) {
          return absl::InternalError(absl::StrCat("preset ", preset, ": the pool of ", blocks,
                                                  " blocks maps ", bytes, " bytes, not ",
                                                  blocks * layout.block_bytes()));
        }
        absl::StrAppend(&row, " ", absl::StrFormat("%.2f", static_cast<double>(int64_t{1} << 30) /
                                                              static_cast<double>(bytes)),
                        " |");
      }
      std::printf("%s\n", row.c_str());
    }
  }
  return absl::OkStatus();
}

void PrintHeader() {
  std::printf(
      "| cache | KV bytes/token | KV held, peak (token slots) | KL mean | KL mean, 2nd half | "
      "top-1 agreement | greedy: first divergence (mean) | (earliest) | never diverged |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
}

absl::Status Main() {
  PD_ASSIGN_OR_RETURN(const std::vector<int> budgets, ParseBudgets(absl::GetFlag(FLAGS_budgets)));
  const int64_t sink = absl::GetFlag(FLAGS_sink_tokens);
  std::vector<kernels::DType> dtypes;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    PD_ASSIGN_OR_RETURN(const kernels::DType dtype, kernels::DTypeFromName(name));
    dtypes.push_back(dtype);
  }
  std::vector<kernels::DType> all_dtypes = {kernels::DType::kF32};
  all_dtypes.insert(all_dtypes.end(), dtypes.begin(), dtypes.end());
  PD_RETURN_IF_ERROR(Memory(all_dtypes, budgets, sink));
  const CacheConfig full{kernels::DType::kF32, 0, 0, "f32, full (reference)"};
  PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelRuntime> base, MakeRuntime(full));
  const ModelConfig& mc = base->model_config();
  const int64_t context = mc.seq_len;
  const int64_t block_size = base->kv_layout().block_size;
  const bool add_bos = mc.bos_id != ModelConfig::kNoToken;
  // KV bytes per token of a dtype: one block's bytes (scales included) over its tokens.
  auto bytes_per_token = [&](kernels::DType dtype) {
    kvcache::KvLayout layout = base->kv_layout();
    layout.dtype = dtype;
    return layout.block_bytes() / layout.block_size;
  };
  Reference ref;
  const int num_prompts =
      std::clamp(absl::GetFlag(FLAGS_prompts), 1, static_cast<int>(std::size(kStoryPrompts)));
  size_t longest = 0;
  for (int p = 0; p < num_prompts; ++p) {
    PD_ASSIGN_OR_RETURN(std::vector<uint32_t> tokens,
                        base->tokenizer().Encode(kStoryPrompts[p], add_bos, false));
    longest = std::max(longest, tokens.size());
    ref.prompts.push_back(std::move(tokens));
  }
  // Every prompt generates the same number of tokens: up to the context for the longest one.
  const auto length = static_cast<uint32_t>(context - static_cast<int64_t>(longest));
  for (const auto& prompt : ref.prompts) {
    ref.runs.push_back(Generate(base.get(), prompt, length, nullptr, true));
    PD_RETURN_IF_ERROR(ref.runs.back().status);
  }
  std::printf(
      "\nquality: model context %lld tokens, block %lld; %d prompts, %u generated tokens each "
      "(to the end of the context), every position scored\n\n",
      static_cast<long long>(context), static_cast<long long>(block_size),
      num_prompts, length);
  PrintHeader();
  std::vector<CacheConfig> rows;
  for (const kernels::DType dtype : dtypes) {
    rows.push_back({dtype, 0, 0, absl::StrCat(kernels::DTypeName(dtype), ", full")});
  }
  PD_ASSIGN_OR_RETURN(std::vector<CacheConfig> policy_rows, PolicyRows(context, sink, budgets));
  rows.insert(rows.end(), policy_rows.begin(), policy_rows.end());
  std::fflush(stdout);
  for (const CacheConfig& row : rows) {
    PD_ASSIGN_OR_RETURN(const RowResult r, Measure(row, ref, length));
    PrintRow(row, bytes_per_token(row.dtype), block_size, r, ref.prompts.size());
    std::fflush(stdout);
  }

  const int past = absl::GetFlag(FLAGS_past);
  if (past <= 0) return absl::OkStatus();
  // Past the context: the reference keeps the most the context allows (its sinks, its window
  // and the block being filled).
  const int64_t widest_window = context - sink - block_size;
  const CacheConfig widest{kernels::DType::kF32, sink, widest_window,
                           absl::StrCat("f32, sink + window of the context (", sink, " + ",
                                        widest_window, ")")};
  PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelRuntime> wide, MakeRuntime(widest));
  const auto past_length =
      static_cast<uint32_t>(past * context - static_cast<int64_t>(longest));
  Reference past_ref;
  past_ref.prompts = ref.prompts;
  for (const auto& prompt : past_ref.prompts) {
    past_ref.runs.push_back(Generate(wide.get(), prompt, past_length, nullptr, true));
    PD_RETURN_IF_ERROR(past_ref.runs.back().status);
  }
  std::printf(
      "\npast the context: %u generated tokens each (%dx the context); reference: %s\n\n",
      past_length, past, widest.name.c_str());
  PrintHeader();
  for (const CacheConfig& row : policy_rows) {
    // SnapKV keeps every generated token: the context bounds its sequences.
    if (row.kv_policy == "snapkv") continue;
    PD_ASSIGN_OR_RETURN(const RowResult r, Measure(row, past_ref, past_length));
    PrintRow(row, bytes_per_token(row.dtype), block_size, r, past_ref.prompts.size());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pd::engine

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kv_policy_quality --model=M [--tokenizer=T]: each KV dtype's and eviction policy's "
      "output quality against the f32 full cache (KL divergence, top-1 agreement, first greedy "
      "divergence)");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_model).empty()) {
    std::fprintf(stderr, "kv_policy_quality: --model is required (see --help)\n");
    return 2;
  }
  absl::Status s = pd::engine::Main();
  if (!s.ok()) {
    std::fprintf(stderr, "kv_policy_quality: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
