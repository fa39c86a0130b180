#include "common/base/status_macros.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

absl::Status FailIf(bool fail) {
  return fail ? absl::InvalidArgumentError("boom") : absl::OkStatus();
}

absl::Status Chain(bool fail, int* reached) {
  PD_RETURN_IF_ERROR(FailIf(fail));
  *reached = 1;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool fail) {
  if (fail) {
    return absl::NotFoundError("no int");
  }
  return std::make_unique<int>(42);
}

absl::StatusOr<int> UseInt(bool fail) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<int> p, MakeInt(fail));  // move-only value
  int existing = 0;
  PD_ASSIGN_OR_RETURN(existing, absl::StatusOr<int>(*p + 1));  // existing lvalue
  return existing;
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesAndContinues) {
  int reached = 0;
  EXPECT_EQ(Chain(true, &reached).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(Chain(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, AssignOrReturnMovesValueOrReturnsStatus) {
  EXPECT_EQ(*UseInt(false), 43);
  absl::StatusOr<int> failed = UseInt(true);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(failed.status().message(), "no int");
}

}  // namespace
}  // namespace pd
