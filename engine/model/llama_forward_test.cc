#include "engine/model/llama_forward.h"

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/device_weights.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "engine/model/model_weights.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/device_memory.h"
#include "kernels/sampling.h"

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
  std::vector<uint32_t> prompt = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273, 270, 280,
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
  ASSERT_TRUE(
      f->Forward({{other, 0, t_b}, {prompt, 0, t_a}, {single, 0, t_c}}, batched.data()).ok());
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
// --device cuda where it cannot run says why: the build lacks CUDA (Unimplemented naming
// PD_ENABLE_CUDA) or the machine lacks a device (FailedPrecondition). On a GPU machine the
// CUDA forward pass is compared with this one in llama_forward_cuda_test.cc (label gpu).
TEST_F(LlamaForwardTest, CudaDeviceWithoutDeviceOrBackendIsAClearError) {
  const ModelConfig& c = weights_.config;
  pool_.assign(int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize, 0.0f);
  KvPoolView view{pool_.data(), kernels::DType::kF32, 1, kBlockSize};
  kernels::OpContext cuda;
  cuda.device = kernels::Device::kCuda;
  if (!kernels::DeviceMemoryBuilt(kernels::Device::kCuda)) {
    const absl::Status s = LlamaForward::Create(&weights_, view, cuda, ForwardOptions{}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("PD_ENABLE_CUDA"), absl::string_view::npos) << s;
  } else if (kernels::DeviceCount(kernels::Device::kCuda) == 0) {
    const absl::Status s = LlamaForward::Create(&weights_, view, cuda, ForwardOptions{}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("no CUDA device"), absl::string_view::npos) << s;
  } else {
    GTEST_SKIP() << "a CUDA device exists: see llama_forward_cuda_test.cc";
  }
}

// The CUDA path's staging (inv_freq and batch metadata carved from the scratch allocation and
// uploaded each call) run on the host: bitwise the logits and KV of the direct path, for a
// mixed batch of decodes and prefills and then a decode step over those prefixes.
TEST_F(LlamaForwardTest, StagedMetadataGivesBitwiseEqualResults) {
  std::unique_ptr<LlamaForward> direct = MakeForward(16);
  ASSERT_NE(direct, nullptr);
  const std::vector<float> pool_direct_before = pool_;
  const ModelConfig& c = weights_.config;
  std::vector<float> pool2(pool_.size(), 0.0f);
  ForwardOptions staged_options;
  staged_options.staged_metadata = true;
  absl::StatusOr<std::unique_ptr<LlamaForward>> staged =
      LlamaForward::Create(&weights_, {pool2.data(), kernels::DType::kF32, 16, kBlockSize},
                           kernels::OpContext{}, staged_options);
  ASSERT_TRUE(staged.ok()) << staged.status();
  const int64_t vocab = c.vocab_size;
  const std::vector<uint32_t> p1 = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273,
                                    270, 280, 301, 302, 303, 304, 305, 306, 307, 308};  // 20
  const std::vector<uint32_t> p2 = {1, 265, 266};
  const std::vector<uint32_t> one = {42}, next = {7}, next2 = {9};
  const std::vector<int32_t> t1 = {5, 2}, t2 = {9}, t3 = {0};
  std::vector<float> a(3 * vocab), b(3 * vocab);
  ASSERT_TRUE(direct->Forward({{p1, 0, t1}, {one, 0, t3}, {p2, 0, t2}}, a.data()).ok());
  ASSERT_TRUE((*staged)->Forward({{p1, 0, t1}, {one, 0, t3}, {p2, 0, t2}}, b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  ASSERT_TRUE(direct->Forward({{next, 20, t1}, {next2, 3, t2}}, a.data()).ok());
  ASSERT_TRUE((*staged)->Forward({{next, 20, t1}, {next2, 3, t2}}, b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 2 * vocab * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pool_.data(), pool2.data(), pool2.size() * sizeof(float)), 0);
  EXPECT_NE(pool_, pool_direct_before);  // KV was written at all
}

// The sink + window policy's operations on the staged (CUDA-shaped) path give bitwise the
// direct path's logits and KV: RoPE offsets in a mixed batch and in decode steps (replayed as
// decode graphs: the RoPE positions live in a fixed, always-uploaded buffer), and
// CopyBlocksShifted in two chunks (32 tokens through a 24-token scratch), then a decode step
// reading the shifted copies.
TEST_F(LlamaForwardTest, StagedMetadataGivesBitwiseEqualRopeOffsetsAndShiftedCopies) {
  const ModelConfig& c = weights_.config;
  const int64_t vocab = c.vocab_size;
  const int64_t block_floats = int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize;
  std::vector<float> pool_direct(16 * block_floats, 0.0f), pool_staged(16 * block_floats, 0.0f);
  ForwardOptions direct_options, staged_options;
  direct_options.max_batch_tokens = staged_options.max_batch_tokens = 24;
  direct_options.max_seqs = staged_options.max_seqs = 4;
  staged_options.staged_metadata = true;
  auto make = [&](std::vector<float>& pool, ForwardOptions o) {
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        &weights_, {pool.data(), kernels::DType::kF32, 16, kBlockSize}, kernels::OpContext{}, o);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *std::move(f) : nullptr;
  };
  std::unique_ptr<LlamaForward> direct = make(pool_direct, direct_options);
  std::unique_ptr<LlamaForward> staged = make(pool_staged, staged_options);
  ASSERT_TRUE(direct != nullptr && staged != nullptr);
  const std::vector<uint32_t> p1 = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273,
                                    270, 280, 301, 302, 303, 304, 305, 306, 307, 308};  // 20
  const std::vector<uint32_t> p2 = {1, 265, 266};
  const std::vector<uint32_t> one = {42}, next = {7}, next2 = {9};
  const std::vector<int32_t> t1 = {5, 2}, t2 = {9}, t3 = {0}, shifted = {11, 12};
  std::vector<float> a(3 * vocab), b(3 * vocab);
  auto both = [&](const std::vector<ForwardSequence>& batch, const char* what) {
    ASSERT_TRUE(direct->Forward(batch, a.data()).ok()) << what;
    ASSERT_TRUE(staged->Forward(batch, b.data()).ok()) << what;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), batch.size() * vocab * sizeof(float)), 0) << what;
  };
  both({{p1, 0, t1}, {one, 0, t3, 100}, {p2, 0, t2, 37}}, "mixed batch with offsets");
  both({{next, 20, t1}, {next2, 3, t2, 37}, {one, 1, t3, 100}}, "decode step with offsets");
  both({{next2, 21, t1, 5}, {next, 4, t2, 37}}, "decode step, other offsets");
  EXPECT_EQ(staged->graph_stats().replays, 2);  // both decode steps ran as graphs
  // Ids are checked on the host before anything is staged.
  EXPECT_TRUE(absl::IsInvalidArgument(staged->CopyBlocksShifted({5, 2}, {11, 16}, 32, 48)));
  EXPECT_TRUE(absl::IsInvalidArgument(staged->CopyBlocksShifted({5, 2}, {11, 5}, 32, 48)));
  ASSERT_TRUE(direct->CopyBlocksShifted(t1, shifted, 32, 48).ok());
  ASSERT_TRUE(staged->CopyBlocksShifted(t1, shifted, 32, 48).ok());
  EXPECT_EQ(std::memcmp(pool_direct.data(), pool_staged.data(), pool_direct.size() * 4), 0);
  EXPECT_NE(pool_direct[11 * block_floats], 0.0f);  // the copies were written
  both({{next, 22, shifted, 48}, {next2, 5, t2, 37}}, "decode step over the shifted copies");
  EXPECT_EQ(std::memcmp(pool_direct.data(), pool_staged.data(), pool_direct.size() * 4), 0);
}

// ForwardSample equals Forward followed by kernels::Sample on each logits row (greedy and
// sampled rows, mixed decode and prefill, batch order differing from slot order), returns only
// the rows asked for, and gives the same on the staged (CUDA-shaped) path.
// H2O / SnapKV scores: asking for them changes no logit; each layer's query heads hand out one
// unit of attention per query; a prompt chunked and then decoded adds bitwise the same scores
// as one prefill; the staged (CUDA) path refuses them.
TEST_F(LlamaForwardTest, AttentionMassIsBatchInvariantAndLeavesLogitsAlone) {
  const ModelConfig& c = weights_.config;
  const int64_t vocab = c.vocab_size, stride = 32;
  const int64_t rows = int64_t{c.n_layers} * c.n_kv_heads;
  const std::vector<uint32_t> prompt = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273,
                                        270, 280, 301, 302, 303, 304, 305, 306, 307, 308};
  const std::vector<int32_t> table = {3, 1};
  std::vector<float> plain(vocab), scored(vocab), mass(rows * stride, 0.0f);
  {
    std::unique_ptr<LlamaForward> f = MakeForward(4);
    ASSERT_TRUE(f->Forward({{prompt, 0, table}}, plain.data()).ok());
  }
  std::unique_ptr<LlamaForward> f = MakeForward(4);
  ForwardSequence one{prompt, 0, table};
  one.attention_mass = mass.data();
  one.mass_stride = stride;
  ASSERT_TRUE(f->Forward({one}, scored.data()).ok());
  EXPECT_EQ(std::memcmp(plain.data(), scored.data(), vocab * sizeof(float)), 0);
  const int64_t group = c.n_heads / c.n_kv_heads;
  for (int64_t r = 0; r < c.n_layers; ++r) {
    double total = 0;
    for (int64_t g = 0; g < c.n_kv_heads; ++g) {
      for (int64_t t = 0; t < stride; ++t) total += mass[(r * c.n_kv_heads + g) * stride + t];
    }
    EXPECT_NEAR(total, 20.0 * group * c.n_kv_heads, 1e-3) << "layer " << r;
  }
  // Chunks of 7 and 11 (the first 4 of the first not scored), then two decode steps.
  std::vector<float> want(rows * stride, 0.0f), got(rows * stride, 0.0f);
  std::unique_ptr<LlamaForward> g = MakeForward(4);
  ForwardSequence whole{absl::MakeConstSpan(prompt).first(18), 0, table};
  whole.attention_mass = want.data();
  whole.mass_stride = stride;
  whole.mass_from = 4;
  ASSERT_TRUE(g->Forward({whole}, scored.data()).ok());
  for (int64_t pos : {18, 19}) {
    ForwardSequence d{absl::MakeConstSpan(prompt).subspan(pos, 1), pos, table};
    d.attention_mass = want.data();
    d.mass_stride = stride;
    ASSERT_TRUE(g->Forward({d}, scored.data()).ok());
  }
  std::unique_ptr<LlamaForward> h = MakeForward(4);
  ForwardSequence first{absl::MakeConstSpan(prompt).first(7), 0, table};
  first.attention_mass = got.data();
  first.mass_stride = stride;
  first.mass_from = 4;
  ForwardSequence second{absl::MakeConstSpan(prompt).subspan(7, 11), 7, table};
  second.attention_mass = got.data();
  second.mass_stride = stride;
  ASSERT_TRUE(h->Forward({first}, scored.data()).ok());
  ASSERT_TRUE(h->Forward({second}, scored.data()).ok());
  ForwardSequence tail{absl::MakeConstSpan(prompt).subspan(18, 2), 18, table};
  tail.attention_mass = got.data();
  tail.mass_stride = stride;
  ASSERT_TRUE(h->Forward({tail}, scored.data()).ok());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);

  ForwardSequence bad = one;
  bad.mass_stride = 19;
  EXPECT_TRUE(absl::IsInvalidArgument(f->Forward({bad}, scored.data())));
  bad = one;
  bad.mass_from = 20;
  EXPECT_TRUE(absl::IsInvalidArgument(f->Forward({bad}, scored.data())));
  // The CUDA path's staging on the host (the block tables read from the staged copy) adds the
  // same bits.
  ForwardOptions staged;
  staged.staged_metadata = true;
  std::unique_ptr<LlamaForward> s = MakeForward(4, staged);
  std::vector<float> staged_mass(rows * stride, 0.0f);
  ForwardSequence staged_one = one;
  staged_one.attention_mass = staged_mass.data();
  ASSERT_TRUE(s->Forward({staged_one}, scored.data()).ok());
  EXPECT_EQ(std::memcmp(staged_mass.data(), mass.data(), mass.size() * sizeof(float)), 0);
}

// GatherKvRows moves each (layer, kv head)'s kept rows on their own, scales included: read
// back, every kept row equals its source row, for an unquantized, an i8 and an i4 cache, and
// with staged metadata (the ids uploaded first, as on CUDA).
TEST_F(LlamaForwardTest, GatherKvRowsMovesEachHeadsRowsWithTheirScales) {
  const ModelConfig& c = weights_.config;
  const std::vector<uint32_t> prompt = {1,   403, 407, 261, 378, 11,  300, 290, 350, 273,
                                        270, 280, 301, 302, 303, 304, 305, 306, 307, 308};
  const std::vector<int32_t> src = {5, 2}, dst = {7};
  constexpr int64_t kKeep = 9, kBlocks = 8;
  std::vector<int32_t> keep;
  for (int64_t r = 0; r < int64_t{c.n_layers} * c.n_kv_heads; ++r) {
    for (int64_t i = 0; i < kKeep; ++i) keep.push_back(static_cast<int32_t>((r + 2 * i) % 20));
  }
  for (const auto& [dtype, staged] :
       {std::pair{kernels::DType::kF32, false}, std::pair{kernels::DType::kI8, false},
        std::pair{kernels::DType::kI4, false}, std::pair{kernels::DType::kI8, true}}) {
    const int64_t block_bytes =
        kernels::DenseKvBlockBytes(dtype, c.n_layers, c.n_kv_heads, kBlockSize, c.head_dim);
    std::vector<uint8_t> pool(kBlocks * block_bytes + 64, 0);
    ForwardOptions options;
    options.staged_metadata = staged;
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        &weights_, {pool.data(), dtype, kBlocks, kBlockSize}, kernels::OpContext{}, options);
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<float> logits(c.vocab_size);
    ASSERT_TRUE((*f)->Forward({{prompt, 0, src}}, logits.data()).ok());
    EXPECT_TRUE(absl::IsInvalidArgument((*f)->GatherKvRows(src, {5}, keep, kKeep)));  // shared
    EXPECT_TRUE(absl::IsInvalidArgument((*f)->GatherKvRows(src, dst, keep, kKeep + 1)));
    ASSERT_TRUE((*f)->GatherKvRows(src, dst, keep, kKeep).ok());
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const kernels::KvCacheView view = kernels::DenseKvCacheView(
          pool.data(), dtype, kBlocks, c.n_layers, c.n_kv_heads, kBlockSize, c.head_dim, layer);
      auto read = [&](const std::vector<int32_t>& table, int64_t n, std::vector<float>* k,
                      std::vector<float>* v) {
        std::vector<int32_t> positions(n);
        std::iota(positions.begin(), positions.end(), 0);
        k->assign(n * c.kv_dim, 0.0f);
        v->assign(n * c.kv_dim, 0.0f);
        kernels::ReadKvParams r;
        r.k = k->data();
        r.v = v->data();
        r.k_token_stride = r.v_token_stride = c.kv_dim;
        r.cache = view;
        r.num_tokens = n;
        r.positions = positions.data();
        r.block_tables = table.data();
        r.max_blocks_per_seq = static_cast<int64_t>(table.size());
        ASSERT_TRUE(kernels::ReadKv(kernels::OpContext{}, r).ok());
      };
      std::vector<float> sk, sv, dk, dv;
      read(src, 20, &sk, &sv);
      read(dst, kKeep, &dk, &dv);
      for (int64_t g = 0; g < c.n_kv_heads; ++g) {
        for (int64_t i = 0; i < kKeep; ++i) {
          const int64_t from = keep[(layer * c.n_kv_heads + g) * kKeep + i];
          for (const auto& [a, b] : {std::pair{&sk, &dk}, std::pair{&sv, &dv}}) {
            EXPECT_EQ(
                std::memcmp(&(*b)[i * c.kv_dim + g * c.head_dim],
                            &(*a)[from * c.kv_dim + g * c.head_dim], c.head_dim * sizeof(float)),
                0)
                << static_cast<int>(dtype) << " layer " << layer << " head " << g << " row " << i;
          }
        }
      }
    }
  }
}

TEST_F(LlamaForwardTest, ForwardSampleEqualsForwardThenSample) {
  const ModelConfig& c = weights_.config;
  const int64_t vocab = c.vocab_size;
  const std::vector<uint32_t> p1 = {1, 403, 407, 261, 378, 11, 300, 290, 350};
  const std::vector<uint32_t> p2 = {1, 265, 266}, one = {42};
  const std::vector<int32_t> t1 = {5}, t2 = {9}, t3 = {0};
  const std::vector<ForwardSequence> batch = {{p1, 0, t1}, {one, 0, t3}, {p2, 0, t2}};
  std::vector<SampleSpec> specs(3);
  specs[0] = {0.8f, 20, 0.9f, 7, 3, /*want_logits=*/true};
  specs[1] = {0.0f, 0, 1.0f, 0, 0, false};  // greedy
  specs[2] = {1.5f, 0, 1.0f, 11, 0, false};

  // Reference: Forward, then each row through kernels::Sample on the host.
  std::unique_ptr<LlamaForward> plain = MakeForward(16);
  ASSERT_NE(plain, nullptr);
  std::vector<float> logits(3 * vocab);
  ASSERT_TRUE(plain->Forward(batch, logits.data()).ok());
  std::vector<int32_t> want(3);
  for (int s = 0; s < 3; ++s) {
    kernels::SamplingParams p;
    p.logits = &logits[s * vocab];
    p.out_tokens = &want[s];
    p.num_seqs = 1;
    p.vocab_size = p.logits_stride = vocab;
    p.temperature = &specs[s].temperature;
    p.top_k = &specs[s].top_k;
    p.top_p = &specs[s].top_p;
    p.seeds = &specs[s].seed;
    p.steps = &specs[s].step;
    std::vector<uint8_t> ws(kernels::SamplingWorkspaceBytes(kernels::OpContext{}, p));
    p.workspace = ws.data();
    p.workspace_bytes = static_cast<int64_t>(ws.size());
    ASSERT_TRUE(kernels::Sample(kernels::OpContext{}, p).ok());
  }
  EXPECT_EQ(static_cast<uint32_t>(want[1]), Argmax(&logits[vocab], vocab));

  for (bool staged : {false, true}) {
    ForwardOptions options;
    options.staged_metadata = staged;
    std::unique_ptr<LlamaForward> f = MakeForward(16, options);
    ASSERT_NE(f, nullptr);
    std::vector<int32_t> tokens(3, -1);
    std::vector<float> rows(3 * vocab, -7.0f);
    ASSERT_TRUE(f->ForwardSample(batch, specs, tokens.data(), rows.data()).ok());
    EXPECT_EQ(tokens, want) << "staged " << staged;
    EXPECT_EQ(std::memcmp(rows.data(), logits.data(), vocab * sizeof(float)), 0);
    EXPECT_EQ(rows[vocab], -7.0f);  // rows nobody asked for are not written
    EXPECT_EQ(rows[2 * vocab + 5], -7.0f);
  }
}

// Logit edits and min_p: ForwardSample equals Forward, then kernels::ApplyLogitEdits and
// kernels::Sample on the host, unstaged and staged (where 3 x 512 edits go up in three chunks
// of 768), and the returned rows carry the edits. A decode step with edits runs eagerly (no
// graph), one without replays its graph.
TEST_F(LlamaForwardTest, ForwardSampleAppliesEditsAndMinP) {
  const ModelConfig& c = weights_.config;
  const int64_t vocab = c.vocab_size;
  const std::vector<uint32_t> p1 = {1, 403, 407, 261, 378}, p2 = {1, 265, 266}, p3 = {1, 300};
  const std::vector<int32_t> t1 = {5}, t2 = {9}, t3 = {0};
  const std::vector<ForwardSequence> batch = {{p1, 0, t1}, {p2, 0, t2}, {p3, 0, t3}};
  std::vector<std::vector<kernels::LogitEdit>> edits(3);
  for (int s = 0; s < 3; ++s) {
    for (int32_t t = 0; t < vocab; ++t) {  // every token: 3 x 512 edits
      edits[s].push_back({t, (t % 11) * 0.5f - 2.0f, 1.0f + 0.1f * (t % 4),
                          0.25f * static_cast<float>(t % 3), t % 2 == 0 ? 0.5f : -0.5f});
    }
  }
  std::vector<SampleSpec> specs(3);
  for (int s = 0; s < 3; ++s) {
    specs[s].temperature = s == 0 ? 0.0f : 1.0f;
    specs[s].seed = 40 + s;
    specs[s].step = 2;
    specs[s].min_p = s == 2 ? 0.2f : 0.05f;
    specs[s].want_logits = true;
    specs[s].edits = edits[s];
  }
  std::unique_ptr<LlamaForward> plain = MakeForward(16);
  ASSERT_NE(plain, nullptr);
  std::vector<float> logits(3 * vocab);
  ASSERT_TRUE(plain->Forward(batch, logits.data()).ok());
  std::vector<kernels::LogitEdit> flat;
  std::vector<int32_t> rows;
  for (int s = 0; s < 3; ++s) {
    flat.insert(flat.end(), edits[s].begin(), edits[s].end());
    rows.resize(flat.size(), s);
  }
  kernels::LogitEditParams e;
  e.logits = logits.data();
  e.edits = flat.data();
  e.rows = rows.data();
  e.num_edits = static_cast<int64_t>(flat.size());
  e.num_seqs = 3;
  e.vocab_size = e.logits_stride = vocab;
  ASSERT_TRUE(kernels::ApplyLogitEdits(kernels::OpContext{}, e).ok());
  std::vector<int32_t> want(3);
  for (int s = 0; s < 3; ++s) {
    kernels::SamplingParams p;
    p.logits = &logits[s * vocab];
    p.out_tokens = &want[s];
    p.num_seqs = 1;
    p.vocab_size = p.logits_stride = vocab;
    p.temperature = &specs[s].temperature;
    p.min_p = &specs[s].min_p;
    p.seeds = &specs[s].seed;
    p.steps = &specs[s].step;
    std::vector<uint8_t> ws(kernels::SamplingWorkspaceBytes(kernels::OpContext{}, p));
    p.workspace = ws.data();
    p.workspace_bytes = static_cast<int64_t>(ws.size());
    ASSERT_TRUE(kernels::Sample(kernels::OpContext{}, p).ok());
  }
  for (bool staged : {false, true}) {
    ForwardOptions options;
    options.staged_metadata = staged;
    options.max_seqs = 3;  // staged edits then go up 768 at a time
    std::unique_ptr<LlamaForward> f = MakeForward(16, options);
    ASSERT_NE(f, nullptr);
    std::vector<int32_t> tokens(3, -1);
    std::vector<float> got(3 * vocab);
    ASSERT_TRUE(f->ForwardSample(batch, specs, tokens.data(), got.data()).ok());
    EXPECT_EQ(tokens, want) << "staged " << staged;
    EXPECT_EQ(std::memcmp(got.data(), logits.data(), got.size() * sizeof(float)), 0);

    // Decode steps: with edits eagerly, without them through a graph (staged only), the
    // tokens as the step without graphs gives them.
    const std::vector<uint32_t> next = {static_cast<uint32_t>(tokens[0])};
    const std::vector<ForwardSequence> decode = {{next, static_cast<int64_t>(p1.size()), t1}};
    std::vector<SampleSpec> one = {specs[0]};
    int32_t with_edits = -1, without = -1;
    ASSERT_TRUE(f->ForwardSample(decode, one, &with_edits, got.data()).ok());
    const int64_t replays = f->graph_stats().replays;
    EXPECT_EQ(replays, 0);
    one[0].edits = {};
    ASSERT_TRUE(f->ForwardSample(decode, one, &without, got.data()).ok());
    EXPECT_EQ(f->graph_stats().replays, staged ? 1 : 0);
    EXPECT_EQ(static_cast<uint32_t>(without), Argmax(got.data(), vocab));
  }
  // Out-of-range edits and min_p are refused before any compute.
  std::unique_ptr<LlamaForward> f = MakeForward(16);
  std::vector<int32_t> tokens(3);
  std::vector<kernels::LogitEdit> past = {{static_cast<int32_t>(vocab), 1.0f, 1.0f, 0, 0}};
  std::vector<SampleSpec> bad = specs;
  bad[1].edits = past;
  EXPECT_EQ(f->ForwardSample(batch, bad, tokens.data(), logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  bad = specs;
  bad[2].min_p = 1.5f;
  EXPECT_EQ(f->ForwardSample(batch, bad, tokens.data(), logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Decode graphs (emulated on the CPU through the staged path: kernels::DeviceGraph replays the
// captured step's code) give bitwise the results of launching kernel by kernel: the graph is
// keyed by the right shape and the per-step inputs reach it through the fixed buffers.
TEST_F(LlamaForwardTest, DecodeGraphsReplayBitwiseLikeEagerSteps) {
  const ModelConfig& c = weights_.config;
  const int64_t vocab = c.vocab_size;
  const int64_t block_floats = int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize;
  std::vector<float> pool_graph(16 * block_floats, 0.0f), pool_eager(16 * block_floats, 0.0f);
  ForwardOptions graph_options, eager_options;
  graph_options.staged_metadata = eager_options.staged_metadata = true;
  eager_options.decode_graphs = false;
  auto make = [&](std::vector<float>& pool, ForwardOptions o) {
    absl::StatusOr<std::unique_ptr<LlamaForward>> f = LlamaForward::Create(
        &weights_, {pool.data(), kernels::DType::kF32, 16, kBlockSize}, kernels::OpContext{}, o);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *std::move(f) : nullptr;
  };
  std::unique_ptr<LlamaForward> graph = make(pool_graph, graph_options);
  std::unique_ptr<LlamaForward> eager = make(pool_eager, eager_options);
  ASSERT_TRUE(graph != nullptr && eager != nullptr);

  std::vector<std::vector<uint32_t>> seqs = {{1, 403, 407, 261}, {1, 265}, {1, 300, 290}};
  const std::vector<std::vector<int32_t>> tables = {{0, 1}, {4, 5}, {8, 9}};
  // Step 0 prefills all three (not a decode step); then decode steps with 3, 2, 3, 1 and 3
  // sequences, alternating Forward and ForwardSample.
  const std::vector<std::vector<int>> steps = {{0, 1, 2}, {0, 1, 2}, {2, 0}, {0, 1, 2},
                                               {1},       {2, 1, 0}, {0, 2}};
  std::vector<size_t> computed(3, 0);
  int64_t decode_steps = 0;
  for (size_t step = 0; step < steps.size(); ++step) {
    std::vector<ForwardSequence> batch;
    std::vector<SampleSpec> specs;
    bool decode = true;
    for (int s : steps[step]) {
      const size_t n = seqs[s].size() - computed[s];
      decode = decode && n == 1;
      batch.push_back({absl::MakeConstSpan(seqs[s]).subspan(computed[s]),
                       static_cast<int64_t>(computed[s]), tables[s]});
      SampleSpec sp;
      sp.temperature = s == 1 ? 0.0f : 0.9f;
      sp.top_k = 40;
      sp.seed = static_cast<uint64_t>(s);
      sp.step = step;
      sp.want_logits = true;
      specs.push_back(sp);
    }
    decode_steps += decode ? 1 : 0;
    std::vector<float> a(batch.size() * vocab), b(batch.size() * vocab);
    std::vector<int32_t> ta(batch.size(), -1), tb(batch.size(), -2);
    if (step % 2 == 0) {
      ASSERT_TRUE(graph->Forward(batch, a.data()).ok());
      ASSERT_TRUE(eager->Forward(batch, b.data()).ok());
      for (size_t i = 0; i < batch.size(); ++i) {
        ta[i] = tb[i] = static_cast<int32_t>(Argmax(&a[i * vocab], vocab));
      }
    } else {
      ASSERT_TRUE(graph->ForwardSample(batch, specs, ta.data(), a.data()).ok());
      ASSERT_TRUE(eager->ForwardSample(batch, specs, tb.data(), b.data()).ok());
    }
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "step " << step;
    EXPECT_EQ(ta, tb) << "step " << step;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int s = steps[step][i];
      computed[s] = seqs[s].size();
      seqs[s].push_back(static_cast<uint32_t>(ta[i]));
    }
  }
  EXPECT_EQ(std::memcmp(pool_graph.data(), pool_eager.data(), pool_graph.size() * sizeof(float)),
            0);
  // Decode steps 1-6 have shapes (3, sample), (2, forward), (3, sample), (1, forward),
  // (3, sample), (2, forward): each replays, and each of the 3 shapes was captured once.
  EXPECT_EQ(decode_steps, 6);
  EXPECT_EQ(graph->graph_stats().replays, 6);
  EXPECT_EQ(graph->graph_stats().captures, 3);
  EXPECT_EQ(eager->graph_stats().replays, 0);
}

// ScratchBytes measures what Create allocates without allocating (the runtime sizes a GPU pool
// from what is left): a null pool base is fine for it, not for Create.
TEST_F(LlamaForwardTest, ScratchBytesMeasuresWithoutAPool) {
  ForwardOptions small, big;
  big.max_batch_tokens = 1024;
  big.max_seqs = 128;
  const KvPoolView no_base{nullptr, kernels::DType::kF32, 4, kBlockSize};
  absl::StatusOr<int64_t> a = LlamaForward::ScratchBytes(&weights_, no_base, {}, small);
  absl::StatusOr<int64_t> b = LlamaForward::ScratchBytes(&weights_, no_base, {}, big);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const ModelConfig& c = weights_.config;
  EXPECT_GE(*a, small.max_batch_tokens * c.dim * 4 + small.max_seqs * c.vocab_size * 4);
  EXPECT_GT(*b, *a);
  EXPECT_EQ(LlamaForward::Create(&weights_, no_base, {}, small).status().code(),
            absl::StatusCode::kInvalidArgument);
  big.max_seqs = 2048;  // more sequences than tokens: rejected as by Create
  EXPECT_EQ(LlamaForward::ScratchBytes(&weights_, no_base, {}, big).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(LlamaForwardTest, ForwardSampleRejectsBadSpecsBeforeCompute) {
  std::unique_ptr<LlamaForward> f = MakeForward(4);
  ASSERT_NE(f, nullptr);
  const std::vector<float> before = pool_;
  const std::vector<uint32_t> one = {42};
  const std::vector<int32_t> t = {0};
  const std::vector<ForwardSequence> batch = {{one, 0, t}};
  int32_t token = -1;
  std::vector<SampleSpec> specs(1);
  specs[0].top_p = 1.5f;
  absl::Status s = f->ForwardSample(batch, specs, &token, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("top_p"), std::string::npos) << s;
  specs[0] = SampleSpec{};
  specs[0].want_logits = true;
  s = f->ForwardSample(batch, specs, &token, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(f->ForwardSample(batch, {}, &token, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_, before);
}

// DeviceWeights on kCpu is a full host copy in one allocation: a forward pass over the copy
// gives bitwise the logits of the original, so the upload's layout (every tensor, its size,
// the shared classifier) is checked without a GPU.
TEST_F(LlamaForwardTest, UploadedWeightsGiveBitwiseEqualLogits) {
  absl::StatusOr<std::unique_ptr<DeviceWeights>> uploaded =
      DeviceWeights::Upload(weights_, kernels::OpContext{});
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  const ModelWeights& copy = (*uploaded)->weights();
  EXPECT_EQ(copy.fingerprint, weights_.fingerprint);
  EXPECT_NE(copy.embedding, weights_.embedding);
  EXPECT_NE(copy.layers[0].wq, weights_.layers[0].wq);
  EXPECT_EQ(copy.classifier == copy.embedding, weights_.classifier == weights_.embedding);
  EXPECT_TRUE(copy.owned.empty());

  std::unique_ptr<LlamaForward> original = MakeForward(8);
  ASSERT_NE(original, nullptr);
  const ModelConfig& c = weights_.config;
  std::vector<float> pool2(8 * int64_t{c.n_layers} * 2 * c.kv_dim * kBlockSize, 0.0f);
  absl::StatusOr<std::unique_ptr<LlamaForward>> on_copy = LlamaForward::Create(
      &copy, {pool2.data(), kernels::DType::kF32, 8, kBlockSize}, kernels::OpContext{}, {});
  ASSERT_TRUE(on_copy.ok()) << on_copy.status();
  const std::vector<uint32_t> prompt = {1, 403, 407, 261, 378, 11, 300, 290, 350, 273};
  const std::vector<int32_t> table = Table(0, 1);
  std::vector<float> a(original->vocab_size()), b(original->vocab_size());
  ASSERT_TRUE(original->Forward({{prompt, 0, table}}, a.data()).ok());
  ASSERT_TRUE((*on_copy)->Forward({{prompt, 0, table}}, b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pool_.data(), pool2.data(), pool2.size() * sizeof(float)), 0);

  // int8 weights: the scales travel too (the CUDA W8A8 MatMul needs them on the device).
  absl::StatusOr<ModelWeights> w8 = QuantizeWeightsInt8(weights_);
  ASSERT_TRUE(w8.ok()) << w8.status();
  absl::StatusOr<std::unique_ptr<DeviceWeights>> up8 =
      DeviceWeights::Upload(*w8, kernels::OpContext{});
  ASSERT_TRUE(up8.ok()) << up8.status();
  const ModelWeights& copy8 = (*up8)->weights();
  EXPECT_EQ(copy8.dtype, kernels::DType::kI8);
  EXPECT_NE(copy8.layers[0].wq_scales, nullptr);
  EXPECT_NE(copy8.layers[0].wq_scales, w8->layers[0].wq_scales);
  EXPECT_NE(copy8.classifier_scales, nullptr);
  std::vector<float> pool8a(pool2.size(), 0.0f), pool8b(pool2.size(), 0.0f);
  absl::StatusOr<std::unique_ptr<LlamaForward>> host8 = LlamaForward::Create(
      &*w8, {pool8a.data(), kernels::DType::kF32, 8, kBlockSize}, kernels::OpContext{}, {});
  absl::StatusOr<std::unique_ptr<LlamaForward>> dev8 = LlamaForward::Create(
      &copy8, {pool8b.data(), kernels::DType::kF32, 8, kBlockSize}, kernels::OpContext{}, {});
  ASSERT_TRUE(host8.ok() && dev8.ok());
  ASSERT_TRUE((*host8)->Forward({{prompt, 0, table}}, a.data()).ok());
  ASSERT_TRUE((*dev8)->Forward({{prompt, 0, table}}, b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  const float* wo_scales = w8->layers[0].wo_scales;
  w8->layers[0].wo_scales = nullptr;  // a matrix without its scales
  EXPECT_EQ(DeviceWeights::Upload(*w8, kernels::OpContext{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  w8->layers[0].wo_scales = wo_scales;

  ModelWeights broken;  // a layer without wq
  broken.config = weights_.config;
  broken.embedding = weights_.embedding;
  broken.classifier = weights_.classifier;
  broken.final_norm = weights_.final_norm;
  broken.layers = weights_.layers;
  broken.layers.back().wq = nullptr;
  EXPECT_EQ(DeviceWeights::Upload(broken, kernels::OpContext{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::engine
