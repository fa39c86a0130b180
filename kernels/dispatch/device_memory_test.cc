// kernels/device_memory.h: the kCpu path, and on kCuda the behaviour this machine allows
// (unbuilt -> Unimplemented naming PD_ENABLE_CUDA; no device -> FailedPrecondition; a device ->
// real allocations and copies). Label unit: it never needs a GPU.
#include "kernels/device_memory.h"

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::kernels {
namespace {

using ::testing::HasSubstr;

TEST(DeviceMemoryTest, CpuBufferIsZeroedAlignedAndMovable) {
  EXPECT_TRUE(DeviceMemoryBuilt(Device::kCpu));
  EXPECT_EQ(DeviceCount(Device::kCpu), 1);
  EXPECT_TRUE(CheckDeviceAvailable(Device::kCpu).ok());
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(Device::kCpu, 1000);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE(b->data(), nullptr);
  EXPECT_EQ(b->size_bytes(), 1000);
  EXPECT_EQ(b->device(), Device::kCpu);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 256, 0u);
  const uint8_t* bytes = b->as<uint8_t>();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(bytes[i], 0) << i;
  }
  void* p = b->data();
  DeviceBuffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(b->data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_EQ(b->size_bytes(), 0);
  DeviceBuffer other;
  other = std::move(moved);
  EXPECT_EQ(other.data(), p);
}

TEST(DeviceMemoryTest, EmptyAndNegativeSizes) {
  absl::StatusOr<DeviceBuffer> empty = DeviceBuffer::Allocate(Device::kCpu, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(DeviceBuffer::Allocate(Device::kCpu, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceBuffer::Allocate(Device::kCuda, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMemoryTest, CpuCopyStreamAndEvent) {
  absl::StatusOr<DeviceStream> stream = DeviceStream::Create(Device::kCpu);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(stream->handle(), nullptr);
  const OpContext ctx = stream->context();
  EXPECT_EQ(ctx.device, Device::kCpu);
  std::vector<int32_t> src(100), dst(100, -1);
  std::iota(src.begin(), src.end(), 7);
  ASSERT_TRUE(CopyAsync(ctx, dst.data(), src.data(), 100 * sizeof(int32_t)).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(dst, src);
  EXPECT_TRUE(CopyAsync(ctx, dst.data(), src.data(), 0).ok());
  EXPECT_EQ(CopyAsync(ctx, nullptr, src.data(), 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyAsync(ctx, dst.data(), src.data(), -4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ZeroAsync(ctx, dst.data() + 1, 98 * sizeof(int32_t)).ok());
  EXPECT_EQ(dst.front(), 7);
  EXPECT_EQ(dst[1], 0);
  EXPECT_EQ(dst[98], 0);
  EXPECT_EQ(dst.back(), 106);
  EXPECT_TRUE(ZeroAsync(ctx, nullptr, 0).ok());
  EXPECT_EQ(ZeroAsync(ctx, nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ZeroAsync(ctx, dst.data(), -4).code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<DeviceEvent> event = DeviceEvent::Create(Device::kCpu);
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(event->Record(ctx).ok());
  absl::StatusOr<bool> done = event->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_TRUE(event->Synchronize().ok());
  EXPECT_EQ(event->Record(OpContext{Device::kCuda, nullptr, nullptr}).code(),
            absl::StatusCode::kInvalidArgument);

  absl::StatusOr<HostRegistration> reg = HostRegistration::Register(Device::kCpu, dst.data(), 400);
  ASSERT_TRUE(reg.ok());
  EXPECT_TRUE(reg->registered());
  EXPECT_EQ(HostRegistration::Register(Device::kCpu, nullptr, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// What kCuda does depends on the build and the machine; each case checks its own contract.
TEST(DeviceMemoryTest, CudaReportsUnbuiltOrNoDeviceOrWorks) {
  const OpContext cuda{Device::kCuda, nullptr, nullptr};
  if (!DeviceMemoryBuilt(Device::kCuda)) {
    EXPECT_EQ(DeviceCount(Device::kCuda), 0);
    const absl::Status s = CheckDeviceAvailable(Device::kCuda);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(s.message(), HasSubstr("PD_ENABLE_CUDA"));
    EXPECT_EQ(DeviceBuffer::Allocate(Device::kCuda, 64).status().code(),
              absl::StatusCode::kUnimplemented);
    EXPECT_EQ(DeviceStream::Create(Device::kCuda).status().code(),
              absl::StatusCode::kUnimplemented);
    int x = 0, y = 1;
    EXPECT_EQ(CopyAsync(cuda, &x, &y, sizeof(int)).code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(ZeroAsync(cuda, &x, sizeof(int)).code(), absl::StatusCode::kUnimplemented);
    return;
  }
  if (DeviceCount(Device::kCuda) == 0) {
    const absl::Status s = CheckDeviceAvailable(Device::kCuda);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("no CUDA device"));
    const absl::Status alloc = DeviceBuffer::Allocate(Device::kCuda, 64).status();
    EXPECT_EQ(alloc.code(), absl::StatusCode::kFailedPrecondition) << alloc;
    EXPECT_THAT(alloc.message(), HasSubstr("no CUDA device"));
    const absl::Status stream = DeviceStream::Create(Device::kCuda).status();
    EXPECT_EQ(stream.code(), absl::StatusCode::kFailedPrecondition) << stream;
    return;
  }
  // A device: host -> device -> device -> host round trip on an owned stream, and an event.
  ASSERT_TRUE(CheckDeviceAvailable(Device::kCuda).ok());
  absl::StatusOr<DeviceStream> stream = DeviceStream::Create(Device::kCuda);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const OpContext ctx = stream->context();
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(Device::kCuda, 4096);
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(Device::kCuda, 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> zeros(4096, 1);
  ASSERT_TRUE(CopyAsync(ctx, zeros.data(), a->data(), 4096).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(zeros, std::vector<uint8_t>(4096, 0));  // allocations read as zeros
  std::vector<uint8_t> src(4096), back(4096);
  std::iota(src.begin(), src.end(), uint8_t{3});
  absl::StatusOr<HostRegistration> pinned =
      HostRegistration::Register(Device::kCuda, back.data(), 4096);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_TRUE(CopyAsync(ctx, a->data(), src.data(), 4096).ok());
  ASSERT_TRUE(CopyAsync(ctx, b->data(), a->data(), 4096).ok());
  ASSERT_TRUE(CopyAsync(ctx, back.data(), b->data(), 4096).ok());
  absl::StatusOr<DeviceEvent> event = DeviceEvent::Create(Device::kCuda);
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(event->Record(ctx).ok());
  ASSERT_TRUE(event->Synchronize().ok());
  absl::StatusOr<bool> done = event->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(back, src);
  ASSERT_TRUE(ZeroAsync(ctx, static_cast<uint8_t*>(b->data()) + 16, 4000).ok());
  ASSERT_TRUE(CopyAsync(ctx, back.data(), b->data(), 4096).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  for (int i = 0; i < 4096; ++i) {
    ASSERT_EQ(back[i], i >= 16 && i < 4016 ? 0 : src[i]) << i;
  }

  // A graph: a device-to-device copy captured (not run), then replayed twice.
  std::vector<uint8_t> other(4096, 9), out(4096);
  int calls = 0;
  absl::StatusOr<DeviceGraph> graph = DeviceGraph::Capture(ctx, [&] {
    ++calls;
    return CopyAsync(ctx, b->data(), a->data(), 4096);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(calls, 1);  // the body queued its work once, into the graph
  ASSERT_TRUE(CopyAsync(ctx, a->data(), other.data(), 4096).ok());
  ASSERT_TRUE(graph->Launch(ctx).ok());
  ASSERT_TRUE(CopyAsync(ctx, out.data(), b->data(), 4096).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(out, other);  // the replay copied a's new contents
  EXPECT_EQ(calls, 1);
  // The default stream cannot be captured; a failing body's error comes back.
  EXPECT_EQ(DeviceGraph::Capture(cuda, [] { return absl::OkStatus(); }).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DeviceGraph::Capture(ctx, [] { return absl::DataLossError("x"); }).status().code(),
            absl::StatusCode::kDataLoss);
}

// On kCpu a graph keeps its body and runs it at each launch (the emulation CPU tests use).
TEST(DeviceMemoryTest, CpuGraphRunsItsBodyAtEachLaunch) {
  const OpContext cpu{};
  int calls = 0;
  absl::StatusOr<DeviceGraph> graph = DeviceGraph::Capture(cpu, [&] {
    ++calls;
    return calls == 3 ? absl::InternalError("third") : absl::OkStatus();
  });
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(graph->Launch(cpu).ok());
  EXPECT_TRUE(graph->Launch(cpu).ok());
  EXPECT_EQ(graph->Launch(cpu).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(graph->Launch(OpContext{Device::kCuda, nullptr, nullptr}).code(),
            absl::StatusCode::kInvalidArgument);
  DeviceGraph moved = *std::move(graph);
  EXPECT_FALSE(moved.empty());
  EXPECT_EQ(DeviceGraph().Launch(cpu).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pd::kernels
