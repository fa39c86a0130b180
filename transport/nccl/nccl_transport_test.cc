#include "transport/nccl/nccl_transport.h"

#include "gtest/gtest.h"

namespace pd::transport {
namespace {

TEST(NcclTransportTest, CreateOnGpuOrSkip) {
  if (NcclUsableDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateNcclTransport({});
  // The data path is not implemented yet (TODO(#4)); creation must say so, not crash.
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(NcclTransportTest, NoDeviceIsFailedPrecondition) {
  if (NcclUsableDeviceCount() != 0) {
    GTEST_SKIP() << "a CUDA device is present";
  }
  EXPECT_EQ(CreateNcclTransport({}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pd::transport
