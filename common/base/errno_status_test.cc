#include "common/base/errno_status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace pd {
namespace {

TEST(ErrnoToStatusTest, MapsToSpecificCodesAndNamesThePath) {
  absl::Status s = ErrnoToStatus(ENOENT, "open", "/no/such");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message().substr(0, 15), "open /no/such: ");
  EXPECT_EQ(ErrnoToStatus(EACCES, "open", "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EEXIST, "mkdir", "x").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoToStatus(EISDIR, "open", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write", "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EIO, "read", "x").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace pd
