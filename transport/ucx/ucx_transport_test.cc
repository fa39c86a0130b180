// UcxTransport checks that need no peer: device-memory registration follows what the UCX
// library supports (Debian's UCX 1.13 has no CUDA transports, so there it must be a clear
// Unimplemented naming the fix); the lane parsing and descriptor blob that choose the data path;
// transport-allocated host memory. Data movement is covered by transport/conformance.
#include "transport/ucx/ucx_transport.h"

#include <string>
#include <vector>

#include "common/testing/net.h"
#include "transport/ucx/ucx_internal.h"

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

// Bound to 127.0.0.1, the transport listens on loopback only: UCX's tcp transport, which by
// default opens a listening socket on every network device (the host's external address too),
// is restricted to the interface owning the listen address. Both with tcp alone and with every
// transport UCX finds.
TEST(UcxTransportTest, ListensOnlyOnTheLoopbackInterfaceItWasGiven) {
  for (const char* tls : {"tcp", "all"}) {
    UcxTransportOptions o;
    o.listen_host = "127.0.0.1";
    o.ucp_options.push_back({"TLS", tls});
    absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateUcxTransport(o);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<std::vector<pd::testing::ListeningSocket>> socks =
        pd::testing::ListeningTcpSockets();
    ASSERT_TRUE(socks.ok()) << socks.status();
    EXPECT_FALSE(socks->empty()) << "the ucp listener should be listed";
    for (const pd::testing::ListeningSocket& s : *socks) {
      EXPECT_TRUE(s.IsLoopback()) << "UCX_TLS=" << tls << " listens on " << s.ToString();
    }
  }
}

TEST(UcxTransportTest, ListenAddressMustBelongToAnInterface) {
  UcxTransportOptions o;
  o.listen_host = "192.0.2.254";  // TEST-NET-1: on no interface here
  o.ucp_options.push_back({"TLS", "tcp"});
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateUcxTransport(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), ::testing::HasSubstr("192.0.2.254"));
}

TEST(UcxInternalTest, InterfaceOwningAndPrintedConfig) {
  using ucx_internal::InterfaceOwning;
  absl::StatusOr<std::string> lo = InterfaceOwning("127.0.0.1");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_FALSE(lo->empty());
  EXPECT_EQ(InterfaceOwning("127.0.0.2").value_or("?"), *lo);  // the rest of 127/8
  EXPECT_EQ(InterfaceOwning("0.0.0.0").value_or("?"), "");     // every interface
  EXPECT_EQ(InterfaceOwning("localhost").status().code(), absl::StatusCode::kInvalidArgument);
  const std::string printed = "UCX_NET_DEVICES=all\nUCX_SHM_DEVICES=all\nUCX_TLS=tcp\n";
  EXPECT_EQ(ucx_internal::PrintedConfigValue(printed, "NET_DEVICES"), "all");
  EXPECT_EQ(ucx_internal::PrintedConfigValue(printed, "TLS"), "tcp");
  EXPECT_EQ(ucx_internal::PrintedConfigValue(printed, "DEVICES"), "");
}

TEST(UcxInternalTest, LaneTransportReadsTheLaneOfARole) {
  // Lines as ucp_ep_print_info prints them (UCX 1.13, a data endpoint on one host).
  const std::string info =
      "#\n# UCP endpoint\n#\n"
      "#               peer: <no debug data>\n"
      "#                 lane[0]:  2:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0\n"
      "#                 lane[1]:  5:cma/memory.0 md[4]   -> md[4]/cma/sysdev[255] rma_bw#0\n";
  EXPECT_EQ(ucx_internal::LaneTransport(info, "am_bw#0"), "sysv/memory");
  EXPECT_EQ(ucx_internal::LaneTransport(info, "rma_bw#0"), "cma/memory");
  EXPECT_EQ(ucx_internal::LaneTransport(info, "amo"), "");
  EXPECT_EQ(ucx_internal::LaneTransport("garbage", "am_bw#0"), "");
  EXPECT_TRUE(ucx_internal::IsSharedMemoryTransport("sysv/memory"));
  EXPECT_TRUE(ucx_internal::IsSharedMemoryTransport("posix/memory"));
  EXPECT_FALSE(ucx_internal::IsSharedMemoryTransport("cma/memory"));
  EXPECT_FALSE(ucx_internal::IsSharedMemoryTransport("tcp/lo"));
  EXPECT_TRUE(ucx_internal::IsFastTransport("cma/memory"));
  EXPECT_FALSE(ucx_internal::IsFastTransport("tcp/eth0"));
  EXPECT_TRUE(ucx_internal::IsGoodPutTransport("rc_mlx5/mlx5_0:1"));
  EXPECT_FALSE(ucx_internal::IsGoodPutTransport("sysv/memory"));
}

TEST(UcxInternalTest, RegionBlobSaysDeviceAndMapped) {
  const std::string rkey = "packed rkey bytes";
  using ucx_internal::DescriptorIsMapped;
  using ucx_internal::DescriptorTargetsDevice;
  using ucx_internal::EncodeRegionBlob;
  EXPECT_FALSE(DescriptorTargetsDevice(EncodeRegionBlob(4096, rkey, MemoryKind::kHost, false)));
  EXPECT_FALSE(DescriptorIsMapped(EncodeRegionBlob(4096, rkey, MemoryKind::kHost, false)));
  EXPECT_TRUE(DescriptorIsMapped(EncodeRegionBlob(4096, rkey, MemoryKind::kHost, true)));
  EXPECT_TRUE(DescriptorTargetsDevice(EncodeRegionBlob(4096, rkey, MemoryKind::kCuda, false)));
  EXPECT_FALSE(DescriptorIsMapped(EncodeRegionBlob(4096, rkey, MemoryKind::kCuda, false)));
  // A truncated blob (an older peer, garbage) never selects a path.
  std::string cut = EncodeRegionBlob(4096, rkey, MemoryKind::kCuda, true);
  cut.pop_back();
  EXPECT_FALSE(DescriptorIsMapped(cut));
  EXPECT_FALSE(DescriptorIsMapped(""));
  EXPECT_FALSE(DescriptorTargetsDevice(""));
}

TEST(UcxTransportTest, HostAllocationsAreZeroedAndOutliveTheTransport) {
  UcxTransportOptions o;
  o.ucp_options.push_back({"TLS", "shm,self,tcp"});
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateUcxTransport(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->Caps().fast_host_allocation);
  absl::StatusOr<std::unique_ptr<HostAllocation>> a = (*t)->AllocateHost(3 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_GE((*a)->size(), uint64_t{3} << 20);
  const char* p = static_cast<const char*>((*a)->data());
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[(3 << 20) - 1], 0);
  PoolGeometry g;
  g.dtype = "bf16";
  g.block_bytes = 1 << 20;
  g.num_blocks = 3;
  absl::StatusOr<RegionHandle> h =
      (*t)->Register({(*a)->data(), uint64_t{3} << 20, MemoryKind::kHost, 0, g});
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*t)->Deregister(*h).ok());
  t->reset();  // the transport goes first; the allocation still unmaps cleanly
  static_cast<char*>((*a)->data())[42] = 1;
  a->reset();
  EXPECT_EQ((*t), nullptr);
}

}  // namespace
}  // namespace pd::transport
