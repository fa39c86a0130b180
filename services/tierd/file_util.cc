#include "services/tierd/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/errno_status.h"
#include "common/log/log.h"

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

absl::Status RestrictFileMode(int fd, absl::string_view path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return FileError(errno, "fstat", path);
  }
  if ((st.st_mode & 077) == 0) {
    return absl::OkStatus();
  }
  if (fchmod(fd, kPrivateFileMode) != 0) {
    return FileError(errno, absl::StrFormat("chmod %04o", kPrivateFileMode), path);
  }
  LOG(WARNING) << "nvme store: " << path
               << absl::StrFormat(" was mode %04o (readable by other users); now %04o",
                                  st.st_mode & 07777, kPrivateFileMode);
  return absl::OkStatus();
}

absl::Status RestrictDirMode(absl::string_view dir) {
  const std::string path(dir);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return FileError(errno, "stat", path);
  }
  if ((st.st_mode & 077) == 0) {
    return absl::OkStatus();
  }
  if (chmod(path.c_str(), kPrivateDirMode) != 0) {
    if (errno == EPERM) {
      LOG(WARNING) << "nvme store: " << path
                   << absl::StrFormat(" is mode %04o and not ours to change; its files are %04o",
                                      st.st_mode & 07777, kPrivateFileMode);
      return absl::OkStatus();
    }
    return FileError(errno, absl::StrFormat("chmod %04o", kPrivateDirMode), path);
  }
  LOG(WARNING) << "nvme store: folder " << path
               << absl::StrFormat(" was mode %04o (open to other users); now %04o",
                                  st.st_mode & 07777, kPrivateDirMode);
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
