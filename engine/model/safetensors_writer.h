// SafetensorsWriter: streams a safetensors file to disk without holding the tensors in memory.
//
// The header is written first, from the declared tensor list; the data of each tensor is then
// appended in order() (the declared tensors stably sorted by decreasing element size, then by
// name, as the safetensors library does, so every tensor is naturally aligned). The JSON header
// is padded with spaces to a multiple of 8 bytes and carries __metadata__ {"format": "pt"},
// which transformers expects. The file is written as `path`.tmp and renamed over `path` by
// Finish(), so readers never see a partial file; destroying an unfinished writer removes the
// temporary file.
//
// Thread-compatible (one writer per file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/safetensors.h"

namespace pd::engine {

struct SafetensorsTensorSpec {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;  // non-negative

  uint64_t size_bytes() const;
};

class SafetensorsWriter {
 public:
  // Creates `path`.tmp and writes the header for `tensors`.
  // Errors: InvalidArgument for an empty or duplicate name ("__metadata__" is reserved) or a
  // negative dimension; the errno mapping of MappedFile::Open for open/write failures
  // (NotFound: missing directory, PermissionDenied, ResourceExhausted: disk full).
  static absl::StatusOr<SafetensorsWriter> Create(absl::string_view path,
                                                  std::vector<SafetensorsTensorSpec> tensors);

  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) = delete;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // The order in which tensor data must be appended.
  const std::vector<SafetensorsTensorSpec>& order() const { return order_; }
  // Total bytes of tensor data (sum of size_bytes()).
  uint64_t data_bytes() const { return data_bytes_; }
  // Data bytes appended so far.
  uint64_t written_bytes() const { return written_; }

  // Appends raw little-endian bytes; tensor boundaries need not align with calls.
  // Errors: FailedPrecondition when more than data_bytes() would be written or after Finish();
  // write errors as in Create.
  absl::Status Append(const void* data, size_t size_bytes);

  // Flushes, checks that exactly data_bytes() were appended (FailedPrecondition otherwise),
  // closes and renames the temporary file to the final path.
  absl::Status Finish();

 private:
  SafetensorsWriter() = default;
  absl::Status Flush();

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  std::vector<SafetensorsTensorSpec> order_;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
  std::string buffer_;  // pending bytes, flushed at kBufferBytes
};

}  // namespace pd::engine
