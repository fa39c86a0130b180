#include "services/tierd/nvme_manifest.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace pd::tierd {
namespace {

constexpr ManifestGeometry kGeometry{10240, 12288, 64};

ManifestRecord Commit(uint32_t slot, uint64_t h, uint64_t fp = 7) {
  return ManifestRecord{
      ManifestRecordType::kCommit, slot, BlockHash{h, h + 1}, h * 3, fp, 1'700'000'000'000};
}
ManifestRecord Drop(uint32_t slot, uint64_t h) {
  ManifestRecord r = Commit(slot, h);
  r.type = ManifestRecordType::kDrop;
  r.checksum = 0;
  return r;
}

class NvmeManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create("pd-tierd-manifest-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<testing::TempDir>(*std::move(dir));
    path_ = dir_->File("manifest.log");
  }

  std::unique_ptr<NvmeManifest> Open(ManifestReplay* replay,
                                     ManifestGeometry geometry = kGeometry) {
    absl::StatusOr<std::unique_ptr<NvmeManifest>> m =
        NvmeManifest::Open(path_, geometry, /*sync=*/false, replay);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  std::unique_ptr<testing::TempDir> dir_;
  std::string path_;
};

TEST_F(NvmeManifestTest, RecordEncodingRoundTripsAndDetectsDamage) {
  uint8_t buf[kManifestRecordBytes];
  const ManifestRecord r = Commit(42, 0xfeedface);
  EncodeManifestRecord(r, buf);
  ManifestRecord back;
  ASSERT_TRUE(DecodeManifestRecord(buf, &back));
  EXPECT_EQ(back, r);
  for (size_t i = 0; i < kManifestRecordBytes; ++i) {
    uint8_t copy[kManifestRecordBytes];
    std::copy(buf, buf + kManifestRecordBytes, copy);
    copy[i] ^= 0x10;
    EXPECT_FALSE(DecodeManifestRecord(copy, &back)) << "flip at byte " << i;
  }
  EXPECT_NE(FingerprintId("model-a"), FingerprintId("model-b"));
}

TEST_F(NvmeManifestTest, ReplayKeepsTheLastStandingCommitPerSlot) {
  {
    ManifestReplay replay;
    auto m = Open(&replay);
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(replay.created);
    ASSERT_TRUE(m->Append({Commit(0, 100), Commit(1, 101), Commit(2, 102)}).ok());
    ASSERT_TRUE(m->Append({Drop(1, 101), Commit(0, 200), Drop(2, 999)}).ok());
    EXPECT_EQ(m->num_records(), 6);
  }
  ManifestReplay replay;
  auto m = Open(&replay);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(replay.created);
  EXPECT_EQ(replay.records, 6);
  EXPECT_EQ(replay.bad_records, 0);
  EXPECT_EQ(replay.torn_bytes, 0);
  // Slot 0 was overwritten, slot 1 dropped, slot 2's drop named another block.
  ASSERT_EQ(replay.live.size(), 2u);
  EXPECT_EQ(replay.live[0], Commit(2, 102));
  EXPECT_EQ(replay.live[1], Commit(0, 200));
}

TEST_F(NvmeManifestTest, TornTailIsCutAndCorruptRecordsSkipped) {
  {
    ManifestReplay replay;
    auto m = Open(&replay);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->Append({Commit(0, 1), Commit(1, 2), Commit(2, 3), Commit(3, 4)}).ok());
  }
  {
    // Damage record 1 (in the middle) and leave half a record at the end.
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kManifestHeaderBytes + kManifestRecordBytes + 10);
    f.write("X", 1);
    f.seekp(0, std::ios::end);
    f.write("0123456789012345678901234", 25);
  }
  ManifestReplay replay;
  auto m = Open(&replay);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(replay.records, 3);
  EXPECT_EQ(replay.bad_records, 1);
  EXPECT_EQ(replay.torn_bytes, 25);
  ASSERT_EQ(replay.live.size(), 3u);
  EXPECT_EQ(std::filesystem::file_size(path_), kManifestHeaderBytes + 4 * kManifestRecordBytes);
  // Appends continue on a record boundary.
  ASSERT_TRUE(m->Append({Commit(9, 9)}).ok());
  m.reset();
  m = Open(&replay);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(replay.live.size(), 4u);
  EXPECT_EQ(replay.torn_bytes, 0);
}

TEST_F(NvmeManifestTest, AnotherGeometryStartsEmpty) {
  {
    ManifestReplay replay;
    auto m = Open(&replay);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->Append({Commit(0, 1)}).ok());
  }
  ManifestReplay replay;
  auto m = Open(&replay, ManifestGeometry{4096, 4096, 64});
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(replay.geometry_mismatch);
  EXPECT_TRUE(replay.live.empty());
  EXPECT_EQ(std::filesystem::file_size(path_), kManifestHeaderBytes);
}

TEST_F(NvmeManifestTest, RewriteReplacesTheLog) {
  ManifestReplay replay;
  auto m = Open(&replay);
  ASSERT_NE(m, nullptr);
  for (uint32_t i = 0; i < 50; ++i) {
    ASSERT_TRUE(m->Append({Commit(i % 5, i)}).ok());
  }
  ASSERT_TRUE(m->Rewrite({Commit(0, 45), Commit(1, 46)}).ok());
  EXPECT_EQ(m->num_records(), 2);
  ASSERT_TRUE(m->Append({Commit(2, 47)}).ok());
  m.reset();
  m = Open(&replay);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(replay.live.size(), 3u);
  EXPECT_EQ(replay.live[2], Commit(2, 47));
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
}

}  // namespace
}  // namespace pd::tierd
