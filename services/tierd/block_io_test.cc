#include "services/tierd/block_io.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "services/tierd/file_util.h"

namespace pd::tierd {
namespace {

std::vector<IoRequest> Requests(std::vector<std::pair<int, int64_t>> fd_offsets, size_t len) {
  std::vector<IoRequest> out;
  for (auto [fd, offset] : fd_offsets) {
    out.push_back(IoRequest{fd, offset, nullptr, len, 0});
  }
  return out;
}

TEST(PlanIoOpsTest, MergesAdjacentRequestsOfOneFile) {
  // Out of order on purpose: slots 2, 0, 1 of fd 3, then slot 5 (a gap) and fd 4.
  std::vector<IoRequest> r =
      Requests({{3, 8192}, {3, 0}, {3, 4096}, {3, 5 * 4096}, {4, 4096}}, 4096);
  std::vector<IoOp> ops = PlanIoOps(r, 1 << 20);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].fd, 3);
  EXPECT_EQ(ops[0].offset, 0);
  EXPECT_EQ(ops[0].total_bytes, 3u * 4096);
  EXPECT_EQ(ops[0].requests, (std::vector<size_t>{1, 2, 0}));
  EXPECT_EQ(ops[1].offset, 5 * 4096);
  EXPECT_EQ(ops[1].requests, (std::vector<size_t>{3}));
  EXPECT_EQ(ops[2].fd, 4);
}

TEST(PlanIoOpsTest, RespectsTheSizeAndIovecLimits) {
  std::vector<std::pair<int, int64_t>> fo;
  for (int i = 0; i < 200; ++i) {
    fo.push_back({3, int64_t{i} * 4096});
  }
  std::vector<IoRequest> r = Requests(fo, 4096);
  std::vector<IoOp> by_size = PlanIoOps(r, 10 * 4096);
  ASSERT_EQ(by_size.size(), 20u);
  EXPECT_EQ(by_size[0].iov.size(), 10u);
  std::vector<IoOp> by_iov = PlanIoOps(r, size_t{1} << 30);
  ASSERT_EQ(by_iov.size(), 4u);  // 64 + 64 + 64 + 8
  EXPECT_EQ(by_iov[0].iov.size(), kMaxIovecs);
  EXPECT_EQ(by_iov[3].iov.size(), 8u);
  // A request larger than the limit stays whole.
  std::vector<IoRequest> big = Requests({{3, 0}}, 1 << 20);
  EXPECT_EQ(PlanIoOps(big, 4096).size(), 1u);
}

// Both engines move the same bytes (a memfd: no O_DIRECT, so any alignment works).
void RoundTrip(BlockIo& io) {
  ScopedFd fd(memfd_create("block-io-test", 0));
  ASSERT_TRUE(fd.valid());
  constexpr int64_t kBlock = 3000;
  constexpr int kBlocks = 100;
  ASSERT_EQ(ftruncate(fd.get(), kBlock * kBlocks), 0);
  std::vector<uint8_t> src(kBlock * kBlocks);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<uint8_t>(i * 13 + 1);
  }
  std::vector<IoRequest> writes;
  for (int b = kBlocks - 1; b >= 0; --b) {  // reverse order: the planner sorts and merges
    writes.push_back(IoRequest{fd.get(), int64_t{b} * kBlock, src.data() + b * kBlock,
                               static_cast<size_t>(kBlock), 1});
  }
  io.Run(absl::MakeSpan(writes), /*write=*/true);
  for (const IoRequest& r : writes) {
    EXPECT_EQ(r.result, 0);
  }
  std::vector<uint8_t> dst(src.size(), 0);
  std::vector<IoRequest> reads;
  for (int b = 0; b < kBlocks; b += 2) {  // every other block: no merging
    reads.push_back(IoRequest{fd.get(), int64_t{b} * kBlock, dst.data() + b * kBlock,
                              static_cast<size_t>(kBlock), 1});
  }
  io.Run(absl::MakeSpan(reads), /*write=*/false);
  for (int b = 0; b < kBlocks; ++b) {
    const bool read = b % 2 == 0;
    EXPECT_EQ(std::memcmp(dst.data() + b * kBlock, src.data() + b * kBlock,
                          static_cast<size_t>(kBlock)) == 0,
              read)
        << "block " << b;
  }
  // Reading past the end of the file reports an error instead of short data.
  std::vector<IoRequest> past = {
      IoRequest{fd.get(), kBlock * kBlocks - 10, dst.data(), static_cast<size_t>(kBlock), 0}};
  io.Run(absl::MakeSpan(past), /*write=*/false);
  EXPECT_LT(past[0].result, 0);
}

TEST(BlockIoTest, PreadRoundTrip) {
  std::unique_ptr<BlockIo> io = CreatePreadBlockIo(1 << 20);
  EXPECT_STREQ(io->Name(), "pread");
  RoundTrip(*io);
}

TEST(BlockIoTest, UringRoundTrip) {
  absl::StatusOr<std::unique_ptr<BlockIo>> io = CreateUringBlockIo(8, 1 << 20);
  if (!io.ok()) {
    GTEST_SKIP() << "io_uring refused here: " << io.status();
  }
  EXPECT_STREQ((*io)->Name(), "io_uring");
  RoundTrip(**io);
}

}  // namespace
}  // namespace pd::tierd
