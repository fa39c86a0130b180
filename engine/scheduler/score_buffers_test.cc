// ScoreBufferPool: buffers given back are taken again, zeroed, by a request of at most their
// size and more than half of it; kept bytes are bounded. On kCpu (the staged host path's
// device). Label unit.
#include "engine/scheduler/score_buffers.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace pd::engine {
namespace {

const kernels::OpContext kCpu{kernels::Device::kCpu, nullptr, nullptr};

TEST(ScoreBufferPoolTest, GivenBuffersAreTakenAgainZeroed) {
  ScoreBufferPool pool(kernels::Device::kCpu);
  absl::StatusOr<kernels::DeviceBuffer> a = pool.Take(kCpu, 4000);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_GE(a->size_bytes(), 4000);
  std::memset(a->data(), 0x7F, 4000);
  void* const first = a->data();
  pool.Give(*std::move(a));
  EXPECT_EQ(pool.stats().free_bytes, 4000);

  absl::StatusOr<kernels::DeviceBuffer> b = pool.Take(kCpu, 3000);  // fits, not too small
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), first);
  const auto* bytes = static_cast<const unsigned char*>(b->data());
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(bytes[i], 0) << i;
  EXPECT_EQ(pool.stats().reused, 1);
  EXPECT_EQ(pool.stats().free_bytes, 0);
  pool.Give(*std::move(b));

  // More than twice the request: a new buffer, the big one stays for a bigger request.
  absl::StatusOr<kernels::DeviceBuffer> c = pool.Take(kCpu, 1000);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), first);
  EXPECT_EQ(pool.stats().allocated, 2);
  EXPECT_EQ(pool.stats().free_bytes, 4000);
  absl::StatusOr<kernels::DeviceBuffer> d = pool.Take(kCpu, 5000);  // bigger than any kept
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(pool.stats().allocated, 3);
  pool.Give(kernels::DeviceBuffer());  // empty: dropped
  EXPECT_EQ(pool.stats().free_bytes, 4000);
}

TEST(ScoreBufferPoolTest, KeptBytesAreBoundedLargestFreedFirst) {
  ScoreBufferPool pool(kernels::Device::kCpu, /*max_free_bytes=*/10000);
  std::vector<kernels::DeviceBuffer> taken;
  for (const int64_t size : {3000, 6000, 4000}) {
    absl::StatusOr<kernels::DeviceBuffer> b = pool.Take(kCpu, size);
    ASSERT_TRUE(b.ok());
    taken.push_back(*std::move(b));
  }
  for (kernels::DeviceBuffer& b : taken) pool.Give(std::move(b));
  // 3000 + 6000 + 4000 > 10000: the 6000-byte buffer went.
  EXPECT_EQ(pool.stats().free_bytes, 7000);
  absl::StatusOr<kernels::DeviceBuffer> b = pool.Take(kCpu, 5000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.stats().reused, 0);  // nothing kept between 5000 and 10000 bytes
}

}  // namespace
}  // namespace pd::engine
