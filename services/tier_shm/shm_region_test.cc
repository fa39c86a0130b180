#include "services/tier_shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pd::tier_shm {
namespace {

std::string UniqueShmName() {
  static std::atomic<int> counter{0};
  return absl::StrCat("/pd-tierd-shm-test-", getpid(), "-", counter++);
}

TEST(ShmRegionTest, SecondMappingSeesTheOwnersBytes) {
  const std::string name = UniqueShmName();
  absl::StatusOr<std::unique_ptr<ShmRegion>> owner = ShmRegion::Create(name, 3 * 4096);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_TRUE((*owner)->owner());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*owner)->data()) % 4096, 0u);
  absl::StatusOr<std::unique_ptr<ShmRegion>> worker = ShmRegion::MapExisting(name, 3 * 4096);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_FALSE((*worker)->owner());
  ASSERT_NE((*owner)->data(), (*worker)->data());  // two mappings of one object
  std::memcpy((*owner)->data() + 5000, "parent", 6);
  EXPECT_EQ(std::memcmp((*worker)->data() + 5000, "parent", 6), 0);
  std::memcpy((*worker)->data() + 12000, "worker", 6);
  EXPECT_EQ(std::memcmp((*owner)->data() + 12000, "worker", 6), 0);
}

// A worker is another process: a forked child maps the object by name, checks what the parent
// wrote, and writes an answer the parent reads.
TEST(ShmRegionTest, ChildProcessMapsByName) {
  const std::string name = UniqueShmName();
  constexpr size_t kSize = 64 * 1024;
  absl::StatusOr<std::unique_ptr<ShmRegion>> owner = ShmRegion::Create(name, kSize);
  ASSERT_TRUE(owner.ok()) << owner.status();
  for (size_t i = 0; i < kSize; ++i) {
    (*owner)->data()[i] = static_cast<uint8_t>(i * 7);
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: no gtest assertions (they would report from the wrong process); exit codes.
    // The parent's mapping is inherited; unmap it so the read really goes through the name.
    munmap((*owner)->data(), kSize);
    absl::StatusOr<std::unique_ptr<ShmRegion>> mine = ShmRegion::MapExisting(name, kSize);
    if (!mine.ok()) {
      _exit(2);
    }
    for (size_t i = 0; i < kSize; ++i) {
      if ((*mine)->data()[i] != static_cast<uint8_t>(i * 7)) {
        _exit(3);
      }
    }
    std::memcpy((*mine)->data(), "child ok", 8);
    _exit(0);  // skips destructors: the child must not unlink the parent's object
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "2: map failed, 3: wrong bytes";
  EXPECT_EQ(std::memcmp((*owner)->data(), "child ok", 8), 0);
}

TEST(ShmRegionTest, MapExistingChecksNameAndSize) {
  const std::string name = UniqueShmName();
  EXPECT_EQ(ShmRegion::MapExisting(name, 4096).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<ShmRegion>> owner = ShmRegion::Create(name, 8192);
  ASSERT_TRUE(owner.ok()) << owner.status();
  absl::Status wrong = ShmRegion::MapExisting(name, 4096).status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.message().find(name), absl::string_view::npos) << wrong;
  EXPECT_NE(wrong.message().find("8192"), absl::string_view::npos) << wrong;
  EXPECT_EQ(ShmRegion::MapExisting("bad/name", 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShmRegionTest, OwnerUnlinksOnDestruction) {
  const std::string name = UniqueShmName();
  {
    absl::StatusOr<std::unique_ptr<ShmRegion>> owner = ShmRegion::Create(name, 4096);
    ASSERT_TRUE(owner.ok()) << owner.status();
  }
  EXPECT_EQ(ShmRegion::MapExisting(name, 4096).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmRegionTest, ReplacesAStaleObject) {
  const std::string name = UniqueShmName();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);  // a crashed tierd's leftover
  ASSERT_GE(fd, 0);
  close(fd);
  absl::StatusOr<std::unique_ptr<ShmRegion>> owner = ShmRegion::Create(name, 4096);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_TRUE(ShmRegion::MapExisting(name, 4096).ok());
}

TEST(ShmRegionTest, TooLargeForDevShmNamesTheObject) {
  struct statvfs vfs {};
  ASSERT_EQ(statvfs("/dev/shm", &vfs), 0);
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const std::string name = UniqueShmName();
  absl::Status s = ShmRegion::Create(name, avail + (size_t{1} << 30)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(name), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("/dev/shm"), absl::string_view::npos) << s;
  // Nothing is left behind.
  EXPECT_EQ(ShmRegion::MapExisting(name, 4096).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmRegionTest, RejectsBadNames) {
  EXPECT_FALSE(ShmRegion::ValidateName("").ok());
  EXPECT_FALSE(ShmRegion::ValidateName("/").ok());
  EXPECT_FALSE(ShmRegion::ValidateName("x").ok());
  EXPECT_FALSE(ShmRegion::ValidateName("/a/b").ok());
  EXPECT_FALSE(ShmRegion::ValidateName("/" + std::string(300, 'a')).ok());
  EXPECT_TRUE(ShmRegion::ValidateName("/pdserve-node1-g2").ok());
  EXPECT_EQ(ShmRegion::Create("/pd-zero", 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::tier_shm
