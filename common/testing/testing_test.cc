#include <sys/stat.h>

#include <fstream>
#include <string>

#include "common/testing/net.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace pd::testing {
namespace {

TEST(TestingHelpersTest, FreePortIsInRange) {
  absl::StatusOr<int> port = PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_LT(*port, 65536);
}

TEST(TestingHelpersTest, TempDirIsRemovedWithContents) {
  std::string path;
  {
    absl::StatusOr<TempDir> dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    path = dir->path();
    std::ofstream(dir->File("x.txt")) << "hello";
    struct stat st;
    ASSERT_EQ(::stat(dir->File("x.txt").c_str(), &st), 0);
    TempDir moved = std::move(*dir);  // ownership moves; only one removal
    EXPECT_EQ(moved.path(), path);
  }
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace pd::testing
