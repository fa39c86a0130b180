// MappedFile: a whole file mapped read-only into memory (RAII over open/fstat/mmap/munmap).
//
// Used to load model weights and tokenizer files without copying them: pointers into
// data() stay valid for as long as the MappedFile (or whatever it was moved into) lives, because
// a move transfers the mapping without remapping it.
//
// Caveat: the mapping is MAP_PRIVATE of the file as it is on disk. Truncating or rewriting the
// file while it is mapped is undefined from our side (reads past a truncation raise SIGBUS), so
// model files must be treated as immutable while loaded.
//
// Thread-safety: immutable after Open(); concurrent reads of data() are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::engine {

class MappedFile {
 public:
  // Opens and maps `path` read-only. An empty file yields size() == 0 and data() == nullptr.
  // Errors (message names the path and strerror):
  //   NotFound          the file or a directory on the path does not exist;
  //   PermissionDenied  the file cannot be opened for reading;
  //   InvalidArgument   the path is not a regular file (directory, device, fifo);
  //   ResourceExhausted out of file descriptors, memory or address space;
  //   Internal          any other open/fstat/mmap failure.
  static absl::StatusOr<MappedFile> Open(absl::string_view path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // First byte of the file; page-aligned when size() > 0, nullptr when the file is empty.
  const uint8_t* data() const { return data_; }
  // File size in bytes at the time of Open().
  size_t size() const { return size_; }
  // The whole file as bytes (empty view for an empty file).
  absl::string_view contents() const {
    return absl::string_view(reinterpret_cast<const char*>(data_), size_);
  }
  // The path given to Open(), for error messages.
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void Unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;  // owned mapping of size_ bytes, or nullptr
  size_t size_ = 0;
};

}  // namespace pd::engine
