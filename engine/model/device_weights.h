// DeviceWeights: one copy of a model's weights in one device's memory, and a ModelWeights view
// whose pointers point into it (what LlamaForward needs on Device::kCuda, where every kernel
// pointer is device memory).
//
// Every matrix and vector of the source view is uploaded once, into a single allocation (one
// RAII owner, 256-byte aligned pieces); a classifier shared with the embedding is uploaded once.
// On Device::kCpu the "upload" is a host copy, which is how the layout is tested without a GPU.
// One exception: a mixture-of-experts layer's router selection bias (DeepSeek-V3) stays in host
// memory, in a copy this object owns, because routing runs on the host.
//
// Ownership: owns the device memory; the view returned by weights() is valid while this object
// lives. The source ModelWeights is only read during Upload. Immutable after Upload:
// thread-safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_weights.h"
#include "kernels/device_memory.h"
#include "kernels/types.h"

namespace pd::engine {

class DeviceWeights {
 public:
  // Copies `host` to ctx.device on ctx.stream and waits for the copies. Errors: InvalidArgument
  // for an invalid config or a missing required tensor (embedding, classifier, a norm or a
  // matrix); the device errors of kernels/device_memory.h (Unimplemented naming
  // PD_ENABLE_CUDA, FailedPrecondition "no CUDA device", ResourceExhausted, Internal).
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(const ModelWeights& host,
                                                               const kernels::OpContext& ctx);

  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  // The device view: config, fingerprint and dtype of the source, pointers into device memory,
  // no owned host storage.
  const ModelWeights& weights() const { return view_; }
  kernels::Device device() const { return buffer_.device(); }
  int64_t size_bytes() const { return buffer_.size_bytes(); }

 private:
  DeviceWeights() = default;

  kernels::DeviceBuffer buffer_;
  ModelWeights view_;
  std::vector<std::vector<float>> router_bias_;  // host copies, one per layer that has one
};

}  // namespace pd::engine
