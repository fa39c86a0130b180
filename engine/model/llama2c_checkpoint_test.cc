#include "engine/model/llama2c_checkpoint.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

constexpr char kModelPath[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
constexpr size_t kModelBytes = 1056540;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void SetHeaderField(std::string* bytes, int index, int32_t value) {
  std::memcpy(bytes->data() + 4 * index, &value, sizeof(value));
}

class Llama2cCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<pd::testing::TempDir>(std::move(*dir));
    original_ = ReadFile(kModelPath);
    ASSERT_EQ(original_.size(), kModelBytes);
  }

  // Writes `bytes` to a temp file and loads it.
  absl::StatusOr<Llama2cCheckpoint> LoadBytes(const std::string& bytes) {
    const std::string path = dir_->File("model.bin");
    WriteFile(path, bytes);
    return Llama2cCheckpoint::Load(path);
  }

  std::unique_ptr<pd::testing::TempDir> dir_;
  std::string original_;
};

// Byte offset of a tensor view inside the mapped file.
ptrdiff_t Offset(const Llama2cCheckpoint& c, const float* p) {
  return reinterpret_cast<const uint8_t*>(p) - c.file_data();
}

TEST_F(Llama2cCheckpointTest, HeaderMatchesReadme) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kModelPath);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelConfig& c = ckpt->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.kv_dim, 32);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.bos_id, 1u);
  EXPECT_EQ(c.eos_id, 2u);
  EXPECT_EQ(ckpt->file_size_bytes(), kModelBytes);
}

TEST_F(Llama2cCheckpointTest, TensorViewsPointAtReadmeOffsets) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kModelPath);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Llama2cCheckpoint& c = *ckpt;
  EXPECT_EQ(Offset(c, c.token_embedding()), 28);
  EXPECT_EQ(Offset(c, c.rms_att(0)), 131100);
  EXPECT_EQ(Offset(c, c.rms_att(4)), 131100 + 4 * 64 * 4);
  EXPECT_EQ(Offset(c, c.wq(0)), 132380);
  EXPECT_EQ(Offset(c, c.wq(1)), 132380 + 64 * 64 * 4);
  EXPECT_EQ(Offset(c, c.wk(0)), 214300);
  EXPECT_EQ(Offset(c, c.wk(2)), 214300 + 2 * 32 * 64 * 4);
  EXPECT_EQ(Offset(c, c.wv(0)), 255260);
  EXPECT_EQ(Offset(c, c.wo(0)), 296220);
  EXPECT_EQ(Offset(c, c.rms_ffn(0)), 378140);
  EXPECT_EQ(Offset(c, c.w1(0)), 379420);
  EXPECT_EQ(Offset(c, c.w2(0)), 599580);
  EXPECT_EQ(Offset(c, c.w3(0)), 819740);
  EXPECT_EQ(Offset(c, c.w3(4)) + 172 * 64 * 4, 1039900);  // last layer ends where rms_final starts
  EXPECT_EQ(Offset(c, c.rms_final()), 1039900);
  EXPECT_EQ(c.wcls(), c.token_embedding());
  // Views read the mapped bytes themselves, not copies.
  float first_rms_final;
  std::memcpy(&first_rms_final, original_.data() + 1039900, sizeof(float));
  EXPECT_EQ(c.rms_final()[0], first_rms_final);
}

TEST_F(Llama2cCheckpointTest, MoveKeepsViews) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kModelPath);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const float* wq0 = ckpt->wq(0);
  Llama2cCheckpoint moved = std::move(*ckpt);
  EXPECT_EQ(moved.wq(0), wq0);
  EXPECT_EQ(Offset(moved, moved.wq(0)), 132380);
}

TEST_F(Llama2cCheckpointTest, UnsharedClassifierFollowsFreqCis) {
  std::string bytes = original_;
  SetHeaderField(&bytes, 5, -512);
  bytes.append(std::string(512 * 64 * sizeof(float), '\x01'));
  absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(bytes);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE(ckpt->config().shared_classifier);
  EXPECT_EQ(ckpt->config().vocab_size, 512);
  EXPECT_EQ(Offset(*ckpt, ckpt->wcls()), static_cast<ptrdiff_t>(kModelBytes));
  EXPECT_NE(ckpt->wcls(), ckpt->token_embedding());
}

TEST_F(Llama2cCheckpointTest, UnsharedClassifierMissingIsInvalidArgument) {
  std::string bytes = original_;
  SetHeaderField(&bytes, 5, -512);
  absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(bytes);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("implies 1187612 bytes"));
}

TEST_F(Llama2cCheckpointTest, TruncatedFileNamesSizes) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(original_.substr(0, kModelBytes - 100));
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("file is 1056440 bytes"));
  EXPECT_THAT(ckpt.status().message(), HasSubstr("implies 1056540 bytes"));
  EXPECT_THAT(ckpt.status().message(), HasSubstr("truncated"));
}

TEST_F(Llama2cCheckpointTest, OversizedFileIsInvalidArgument) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(original_ + std::string(4, '\0'));
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("file is 1056544 bytes"));
  EXPECT_THAT(ckpt.status().message(), HasSubstr("trailing data"));
}

TEST_F(Llama2cCheckpointTest, ShorterThanHeaderIsInvalidArgument) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(original_.substr(0, 10));
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("10 bytes, shorter than the 28-byte"));
}

TEST_F(Llama2cCheckpointTest, ZeroHeadsIsInvalidArgument) {
  std::string bytes = original_;
  SetHeaderField(&bytes, 3, 0);
  absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(bytes);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("n_heads is 0 at byte offset 12"));
}

TEST_F(Llama2cCheckpointTest, InconsistentHeadsAreInvalidArgument) {
  struct Case {
    int field;
    int32_t value;
    const char* message;
  };
  const Case cases[] = {
      {3, 7, "dim 64 is not a multiple of n_heads 7"},
      {4, 3, "n_heads 8 is not a multiple of n_kv_heads 3"},
      {3, 64, "head_dim 1 is odd"},
      {5, 0, "vocab_size is 0"},
      {6, -1, "seq_len is -1"},
      {2, 0x7fffffff, "overflows"},
  };
  for (const Case& c : cases) {
    std::string bytes = original_;
    SetHeaderField(&bytes, c.field, c.value);
    if (c.field == 2) {
      SetHeaderField(&bytes, 0, 1 << 30);
      SetHeaderField(&bytes, 1, 0x7fffffff);
      SetHeaderField(&bytes, 3, 1);
      SetHeaderField(&bytes, 4, 1);
    }
    if (c.field == 3 && c.value == 64) {
      SetHeaderField(&bytes, 4, 64);
    }
    absl::StatusOr<Llama2cCheckpoint> ckpt = LoadBytes(bytes);
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(ckpt.status().message(), HasSubstr(c.message));
  }
}

TEST_F(Llama2cCheckpointTest, MissingFileIsNotFound) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(dir_->File("absent.bin"));
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ckpt.status().message(), HasSubstr("absent.bin"));
}

TEST_F(Llama2cCheckpointTest, FingerprintIsStableAndContentSensitive) {
  absl::StatusOr<Llama2cCheckpoint> a = Llama2cCheckpoint::Load(kModelPath);
  absl::StatusOr<Llama2cCheckpoint> b = Llama2cCheckpoint::Load(kModelPath);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(a->Fingerprint(), ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());

  absl::StatusOr<Llama2cCheckpoint> copy = LoadBytes(original_);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->Fingerprint(), a->Fingerprint());  // same bytes, another path

  std::string modified = original_;
  modified[500000] ^= 0x01;  // one bit of one weight in w1
  absl::StatusOr<Llama2cCheckpoint> changed = LoadBytes(modified);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(changed->Fingerprint(), a->Fingerprint());
}

TEST_F(Llama2cCheckpointTest, LayerOutOfRangeDies) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kModelPath);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_DEATH((void)ckpt->wq(5), "n_layers");
}

}  // namespace
}  // namespace pd::engine
