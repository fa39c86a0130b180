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

// The NVMe tier's files hold every tenant's KV blocks: only tierd's user may read them. New
// files are created with kPrivateFileMode, the folder gets kPrivateDirMode.
inline constexpr int kPrivateFileMode = 0600;
inline constexpr int kPrivateDirMode = 0700;

// Makes the open file `fd` (named `path` in messages) kPrivateFileMode when it grants group or
// other users any access (a file from an older tierd, or copied in), with a WARNING saying so.
// FileError when fstat or fchmod fails (e.g. the file belongs to another user).
absl::Status RestrictFileMode(int fd, absl::string_view path);

// Makes directory `dir` kPrivateDirMode when it grants group or other users any access, with a
// WARNING saying so. A folder tierd does not own (EPERM: a mount point owned by root, e.g. a
// Kubernetes volume) is left as is with a WARNING: its files are private anyway. FileError for
// any other failure.
absl::Status RestrictDirMode(absl::string_view dir);

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
