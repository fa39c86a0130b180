// Little-endian byte writer/reader for the transport's wire structs: the handshake encodings
// (handshake.h: endpoints, descriptors) and the backends' frames and blobs. For use inside
// transport/ (other layers see only the encoded bytes). Thread-compatible value types.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace pd::transport {

class ByteWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void U64(uint64_t v) { Raw(&v, sizeof(v)); }
  // Length-prefixed (u32) bytes.
  void Bytes(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string Take() { return std::move(out_); }
  const std::string& str() const { return out_; }

 private:
  // The project only targets little-endian hosts (x86-64, aarch64): raw copies are the encoding.
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads fields in order; any short read sets ok() to false and returns zeros from then on.
class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  uint8_t U8() {
    uint8_t v = 0;
    Raw(&v, 1);
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    Raw(&v, sizeof(v));
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    Raw(&v, sizeof(v));
    return v;
  }
  std::string Bytes(uint32_t max_len = 1u << 20) {
    const uint32_t n = U32();
    if (!ok_ || n > max_len || n > in_.size()) {
      ok_ = false;
      return {};
    }
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && in_.empty(); }
  size_t remaining() const { return in_.size(); }

 private:
  void Raw(void* p, size_t n) {
    if (!ok_ || in_.size() < n) {
      ok_ = false;
      return;
    }
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
  }
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace pd::transport
