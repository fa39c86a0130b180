// NcclTransport tests that need no peer: creation and Register's input checks. They need a
// CUDA device (label gpu) except NoDeviceIsFailedPrecondition, which checks the answer on
// machines without one. Data movement is covered by the conformance suites
// (transport/conformance: nccl_conformance_test, nccl_two_process_test).
#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime.h>

#include "gtest/gtest.h"

namespace pd::transport {
namespace {

PoolGeometry Geometry() {
  PoolGeometry g;
  g.dtype = "bf16";
  g.block_bytes = 4096;
  g.num_blocks = 4;
  return g;
}

TEST(NcclTransportTest, NoDeviceIsFailedPrecondition) {
  if (NcclUsableDeviceCount() != 0) {
    GTEST_SKIP() << "a CUDA device is present";
  }
  EXPECT_EQ(CreateNcclTransport({}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NcclTransportTest, CreateCapsAndEndpoint) {
  if (NcclUsableDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateNcclTransport({});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Name(), "nccl");
  const TransportCaps caps = (*t)->Caps();
  EXPECT_TRUE(caps.cuda_memory);
  EXPECT_FALSE(caps.host_memory);
  EXPECT_TRUE(caps.two_sided);
  EXPECT_FALSE(caps.cancel);
  absl::StatusOr<EndpointInfo> e = EndpointInfo::Decode((*t)->LocalEndpoint());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->backend, "nccl");
  EXPECT_EQ((*t)->Connect("garbage").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportTest, BadOptionsRejected) {
  if (NcclUsableDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  NcclTransportOptions o;
  o.device = NcclUsableDeviceCount();
  EXPECT_EQ(CreateNcclTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.device = 0;
  o.listen_host = "localhost";  // not numeric
  EXPECT_EQ(CreateNcclTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportTest, RegisterAcceptsOnlyDeviceMemoryOfItsDevice) {
  if (NcclUsableDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateNcclTransport({});
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<char> host(4 * 4096);
  MemoryRegion r{host.data(), host.size(), MemoryKind::kHost, 0, Geometry()};
  EXPECT_EQ((*t)->Register(r).status().code(), absl::StatusCode::kUnimplemented);
  r.kind = MemoryKind::kCuda;  // a host pointer claimed to be device memory
  EXPECT_EQ((*t)->Register(r).status().code(), absl::StatusCode::kInvalidArgument);

  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4 * 4096), cudaSuccess);
  r.base = dev;
  absl::StatusOr<RegionHandle> h = (*t)->Register(r);
  EXPECT_TRUE(h.ok()) << h.status();
  r.device = 1;
  EXPECT_EQ((*t)->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.device = 0;
  r.size_bytes = 4096;  // smaller than 4 blocks
  EXPECT_EQ((*t)->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  if (h.ok()) {
    EXPECT_TRUE((*t)->Deregister(*h).ok());
  }
  cudaFree(dev);
}

}  // namespace
}  // namespace pd::transport
