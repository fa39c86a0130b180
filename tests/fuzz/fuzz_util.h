// Helpers shared by the libFuzzer targets in tests/fuzz (header-only; each target is one .cc).
//
// Targets check properties with glog's CHECK (common/log/log.h): a violated property aborts,
// and libFuzzer reports the abort like any crash, with the input that caused it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log/log.h"

namespace pd::fuzz {

// The input as a string_view.
inline absl::string_view AsView(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

// An anonymous in-memory file (memfd) whose contents are replaced per input, for APIs that
// take a path: "/proc/self/fd/N" opens it like a regular file, without touching the disk.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, 0)) {
    PCHECK(fd_ >= 0) << "memfd_create";
    path_ = absl::StrCat("/proc/self/fd/", fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { close(fd_); }

  // Replaces the contents with `bytes`.
  void Write(absl::string_view bytes) {
    PCHECK(ftruncate(fd_, 0) == 0) << "ftruncate";
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      PCHECK(n > 0) << "pwrite";
      done += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace pd::fuzz
