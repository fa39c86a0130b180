#include "services/tierd/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/errno_status.h"

namespace pd::tierd {

bool IsOutOfSpace(int err) { return err == ENOSPC || err == EDQUOT || err == EFBIG; }

absl::Status FileError(int err, absl::string_view op, absl::string_view path) {
  if (IsOutOfSpace(err)) {
    return absl::ResourceExhaustedError(absl::StrCat(op, " ", path, ": ", std::strerror(err)));
  }
  return ErrnoToStatus(err, op, path);
}

absl::Status SyncDir(absl::string_view dir) {
  const std::string path(dir);
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    return FileError(errno, "open", path);
  }
  if (fsync(fd.get()) != 0) {
    return FileError(errno, "fsync", path);
  }
  return absl::OkStatus();
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      close(fd_);
    }
    fd_ = other.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) {
    close(fd_);
  }
}

}  // namespace pd::tierd
