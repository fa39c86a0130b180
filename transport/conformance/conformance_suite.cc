// The conformance tests every backend instantiates (see conformance_suite.h).
#include "transport/conformance/conformance_suite.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>

#include "gmock/gmock.h"
#include "transport/testing/test_device_memory.h"

namespace pd::transport::conformance {
namespace {

using ::testing::HasSubstr;

constexpr char kSentinel = static_cast<char>(0xEE);
constexpr uint64_t kSeed = 42;
const absl::Duration kWait = absl::Seconds(10);

// A test pool: host memory, or device memory with a host mirror that block()/all() refresh
// (pattern fill and verification go through cudaMemcpy for device pools).
struct Pool {
  std::unique_ptr<char[]> mem;  // the pool (host) or its host mirror (device)
  std::optional<TestDeviceBuffer> dev;
  PoolGeometry geometry;
  RegionHandle handle;
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;

  void* base() { return dev.has_value() ? dev->data() : mem.get(); }
  uint64_t size() const { return geometry.block_bytes * geometry.num_blocks; }
  // Host view of block `b`, read back from the device first for device pools.
  char* block(uint32_t b) {
    const uint64_t off = uint64_t{b} * geometry.block_bytes;
    if (dev.has_value()) {
      EXPECT_TRUE(dev->CopyToHost(off, mem.get() + off, geometry.block_bytes).ok());
    }
    return mem.get() + off;
  }
  // Host view of the whole pool.
  char* all() {
    if (dev.has_value()) {
      EXPECT_TRUE(dev->CopyToHost(0, mem.get(), size()).ok());
    }
    return mem.get();
  }
};

// Source pools hold the pattern; destination pools the sentinel. `index` names the transport
// (ConformanceParam::make) so device pools land on its device.
Pool MakePool(KvTransport& t, const PoolGeometry& g, bool source, int index = -1) {
  const ConformanceParam& param = ::testing::TestWithParam<ConformanceParam>::GetParam();
  Pool p;
  p.geometry = g;
  const uint64_t size = g.block_bytes * g.num_blocks;
  p.mem.reset(new char[size]);
  if (source) {
    for (uint32_t b = 0; b < g.num_blocks; ++b) {
      FillPattern(kSeed, b, p.mem.get() + uint64_t{b} * g.block_bytes, g.block_bytes);
    }
  } else {
    std::memset(p.mem.get(), kSentinel, size);
  }
  p.kind = param.memory;
  if (param.memory == MemoryKind::kCuda) {
    p.device = param.device_of ? param.device_of(index < 0 ? (source ? 0 : 1) : index) : 0;
    absl::StatusOr<TestDeviceBuffer> d = TestDeviceBuffer::Allocate(size, p.device);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) {
      return p;
    }
    EXPECT_TRUE(d->CopyFromHost(0, p.mem.get(), size).ok());
    p.dev.emplace(*std::move(d));
  }
  MemoryRegion r;
  r.base = p.base();
  r.size_bytes = size;
  r.kind = p.kind;
  r.device = p.device;
  r.geometry = g;
  absl::StatusOr<RegionHandle> h = t.Register(r);
  EXPECT_TRUE(h.ok()) << h.status();
  p.handle = h.value_or(RegionHandle());
  return p;
}

bool AllSentinel(const char* p, uint64_t n) {
  return std::all_of(p, p + n, [](char c) { return c == kSentinel; });
}

class Harness {
 public:
  explicit Harness(const ConformanceParam& param) : param_(param) {}

  bool Init() {
    if (param_.skip_reason) {
      const std::string why = param_.skip_reason();
      if (!why.empty()) {
        [&] { GTEST_SKIP() << why; }();  // marks the test skipped; the caller returns
        return false;
      }
    }
    absl::StatusOr<std::unique_ptr<KvTransport>> a = param_.make(0);
    absl::StatusOr<std::unique_ptr<KvTransport>> b = param_.make(1);
    if (!a.ok() || !b.ok()) {
      ADD_FAILURE() << a.status() << " / " << b.status();
      return false;
    }
    sender = *std::move(a);
    receiver = *std::move(b);
    absl::StatusOr<PeerHandle> p = sender->Connect(receiver->LocalEndpoint());
    if (!p.ok()) {
      ADD_FAILURE() << p.status();
      return false;
    }
    peer = *p;
    return true;
  }

  // Announces, posts and waits for both sides. Returns {sender state, receiver state}.
  std::pair<TransferState, TransferState> Transfer(Pool& src, Pool& dst,
                                                   const std::vector<BlockPair>& pairs,
                                                   uint64_t tag) {
    std::vector<BlockId> dst_blocks;
    for (const BlockPair& p : pairs) {
      dst_blocks.push_back(p.dst);
    }
    absl::StatusOr<Expectation> e = receiver->ExpectTransfer(tag, dst.handle, dst_blocks, {});
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) {
      return {};
    }
    absl::StatusOr<TransferId> id =
        sender->PostTransfer(peer, tag, src.handle, pairs, e->descriptor, {});
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) {
      return {};
    }
    absl::StatusOr<TransferState> s = sender->Wait(*id, kWait);
    absl::StatusOr<TransferState> r = receiver->Wait(e->id, kWait);
    EXPECT_TRUE(s.ok() && r.ok());
    return {s.value_or(TransferState{}), r.value_or(TransferState{})};
  }

  void VerifyPairs(Pool& dst, const std::vector<BlockPair>& pairs) {
    for (const BlockPair& p : pairs) {
      ASSERT_EQ(FirstPatternMismatch(kSeed, p.src.value(), dst.block(p.dst.value()),
                                     dst.geometry.block_bytes),
                -1)
          << "dst block " << p.dst.value() << " from src " << p.src.value();
    }
  }

  const ConformanceParam& param_;
  std::unique_ptr<KvTransport> sender;
  std::unique_ptr<KvTransport> receiver;
  PeerHandle peer;
};

std::vector<BlockPair> RandomPairs(int n, uint32_t src_blocks, uint32_t dst_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> dst(dst_blocks);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<BlockPair> pairs;
  for (int i = 0; i < n; ++i) {
    pairs.push_back({BlockId(rng() % src_blocks), BlockId(dst[i])});
  }
  return pairs;
}

std::vector<BlockPair> Contiguous(uint32_t src_first, uint32_t dst_first, uint32_t n) {
  std::vector<BlockPair> pairs;
  for (uint32_t i = 0; i < n; ++i) {
    pairs.push_back({BlockId(src_first + i), BlockId(dst_first + i)});
  }
  return pairs;
}

#define PD_HARNESS(h)    \
  Harness h(GetParam()); \
  if (!h.Init()) {       \
    return;              \
  }

TEST_P(KvTransportConformance, NameAndCaps) {
  PD_HARNESS(h);
  EXPECT_EQ(h.sender->Name(), GetParam().name.substr(0, h.sender->Name().size()));
  const TransportCaps caps = h.sender->Caps();
  EXPECT_TRUE(GetParam().memory == MemoryKind::kCuda ? caps.cuda_memory : caps.host_memory);
  EXPECT_TRUE(caps.notifications);
  EXPECT_TRUE(caps.one_sided || caps.two_sided);
}

TEST_P(KvTransportConformance, RegisterValidatesInput) {
  PD_HARNESS(h);
  std::vector<char> mem(4096);
  MemoryRegion r;
  r.base = mem.data();
  r.size_bytes = mem.size();
  std::optional<TestDeviceBuffer> dev;
  if (GetParam().memory == MemoryKind::kCuda) {
    absl::StatusOr<TestDeviceBuffer> d =
        TestDeviceBuffer::Allocate(4096, GetParam().device_of ? GetParam().device_of(0) : 0);
    ASSERT_TRUE(d.ok()) << d.status();
    dev.emplace(*std::move(d));
    r.base = dev->data();
    r.kind = MemoryKind::kCuda;
    r.device = dev->device();
  }
  r.geometry = TestGeometry(1024, 8);  // needs 8 KiB
  EXPECT_EQ(h.sender->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.geometry = TestGeometry(0, 4);
  EXPECT_EQ(h.sender->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.geometry = TestGeometry(1024, 4);
  r.base = nullptr;
  EXPECT_EQ(h.sender->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.sender->Deregister(RegionHandle(999)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.sender->Poll(TransferId(999)).status().code(), absl::StatusCode::kNotFound);
}

// Memory from AllocateHost is zeroed, registrable, and carries transfers both ways; it may be
// freed after its transport is gone.
TEST_P(KvTransportConformance, AllocateHostMemoryCarriesTransfers) {
  if (GetParam().memory != MemoryKind::kHost) {
    GTEST_SKIP() << "the backend moves device memory; AllocateHost is for host pools";
  }
  PD_HARNESS(h);
  EXPECT_EQ(h.sender->AllocateHost(0).status().code(), absl::StatusCode::kInvalidArgument);
  const PoolGeometry g = TestGeometry(4096, 16);
  const uint64_t size = g.block_bytes * g.num_blocks;
  absl::StatusOr<std::unique_ptr<HostAllocation>> src_mem = h.sender->AllocateHost(size);
  absl::StatusOr<std::unique_ptr<HostAllocation>> dst_mem = h.receiver->AllocateHost(size);
  ASSERT_TRUE(src_mem.ok()) << src_mem.status();
  ASSERT_TRUE(dst_mem.ok()) << dst_mem.status();
  ASSERT_GE((*dst_mem)->size(), size);
  EXPECT_FALSE((*dst_mem)->Describe().empty());
  char* s = static_cast<char*>((*src_mem)->data());
  char* d = static_cast<char*>((*dst_mem)->data());
  EXPECT_TRUE(std::all_of(d, d + size, [](char c) { return c == 0; }));
  for (uint32_t b = 0; b < g.num_blocks; ++b) {
    FillPattern(kSeed, b, s + uint64_t{b} * g.block_bytes, g.block_bytes);
  }
  Pool src;
  src.geometry = g;
  Pool dst;
  dst.geometry = g;
  absl::StatusOr<RegionHandle> sh = h.sender->Register({s, size, MemoryKind::kHost, 0, g});
  absl::StatusOr<RegionHandle> dh = h.receiver->Register({d, size, MemoryKind::kHost, 0, g});
  ASSERT_TRUE(sh.ok() && dh.ok()) << sh.status() << " / " << dh.status();
  src.handle = *sh;
  dst.handle = *dh;
  const std::vector<BlockPair> pairs = RandomPairs(12, 16, 16, 3);
  auto [st, rt] = h.Transfer(src, dst, pairs, 1);
  ASSERT_EQ(st.phase, TransferPhase::kDone) << st.status;
  ASSERT_EQ(rt.phase, TransferPhase::kDone) << rt.status;
  for (const BlockPair& p : pairs) {
    EXPECT_EQ(FirstPatternMismatch(kSeed, p.src.value(), d + uint64_t{p.dst.value()} * g.block_bytes,
                                   g.block_bytes),
              -1)
        << "dst block " << p.dst.value();
  }
  // Re-registering the same allocation gives a fresh region that still works.
  ASSERT_TRUE(h.receiver->Deregister(dst.handle).ok());
  dh = h.receiver->Register({d, size, MemoryKind::kHost, 0, g});
  ASSERT_TRUE(dh.ok()) << dh.status();
  dst.handle = *dh;
  const std::vector<BlockPair> more = Contiguous(0, 8, 8);
  std::tie(st, rt) = h.Transfer(src, dst, more, 2);
  ASSERT_EQ(st.phase, TransferPhase::kDone) << st.status;
  ASSERT_EQ(rt.phase, TransferPhase::kDone) << rt.status;
  EXPECT_EQ(FirstPatternMismatch(kSeed, 7, d + 15 * g.block_bytes, g.block_bytes), -1);
  // The transports go first; the allocations are freed afterwards.
  h.sender.reset();
  h.receiver.reset();
  src_mem->reset();
  dst_mem->reset();
}

TEST_P(KvTransportConformance, ConnectRejectsGarbageEndpoint) {
  PD_HARNESS(h);
  EXPECT_EQ(h.sender->Connect("not an endpoint").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(KvTransportConformance, SingleBlock) {
  PD_HARNESS(h);
  Pool src = MakePool(*h.sender, TestGeometry(4096, 8), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(4096, 8), false);
  const std::vector<BlockPair> pairs = {{BlockId(3), BlockId(5)}};
  auto [s, r] = h.Transfer(src, dst, pairs, 1);
  EXPECT_EQ(s.phase, TransferPhase::kDone) << s.status;
  EXPECT_EQ(r.phase, TransferPhase::kDone) << r.status;
  EXPECT_EQ(r.bytes, 4096u);
  h.VerifyPairs(dst, pairs);
  EXPECT_TRUE(AllSentinel(dst.block(4), 4096));
  EXPECT_TRUE(AllSentinel(dst.block(6), 4096));
}

TEST_P(KvTransportConformance, HundredRandomPairsByteForByte) {
  PD_HARNESS(h);
  Pool src = MakePool(*h.sender, TestGeometry(8192, 160), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(8192, 256), false);
  const std::vector<BlockPair> pairs = RandomPairs(100, 160, 256, 7);
  auto [s, r] = h.Transfer(src, dst, pairs, 2);
  ASSERT_EQ(s.phase, TransferPhase::kDone) << s.status;
  ASSERT_EQ(r.phase, TransferPhase::kDone) << r.status;
  h.VerifyPairs(dst, pairs);
  // Blocks not announced are untouched.
  std::vector<bool> written(256);
  for (const BlockPair& p : pairs) {
    written[p.dst.value()] = true;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    if (!written[b]) {
      ASSERT_TRUE(AllSentinel(dst.block(b), 8192)) << "block " << b;
    }
  }
}

TEST_P(KvTransportConformance, UnalignedBlockBytes) {
  PD_HARNESS(h);
  const uint64_t odd = 4099;
  Pool src = MakePool(*h.sender, TestGeometry(odd, 64), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(odd, 64), false);
  std::vector<BlockPair> pairs = Contiguous(10, 20, 7);      // one run of 7
  std::vector<BlockPair> more = RandomPairs(18, 64, 20, 3);  // dst in 0..19, scattered
  pairs.insert(pairs.end(), more.begin(), more.end());
  auto [s, r] = h.Transfer(src, dst, pairs, 3);
  ASSERT_EQ(s.phase, TransferPhase::kDone) << s.status;
  ASSERT_EQ(r.phase, TransferPhase::kDone) << r.status;
  h.VerifyPairs(dst, pairs);
  EXPECT_TRUE(AllSentinel(dst.block(27), odd));
}

TEST_P(KvTransportConformance, LargeBatch) {
  PD_HARNESS(h);
  const uint64_t bb = 1 << 20;
  Pool src = MakePool(*h.sender, TestGeometry(bb, 64), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(bb, 64), false);
  std::vector<BlockPair> pairs = Contiguous(0, 0, 48);
  std::vector<BlockPair> tail = Contiguous(50, 60, 4);
  pairs.insert(pairs.end(), tail.begin(), tail.end());
  auto [s, r] = h.Transfer(src, dst, pairs, 4);
  ASSERT_EQ(s.phase, TransferPhase::kDone) << s.status;
  ASSERT_EQ(r.phase, TransferPhase::kDone) << r.status;
  EXPECT_EQ(s.bytes, 52 * bb);
  h.VerifyPairs(dst, pairs);
}

TEST_P(KvTransportConformance, ManyConcurrentTransfers) {
  PD_HARNESS(h);
  Pool src = MakePool(*h.sender, TestGeometry(2048, 64), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(2048, 64), false);
  std::vector<TransferId> sends, recvs;
  std::vector<BlockPair> all;
  for (uint32_t t = 0; t < 8; ++t) {
    std::vector<BlockPair> pairs = Contiguous(t * 8, 63 - t * 8 - 7, 8);
    std::vector<BlockId> dst_blocks;
    for (const BlockPair& p : pairs) {
      dst_blocks.push_back(p.dst);
      all.push_back(p);
    }
    absl::StatusOr<Expectation> e = h.receiver->ExpectTransfer(100 + t, dst.handle, dst_blocks);
    ASSERT_TRUE(e.ok()) << e.status();
    absl::StatusOr<TransferId> id =
        h.sender->PostTransfer(h.peer, 100 + t, src.handle, pairs, e->descriptor);
    ASSERT_TRUE(id.ok()) << id.status();
    sends.push_back(*id);
    recvs.push_back(e->id);
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    EXPECT_EQ(h.sender->Wait(sends[i], kWait)->phase, TransferPhase::kDone);
    EXPECT_EQ(h.receiver->Wait(recvs[i], kWait)->phase, TransferPhase::kDone);
  }
  h.VerifyPairs(dst, all);
}

TEST_P(KvTransportConformance, PairsMustMatchAnnouncement) {
  PD_HARNESS(h);
  Pool src = MakePool(*h.sender, TestGeometry(1024, 16), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(1024, 16), false);
  const BlockId announced[] = {BlockId(1), BlockId(2)};
  absl::StatusOr<Expectation> e = h.receiver->ExpectTransfer(5, dst.handle, announced);
  ASSERT_TRUE(e.ok());
  const BlockPair wrong_dst[] = {{BlockId(0), BlockId(1)}, {BlockId(1), BlockId(3)}};
  EXPECT_EQ(h.sender->PostTransfer(h.peer, 5, src.handle, wrong_dst, e->descriptor).status().code(),
            absl::StatusCode::kInvalidArgument);
  const BlockPair bad_src[] = {{BlockId(99), BlockId(1)}, {BlockId(1), BlockId(2)}};
  EXPECT_EQ(h.sender->PostTransfer(h.peer, 5, src.handle, bad_src, e->descriptor).status().code(),
            absl::StatusCode::kInvalidArgument);
  const BlockPair ok[] = {{BlockId(0), BlockId(1)}, {BlockId(1), BlockId(2)}};
  EXPECT_EQ(h.sender->PostTransfer(h.peer, 6, src.handle, ok, e->descriptor).status().code(),
            absl::StatusCode::kInvalidArgument);  // tag differs from the descriptor's
  EXPECT_EQ(h.receiver->ExpectTransfer(5, dst.handle, announced).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(AllSentinel(dst.all(), 16 * 1024));
}

TEST_P(KvTransportConformance, HandshakeMismatchNamesBothSides) {
  PD_HARNESS(h);
  PoolGeometry theirs = TestGeometry(1024, 8);
  theirs.dtype = "f16";
  theirs.num_kv_heads = 8;
  Pool src = MakePool(*h.sender, TestGeometry(1024, 8), true);
  Pool dst = MakePool(*h.receiver, theirs, false);
  const BlockId blocks[] = {BlockId(0)};
  absl::StatusOr<Expectation> e = h.receiver->ExpectTransfer(7, dst.handle, blocks);
  ASSERT_TRUE(e.ok());
  const BlockPair pairs[] = {{BlockId(0), BlockId(0)}};
  absl::Status s = h.sender->PostTransfer(h.peer, 7, src.handle, pairs, e->descriptor).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("dtype sender=bf16 receiver=f16"));
  EXPECT_THAT(s.message(), HasSubstr("num_kv_heads sender=2 receiver=8"));
  EXPECT_TRUE(AllSentinel(dst.all(), 8 * 1024));
}

TEST_P(KvTransportConformance, DescriptorForAnotherPeerRejected) {
  PD_HARNESS(h);
  absl::StatusOr<std::unique_ptr<KvTransport>> other = GetParam().make(2);
  ASSERT_TRUE(other.ok()) << other.status();
  Pool src = MakePool(*h.sender, TestGeometry(1024, 8), true);
  Pool elsewhere = MakePool(**other, TestGeometry(1024, 8), false, 2);
  const BlockId blocks[] = {BlockId(0)};
  absl::StatusOr<Expectation> e = (*other)->ExpectTransfer(8, elsewhere.handle, blocks);
  ASSERT_TRUE(e.ok());
  const BlockPair pairs[] = {{BlockId(0), BlockId(0)}};
  absl::Status s = h.sender->PostTransfer(h.peer, 8, src.handle, pairs, e->descriptor).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(AllSentinel(elsewhere.all(), 8 * 1024));
}

TEST_P(KvTransportConformance, StaleDescriptorAfterReRegisterRejected) {
  PD_HARNESS(h);
  Pool src = MakePool(*h.sender, TestGeometry(2048, 8), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(2048, 8), false);
  const BlockId blocks[] = {BlockId(2)};
  absl::StatusOr<Expectation> old = h.receiver->ExpectTransfer(9, dst.handle, blocks);
  ASSERT_TRUE(old.ok());
  // Deregistering fails the pending expectation...
  ASSERT_TRUE(h.receiver->Deregister(dst.handle).ok());
  absl::StatusOr<TransferState> r = h.receiver->Poll(old->id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->phase, TransferPhase::kFailed);
  EXPECT_EQ(r->status.code(), absl::StatusCode::kFailedPrecondition);
  // ...and after re-registering the same memory, a new expectation under the same tag does
  // not accept the old descriptor.
  MemoryRegion again;
  again.base = dst.base();
  again.kind = dst.kind;
  again.device = dst.device;
  again.size_bytes = 8 * 2048;
  again.geometry = dst.geometry;
  absl::StatusOr<RegionHandle> h2 = h.receiver->Register(again);
  ASSERT_TRUE(h2.ok());
  dst.handle = *h2;
  absl::StatusOr<Expectation> fresh = h.receiver->ExpectTransfer(9, dst.handle, blocks);
  ASSERT_TRUE(fresh.ok());
  const BlockPair pairs[] = {{BlockId(1), BlockId(2)}};
  absl::StatusOr<TransferId> id =
      h.sender->PostTransfer(h.peer, 9, src.handle, pairs, old->descriptor);
  if (id.ok()) {
    absl::StatusOr<TransferState> s = h.sender->Wait(*id, kWait);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->phase, TransferPhase::kFailed);
    EXPECT_EQ(s->status.code(), absl::StatusCode::kFailedPrecondition) << s->status;
  } else {
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition) << id.status();
  }
  EXPECT_TRUE(AllSentinel(dst.all(), 8 * 2048));
  // The fresh descriptor works.
  absl::StatusOr<TransferId> ok =
      h.sender->PostTransfer(h.peer, 9, src.handle, pairs, fresh->descriptor);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(h.sender->Wait(*ok, kWait)->phase, TransferPhase::kDone);
  EXPECT_EQ(h.receiver->Wait(fresh->id, kWait)->phase, TransferPhase::kDone);
  h.VerifyPairs(dst, {pairs[0]});
}

TEST_P(KvTransportConformance, CancelMidTransfer) {
  PD_HARNESS(h);
  if (!h.sender->Caps().cancel) {
    GTEST_SKIP() << "backend has no Cancel";
  }
  const uint64_t bb = 256 << 10;
  Pool src = MakePool(*h.sender, TestGeometry(bb, 128), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(bb, 128), false);
  std::vector<BlockPair> pairs = RandomPairs(128, 128, 128, 11);  // many runs
  std::vector<BlockId> dst_blocks;
  for (const BlockPair& p : pairs) {
    dst_blocks.push_back(p.dst);
  }
  absl::StatusOr<Expectation> e = h.receiver->ExpectTransfer(10, dst.handle, dst_blocks);
  ASSERT_TRUE(e.ok());
  absl::StatusOr<TransferId> id =
      h.sender->PostTransfer(h.peer, 10, src.handle, pairs, e->descriptor);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(h.sender->Cancel(*id).ok());
  absl::StatusOr<TransferState> s = h.sender->Wait(*id, kWait);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->finished());
  if (s->phase == TransferPhase::kFailed) {
    EXPECT_EQ(s->status.code(), absl::StatusCode::kCancelled) << s->status;
    // The receiver learns (sender's CANCEL) or its expectation is cancelled locally. It may
    // also be done when every block had already been handed to the wire; then they are all
    // there.
    absl::StatusOr<TransferState> r = h.receiver->Wait(e->id, absl::Seconds(2));
    ASSERT_TRUE(r.ok());
    if (!r->finished()) {
      ASSERT_TRUE(h.receiver->Cancel(e->id).ok());
      r = h.receiver->Poll(e->id);
    }
    ASSERT_TRUE(r->finished());
    if (r->phase == TransferPhase::kDone) {
      h.VerifyPairs(dst, pairs);
    }
  }
  // Cancelling a finished transfer is harmless; the pair stays usable.
  EXPECT_TRUE(h.sender->Cancel(*id).ok());
  const std::vector<BlockPair> again = {{BlockId(0), BlockId(0)}};
  auto [s2, r2] = h.Transfer(src, dst, again, 11);
  EXPECT_EQ(s2.phase, TransferPhase::kDone) << s2.status;
  EXPECT_EQ(r2.phase, TransferPhase::kDone) << r2.status;
  h.VerifyPairs(dst, again);
}

TEST_P(KvTransportConformance, ReceiverCancelRejectsData) {
  PD_HARNESS(h);
  Pool src = MakePool(*h.sender, TestGeometry(1024, 8), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(1024, 8), false);
  const BlockId blocks[] = {BlockId(4)};
  absl::StatusOr<Expectation> e = h.receiver->ExpectTransfer(12, dst.handle, blocks);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(h.receiver->Cancel(e->id).ok());
  EXPECT_EQ(h.receiver->Poll(e->id)->status.code(), absl::StatusCode::kCancelled);
  const BlockPair pairs[] = {{BlockId(0), BlockId(4)}};
  absl::StatusOr<TransferId> id =
      h.sender->PostTransfer(h.peer, 12, src.handle, pairs, e->descriptor);
  if (id.ok()) {
    absl::StatusOr<TransferState> s = h.sender->Wait(*id, kWait);
    EXPECT_EQ(s->phase, TransferPhase::kFailed);
  }
  EXPECT_TRUE(AllSentinel(dst.all(), 8 * 1024));
}

TEST_P(KvTransportConformance, ExpectationTimesOut) {
  PD_HARNESS(h);
  Pool dst = MakePool(*h.receiver, TestGeometry(1024, 8), false);
  const BlockId blocks[] = {BlockId(1)};
  TransferOptions o;
  o.timeout = absl::Milliseconds(30);
  absl::StatusOr<Expectation> e = h.receiver->ExpectTransfer(13, dst.handle, blocks, o);
  ASSERT_TRUE(e.ok());
  absl::StatusOr<TransferState> r = h.receiver->Wait(e->id, kWait);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->phase, TransferPhase::kFailed);
  EXPECT_EQ(r->status.code(), absl::StatusCode::kDeadlineExceeded);
  // The tag is free again.
  EXPECT_TRUE(h.receiver->ExpectTransfer(13, dst.handle, blocks).ok());
}

TEST_P(KvTransportConformance, ReconnectReusesOrRenews) {
  PD_HARNESS(h);
  absl::StatusOr<PeerHandle> again = h.sender->Connect(h.receiver->LocalEndpoint());
  ASSERT_TRUE(again.ok()) << again.status();
  Pool src = MakePool(*h.sender, TestGeometry(512, 4), true);
  Pool dst = MakePool(*h.receiver, TestGeometry(512, 4), false);
  h.peer = *again;
  const std::vector<BlockPair> pairs = {{BlockId(1), BlockId(2)}};
  auto [s, r] = h.Transfer(src, dst, pairs, 14);
  EXPECT_EQ(s.phase, TransferPhase::kDone) << s.status;
  h.VerifyPairs(dst, pairs);
}

}  // namespace
}  // namespace pd::transport::conformance
