#include "engine/model/llama_forward.h"

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "engine/model/model_weights.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";
constexpr int64_t kBlockSize = 16;

uint32_t Argmax(const float* row, int64_t n) {
  return static_cast<uint32_t>(std::max_element(row, row + n) - row);  // first max on ties
}

class LlamaForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kModel);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    checkpoint_ = std::make_unique<Llama2cCheckpoint>(*std::move(ckpt));
    weights_ = WeightsFromLlama2c(*checkpoint_);
  }

  // A pool of `num_blocks` blocks and a forward pass over it.
  std::unique_ptr<LlamaForward> MakeForward(int64_t num_blocks, ForwardOptions options = {}) {
    const ModelConfig& c = weights_.config;
    const int64_t block_floats = int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize;
    pool_.assign(num_blocks * block_floats, 0.0f);
    KvPoolView view{pool_.data(), kernels::DType::kF32, num_blocks, kBlockSize};
    absl::StatusOr<std::unique_ptr<LlamaForward>> f =
        LlamaForward::Create(&weights_, view, kernels::OpContext{}, options);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *std::move(f) : nullptr;
  }

  // Greedy generation of one sequence, one token per Forward (the run.c loop).
  std::vector<uint32_t> Greedy(LlamaForward* f, std::vector<uint32_t> prompt, int steps,
                               const std::vector<int32_t>& table) {
    std::vector<float> logits(f->vocab_size());
    std::vector<uint32_t> out;
    std::vector<uint32_t> seq = prompt;
    for (size_t pos = 0; pos < seq.size() && static_cast<int>(out.size()) < steps; ++pos) {
      ForwardSequence s{absl::MakeConstSpan(&seq[pos], 1), static_cast<int64_t>(pos), table};
      EXPECT_TRUE(f->Forward({s}, logits.data()).ok());
      if (pos + 1 == seq.size()) {
        const uint32_t next = Argmax(logits.data(), f->vocab_size());
        out.push_back(next);
        seq.push_back(next);
      }
    }
    return out;
  }

  std::unique_ptr<Llama2cCheckpoint> checkpoint_;
  ModelWeights weights_;
  std::vector<float> pool_;
};

std::vector<int32_t> Table(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// The model README's greedy text from BOS, through paged blocks in a shuffled order.
TEST_F(LlamaForwardTest, Stories260kGreedyTextMatchesReadme) {
  std::unique_ptr<LlamaForward> f = MakeForward(40);
  ASSERT_NE(f, nullptr);
  std::vector<int32_t> table = Table(0, 32);
  std::reverse(table.begin(), table.end());  // logical block i -> physical 31 - i
  std::vector<uint32_t> tokens = Greedy(f.get(), {1}, 100, table);
  absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Load(kTokenizer, 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::string> text = tok->Decode(tokens, /*prev=*/1);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string expected =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
  EXPECT_EQ(text->substr(0, expected.size()), expected);
}

// Logits of a sequence must not depend on the batch around it, on prompt chunking, or on its
// prefix coming from cached blocks: compared bitwise.
TEST_F(LlamaForwardTest, LogitsAreBitwiseIndependentOfBatchingChunkingAndCacheHits) {
  std::unique_ptr<LlamaForward> f = MakeForward(64);
  ASSERT_NE(f, nullptr);
  const int64_t vocab = f->vocab_size();
  std::vector<uint32_t> prompt = {1, 403, 407, 261, 378, 11, 300, 290, 350, 273, 270, 280,
                                  301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311};  // 23
  std::vector<float> whole(vocab), chunked(vocab), batched(3 * vocab), cached(vocab);

  // Whole prompt in one call (blocks 0..1).
  std::vector<int32_t> t_whole = Table(0, 2);
  ASSERT_TRUE(f->Forward({{prompt, 0, t_whole}}, whole.data()).ok());

  // Same prompt in chunks of 7, 9, 7 (blocks 2..3).
  std::vector<int32_t> t_chunk = Table(2, 2);
  absl::Span<const uint32_t> p(prompt);
  ASSERT_TRUE(f->Forward({{p.subspan(0, 7), 0, t_chunk}}, chunked.data()).ok());
  ASSERT_TRUE(f->Forward({{p.subspan(7, 9), 7, t_chunk}}, chunked.data()).ok());
  ASSERT_TRUE(f->Forward({{p.subspan(16, 7), 16, t_chunk}}, chunked.data()).ok());
  EXPECT_EQ(std::memcmp(whole.data(), chunked.data(), vocab * sizeof(float)), 0)
      << "chunked prefill differs";

  // Batched with two other sequences (one decode-like single token, one prefill).
  std::vector<int32_t> t_a = Table(4, 2), t_b = Table(6, 1), t_c = Table(7, 2);
  std::vector<uint32_t> other = {1, 265, 266, 267};
  std::vector<uint32_t> single = {42};
  ASSERT_TRUE(f->Forward({{other, 0, t_b}, {prompt, 0, t_a}, {single, 0, t_c}}, batched.data())
                  .ok());
  EXPECT_EQ(std::memcmp(whole.data(), batched.data() + vocab, vocab * sizeof(float)), 0)
      << "batched prefill differs";

  // Prefix cache hit: a new sequence sharing block 0 (the first 16 tokens) of t_whole computes
  // only the last 7 tokens into a fresh block.
  std::vector<int32_t> t_hit = {t_whole[0], 9};
  ASSERT_TRUE(f->Forward({{p.subspan(16), 16, t_hit}}, cached.data()).ok());
  EXPECT_EQ(std::memcmp(whole.data(), cached.data(), vocab * sizeof(float)), 0)
      << "cache-hit prefill differs";

  // Decode: one step alone versus the same step batched with another sequence's step.
  std::vector<float> alone(vocab), together(2 * vocab);
  const uint32_t next = Argmax(whole.data(), vocab);
  std::vector<uint32_t> step = {next};
  ASSERT_TRUE(f->Forward({{step, 23, t_whole}}, alone.data()).ok());
  std::vector<uint32_t> other_step = {7};
  ASSERT_TRUE(f->Forward({{other_step, 4, t_b}, {step, 23, t_chunk}}, together.data()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), together.data() + vocab, vocab * sizeof(float)), 0)
      << "batched decode differs";
}

TEST_F(LlamaForwardTest, RejectsBadInputBeforeTouchingThePool) {
  std::unique_ptr<LlamaForward> f = MakeForward(4, ForwardOptions{8, 2});
  ASSERT_NE(f, nullptr);
  std::vector<float> logits(2 * f->vocab_size());
  std::vector<uint32_t> ok = {1, 2};
  std::vector<int32_t> t = {0};
  std::vector<uint32_t> bad_token = {1, 9999};
  EXPECT_EQ(f->Forward({{bad_token, 0, t}}, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> outside = {7};
  EXPECT_EQ(f->Forward({{ok, 0, outside}}, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->Forward({{ok, 15, t}}, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);  // needs 2 blocks, table has 1
  std::vector<int32_t> big(32, 0);
  EXPECT_EQ(f->Forward({{ok, 511, big}}, logits.data()).code(), absl::StatusCode::kOutOfRange);
  std::vector<uint32_t> many(9, 1);
  EXPECT_EQ(f->Forward({{many, 0, t}}, logits.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->Forward({}, logits.data()).code(), absl::StatusCode::kInvalidArgument);
  for (float v : pool_) {
    ASSERT_EQ(v, 0.0f);
  }
}

// Only the CPU forward pass exists: a CUDA context is refused whether or not the CUDA kernels
// are built (they would be handed host buffers).
TEST_F(LlamaForwardTest, CudaDeviceIsUnimplemented) {
  const ModelConfig& c = weights_.config;
  pool_.assign(int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize, 0.0f);
  KvPoolView view{pool_.data(), kernels::DType::kF32, 1, kBlockSize};
  kernels::OpContext cuda;
  cuda.device = kernels::Device::kCuda;
  EXPECT_EQ(LlamaForward::Create(&weights_, view, cuda, ForwardOptions{}).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pd::engine
