// UcxTransport checks that need no peer: device-memory registration follows what the UCX
// library supports (Debian's UCX 1.13 has no CUDA transports, so there it must be a clear
// Unimplemented naming the fix). Data movement is covered by transport/conformance.
#include "transport/ucx/ucx_transport.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::transport {
namespace {

TEST(UcxTransportTest, CudaRegistrationFollowsUcxSupport) {
  UcxTransportOptions o;
  o.ucp_options.push_back({"TLS", "tcp"});
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateUcxTransport(o);
  ASSERT_TRUE(t.ok()) << t.status();
  if ((*t)->Caps().cuda_memory) {
    GTEST_SKIP() << "this UCX supports CUDA memory: the gpu conformance suite covers it";
  }
  // Any pointer will do: the answer must come before UCX looks at the memory.
  std::vector<char> mem(4 * 1024);
  PoolGeometry g;
  g.dtype = "bf16";
  g.block_bytes = 1024;
  g.num_blocks = 4;
  MemoryRegion r{mem.data(), mem.size(), MemoryKind::kCuda, 0, g};
  absl::StatusOr<RegionHandle> h = (*t)->Register(r);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(h.status().message(), ::testing::HasSubstr("cuda_copy/cuda_ipc"));
  // Host memory still registers.
  r.kind = MemoryKind::kHost;
  EXPECT_TRUE((*t)->Register(r).ok());
}

}  // namespace
}  // namespace pd::transport
