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

// Length of the well-formed UTF-8 character at s[i] (Unicode 15 table 3-7: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 when the bytes there are ill-formed. Written
// independently of the project's UTF-8 code, as an oracle.
inline size_t WellFormedCharLength(absl::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c <= 0x7F) {
    return 1;
  }
  // Sequence length and the range of the second byte, by lead byte (table 3-7).
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    lo = c == 0xE0 ? 0xA0 : 0x80;
    hi = c == 0xED ? 0x9F : 0xBF;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    lo = c == 0xF0 ? 0x90 : 0x80;
    hi = c == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) {
    return 0;
  }
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) {
      return 0;
    }
  }
  return n;
}

// True when `s` is well-formed UTF-8.
inline bool IsWellFormedUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = WellFormedCharLength(s, i);
    if (n == 0) {
      return false;
    }
    i += n;
  }
  return true;
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
