// UcxDataPath: how the UCX backend moves data. Its own header so that the registry's
// TransportConfig and the UCX backend's options share the type without the backend including
// the registry (backends sit below it). Thread-compatible value type.
#pragma once

#include <cstdint>

namespace pd::transport {

// Chosen per connection from the lanes UCX selected for it (logged at VLOG(1); Caps().one_sided
// / two_sided say which paths are allowed):
//  kAuto: RMA (put + flush + completion message) when the data endpoint's bulk lane is RDMA
//         (rc/dc) or CUDA IPC; active messages otherwise: over tcp (UCX's tcp RMA is an order
//         of magnitude slower than its AM path) and, for now, over shm (RMA is faster at large
//         batches there but has an undiagnosed 10-15 ms tail). See docs/benchmarks.md.
//  kRma, kActiveMessage: force one path (tests, benchmarks).
enum class UcxDataPath : uint8_t { kAuto, kRma, kActiveMessage };

}  // namespace pd::transport
