// Small file helpers shared by NvmeStore and NvmeManifest. Internal to services/tierd.
// Thread-safety: functions are thread-safe; ScopedFd is thread-compatible.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pd::tierd {

// Whether `err` means "the disk (or this process's share of it) is full": ENOSPC, EDQUOT, and
// EFBIG (a file-size limit, RLIMIT_FSIZE: the same situation for tierd, and how tests fake a
// full disk without root).
bool IsOutOfSpace(int err);

// "<op> <path>: <strerror>": ResourceExhausted when IsOutOfSpace(err), else ErrnoToStatus.
absl::Status FileError(int err, absl::string_view op, absl::string_view path);

// fsync of directory `dir`, so a rename or create inside it is durable. FileError on failure.
absl::Status SyncDir(absl::string_view dir);

// Owns a file descriptor; closes it on destruction. -1 = none.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace pd::tierd
