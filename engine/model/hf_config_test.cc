#include "engine/model/hf_config.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Abridged from meta-llama/Llama-3.2-1B-Instruct.
constexpr char kLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
})";

// Abridged from mistralai/Mistral-7B-v0.1.
constexpr char kMistralConfig[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000
})";

// Abridged from Qwen/Qwen2.5-0.5B-Instruct.
constexpr char kQwen2Config[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

TEST(HfConfigTest, ParsesLlama32) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kLlama32Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->dim, 2048);
  EXPECT_EQ(c->hidden_dim, 8192);
  EXPECT_EQ(c->n_layers, 16);
  EXPECT_EQ(c->n_heads, 32);
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->kv_dim, 512);
  EXPECT_EQ(c->q_dim(), 2048);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->seq_len, 131072);
  EXPECT_TRUE(c->shared_classifier);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_form, RopeForm::kRotateHalf);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(*c->rope_scaling, (Llama3RopeScaling{32.0f, 1.0f, 4.0f, 8192}));
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->bos_id, 128000u);
  EXPECT_EQ(c->eos_id, 128001u);
  EXPECT_THAT(c->eos_ids, ElementsAre(128001u, 128008u, 128009u));
  EXPECT_EQ(c->weight_dtype, kernels::DType::kBF16);
}

TEST(HfConfigTest, ParsesMistral) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kMistralConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->kv_dim, 1024);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_FALSE(c->shared_classifier);
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_EQ(c->bos_id, 1u);
  EXPECT_THAT(c->eos_ids, ElementsAre(2u));
}

TEST(HfConfigTest, MistralWindowAsLongAsTheContextIsNoWindow) {
  const std::string json = absl::StrReplaceAll(
      kMistralConfig, {{"\"sliding_window\": 4096", "\"sliding_window\": null"}});
  absl::StatusOr<ModelConfig> c = ParseHfConfig(json);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  const std::string longer = absl::StrReplaceAll(
      kMistralConfig, {{"\"sliding_window\": 4096", "\"sliding_window\": 32768"}});
  c = ParseHfConfig(longer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
}

TEST(HfConfigTest, ParsesQwen2WithBiasAndNoBosDefault) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kQwen2Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->n_kv_heads, 2);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->bos_id, 151643u);
  EXPECT_EQ(c->sliding_window, 0);

  const std::string no_bos =
      absl::StrReplaceAll(kQwen2Config, {{"\"bos_token_id\": 151643", "\"bos_token_id\": null"}});
  c = ParseHfConfig(no_bos);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_id, ModelConfig::kNoToken);
}

// Qwen3-0.6B's config.json: heads wider than hidden_size / num_heads, q/k norms, no biases.
constexpr char kQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Mixtral-8x7B-v0.1's config.json.
constexpr char kMixtralConfig[] = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Qwen3-30B-A3B's config.json.
constexpr char kQwen3MoeConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

TEST(HfConfigTest, ParsesMixturesOfExperts) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kMixtralConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMixtral);
  EXPECT_EQ(c->n_experts, 8);
  EXPECT_EQ(c->n_experts_per_tok, 2);
  EXPECT_EQ(c->moe_hidden_dim, 14336);
  EXPECT_TRUE(c->moe_norm_topk);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->mlp_width(), 14336);

  c = ParseHfConfig(kQwen3MoeConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(c->n_experts, 128);
  EXPECT_EQ(c->n_experts_per_tok, 8);
  EXPECT_EQ(c->moe_hidden_dim, 768);
  EXPECT_EQ(c->mlp_width(), 768);
  EXPECT_TRUE(c->moe_norm_topk);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 128);
  // The same by model_type alone.
  c = ParseHfConfig(absl::StrReplaceAll(kQwen3MoeConfig,
                                        {{"\"architectures\": [\"Qwen3MoeForCausalLM\"],", ""}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  // Dense layers among the experts are refused by name; so is a top k above the experts.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 47]"},
           {"\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"}}) {
    c = ParseHfConfig(absl::StrReplaceAll(kQwen3MoeConfig, {{from, to}}));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << to;
    EXPECT_THAT(c.status().message(), ::testing::HasSubstr("dense layers")) << to;
  }
  c = ParseHfConfig(absl::StrReplaceAll(
      kQwen3MoeConfig, {{"\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 129"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("n_experts_per_tok 129"));
  // Written back and read again: the same config.
  c = ParseHfConfig(kQwen3MoeConfig);
  absl::StatusOr<std::string> json = HfConfigJson(*c);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<ModelConfig> again = ParseHfConfig(*json);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *c);
  // Experts change the fingerprint's config bytes; a dense model's stay as they were.
  ModelConfig fewer = *c;
  fewer.n_experts_per_tok = 4;
  EXPECT_NE(CanonicalConfigBytes(fewer), CanonicalConfigBytes(*c));
}

// DeepSeek-V2-Lite's config.json (published values), without its yarn rope_scaling.
constexpr char kDeepseekV2LiteConfig[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 100000,
  "eos_token_id": 100001,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 10944,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v2",
  "moe_intermediate_size": 1408,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 64,
  "n_shared_experts": 2,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts_per_tok": 6,
  "num_hidden_layers": 27,
  "num_key_value_heads": 16,
  "q_lora_rank": null,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 10000,
  "routed_scaling_factor": 1.0,
  "scoring_func": "softmax",
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "greedy",
  "torch_dtype": "bfloat16",
  "v_head_dim": 128,
  "vocab_size": 102400
})";

TEST(HfConfigTest, ParsesDeepseekLatentAttentionAndItsExperts) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kDeepseekV2LiteConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kDeepseekV2);
  EXPECT_TRUE(c->mla());
  EXPECT_EQ(c->head_dim, 192);  // nope 128 + rope 64: the query head
  EXPECT_EQ(c->rope_dim(), 64);
  EXPECT_EQ(c->attn_out_dim(), 16 * 128);
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->rope_form, RopeForm::kInterleaved);
  // The cache: 576 elements a token (latent 512 + rope key 64), as 2 heads of K 144 + V 144.
  EXPECT_EQ(c->mla_latent_dim(), 576);
  EXPECT_EQ(c->cache_kv_heads(), 2);
  EXPECT_EQ(c->cache_head_dim(), 144);
  EXPECT_EQ(c->n_experts, 64);
  EXPECT_EQ(c->n_experts_per_tok, 6);
  EXPECT_EQ(c->moe_hidden_dim, 1408);
  EXPECT_EQ(c->n_shared_experts, 2);
  EXPECT_EQ(c->first_dense_layers, 1);
  EXPECT_FALSE(c->moe_layer(0));
  EXPECT_TRUE(c->moe_layer(1));
  EXPECT_EQ(c->mlp_width(), 10944);  // the dense first layer is the widest
  EXPECT_FALSE(c->moe_norm_topk);
  EXPECT_EQ(c->moe_topk, MoeTopk::kGreedy);
  EXPECT_EQ(c->moe_scoring, MoeScoring::kSoftmax);
  EXPECT_EQ(c->bos_id, 100000u);

  // DeepSeek-V3's routing: sigmoid, noaux_tc over 8 groups of which 4, scaled by 2.5.
  const std::string v3 = absl::StrReplaceAll(
      kDeepseekV2LiteConfig, {{"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"},
                              {"\"deepseek_v2\"", "\"deepseek_v3\""},
                              {"\"n_group\": 1", "\"n_group\": 8"},
                              {"\"topk_group\": 1", "\"topk_group\": 4"},
                              {"\"topk_method\": \"greedy\"", "\"topk_method\": \"noaux_tc\""},
                              {"\"scoring_func\": \"softmax\"", "\"scoring_func\": \"sigmoid\""},
                              {"\"norm_topk_prob\": false", "\"norm_topk_prob\": true"},
                              {"\"routed_scaling_factor\": 1.0", "\"routed_scaling_factor\": 2.5"},
                              {"\"q_lora_rank\": null", "\"q_lora_rank\": 1536"}});
  c = ParseHfConfig(v3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kDeepseekV3);
  EXPECT_EQ(c->moe_topk, MoeTopk::kNoAuxTc);
  EXPECT_EQ(c->moe_scoring, MoeScoring::kSigmoid);
  EXPECT_EQ(c->moe_n_group, 8);
  EXPECT_EQ(c->moe_topk_group, 4);
  EXPECT_TRUE(c->moe_norm_topk);
  EXPECT_FLOAT_EQ(c->moe_routed_scale, 2.5f);
  EXPECT_EQ(c->q_lora_rank, 1536);
  // Written back and read again: the same config; MLA changes the fingerprint's bytes.
  absl::StatusOr<std::string> json = HfConfigJson(*c);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<ModelConfig> again = ParseHfConfig(*json);
  ASSERT_TRUE(again.ok()) << again.status() << *json;
  EXPECT_EQ(*again, *c);
  ModelConfig wider = *c;
  wider.kv_lora_rank = 256;
  EXPECT_NE(CanonicalConfigBytes(wider), CanonicalConfigBytes(*c));

  // DeepSeek's yarn (V2-Lite's published values) is read and written back.
  c = ParseHfConfig(absl::StrReplaceAll(
      kDeepseekV2LiteConfig,
      {{"\"rope_scaling\": null",
        "\"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, "
        "\"mscale\": 0.707, \"mscale_all_dim\": 0.707, "
        "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->yarn.has_value());
  EXPECT_FLOAT_EQ(c->yarn->factor, 40.0f);
  EXPECT_FLOAT_EQ(c->yarn->mscale_all_dim, 0.707f);
  EXPECT_EQ(c->yarn->original_max_position_embeddings, 4096);
  absl::StatusOr<std::string> yarn_json = HfConfigJson(*c);
  ASSERT_TRUE(yarn_json.ok()) << yarn_json.status();
  absl::StatusOr<ModelConfig> yarn_again = ParseHfConfig(*yarn_json);
  ASSERT_TRUE(yarn_again.ok()) << yarn_again.status();
  EXPECT_EQ(*yarn_again, *c);

  // What the engine does not run is refused by name.
  for (const auto& [from, to, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2", "moe_layer_freq"},
           {"\"scoring_func\": \"softmax\"", "\"scoring_func\": \"sigmoid\"", "scoring_func"},
           {"\"topk_method\": \"greedy\"", "\"topk_method\": \"noaux_tc\"", "topk_method"}}) {
    c = ParseHfConfig(absl::StrReplaceAll(kDeepseekV2LiteConfig, {{from, to}}));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << to;
    EXPECT_THAT(c.status().message(), HasSubstr(says)) << to;
  }
  // Bad shapes are InvalidArgument naming the fields.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"qk_rope_head_dim\": 64", "\"qk_rope_head_dim\": 63"},
           {"\"kv_lora_rank\": 512", "\"kv_lora_rank\": 2000000"},
           {"\"n_group\": 1", "\"n_group\": 3"}}) {
    std::string json_text = absl::StrReplaceAll(kDeepseekV2LiteConfig, {{from, to}});
    if (from.find("n_group") != std::string::npos) {
      json_text = absl::StrReplaceAll(json_text, {{"\"topk_method\": \"greedy\"",
                                                   "\"topk_method\": \"group_limited_greedy\""}});
    }
    c = ParseHfConfig(json_text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << to;
  }
}

TEST(HfConfigTest, ParsesQwen3WithHeadNormsAndWideHeads) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kQwen3Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 2048);  // wider than hidden_size 1024
  EXPECT_EQ(c->kv_dim, 1024);
  EXPECT_TRUE(c->shared_classifier);
  EXPECT_EQ(c->seq_len, 40960);
  EXPECT_EQ(c->weight_dtype, kernels::DType::kBF16);
  EXPECT_EQ(c->eos_ids, std::vector<uint32_t>{151645});
  // The same by model_type alone.
  c = ParseHfConfig(absl::StrReplaceAll(kQwen3Config, {{"\"Qwen3ForCausalLM\"", ""}}));
  ASSERT_FALSE(c.ok());  // an empty architectures list is an error, not a fallback
  c = ParseHfConfig(
      absl::StrReplaceAll(kQwen3Config, {{"\"architectures\": [\"Qwen3ForCausalLM\"],", ""}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  // What the engine does not implement is refused by name.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"attention_bias\": false", "\"attention_bias\": true"},
           {"\"use_sliding_window\": false", "\"use_sliding_window\": true"}}) {
    c = ParseHfConfig(absl::StrReplaceAll(kQwen3Config, {{from, to}}));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << to;
    EXPECT_THAT(c.status().message(), ::testing::HasSubstr("Qwen3")) << to;
  }
}

TEST(HfConfigTest, ModelTypeWithoutArchitectures) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 300})");
  ASSERT_TRUE(c.ok()) << c.status();
  // transformers' LlamaConfig defaults.
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->seq_len, 2048);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_FALSE(c->shared_classifier);
  EXPECT_EQ(c->bos_id, 1u);
  EXPECT_EQ(c->eos_id, 2u);
  EXPECT_EQ(c->weight_dtype, kernels::DType::kF32);
}

TEST(HfConfigTest, RopeParametersOfNewerConfigs) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 300, "dtype": "float16",
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_FLOAT_EQ(c->rope_scaling->factor, 8.0f);
  EXPECT_EQ(c->weight_dtype, kernels::DType::kF16);
}

TEST(HfConfigTest, GenerationConfigOverridesEos) {
  absl::StatusOr<ModelConfig> c =
      ParseHfConfig(kMistralConfig, R"({"eos_token_id": [2, 7], "bos_token_id": 1})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_id, 2u);
  EXPECT_THAT(c->eos_ids, ElementsAre(2u, 7u));
  c = ParseHfConfig(kLlama32Config, R"({"eos_token_id": 128009, "temperature": 0.6})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_ids, ElementsAre(128009u));
  // Without an eos in either file there is no way to stop.
  const std::string no_eos = absl::StrReplaceAll(kQwen2Config, {{"\"eos_token_id\": 151645,", ""}});
  c = ParseHfConfig(no_eos);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("no eos_token_id"));
  c = ParseHfConfig(no_eos, R"({"eos_token_id": 151643})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_ids, ElementsAre(151643u));
}

TEST(HfConfigTest, UnsupportedArchitectureIsNamed) {
  absl::StatusOr<ModelConfig> c =
      ParseHfConfig(R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})", {},
                    "/models/gpt2/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("/models/gpt2/config.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("GPT2LMHeadModel"));
  EXPECT_THAT(c.status().message(), HasSubstr("Qwen2ForCausalLM"));
  c = ParseHfConfig(R"({"model_type": "phi3"})");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("phi3"));
  c = ParseHfConfig(R"({"hidden_size": 64})");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfConfigTest, BadInputsAreInvalidArgumentNamingTheField) {
  struct Case {
    std::string from, to, expect;
  };
  const Case cases[] = {
      {"\"hidden_size\": 2048,", "", "\"hidden_size\" is missing"},
      {"\"hidden_size\": 2048", "\"hidden_size\": \"big\"", "\"hidden_size\" must be an integer"},
      {"\"hidden_size\": 2048", "\"hidden_size\": -5", "\"hidden_size\" is -5"},
      {"\"num_hidden_layers\": 16", "\"num_hidden_layers\": 4294967296", "num_hidden_layers"},
      {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0", "\"rms_norm_eps\" is 0"},
      {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1", "tie_word_embeddings"},
      {"\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"float64\"", "float64"},
      {"\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5", "not a multiple of n_kv_heads"},
      {"\"eos_token_id\": [128001, 128008, 128009]", "\"eos_token_id\": 999999", "eos id 999999"},
      {"\"eos_token_id\": [128001, 128008, 128009]", "\"eos_token_id\": []", "empty list"},
      {"\"head_dim\": 64,", "\"head_dim\": 63,", "head_dim 63 is odd"},
      {"\"factor\": 32.0", "\"factor\": -1", "\"factor\" is -1"},
      {"\"original_max_position_embeddings\": 8192,", "", "original_max_position_embeddings"},
      {"\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5", "low_freq_factor < high"},
  };
  for (const Case& k : cases) {
    const std::string json = absl::StrReplaceAll(kLlama32Config, {{k.from, k.to}});
    ASSERT_NE(json, kLlama32Config) << k.from;
    absl::StatusOr<ModelConfig> c = ParseHfConfig(json);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << k.from << " " << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr(k.expect)) << k.from;
  }
  EXPECT_EQ(ParseHfConfig("{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHfConfig("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHfConfig(kLlama32Config, "{oops").status().code(),
            absl::StatusCode::kInvalidArgument);
  // hidden_size not divisible by heads without an explicit head_dim.
  absl::StatusOr<ModelConfig> c = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 65,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 300})");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("not a multiple of num_attention_heads"));
}

TEST(HfConfigTest, UnimplementedFeatures) {
  const std::pair<std::string, std::string> cases[] = {
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""},
      {"\"attention_bias\": false", "\"attention_bias\": true"},
      {"\"mlp_bias\": false", "\"mlp_bias\": true"},
      {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""},
  };
  for (const auto& [from, to] : cases) {
    const std::string json = absl::StrReplaceAll(kLlama32Config, {{from, to}});
    absl::StatusOr<ModelConfig> c = ParseHfConfig(json);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << to << " " << c.status();
  }
  const std::string swa = absl::StrReplaceAll(
      kQwen2Config, {{"\"use_sliding_window\": false", "\"use_sliding_window\": true"}});
  EXPECT_EQ(ParseHfConfig(swa).status().code(), absl::StatusCode::kUnimplemented);
  // "default" rope type means no scaling.
  const std::string plain = absl::StrReplaceAll(
      kLlama32Config, {{"\"rope_type\": \"llama3\"", "\"rope_type\": \"default\""}});
  absl::StatusOr<ModelConfig> c = ParseHfConfig(plain);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope_scaling.has_value());
}

TEST(HfConfigTest, JsonRoundTripsEveryArchitecture) {
  for (const char* json : {kLlama32Config, kMistralConfig, kQwen2Config}) {
    absl::StatusOr<ModelConfig> c = ParseHfConfig(json);
    ASSERT_TRUE(c.ok()) << c.status();
    absl::StatusOr<std::string> written = HfConfigJson(*c);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_THAT(*written, HasSubstr("\"rms_norm_eps\": 1e-0"));  // shortest float, not 9.99e-06
    absl::StatusOr<ModelConfig> again = ParseHfConfig(*written, HfGenerationConfigJson(*c));
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << *written;
    EXPECT_EQ(*again, *c) << c->DebugString() << "\n" << again->DebugString();
  }
  ModelConfig llama2c;  // defaults are llama2.c's; not expressible as an HF config
  llama2c.dim = 64, llama2c.hidden_dim = 128, llama2c.n_layers = 1, llama2c.n_heads = 4;
  llama2c.n_kv_heads = 4, llama2c.vocab_size = 32, llama2c.seq_len = 16, llama2c.head_dim = 16;
  llama2c.kv_dim = 64;
  ASSERT_TRUE(llama2c.Validate().ok()) << llama2c.Validate();
  EXPECT_EQ(HfConfigJson(llama2c).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, ValidateAndCanonicalBytes) {
  absl::StatusOr<ModelConfig> base = ParseHfConfig(kLlama32Config);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_TRUE(base->Validate().ok());
  const std::string bytes = CanonicalConfigBytes(*base);
  EXPECT_EQ(CanonicalConfigBytes(*base), bytes);
  ModelConfig c = *base;
  c.eos_ids.push_back(5);
  EXPECT_NE(CanonicalConfigBytes(c), bytes);
  c = *base;
  c.rope_scaling->factor = 8.0f;
  EXPECT_NE(CanonicalConfigBytes(c), bytes);
  c = *base;
  c.weight_dtype = kernels::DType::kF32;
  EXPECT_NE(CanonicalConfigBytes(c), bytes);

  c = *base;
  c.eos_id = 7;  // must equal eos_ids[0]
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  c = *base;
  c.kv_dim = 100;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  c = *base;
  c.bos_id = 128256;
  EXPECT_THAT(c.Validate().message(), HasSubstr("bos_id 128256"));
  c.bos_id = ModelConfig::kNoToken;
  EXPECT_TRUE(c.Validate().ok());
  c.sliding_window = -1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("sliding_window -1"));
}

}  // namespace
}  // namespace pd::engine
