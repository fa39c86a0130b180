// The stories260K scheduler harness of the scheduler tests (scheduler_test.cc,
// scheduler_sampling_test.cc): a real model, a paged host pool, a KV cache manager and a
// scheduler, with every output of each request collected. Test-only.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/log/log.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "engine/model/model_weights.h"
#include "engine/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace pd::engine::scheduler_testing {

inline constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
inline constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

// What a finished request produced.
struct Result {
  std::vector<uint32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  int misaligned_outputs = 0;  // outputs with logprobs not aligned with their new tokens
  std::string text;
  GenerationOutput last;
  int outputs = 0;
  // After each output: tokens and text received so far, and the output's text_offset.
  struct Mark {
    size_t tokens = 0;
    size_t text = 0;
    uint64_t text_offset = 0;
  };
  std::vector<Mark> marks;
};

// stories260K with a paged pool, a KV cache manager and a scheduler. `staged`: the forward pass
// runs the CUDA path's metadata staging (and decode graphs) on the host.
class Harness {
 public:
  Harness(int64_t num_blocks, SchedulerConfig config, Clock* clock = Clock::Real(),
          bool staged = false) {
    absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kModel);
    CHECK(ckpt.ok()) << ckpt.status();
    checkpoint_ = std::make_unique<Llama2cCheckpoint>(*std::move(ckpt));
    weights_ = WeightsFromLlama2c(*checkpoint_);
    absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Load(kTokenizer, 512);
    CHECK(tok.ok()) << tok.status();
    tokenizer_ = std::make_unique<Llama2cTokenizer>(*std::move(tok));
    kvcache::KvLayout layout{weights_.config.n_layers, weights_.config.n_kv_heads,
                             weights_.config.head_dim, 16, kernels::DType::kF32};
    absl::StatusOr<std::unique_ptr<memory::HostKvPool>> pool =
        memory::HostKvPool::Create(layout, num_blocks);
    CHECK(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ForwardOptions fo{config.max_batch_tokens, config.ForwardMaxSeqs()};
    fo.staged_metadata = staged;
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        &weights_, {pool_->base(), kernels::DType::kF32, num_blocks, 16}, {}, fo);
    CHECK(f.ok()) << f.status();
    forward_ = *std::move(f);
    absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> kv =
        kvcache::KvCacheManager::Create({num_blocks, 16});
    CHECK(kv.ok()) << kv.status();
    kv_ = *std::move(kv);
    absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(
        config, forward_.get(), kv_.get(), tokenizer_.get(), checkpoint_->Fingerprint(), clock);
    CHECK(s.ok()) << s.status();
    scheduler_ = *std::move(s);
  }

  absl::Status Submit(uint64_t id, std::vector<uint32_t> prompt, SamplingOptions sampling = {},
                      std::string salt = "") {
    return SubmitRequest(id, std::move(prompt), std::move(sampling), std::move(salt), {});
  }

  // Submit with the caller's disaggregation hooks (remote_prefill / on_prefilled) set in `base`.
  absl::Status SubmitRequest(uint64_t id, std::vector<uint32_t> prompt, SamplingOptions sampling,
                             std::string salt, GenerationRequest base) {
    GenerationRequest r = std::move(base);
    r.id = RequestId(id);
    r.prompt = std::move(prompt);
    r.sampling = std::move(sampling);
    r.cache_salt = std::move(salt);
    r.on_output = [this, id](GenerationOutput out) {
      Result& res = results_[id];
      res.tokens.insert(res.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (!out.logprobs.empty() && out.logprobs.size() != out.new_tokens.size()) {
        ++res.misaligned_outputs;
      }
      res.logprobs.insert(res.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      res.text += out.text;
      ++res.outputs;
      res.marks.push_back({res.tokens.size(), res.text.size(), out.text_offset});
      if (out.finish_reason != FinishReason::kNone) {
        res.last = std::move(out);
      }
    };
    return scheduler_->Submit(std::move(r));
  }

  void RunToCompletion(int max_steps = 100000) {
    for (int i = 0; i < max_steps && !scheduler_->idle(); ++i) {
      scheduler_->Step();
    }
    ASSERT_TRUE(scheduler_->idle()) << "scheduler did not finish";
  }

  std::vector<uint32_t> Encode(const std::string& text) {
    absl::StatusOr<std::vector<uint32_t>> ids = tokenizer_->Encode(text, true, false);
    CHECK(ids.ok()) << ids.status();
    return *ids;
  }

  Scheduler* scheduler() { return scheduler_.get(); }
  // Speculative decoding with a draft model (config.speculative "draft"): stories260K itself
  // (`int8`: its int8-quantized copy, a draft that is sometimes wrong) over a pool of its own of
  // `blocks` blocks; `staged` as the constructor's.
  void UseDraft(int64_t blocks, bool int8, bool staged = false) {
    if (int8) {
      absl::StatusOr<ModelWeights> q = QuantizeWeightsInt8(weights_);
      CHECK(q.ok()) << q.status();
      draft_weights_ = *std::move(q);
    }
    const ModelWeights* w = int8 ? &draft_weights_ : &weights_;
    kvcache::KvLayout layout{w->config.n_layers, w->config.n_kv_heads, w->config.head_dim, 16,
                             kernels::DType::kF32};
    absl::StatusOr<std::unique_ptr<memory::HostKvPool>> pool =
        memory::HostKvPool::Create(layout, blocks);
    CHECK(pool.ok()) << pool.status();
    draft_pool_ = *std::move(pool);
    ForwardOptions fo{forward_->options().max_batch_tokens, forward_->options().max_seqs};
    fo.staged_metadata = staged;
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        w, {draft_pool_->base(), kernels::DType::kF32, blocks, 16}, {}, fo);
    CHECK(f.ok()) << f.status();
    draft_forward_ = *std::move(f);
    absl::Status s = scheduler_->UseDraftModel(draft_forward_.get(), blocks);
    CHECK(s.ok()) << s;
  }
  // The text of `tokens` generated after `prev`, as the scheduler's decoder yields it.
  std::string TextOf(uint32_t prev, absl::Span<const uint32_t> tokens) {
    DecodeStream d(tokenizer_.get(), prev);
    std::string text;
    for (uint32_t t : tokens) {
      absl::StatusOr<std::string> piece = d.Step(t);
      CHECK(piece.ok()) << piece.status();
      text += *piece;
    }
    return text;
  }
  std::map<uint64_t, Result>& results() { return results_; }
  // The block-hash chain the scheduler computes for `prompt` (no cache salt).
  std::vector<BlockHash> ChainOf(const std::vector<uint32_t>& prompt) {
    absl::StatusOr<BlockHash> seed = ComputeHashSeed({checkpoint_->Fingerprint(), "f32", 16, ""});
    CHECK(seed.ok()) << seed.status();
    return ComputeBlockHashes(*seed, prompt, 16);
  }
  memory::HostKvPool* pool() { return pool_.get(); }
  const kvcache::KvCacheManager& kv() const { return *kv_; }

  // The logits row each generated token was sampled from, recomputed by a forward pass of its
  // own (own pool, one sequence, prompt in one chunk, then one token per step).
  std::vector<std::vector<float>> LogitsAlong(const std::vector<uint32_t>& prompt,
                                              const std::vector<uint32_t>& generated) {
    constexpr int64_t kBlocks = 32;
    kvcache::KvLayout layout{weights_.config.n_layers, weights_.config.n_kv_heads,
                             weights_.config.head_dim, 16, kernels::DType::kF32};
    absl::StatusOr<std::unique_ptr<memory::HostKvPool>> pool =
        memory::HostKvPool::Create(layout, kBlocks);
    CHECK(pool.ok()) << pool.status();
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        &weights_, {(*pool)->base(), kernels::DType::kF32, kBlocks, 16}, {}, {});
    CHECK(f.ok()) << f.status();
    std::vector<int32_t> table(kBlocks);
    for (int32_t b = 0; b < kBlocks; ++b) table[b] = b;
    std::vector<uint32_t> seq = prompt;
    seq.insert(seq.end(), generated.begin(), generated.end());
    std::vector<std::vector<float>> rows;
    std::vector<float> logits(weights_.config.vocab_size);
    absl::Span<const uint32_t> all(seq);
    CHECK((*f)->Forward({{all.first(prompt.size()), 0, table}}, logits.data()).ok());
    rows.push_back(logits);
    for (size_t i = 0; i + 1 < generated.size(); ++i) {
      const int64_t pos = static_cast<int64_t>(prompt.size() + i);
      CHECK((*f)->Forward({{all.subspan(pos, 1), pos, table}}, logits.data()).ok());
      rows.push_back(logits);
    }
    return rows;
  }

 private:
  std::unique_ptr<Llama2cCheckpoint> checkpoint_;
  ModelWeights weights_;
  std::unique_ptr<Llama2cTokenizer> tokenizer_;
  std::unique_ptr<memory::HostKvPool> pool_;
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<kvcache::KvCacheManager> kv_;
  ModelWeights draft_weights_;  // UseDraft(int8)
  std::unique_ptr<memory::HostKvPool> draft_pool_;
  std::unique_ptr<LlamaForward> draft_forward_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<uint64_t, Result> results_;
};

inline SamplingOptions MaxTokens(uint32_t n) {
  SamplingOptions s;
  s.max_tokens = n;
  return s;
}

inline const char* const kPrompts[] = {"Once upon a time", "The cat sat on the mat and",
                                       "Lily and Ben went", "One day, a little bird",
                                       "Tom had a big red ball. He"};

}  // namespace pd::engine::scheduler_testing
