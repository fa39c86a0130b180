#include "transport/kv_transport.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/handshake.h"
#include "transport/registry.h"

namespace pd::transport {
namespace {

using ::testing::HasSubstr;

TEST(CoalescePairsTest, MergesRunsWhereBothSidesContinue) {
  const BlockPair pairs[] = {{BlockId(5), BlockId(12)},
                             {BlockId(3), BlockId(10)},
                             {BlockId(4), BlockId(11)},
                             {BlockId(9), BlockId(13)},
                             {BlockId(0), BlockId(2)}};
  const std::vector<BlockRun> runs = CoalescePairs(pairs);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].dst_first, 2u);
  EXPECT_EQ(runs[0].num_blocks, 1u);
  EXPECT_EQ(runs[1].src_first, 3u);
  EXPECT_EQ(runs[1].dst_first, 10u);
  EXPECT_EQ(runs[1].num_blocks, 3u);
  EXPECT_EQ(runs[2].src_first, 9u);
  EXPECT_EQ(runs[2].num_blocks, 1u);
  EXPECT_TRUE(CoalescePairs({}).empty());
}

PoolGeometry Geo() {
  PoolGeometry g;
  g.model_fingerprint = 77;
  g.dtype = "bf16";
  g.block_size = 16;
  g.num_layers = 32;
  g.num_kv_heads = 8;
  g.head_dim = 128;
  g.block_bytes = 2 << 20;
  g.num_blocks = 100;
  return g;
}

TEST(HandshakeTest, CompatibleIgnoresPoolSize) {
  PoolGeometry a = Geo(), b = Geo();
  b.num_blocks = 5;
  EXPECT_TRUE(CheckCompatible(a, b).ok());
}

TEST(HandshakeTest, MismatchNamesBothValues) {
  PoolGeometry a = Geo(), b = Geo();
  b.model_fingerprint = 78;
  b.block_size = 32;
  b.layout_version = 2;
  absl::Status s = CheckCompatible(a, b, "prefill", "decode");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("model_fingerprint prefill=77 decode=78"));
  EXPECT_THAT(s.message(), HasSubstr("block_size prefill=16 decode=32"));
  EXPECT_THAT(s.message(), HasSubstr("layout_version prefill=1 decode=2"));
}

TEST(HandshakeTest, GeometryValidate) {
  PoolGeometry g = Geo();
  EXPECT_TRUE(g.Validate().ok());
  g.block_bytes = 0;
  EXPECT_EQ(g.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HandshakeTest, DescriptorRoundTripAndGarbage) {
  TransferDescriptor d;
  d.backend = "tcp";
  d.receiver_instance_id = 1234;
  d.region_handle = 3;
  d.region_nonce = 99;
  d.tag = 7;
  d.geometry = Geo();
  d.dst_blocks = {BlockId(4), BlockId(1)};
  d.blob = std::string("\0\1rkey", 6);
  absl::StatusOr<TransferDescriptor> back = TransferDescriptor::Decode(d.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->receiver_instance_id, 1234u);
  EXPECT_EQ(back->region_nonce, 99u);
  EXPECT_EQ(back->geometry.dtype, "bf16");
  EXPECT_EQ(back->dst_blocks, d.dst_blocks);
  EXPECT_EQ(back->blob, d.blob);
  const std::string enc = d.Encode();
  EXPECT_EQ(TransferDescriptor::Decode(enc.substr(0, enc.size() - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransferDescriptor::Decode("garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string other_version = enc;
  other_version[4] = 9;
  EXPECT_EQ(TransferDescriptor::Decode(other_version).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(HandshakeTest, EndpointRoundTrip) {
  EndpointInfo e{"ucx", 42, "127.0.0.1:5", "blob"};
  absl::StatusOr<EndpointInfo> back = EndpointInfo::Decode(e.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->backend, "ucx");
  EXPECT_EQ(back->instance_id, 42u);
  EXPECT_EQ(back->address, "127.0.0.1:5");
  EXPECT_EQ(back->blob, "blob");
}

TEST(RegistryTest, KnownNames) {
  EXPECT_THAT(KnownTransports(), ::testing::ElementsAre("loopback", "tcp", "ucx", "nccl"));
  EXPECT_TRUE(IsTransportBuilt("tcp"));
  EXPECT_TRUE(IsTransportBuilt("loopback"));
  EXPECT_FALSE(IsTransportBuilt("carrier-pigeon"));
}

TEST(RegistryTest, UnknownAndUnbuilt) {
  TransportConfig c;
  c.backend = "carrier-pigeon";
  EXPECT_EQ(CreateTransport(c).status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* name : {"ucx", "nccl"}) {
    c.backend = name;
    absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateTransport(c);
    if (IsTransportBuilt(name)) {
      continue;  // built here: the conformance tests cover it
    }
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(t.status().message(),
                HasSubstr(name[0] == 'u' ? "PD_ENABLE_UCX" : "PD_ENABLE_NCCL"));
  }
  c.backend = "tcp";
  c.listen_port = 70000;
  EXPECT_EQ(CreateTransport(c).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, CreatesLoopbackAndTcp) {
  TransportConfig c;
  c.backend = "loopback";
  absl::StatusOr<std::unique_ptr<KvTransport>> l = CreateTransport(c);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)->Name(), "loopback");
  c.backend = "tcp";
  absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateTransport(c);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Name(), "tcp");
  EXPECT_TRUE((*t)->Caps().two_sided);
}

}  // namespace
}  // namespace pd::transport
