// FaultInjectingTransport: a KvTransport decorator that injects failures per a FaultPolicy
// (LevelDB EnvWrapper / TENT fault proxy shape). Everything not faulted is forwarded to the
// wrapped transport. Transfer ids are the decorator's own (mapped to the wrapped ones).
//
// Thread-safe; the policy may be changed at any time (SetPolicy) and applies to later calls
// and to later Poll/Wait results of transfers already posted.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/time/clock.h"
#include "transport/kv_transport.h"

namespace pd::transport {

struct FaultPolicy {
  // Non-OK: PostTransfer returns this status and posts nothing.
  absl::Status fail_submit;
  // >= 0: posting stops once this many blocks (over all transfers) have been posted; the
  // transfer that would cross the budget is not forwarded and fails with Unavailable, so its
  // receiver never completes (it times out or is cancelled). -1: no limit.
  int64_t fail_after_blocks = -1;
  // A finished transfer is reported as pending until `delay` after it was posted.
  absl::Duration delay = absl::ZeroDuration();
  // True: Connect and PostTransfer fail with Unavailable, and pending posted transfers fail
  // with Unavailable (the wrapped ones are cancelled), as if every peer died.
  bool drop_peers = false;
  // Non-OK: a posted transfer that completed is reported as failed with this status (a lost
  // acknowledgement).
  absl::Status corrupt_status;
};

class FaultInjectingTransport : public KvTransport {
 public:
  // `clock` (not owned, must outlive this; Clock::Real() when null) times `delay`.
  FaultInjectingTransport(std::unique_ptr<KvTransport> inner, FaultPolicy policy,
                          Clock* clock = nullptr);

  void SetPolicy(FaultPolicy policy);
  KvTransport& inner() { return *inner_; }
  // Blocks posted so far (counted against fail_after_blocks).
  int64_t PostedBlocksForTest() const;

  absl::string_view Name() const override { return inner_->Name(); }
  TransportCaps Caps() const override { return inner_->Caps(); }
  absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) override;
  absl::Status Deregister(RegionHandle region) override;
  absl::StatusOr<std::unique_ptr<HostAllocation>> AllocateHost(uint64_t bytes) override {
    return inner_->AllocateHost(bytes);
  }
  std::string LocalEndpoint() const override { return inner_->LocalEndpoint(); }
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
  struct Entry {
    TransferId inner;         // invalid for synthetic (never forwarded) transfers
    bool posted = false;      // sender side (faults apply) vs expectation (forwarded as is)
    absl::Time ready;         // not reported finished before this
    TransferState synthetic;  // used when !inner.valid()
  };
  absl::StatusOr<TransferState> Adjust(TransferId id, absl::StatusOr<TransferState> s);
  absl::StatusOr<Entry> Find(TransferId id) const;
  TransferId AddEntry(Entry e);

  std::unique_ptr<KvTransport> inner_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  FaultPolicy policy_ ABSL_GUARDED_BY(mu_);
  int64_t posted_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::transport
