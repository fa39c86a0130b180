// Two-process conformance (integration): this process is the sender (prefill), a spawned
// transport_conformance_peer is the receiver (decode), over 127.0.0.1. Covers byte-for-byte
// delivery, unaligned blocks, stale registrations, a peer SIGKILLed mid-batch (the transfer
// fails within its timeout, no hang) and reconnecting to a restarted peer.
#include <signal.h>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/conformance/conformance_suite.h"
#include "transport/conformance/peer_control.h"
#include "transport/conformance/two_process_params.h"
#include "transport/registry.h"
#include "transport/testing/test_device_memory.h"

namespace pd::transport::conformance {
namespace {

constexpr uint64_t kSeed = 42;

UcxDataPath ParseDataPath(const std::string& s) {
  return s == "rma"  ? UcxDataPath::kRma
         : s == "am" ? UcxDataPath::kActiveMessage
                     : UcxDataPath::kAuto;
}

class TwoProcessTest : public ::testing::TestWithParam<TwoProcessParam> {
 protected:
  void SetUp() override {
    if (!IsTransportBuilt(GetParam().backend)) {
      GTEST_SKIP() << GetParam().backend << " not built";
    }
    if (GetParam().memory == MemoryKind::kCuda &&
        TestDeviceCount() <= std::max(GetParam().local_device, GetParam().peer_device)) {
      GTEST_SKIP() << "needs CUDA devices " << GetParam().local_device << " and "
                   << GetParam().peer_device << " (" << TestDeviceCount()
                   << " usable; NCCL does not support two ranks of one communicator on one GPU)";
    }
    absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create("pd-transport-2p-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(*std::move(dir));
    TransportConfig c;
    c.backend = GetParam().backend;
    if (!GetParam().ucx_tls.empty()) {
      c.ucx_options.push_back({"TLS", GetParam().ucx_tls});
    }
    c.ucx_data_path = ParseDataPath(GetParam().ucx_data_path);
    c.cuda_device = GetParam().local_device;
    absl::StatusOr<std::unique_ptr<KvTransport>> t = CreateTransport(c);
    ASSERT_TRUE(t.ok()) << t.status();
    local_ = *std::move(t);
    if (GetParam().memory == MemoryKind::kCuda && !local_->Caps().cuda_memory) {
      GTEST_SKIP() << "this " << GetParam().backend << " build cannot move CUDA memory";
    }
  }

  // Registers a pattern-filled source pool here.
  void MakeSource(uint64_t block_bytes, uint64_t num_blocks) {
    geometry_ = TestGeometry(block_bytes, num_blocks);
    char* base = nullptr;
    if (GetParam().pool_memory == "transport") {
      absl::StatusOr<std::unique_ptr<HostAllocation>> a =
          local_->AllocateHost(block_bytes * num_blocks);
      ASSERT_TRUE(a.ok()) << a.status();
      allocation_ = *std::move(a);
      base = static_cast<char*>(allocation_->data());
    } else {
      mem_.reset(new char[block_bytes * num_blocks]);
      base = mem_.get();
    }
    for (uint32_t b = 0; b < num_blocks; ++b) {
      FillPattern(kSeed, b, base + b * block_bytes, block_bytes);
    }
    MemoryRegion r{base, block_bytes * num_blocks, MemoryKind::kHost, 0, geometry_};
    if (GetParam().memory == MemoryKind::kCuda) {
      absl::StatusOr<TestDeviceBuffer> d =
          TestDeviceBuffer::Allocate(r.size_bytes, GetParam().local_device);
      ASSERT_TRUE(d.ok()) << d.status();
      ASSERT_TRUE(d->CopyFromHost(0, base, r.size_bytes).ok());
      dev_.emplace(*std::move(d));
      r.base = dev_->data();
      r.kind = MemoryKind::kCuda;
      r.device = GetParam().local_device;
    }
    absl::StatusOr<RegionHandle> h = local_->Register(r);
    ASSERT_TRUE(h.ok()) << h.status();
    src_ = *h;
  }

  std::unique_ptr<PeerControl> StartPeer(uint64_t block_bytes, uint64_t num_blocks, int generation,
                                         const std::string& dtype = "bf16") {
    std::vector<std::string> args = {
        absl::StrCat("--backend=", GetParam().backend), absl::StrCat("--block_bytes=", block_bytes),
        absl::StrCat("--num_blocks=", num_blocks), absl::StrCat("--dtype=", dtype)};
    if (!GetParam().ucx_tls.empty()) {
      args.push_back(absl::StrCat("--ucx_tls=", GetParam().ucx_tls));
    }
    args.push_back(absl::StrCat("--ucx_data_path=", GetParam().ucx_data_path));
    args.push_back(absl::StrCat("--pool_memory=", GetParam().pool_memory));
    if (GetParam().memory == MemoryKind::kCuda) {
      args.push_back("--memory=cuda");
      args.push_back(absl::StrCat("--cuda_device=", GetParam().peer_device));
    }
    absl::StatusOr<std::unique_ptr<PeerControl>> p =
        PeerControl::Start(PD_BINARY_DIR "/transport/conformance/transport_conformance_peer", args,
                           dir_->File(absl::StrCat("peer", generation, ".log")), absl::Seconds(20));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  absl::StatusOr<PeerHandle> ConnectTo(PeerControl& peer) {
    absl::StatusOr<std::string> ep = peer.Call("endpoint");
    if (!ep.ok()) {
      return ep.status();
    }
    return local_->Connect(absl::HexStringToBytes(*ep));
  }

  // Asks the peer to expect `pairs`' dst blocks; returns {receiver id, descriptor}.
  absl::StatusOr<std::pair<std::string, std::string>> Expect(PeerControl& peer, uint64_t tag,
                                                             const std::vector<BlockPair>& pairs,
                                                             int timeout_ms = 20000) {
    std::vector<std::string> dst;
    for (const BlockPair& p : pairs) {
      dst.push_back(absl::StrCat(p.dst.value()));
    }
    absl::StatusOr<std::string> r =
        peer.Call(absl::StrCat("expect ", tag, " ", timeout_ms, " ", absl::StrJoin(dst, ",")));
    if (!r.ok()) {
      return r.status();
    }
    std::pair<std::string, std::string> idd = absl::StrSplit(*r, ' ');
    return std::make_pair(idd.first, absl::HexStringToBytes(idd.second));
  }

  static std::string PairList(const std::vector<BlockPair>& pairs) {
    std::vector<std::string> s;
    for (const BlockPair& p : pairs) {
      s.push_back(absl::StrCat(p.src.value(), ":", p.dst.value()));
    }
    return absl::StrJoin(s, ",");
  }

  // Full round: expect at the peer, post here, wait both, verify at the peer.
  void RoundTrip(PeerControl& peer, PeerHandle handle, uint64_t tag,
                 const std::vector<BlockPair>& pairs) {
    auto e = Expect(peer, tag, pairs);
    ASSERT_TRUE(e.ok()) << e.status();
    absl::StatusOr<TransferId> id = local_->PostTransfer(handle, tag, src_, pairs, e->second);
    ASSERT_TRUE(id.ok()) << id.status();
    absl::StatusOr<TransferState> s = local_->Wait(*id, absl::Seconds(20));
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->phase, TransferPhase::kDone) << s->status;
    absl::StatusOr<std::string> r = peer.Call(absl::StrCat("wait ", e->first, " 20000"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, "done");
    absl::StatusOr<std::string> v = peer.Call(absl::StrCat("verify ", kSeed, " ", PairList(pairs)));
    EXPECT_TRUE(v.ok()) << v.status();
  }

  std::optional<testing::TempDir> dir_;
  std::unique_ptr<HostAllocation> allocation_;  // outlives local_ (registered in it)
  std::unique_ptr<KvTransport> local_;
  PoolGeometry geometry_;
  std::unique_ptr<char[]> mem_;  // the source pool (host) or its pattern (cuda)
  std::optional<TestDeviceBuffer> dev_;
  RegionHandle src_;
};

std::vector<BlockPair> RandomPairs(int n, uint32_t src_blocks, uint32_t dst_blocks, int seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> dst(dst_blocks);
  for (uint32_t i = 0; i < dst_blocks; ++i) {
    dst[i] = i;
  }
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<BlockPair> pairs;
  for (int i = 0; i < n; ++i) {
    pairs.push_back({BlockId(rng() % src_blocks), BlockId(dst[i])});
  }
  return pairs;
}

TEST_P(TwoProcessTest, HundredRandomPairsThenUnalignedThenLarge) {
  MakeSource(8192, 128);
  std::unique_ptr<PeerControl> peer = StartPeer(8192, 256, 0);
  ASSERT_NE(peer, nullptr);
  absl::StatusOr<PeerHandle> h = ConnectTo(*peer);
  ASSERT_TRUE(h.ok()) << h.status();
  RoundTrip(*peer, *h, 1, RandomPairs(100, 128, 256, 5));
  std::vector<BlockPair> contiguous;
  for (uint32_t i = 0; i < 64; ++i) {
    contiguous.push_back({BlockId(i), BlockId(150 + i)});
  }
  RoundTrip(*peer, *h, 2, contiguous);
}

TEST_P(TwoProcessTest, UnalignedBlocks) {
  MakeSource(4099, 64);
  std::unique_ptr<PeerControl> peer = StartPeer(4099, 64, 0);
  ASSERT_NE(peer, nullptr);
  absl::StatusOr<PeerHandle> h = ConnectTo(*peer);
  ASSERT_TRUE(h.ok()) << h.status();
  RoundTrip(*peer, *h, 1, RandomPairs(40, 64, 64, 9));
}

TEST_P(TwoProcessTest, LargeBatch) {
  MakeSource(2 << 20, 32);
  std::unique_ptr<PeerControl> peer = StartPeer(2 << 20, 32, 0);
  ASSERT_NE(peer, nullptr);
  absl::StatusOr<PeerHandle> h = ConnectTo(*peer);
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<BlockPair> pairs;
  for (uint32_t i = 0; i < 32; ++i) {
    pairs.push_back({BlockId(i), BlockId(31 - i)});
  }
  RoundTrip(*peer, *h, 1, pairs);
}

TEST_P(TwoProcessTest, StaleDescriptorAndHandshakeMismatch) {
  MakeSource(1024, 16);
  std::unique_ptr<PeerControl> peer = StartPeer(1024, 16, 0);
  ASSERT_NE(peer, nullptr);
  absl::StatusOr<PeerHandle> h = ConnectTo(*peer);
  ASSERT_TRUE(h.ok()) << h.status();
  const std::vector<BlockPair> pairs = {{BlockId(1), BlockId(2)}};
  auto old = Expect(*peer, 3, pairs);
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(peer->Call("reregister").ok());
  auto fresh = Expect(*peer, 3, pairs);
  ASSERT_TRUE(fresh.ok());
  absl::StatusOr<TransferId> id = local_->PostTransfer(*h, 3, src_, pairs, old->second);
  if (id.ok()) {
    absl::StatusOr<TransferState> s = local_->Wait(*id, absl::Seconds(20));
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->phase, TransferPhase::kFailed);
    EXPECT_EQ(s->status.code(), absl::StatusCode::kFailedPrecondition) << s->status;
  }
  EXPECT_TRUE(peer->Call("sentinel 2").ok());
  RoundTrip(*peer, *h, 4, {{BlockId(5), BlockId(6)}});

  std::unique_ptr<PeerControl> f16 = StartPeer(1024, 16, 1, "f16");
  ASSERT_NE(f16, nullptr);
  absl::StatusOr<PeerHandle> h2 = ConnectTo(*f16);
  ASSERT_TRUE(h2.ok());
  auto e = Expect(*f16, 1, pairs);
  ASSERT_TRUE(e.ok());
  absl::Status s = local_->PostTransfer(*h2, 1, src_, pairs, e->second).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("dtype sender=bf16 receiver=f16"));
}

TEST_P(TwoProcessTest, PeerKilledMidBatchFailsWithinTimeoutThenRestartedPeerWorks) {
  const uint64_t bb = 4 << 20;
  MakeSource(bb, 64);
  std::unique_ptr<PeerControl> peer = StartPeer(bb, 64, 0);
  ASSERT_NE(peer, nullptr);
  absl::StatusOr<PeerHandle> h = ConnectTo(*peer);
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<BlockPair> pairs;
  for (uint32_t i = 0; i < 64; ++i) {
    pairs.push_back({BlockId(i), BlockId(i)});
  }
  auto e = Expect(*peer, 1, pairs);
  ASSERT_TRUE(e.ok());
  // Stop the peer so the 256 MiB batch is certainly in flight, then kill it.
  ASSERT_TRUE(peer->process().Signal(SIGSTOP).ok());
  TransferOptions o;
  o.timeout = absl::Seconds(15);
  const absl::Time start = absl::Now();
  absl::StatusOr<TransferId> id = local_->PostTransfer(*h, 1, src_, pairs, e->second, o);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(local_->Wait(*id, absl::Milliseconds(200))->phase, TransferPhase::kPending);
  ASSERT_TRUE(peer->process().Signal(SIGKILL).ok());
  absl::StatusOr<TransferState> s = local_->Wait(*id, absl::Seconds(20));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_TRUE(s->status.code() == absl::StatusCode::kUnavailable ||
              s->status.code() == absl::StatusCode::kDeadlineExceeded)
      << s->status;
  EXPECT_LT(absl::Now() - start, o.timeout + absl::Seconds(1));
  ASSERT_TRUE(peer->process().Wait(absl::Seconds(5)).ok());

  std::unique_ptr<PeerControl> again = StartPeer(bb, 64, 1);
  ASSERT_NE(again, nullptr);
  absl::StatusOr<PeerHandle> h2 = ConnectTo(*again);
  ASSERT_TRUE(h2.ok()) << h2.status();
  RoundTrip(*again, *h2, 2, {pairs.begin(), pairs.begin() + 8});
}

INSTANTIATE_TEST_SUITE_P(Backends, TwoProcessTest, ::testing::ValuesIn(TwoProcessParams()),
                         [](const ::testing::TestParamInfo<TwoProcessParam>& i) {
                           return i.param.name;
                         });

}  // namespace
}  // namespace pd::transport::conformance
