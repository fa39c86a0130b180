// A uniquely named temporary directory removed (recursively) on destruction. Test-only.
// Thread-compatible.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::testing {

class TempDir {
 public:
  // Creates $TMPDIR/<prefix>XXXXXX (or /tmp). Errors: Internal when mkdtemp fails.
  static absl::StatusOr<TempDir> Create(absl::string_view prefix = "pd-test-");

  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(absl::string_view name) const;

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  void Remove();

  std::string path_;
};

}  // namespace pd::testing
