#include "common/base/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace pd {

absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path) {
  const std::string message = absl::StrCat(op, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EISDIR:
    case ENODEV:
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
      return absl::InvalidArgumentError(message);
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EOVERFLOW:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace pd
