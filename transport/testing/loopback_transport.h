// LoopbackTransport: an in-process fake KvTransport. Instances attached to the same
// LoopbackHub reach each other through Connect; data moves by memcpy on a per-transport worker
// thread, run by run, with the same validation, descriptors, deadlines and receiver
// notifications as the real backends (it shares their TransportCore).
//
// Thread-safe. The hub must outlive nothing in particular: it is shared (shared_ptr) by every
// transport attached to it and by deliveries in flight.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "transport/kv_transport.h"

namespace pd::transport {

namespace transport_internal {
class TransportCore;
}  // namespace transport_internal

// The in-memory "network": instance id -> the receiving side of an attached transport.
class LoopbackHub {
 public:
  LoopbackHub() = default;
  LoopbackHub(const LoopbackHub&) = delete;
  LoopbackHub& operator=(const LoopbackHub&) = delete;

  // Shared by the transport and by deliveries in flight into it.
  using CorePtr = std::shared_ptr<transport_internal::TransportCore>;
  void Attach(uint64_t instance_id, CorePtr core);
  void Detach(uint64_t instance_id);
  CorePtr Find(uint64_t instance_id) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, CorePtr> cores_ ABSL_GUARDED_BY(mu_);
};

class LoopbackTransport : public KvTransport {
 public:
  // Attaches to `hub` (a fresh hub when null).
  static std::unique_ptr<LoopbackTransport> Create(std::shared_ptr<LoopbackHub> hub);
  ~LoopbackTransport() override;

  absl::string_view Name() const override { return "loopback"; }
  TransportCaps Caps() const override;
  absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) override;
  absl::Status Deregister(RegionHandle region) override;
  std::string LocalEndpoint() const override;
  absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) override;
  absl::Status Disconnect(PeerHandle peer) override;
  absl::StatusOr<Expectation> ExpectTransfer(uint64_t tag, RegionHandle dst,
                                             absl::Span<const BlockId> dst_blocks,
                                             const TransferOptions& options) override;
  absl::StatusOr<TransferId> PostTransfer(PeerHandle peer, uint64_t tag, RegionHandle src,
                                          absl::Span<const BlockPair> pairs,
                                          absl::string_view remote_descriptor,
                                          const TransferOptions& options) override;
  absl::StatusOr<TransferState> Poll(TransferId id) override;
  absl::StatusOr<TransferState> Wait(TransferId id, absl::Duration timeout) override;
  absl::Status Cancel(TransferId id) override;

 private:
  class Impl;
  explicit LoopbackTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pd::transport
