// StrongId<Tag, T>: an integer id that does not mix with other ids or bare integers.
//
//   using BlockId = pd::StrongId<struct BlockIdTag, uint32_t>;
//   BlockId b{7};  b.value() == 7;  BlockId != WorkerId at compile time.
//
// Hashable (absl and std), ordered, printable via absl::StrCat (AbslStringify is not in
// Abseil 20220623, so use ToString()). Thread-compatible value type.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>

namespace pd {

template <typename Tag, typename T = uint64_t>
class StrongId {
 public:
  using ValueType = T;

  constexpr StrongId() = default;
  constexpr explicit StrongId(T value) : value_(value) {}

  // The reserved "no id" value (max of T); default-constructed ids are invalid.
  static constexpr StrongId Invalid() { return StrongId(); }
  constexpr bool valid() const { return value_ != std::numeric_limits<T>::max(); }
  constexpr T value() const { return value_; }
  std::string ToString() const { return std::to_string(value_); }

  friend constexpr auto operator<=>(const StrongId&, const StrongId&) = default;

  template <typename H>
  friend H AbslHashValue(H h, const StrongId& id) {
    return H::combine(std::move(h), id.value_);
  }
  friend std::ostream& operator<<(std::ostream& os, const StrongId& id) { return os << id.value_; }

 private:
  T value_ = std::numeric_limits<T>::max();
};

// Ids shared across layers. Layer-private ids live with their layer.
using RequestId = StrongId<struct RequestIdTag, uint64_t>;
using BlockId = StrongId<struct BlockIdTag, uint32_t>;
using WorkerId = StrongId<struct WorkerIdTag, uint32_t>;
using PeerId = StrongId<struct PeerIdTag, uint32_t>;
using TransferId = StrongId<struct TransferIdTag, uint64_t>;

}  // namespace pd

template <typename Tag, typename T>
struct std::hash<pd::StrongId<Tag, T>> {
  size_t operator()(const pd::StrongId<Tag, T>& id) const { return std::hash<T>()(id.value()); }
};
