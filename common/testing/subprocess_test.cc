#include "common/testing/subprocess.h"

#include <signal.h>

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace pd::testing {
namespace {

TEST(SubprocessTest, CapturesOutputAndExitCode) {
  absl::StatusOr<TempDir> dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<Subprocess> p =
      Subprocess::Spawn({"/bin/sh", "-c", "echo hello; echo oops >&2; exit 3"}, dir->File("log"));
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<ExitInfo> info = p->Wait(absl::Seconds(10));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->exited);
  EXPECT_EQ(info->code, 3);
  EXPECT_EQ(p->ReadLog(), "hello\noops\n");
  EXPECT_FALSE(p->running());
}

TEST(SubprocessTest, StopEndsALongRunningChild) {
  absl::StatusOr<TempDir> dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<Subprocess> p = Subprocess::Spawn({"/bin/sleep", "60"}, dir->File("log"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->Poll().has_value());
  absl::StatusOr<ExitInfo> info = p->Stop();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->exited);
  EXPECT_EQ(info->signal, SIGTERM);
}

TEST(SubprocessTest, MissingBinaryIsNotFound) {
  EXPECT_EQ(Subprocess::Spawn({"/nonexistent/binary"}, "/dev/null").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::testing
