// pd-make-model: writes a random-weight Hugging Face model directory (see make_model.h).
//
//   pd-make-model --out /tmp/tiny --preset tiny [--seed 1] [--dtype bf16] [--force]
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/model/hf_model.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/tools/make_model.h"

ABSL_FLAG(std::string, out, "", "output directory (created if missing; required)");
ABSL_FLAG(std::string, preset, "tiny", "tiny | small | 1b | 8b");
ABSL_FLAG(uint64_t, seed, 0, "weight seed; equal seeds give byte-identical files");
ABSL_FLAG(std::string, dtype, "", "f32 | bf16 | f16 (default: the preset's)");
ABSL_FLAG(std::string, arch, "llama",
          "llama | mistral | qwen2 | qwen3 | mixtral | qwen3_moe | deepseek_v2 | deepseek_v3");
ABSL_FLAG(bool, force, false, "overwrite the model files in an existing non-empty directory");
ABSL_FLAG(bool, verify, true, "load the result with HfModel/HfTokenizer and print its fingerprint");
ABSL_FLAG(int32_t, hidden_size, 0, "override (0 = preset)");
ABSL_FLAG(int32_t, intermediate_size, 0, "override (0 = preset)");
ABSL_FLAG(int32_t, num_layers, 0, "override (0 = preset)");
ABSL_FLAG(int32_t, num_heads, 0, "override (0 = preset)");
ABSL_FLAG(int32_t, num_kv_heads, 0, "override (0 = preset)");
ABSL_FLAG(int32_t, head_dim, 0, "width of a head (0 = hidden_size / num_heads; Qwen3 uses more)");
ABSL_FLAG(int32_t, vocab_size, 0, "override (0 = preset; at least 260)");
ABSL_FLAG(int32_t, max_position_embeddings, 0, "override (0 = preset)");
ABSL_FLAG(std::string, tie_word_embeddings, "", "true | false (default: the preset's)");
ABSL_FLAG(int32_t, num_experts, 0, "mixtral / qwen3_moe: experts per layer (0 = 8)");
ABSL_FLAG(int32_t, num_experts_per_tok, 0, "mixtral / qwen3_moe: experts per token (0 = 2)");
ABSL_FLAG(int32_t, moe_intermediate_size, 0,
          "qwen3_moe: width of an expert (0 = intermediate_size / 4); mixtral's experts are "
          "intermediate_size wide");
ABSL_FLAG(int32_t, q_lora_rank, 0, "deepseek: q_a_proj's rank (0 = q_proj, no low-rank query)");
ABSL_FLAG(int32_t, kv_lora_rank, 0, "deepseek: MLA's latent width (0 = 4 x the head's nope part)");
ABSL_FLAG(int32_t, qk_rope_head_dim, 0,
          "deepseek: rotated part of a head (0 = half the nope part)");
ABSL_FLAG(int32_t, n_shared_experts, -1, "deepseek: shared experts (-1 = 1)");
ABSL_FLAG(int32_t, first_k_dense_replace, -1,
          "deepseek: leading dense layers (-1 = 1; num_layers = every MLP dense)");
ABSL_FLAG(int32_t, fp8_block, 0,
          "> 0: linear projections as block-scaled fp8 E4M3 (blocks of N x N), as DeepSeek-V3's "
          "and Qwen3-FP8's checkpoints");
ABSL_FLAG(double, layer_output_scale, 1.0,
          "multiply the output projections (o_proj, down_proj) of layers --scaled_layers_from and "
          "later by this, in [0, 1]: the same command with --num_layers=<scaled_layers_from> "
          "(and no scale) then writes a draft model that agrees with this one most of the time");
ABSL_FLAG(int32_t, scaled_layers_from, 0, "first layer --layer_output_scale applies to");
ABSL_FLAG(std::string, norm_topk_prob, "",
          "qwen3_moe: true | false, renormalize the chosen experts' weights (default true)");

namespace {

// The options the flags describe; InvalidArgument for a bad enum value.
absl::StatusOr<pd::engine::MakeModelOptions> OptionsFromFlags() {
  pd::engine::MakeModelOptions o;
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.preset = absl::GetFlag(FLAGS_preset);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.force = absl::GetFlag(FLAGS_force);
  o.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  o.intermediate_size = absl::GetFlag(FLAGS_intermediate_size);
  o.num_layers = absl::GetFlag(FLAGS_num_layers);
  o.num_heads = absl::GetFlag(FLAGS_num_heads);
  o.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  o.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    PD_ASSIGN_OR_RETURN(o.dtype, pd::engine::ParseDTypeName(absl::GetFlag(FLAGS_dtype)));
  }
  PD_ASSIGN_OR_RETURN(o.architecture, pd::engine::ParseArchitectureName(absl::GetFlag(FLAGS_arch)));
  o.num_experts = absl::GetFlag(FLAGS_num_experts);
  o.num_experts_per_tok = absl::GetFlag(FLAGS_num_experts_per_tok);
  o.moe_intermediate_size = absl::GetFlag(FLAGS_moe_intermediate_size);
  o.q_lora_rank = absl::GetFlag(FLAGS_q_lora_rank);
  o.fp8_block = absl::GetFlag(FLAGS_fp8_block);
  o.layer_output_scale = static_cast<float>(absl::GetFlag(FLAGS_layer_output_scale));
  o.scaled_layers_from = absl::GetFlag(FLAGS_scaled_layers_from);
  o.kv_lora_rank = absl::GetFlag(FLAGS_kv_lora_rank);
  o.qk_rope_head_dim = absl::GetFlag(FLAGS_qk_rope_head_dim);
  if (absl::GetFlag(FLAGS_n_shared_experts) >= 0) {
    o.n_shared_experts = absl::GetFlag(FLAGS_n_shared_experts);
  }
  if (absl::GetFlag(FLAGS_first_k_dense_replace) >= 0) {
    o.first_k_dense_replace = absl::GetFlag(FLAGS_first_k_dense_replace);
  }
  const std::string norm = absl::GetFlag(FLAGS_norm_topk_prob);
  if (norm == "true" || norm == "false") {
    o.norm_topk_prob = norm == "true";
  } else if (!norm.empty()) {
    return absl::InvalidArgumentError("--norm_topk_prob must be true or false");
  }
  const std::string tie = absl::GetFlag(FLAGS_tie_word_embeddings);
  if (tie == "true" || tie == "false") {
    o.tie_word_embeddings = tie == "true";
  } else if (!tie.empty()) {
    return absl::InvalidArgumentError("--tie_word_embeddings must be true or false");
  }
  return o;
}

// Progress on stderr in 5% steps, for models of 64 MiB and more.
void PrintProgress(uint64_t done, uint64_t total) {
  static int last_step = -1;
  const int step = static_cast<int>(20 * done / total);
  if (total < (64u << 20) || step == last_step) {
    return;
  }
  last_step = step;
  std::fprintf(stderr, "\rweights: %3d%% (%llu / %llu MiB)%s", 5 * step,
               static_cast<unsigned long long>(done >> 20),
               static_cast<unsigned long long>(total >> 20), done == total ? "\n" : "");
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists the flags of this file (absl matches files named after the binary otherwise).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "make_model_main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "writes a random-weight Hugging Face model directory (config.json, generation_config.json, "
      "tokenizer.json, model.safetensors).\nUsage: pd-make-model --out DIR --preset "
      "tiny|small|1b|8b [--seed N] [--dtype f32|bf16|f16] [--force] [shape overrides]");
  absl::ParseCommandLine(argc, argv);
  pd::InitLogging(argv[0]);
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::cerr << "pd-make-model: --out is required (see --help)\n";
    return 2;
  }
  absl::StatusOr<pd::engine::MakeModelOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "pd-make-model: " << options.status().message() << "\n";
    return 2;
  }
  options->progress = PrintProgress;
  absl::StatusOr<pd::engine::MakeModelResult> r = pd::engine::MakeModel(*options);
  if (!r.ok()) {
    std::cerr << "pd-make-model: " << r.status() << "\n";
    return 1;
  }
  const std::string& dir = options->out_dir;
  std::cout << "wrote " << dir << ": " << r->config.DebugString() << "\n  " << r->num_parameters
            << " parameters, " << r->weight_bytes << " weight bytes in " << r->weight_seconds
            << " s (total " << r->total_seconds << " s)\n";
  if (absl::GetFlag(FLAGS_verify)) {
    absl::StatusOr<pd::engine::HfModel> model = pd::engine::HfModel::Load(dir);
    absl::StatusOr<pd::engine::HfTokenizer> tok =
        pd::engine::HfTokenizer::Load(absl::StrCat(dir, "/tokenizer.json"));
    if (!model.ok() || !tok.ok()) {
      std::cerr << "pd-make-model: verification failed: "
                << (model.ok() ? tok.status() : model.status()) << "\n";
      return 1;
    }
    std::cout << "  fingerprint " << model->Fingerprint() << " (hashed "
              << model->load_stats().hashed_bytes << " bytes in "
              << model->load_stats().hash_seconds << " s), tokenizer vocab " << tok->vocab_size()
              << "\n";
  }
  return 0;
}
