// ErrnoToStatus: the one mapping from a failed system call's errno to a canonical status.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pd {

// "<op> <path>: <strerror>" with the most specific code: NotFound (ENOENT, ENOTDIR),
// PermissionDenied (EACCES, EPERM, EROFS), AlreadyExists (EEXIST), InvalidArgument (EISDIR,
// ENODEV, EINVAL, ENAMETOOLONG, ELOOP), ResourceExhausted (ENOSPC, EDQUOT, EMFILE, ENFILE,
// ENOMEM, EOVERFLOW), Internal otherwise. Thread-safe.
absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path);

}  // namespace pd
