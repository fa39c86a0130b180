#include "engine/model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "common/base/errno_status.h"

namespace pd::engine {
namespace {

constexpr size_t kBufferBytes = 8u << 20;

}  // namespace

uint64_t SafetensorsTensorSpec::size_bytes() const {
  uint64_t n = SafetensorsDtypeSize(dtype);
  for (int64_t d : shape) {
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(
    absl::string_view path, std::vector<SafetensorsTensorSpec> tensors) {
  absl::flat_hash_set<std::string> names;
  for (const SafetensorsTensorSpec& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name \"", t.name, "\" is empty, reserved or duplicate"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor \"", t.name, "\" has negative dimension ", d));
      }
    }
  }
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const SafetensorsTensorSpec& a, const SafetensorsTensorSpec& b) {
                     const size_t sa = SafetensorsDtypeSize(a.dtype);
                     const size_t sb = SafetensorsDtypeSize(b.dtype);
                     return sa != sb ? sa > sb : a.name < b.name;
                   });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const SafetensorsTensorSpec& t : tensors) {
    const uint64_t size = t.size_bytes();
    header[t.name] = {{"dtype", std::string(SafetensorsDtypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');

  SafetensorsWriter w;
  w.path_ = std::string(path);
  w.tmp_path_ = absl::StrCat(path, ".tmp");
  w.order_ = std::move(tensors);
  w.data_bytes_ = offset;
  w.fd_ = ::open(w.tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) {
    return ErrnoToStatus(errno, "open", w.tmp_path_);
  }
  const uint64_t len = text.size();
  w.buffer_.reserve(kBufferBytes);
  w.buffer_.append(reinterpret_cast<const char*>(&len), sizeof(len));  // little-endian host
  w.buffer_ += text;
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      order_(std::move(other.order_)),
      data_bytes_(other.data_bytes_),
      written_(other.written_),
      buffer_(std::move(other.buffer_)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

absl::Status SafetensorsWriter::Flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return ErrnoToStatus(errno, "write", tmp_path_);
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Append(const void* data, size_t size_bytes) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": Append after Finish"));
  }
  if (size_bytes > data_bytes_ - written_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": appending ", size_bytes, " bytes after ", written_,
                     " exceeds the declared ", data_bytes_, " bytes of tensor data"));
  }
  const char* p = static_cast<const char*>(data);
  while (size_bytes > 0) {
    const size_t take = std::min(size_bytes, kBufferBytes - buffer_.size());
    buffer_.append(p, take);
    p += take;
    size_bytes -= take;
    written_ += take;
    if (buffer_.size() == kBufferBytes) {
      absl::Status s = Flush();
      if (!s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish called twice"));
  }
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": only ", written_, " of ", data_bytes_, " data bytes were appended"));
  }
  absl::Status s = Flush();
  if (!s.ok()) {
    return s;
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    return ErrnoToStatus(err, "close", tmp_path_);
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    return ErrnoToStatus(err, "rename to", path_);
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
