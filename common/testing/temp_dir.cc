#include "common/testing/temp_dir.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pd::testing {

absl::StatusOr<TempDir> TempDir::Create(absl::string_view prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp", "/", prefix,
                                   "XXXXXX");
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", templ, ": ", std::strerror(errno)));
  }
  return TempDir(std::string(buf.data()));
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

TempDir::~TempDir() { Remove(); }

std::string TempDir::File(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

void TempDir::Remove() {
  if (!path_.empty()) {
    std::error_code ec;  // best effort: a leftover temp dir must not fail a test
    std::filesystem::remove_all(path_, ec);
    path_.clear();
  }
}

}  // namespace pd::testing
