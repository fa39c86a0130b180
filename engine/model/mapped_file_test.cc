#include "engine/model/mapped_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

constexpr char kModelPath[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";

TEST(MappedFileTest, MapsWholeFilePageAligned) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(kModelPath);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 1056540u);
  ASSERT_NE(file->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file->data()) % ::sysconf(_SC_PAGESIZE), 0u);
  int32_t dim = 0;
  std::memcpy(&dim, file->data(), sizeof(dim));
  EXPECT_EQ(dim, 64);
  EXPECT_EQ(file->contents().size(), file->size());
  EXPECT_EQ(file->path(), kModelPath);
}

TEST(MappedFileTest, EmptyFileIsEmptyMapping) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string path = dir->File("empty");
  std::ofstream(path).close();
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 0u);
  EXPECT_EQ(file->data(), nullptr);
  EXPECT_TRUE(file->contents().empty());
}

TEST(MappedFileTest, MoveTransfersMapping) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(kModelPath);
  ASSERT_TRUE(file.ok()) << file.status();
  const uint8_t* data = file->data();
  MappedFile moved = std::move(*file);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(file->data(), nullptr);  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(file->size(), 0u);
  MappedFile assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), data);
  EXPECT_EQ(assigned.data()[0], 64);
}

TEST(MappedFileTest, MissingFileIsNotFound) {
  absl::StatusOr<MappedFile> file = MappedFile::Open("/nonexistent/dir/model.bin");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/dir/model.bin"));
  EXPECT_THAT(file.status().message(), HasSubstr("No such file"));
}

TEST(MappedFileTest, DirectoryIsInvalidArgument) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<MappedFile> file = MappedFile::Open(dir->path());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr("is a directory"));
}

TEST(MappedFileTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "root bypasses file permissions";
  }
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string path = dir->File("secret");
  std::ofstream(path) << "x";
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace pd::engine
