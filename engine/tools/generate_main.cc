// pd-generate: one-shot local generation that streams text to stdout.
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log/log.h"
#include "engine/runtime/model_front.h"
#include "engine/runtime/model_runtime.h"
#include "kernels/type_names.h"

ABSL_FLAG(std::string, model, "", "HF model directory or llama2.c checkpoint file (required)");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer file (llama2.c: required; HF: tokenizer.json)");
ABSL_FLAG(std::string, prompt, "", "prompt text (empty = start from BOS)");
ABSL_FLAG(uint32_t, max_tokens, 128, "tokens to generate");
ABSL_FLAG(float, temperature, 0.0f, "0 = greedy");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling mass, (0, 1]");
ABSL_FLAG(int32_t, top_k, 0, "sample from the k most likely tokens; 0 = off");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(int64_t, kv_blocks, 256,
          "KV pool size in blocks of 16 tokens; 0 with --device cuda = fill "
          "--gpu_memory_fraction of the GPU");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "with --kv_blocks 0 on cuda: share of the GPU's total memory to use, in (0, 1]");
ABSL_FLAG(int32_t, threads, 0, "CPU threads; 0 = all cores");
ABSL_FLAG(int32_t, tensor_parallel, 1,
          "split the model over N ranks (CPU threads sharing the KV pool); 1 = off");
ABSL_FLAG(std::string, tp_kv_pools, "shared",
          "with --tensor_parallel above 1: shared (the ranks share one KV pool) | per_rank (each "
          "rank keeps its KV heads in a pool of its own, as ranks on separate GPUs must)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda: where the weights, KV pool and forward run");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32 | bf16 | f16 | i8 | fp8_e4m3 | i4");
ABSL_FLAG(int64_t, kv_sink_tokens, 0,
          "sink + window KV policy: attention-sink tokens kept (whole blocks); with "
          "--kv_window_tokens");
ABSL_FLAG(int64_t, kv_window_tokens, 0,
          "sink + window KV policy: recent tokens kept (whole blocks), the rest dropped, so "
          "--max_tokens may exceed the model's context; 0 = off");
ABSL_FLAG(std::string, kv_policy, "",
          "KV eviction by attention score: h2o (keep the heaviest-hit tokens and the recent "
          "ones) | snapkv (compress the prompt once, by the votes of its last tokens); with "
          "--kv_budget_tokens and --kv_recent_tokens; not for MLA models; empty = off");
ABSL_FLAG(int64_t, kv_budget_tokens, 0,
          "--kv_policy: cached tokens a sequence keeps (rounded up to whole blocks)");
ABSL_FLAG(int64_t, kv_recent_tokens, 0,
          "--kv_policy: of the budget, the most recent tokens always kept (h2o) or the prompt's "
          "last tokens that vote (snapkv's observation window)");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "linear weights: auto (as stored) | int8 (quantized at load, W8A8)");
ABSL_FLAG(bool, huge_page_weights, true,
          "cpu: copy the model's matrices into transparent huge pages at load (same bytes, "
          "faster decode); false decodes from the mapped checkpoint");

namespace {

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "pd-generate: error: %s\n", std::string(status.message()).c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "pd-generate --model DIR|FILE [--tokenizer FILE] --prompt TEXT: stream a generation");
  absl::ParseCommandLine(argc, argv);
  pd::InitLogging(argv[0]);
  pd::engine::ModelRuntimeConfig config;
  config.model = absl::GetFlag(FLAGS_model);
  config.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  config.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  config.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  config.threads = absl::GetFlag(FLAGS_threads);
  config.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  absl::StatusOr<bool> rank_pools = pd::engine::ParseTpKvPools(absl::GetFlag(FLAGS_tp_kv_pools));
  if (!rank_pools.ok()) Fail(rank_pools.status());
  config.tp_rank_pools = *rank_pools;
  absl::StatusOr<pd::kernels::Device> device = pd::engine::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) Fail(device.status());
  config.device = *device;
  absl::StatusOr<pd::kernels::DType> kv_dtype =
      pd::kernels::DTypeFromName(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) {
    Fail(absl::InvalidArgumentError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message())));
  }
  config.kv_dtype = *kv_dtype;
  absl::StatusOr<pd::engine::WeightDType> weight_dtype =
      pd::engine::ParseWeightDType(absl::GetFlag(FLAGS_weight_dtype));
  if (!weight_dtype.ok()) {
    Fail(weight_dtype.status());
  }
  config.weight_dtype = *weight_dtype;
  config.huge_page_weights = absl::GetFlag(FLAGS_huge_page_weights);
  config.scheduler.max_running = 1;
  config.scheduler.kv_sink_tokens = absl::GetFlag(FLAGS_kv_sink_tokens);
  config.scheduler.kv_window_tokens = absl::GetFlag(FLAGS_kv_window_tokens);
  config.scheduler.kv_policy = absl::GetFlag(FLAGS_kv_policy);
  config.scheduler.kv_budget_tokens = absl::GetFlag(FLAGS_kv_budget_tokens);
  config.scheduler.kv_recent_tokens = absl::GetFlag(FLAGS_kv_recent_tokens);
  absl::StatusOr<std::unique_ptr<pd::engine::ModelRuntime>> rt =
      pd::engine::ModelRuntime::Create(config);
  if (!rt.ok()) Fail(rt.status());
  LOG(INFO) << (*rt)->Describe();

  // BOS as pd-router adds it to a text prompt (as Hugging Face's tokenizer does, not
  // config.json's bos_token_id alone).
  const bool add_bos =
      pd::engine::AddsBos(config.model, (*rt)->tokenizer(), (*rt)->model_config());
  absl::StatusOr<std::vector<uint32_t>> prompt =
      (*rt)->tokenizer().Encode(absl::GetFlag(FLAGS_prompt), add_bos, false);
  if (!prompt.ok()) Fail(prompt.status());
  if (prompt->empty()) Fail(absl::InvalidArgumentError("empty prompt and the model has no BOS"));

  pd::engine::GenerationRequest request;
  request.id = pd::RequestId(1);
  request.prompt = *prompt;
  request.sampling.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  request.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  request.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  request.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  request.sampling.seed = absl::GetFlag(FLAGS_seed);
  pd::engine::GenerationOutput last;
  request.on_output = [&last](pd::engine::GenerationOutput out) {
    std::fwrite(out.text.data(), 1, out.text.size(), stdout);
    std::fflush(stdout);
    if (out.finish_reason != pd::engine::FinishReason::kNone) last = std::move(out);
  };
  std::fputs(absl::GetFlag(FLAGS_prompt).c_str(), stdout);
  if (absl::Status s = (*rt)->scheduler()->Submit(std::move(request)); !s.ok()) Fail(s);
  while (!(*rt)->scheduler()->idle()) {
    (*rt)->scheduler()->Step();
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!last.status.ok()) Fail(last.status);
  const double decode_s = absl::ToDoubleSeconds(last.timings.total - last.timings.first_token);
  std::fprintf(stderr,
               "pd-generate: %u prompt + %u generated tokens; TTFT %.1f ms; decode %.1f tok/s\n",
               last.prompt_tokens, last.completion_tokens,
               absl::ToDoubleMilliseconds(last.timings.first_token),
               last.completion_tokens > 1 ? (last.completion_tokens - 1) / decode_s : 0.0);
  return 0;
}
