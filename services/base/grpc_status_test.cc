#include "services/base/grpc_status.h"

#include "gtest/gtest.h"

namespace pd::services {
namespace {

TEST(GrpcStatusTest, EveryCanonicalCodeMapsOneToOne) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("kv blocks exhausted")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("kv blocks exhausted")).error_message(),
            "kv blocks exhausted");
}

}  // namespace
}  // namespace pd::services
