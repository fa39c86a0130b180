#include "services/tier_shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::tier_shm {
namespace {

constexpr char kShmMount[] = "/dev/shm";

// "(/dev/shm: 1.5 GiB free of 2.0 GiB)" or "" when statvfs fails.
std::string ShmSpace() {
  struct statvfs vfs {};
  if (statvfs(kShmMount, &vfs) != 0) {
    return absl::StrCat("(", kShmMount, " is not available: ", std::strerror(errno),
                        "; is it mounted?)");
  }
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  return absl::StrCat("(", kShmMount, ": ", avail, " of ", total, " bytes free)");
}

absl::Status ShmOpenError(int err, absl::string_view what, absl::string_view name) {
  const std::string msg =
      absl::StrCat(what, " shm ", name, ": ", std::strerror(err), " ", ShmSpace());
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Closes a descriptor on scope exit; the mapping keeps the object alive without it.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

absl::StatusOr<uint8_t*> MapShared(int fd, size_t size_bytes, absl::string_view name) {
  void* p = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap shm ", name, " (", size_bytes, " bytes): ", std::strerror(err)));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

absl::Status ShmRegion::ValidateName(absl::string_view name) {
  if (name.size() < 2 || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name \"", name, "\" must start with '/' and have a name after it"));
  }
  if (name.find('/', 1) != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name \"", name, "\" must not contain '/' after the first character"));
  }
  if (name.size() > NAME_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name \"", name, "\" is longer than ", NAME_MAX, " characters"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(absl::string_view name,
                                                             size_t size_bytes, bool reserve) {
  if (absl::Status s = ValidateName(name); !s.ok()) {
    return s;
  }
  if (size_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm ", name, ": size must be > 0"));
  }
  const std::string name_str(name);
  int fd = shm_open(name_str.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    // One tierd per node and name: an existing object is the leftover of a tierd that died
    // without unlinking it.
    LOG(WARNING) << "shm " << name << " already exists (left by a previous tierd?); replacing it";
    shm_unlink(name_str.c_str());
    fd = shm_open(name_str.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (fd < 0) {
    return ShmOpenError(errno, "create", name);
  }
  FdCloser closer(fd);
  auto fail = [&](absl::Status status) {
    shm_unlink(name_str.c_str());
    return status;
  };
  struct statvfs vfs {};
  if (reserve && fstatvfs(fd, &vfs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < size_bytes) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "shm ", name, ": needs ", size_bytes, " bytes but ", kShmMount, " has only ", avail,
          " bytes free; enlarge it (mount -o remount,size=... ", kShmMount,
          ", or a larger --shm-size / emptyDir sizeLimit in containers) or shrink the DRAM tier")));
    }
  }
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    return fail(ShmOpenError(errno, "ftruncate", name));
  }
  if (reserve) {
    // posix_fallocate returns the error number instead of setting errno.
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
    if (err == ENOSPC || err == ENOMEM) {
      return fail(absl::ResourceExhaustedError(
          absl::StrCat("shm ", name, ": cannot reserve ", size_bytes, " bytes in ", kShmMount, ": ",
                       std::strerror(err), " ", ShmSpace(), "; enlarge ", kShmMount,
                       " or shrink the DRAM tier")));
    }
    if (err != 0) {
      LOG(WARNING) << "shm " << name << ": posix_fallocate failed (" << std::strerror(err)
                   << "); pages will be allocated on first touch";
    }
  }
  absl::StatusOr<uint8_t*> data = MapShared(fd, size_bytes, name);
  if (!data.ok()) {
    return fail(data.status());
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(name_str, *data, size_bytes, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::MapExisting(absl::string_view name,
                                                                  size_t expected_size_bytes) {
  if (absl::Status s = ValidateName(name); !s.ok()) {
    return s;
  }
  const std::string name_str(name);
  const int fd = shm_open(name_str.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return ShmOpenError(errno, "open", name);
  }
  FdCloser closer(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return ShmOpenError(errno, "fstat", name);
  }
  if (static_cast<uint64_t>(st.st_size) != expected_size_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm ", name, " is ", st.st_size, " bytes, expected ", expected_size_bytes));
  }
  if (expected_size_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm ", name, ": size must be > 0"));
  }
  absl::StatusOr<uint8_t*> data = MapShared(fd, expected_size_bytes, name);
  if (!data.ok()) {
    return data.status();
  }
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(name_str, *data, expected_size_bytes, /*owner=*/false));
}

ShmRegion::~ShmRegion() {
  munmap(data_, size_bytes_);
  if (owner_) {
    shm_unlink(name_.c_str());
  }
}

}  // namespace pd::tier_shm
