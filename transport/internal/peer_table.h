// PeerTable: the PeerHandle -> connection map of a backend that owns its connections (tcp,
// nccl): fresh handles (never reused), the lookups Connect, PostTransfer and Disconnect make,
// and their NotFound/Unavailable answers worded the same for every backend. Private to
// transport/.
//
// Thread-compatible: the owning transport guards it with its own mutex (the same lock that
// orders its shutdown), e.g. `PeerTable<std::shared_ptr<Conn>> peers_ ABSL_GUARDED_BY(mu_)`.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "transport/kv_transport.h"

namespace pd::transport::transport_internal {

// What PostTransfer answers for a peer whose connection is known to be closed.
inline absl::Status ClosedPeerError(PeerHandle handle) {
  return absl::UnavailableError(
      absl::StrCat("post: connection to peer ", handle.value(), " is closed; Connect again"));
}

// `Peer` is a copyable pointer-like value (a std::shared_ptr to the backend's connection).
template <typename Peer>
class PeerTable {
 public:
  // Stores `peer` under a fresh handle.
  PeerHandle Add(Peer peer) {
    const uint32_t handle = next_handle_++;
    peers_[handle] = std::move(peer);
    return PeerHandle(handle);
  }

  // The handle of a peer for which `match(peer)` holds (Connect reuses a live connection to the
  // same instance), if any.
  template <typename Match>
  std::optional<PeerHandle> FindIf(Match match) const {
    for (const auto& [handle, peer] : peers_) {
      if (match(peer)) {
        return PeerHandle(handle);
      }
    }
    return std::nullopt;
  }

  // NotFound "<op>: unknown peer N" for a handle this table never gave or already removed.
  absl::StatusOr<Peer> Get(PeerHandle handle, absl::string_view op) const {
    auto it = peers_.find(handle.value());
    if (it == peers_.end()) {
      return UnknownPeer(handle, op);
    }
    return it->second;
  }

  // Forgets the peer and returns it (Disconnect); NotFound as Get("disconnect").
  absl::StatusOr<Peer> Remove(PeerHandle handle) {
    auto it = peers_.find(handle.value());
    if (it == peers_.end()) {
      return UnknownPeer(handle, "disconnect");
    }
    Peer peer = std::move(it->second);
    peers_.erase(it);
    return peer;
  }

  // Every peer (shutdown).
  std::vector<Peer> Values() const {
    std::vector<Peer> out;
    out.reserve(peers_.size());
    for (const auto& [handle, peer] : peers_) {
      out.push_back(peer);
    }
    return out;
  }

 private:
  static absl::Status UnknownPeer(PeerHandle handle, absl::string_view op) {
    return absl::NotFoundError(absl::StrCat(op, ": unknown peer ", handle.value()));
  }

  uint32_t next_handle_ = 1;
  absl::flat_hash_map<uint32_t, Peer> peers_;
};

}  // namespace pd::transport::transport_internal
