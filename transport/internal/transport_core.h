// TransportCore: the bookkeeping every KvTransport backend shares — registered regions with
// their nonces, the transfer table (states, deadlines, Wait), receiver expectations and the
// validation of incoming writes and outgoing posts. Backends own the data movement and call in
// here; no backend-specific fields live in it. Private to transport/.
//
// Thread-safe: one mutex guards all state; no method blocks on I/O while holding it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/handshake.h"
#include "transport/kv_transport.h"

namespace pd::transport::transport_internal {

// A random 64-bit value (instance ids, nonces); never 0.
uint64_t RandomId();

// The endpoint a `backend` transport's Connect was given: InvalidArgument for garbage,
// FailedPrecondition for another protocol version or an endpoint of another backend.
absl::StatusOr<EndpointInfo> DecodePeerEndpoint(absl::string_view backend,
                                                absl::string_view endpoint);

struct RegionInfo {
  MemoryRegion region;
  uint64_t nonce = 0;
  std::string blob;  // backend data for descriptors (e.g. UCX base address + rkey)
  char* base() const { return static_cast<char*>(region.base); }
};

// Receiver state of one announced transfer. Shared by the tag map and in-progress writers.
struct ExpectationState {
  TransferId id;
  uint64_t tag = 0;
  RegionHandle region;
  uint64_t nonce = 0;
  char* base = nullptr;
  uint64_t block_bytes = 0;
  // dst block -> 0 announced, 1 being written, 2 arrived.
  absl::flat_hash_map<uint32_t, uint8_t> blocks;
  size_t remaining = 0;
  int writers = 0;                // writes in progress (guarded by the core mutex)
  uint64_t source = 0;            // backend connection that wrote into it (0: none yet)
  std::atomic<bool> dead{false};  // set once finished; writers stop at the next chunk
};

// Permission to write `length` bytes at `dst` for one run of an expectation. Writers copy in
// chunks and check Valid() between them; EndWrite must follow every successful BeginWrite.
struct WriteGrant {
  std::shared_ptr<ExpectationState> exp;
  char* dst = nullptr;
  uint64_t length = 0;
  uint32_t dst_first = 0;
  uint32_t num_blocks = 0;
  bool Valid() const { return !exp->dead.load(std::memory_order_acquire); }
};

// A validated outgoing transfer.
struct PreparedPost {
  TransferId id;
  TransferDescriptor desc;
  std::vector<BlockRun> runs;
  const char* src_base = nullptr;
  uint64_t block_bytes = 0;
  uint64_t bytes = 0;
};

class TransportCore {
 public:
  explicit TransportCore(std::string backend);
  TransportCore(const TransportCore&) = delete;
  TransportCore& operator=(const TransportCore&) = delete;

  const std::string& backend() const { return backend_; }
  uint64_t instance_id() const { return instance_id_; }

  // ---- regions
  // Validates `region` (kinds in `allow_cuda`) and records it with a fresh nonce.
  absl::StatusOr<RegionHandle> AddRegion(const MemoryRegion& region, bool allow_cuda,
                                         std::string blob = "");
  // Fails the region's expectations (FailedPrecondition), waits for their writers, forgets it.
  absl::StatusOr<RegionInfo> RemoveRegion(RegionHandle handle);
  absl::StatusOr<RegionInfo> GetRegion(RegionHandle handle) const;

  // ---- transfers (posted and expected)
  TransferId NewTransfer(uint64_t bytes, absl::Duration timeout);
  // First finish wins; returns whether this call finished it. Finishing an expectation removes
  // it from the tag map and marks it dead for writers.
  bool Finish(TransferId id, const absl::Status& status);
  // True while pending (applies the deadline first). Unknown ids are not pending.
  bool IsPending(TransferId id);
  absl::StatusOr<TransferState> Poll(TransferId id);
  absl::StatusOr<TransferState> Wait(TransferId id, absl::Duration timeout);
  // Fails with Cancelled; for an expectation also waits for in-progress writers. Returns the tag
  // and whether the id was an expectation, so the backend can tell the peer.
  struct CancelResult {
    bool was_pending = false;
    bool expectation = false;
    uint64_t tag = 0;
  };
  absl::StatusOr<CancelResult> Cancel(TransferId id);

  // ---- receiver
  absl::StatusOr<Expectation> Expect(uint64_t tag, RegionHandle dst,
                                     absl::Span<const BlockId> dst_blocks,
                                     const TransferOptions& options);
  // Validates a run arriving for `tag` against the pending expectation (nonce, announced
  // blocks not yet written) and marks it in progress. `source` identifies the connection.
  absl::StatusOr<WriteGrant> BeginWrite(uint64_t tag, uint64_t nonce, uint32_t dst_first,
                                        uint32_t num_blocks, uint64_t source);
  // Ends a write; ok=false fails the expectation with `error`.
  void EndWrite(const WriteGrant& grant, bool ok, const absl::Status& error = absl::OkStatus());
  // The sender finished sending `tag`: done when every announced block arrived, otherwise the
  // expectation fails (DataLoss) and so does the returned status.
  absl::Status CompleteExpectation(uint64_t tag, uint64_t nonce);
  // Fails the pending expectation for `tag` (if any, and if `nonce` matches when non-zero).
  void FailExpectation(uint64_t tag, uint64_t nonce, const absl::Status& status);
  // Fails every expectation a write from `source` touched (that connection died).
  void FailExpectationsFromSource(uint64_t source, const absl::Status& status);

  // ---- sender
  // Decodes and checks `descriptor` against the connected peer, the tag, the source region and
  // the pairs; coalesces runs; creates the transfer record.
  absl::StatusOr<PreparedPost> PreparePost(uint64_t peer_instance_id, uint64_t tag,
                                           RegionHandle src, absl::Span<const BlockPair> pairs,
                                           absl::string_view descriptor,
                                           const TransferOptions& options);

 private:
  struct Record {
    TransferState state;
    absl::Time deadline;
    std::shared_ptr<ExpectationState> exp;  // set for expectations
  };

  bool FinishLocked(TransferId id, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyDeadlineLocked(TransferId id, Record& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WaitWritersLocked(const ExpectationState& exp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string backend_;
  const uint64_t instance_id_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every finish and writer exit
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, RegionInfo> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Record> transfers_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> finished_order_ ABSL_GUARDED_BY(mu_);  // bounded history
  absl::flat_hash_map<uint64_t, std::shared_ptr<ExpectationState>> expectations_
      ABSL_GUARDED_BY(mu_);  // by tag
};

// A backend built on TransportCore: the methods every such backend answers the same way —
// its name, its endpoint (backend name, instance id, `address_`), announcements, polling and
// waiting — live here; a backend adds its data movement.
class CoreBackedTransport : public KvTransport {
 public:
  absl::string_view Name() const override { return core_.backend(); }
  std::string LocalEndpoint() const override;
  absl::StatusOr<Expectation> ExpectTransfer(uint64_t tag, RegionHandle dst,
                                             absl::Span<const BlockId> dst_blocks,
                                             const TransferOptions& options) override {
    return core_.Expect(tag, dst, dst_blocks, options);
  }
  absl::StatusOr<TransferState> Poll(TransferId id) override { return core_.Poll(id); }
  absl::StatusOr<TransferState> Wait(TransferId id, absl::Duration timeout) override {
    return core_.Wait(id, timeout);
  }

 protected:
  // `address` is what peers dial ("host:port"); a backend that learns it later sets address_
  // before the transport is shared.
  explicit CoreBackedTransport(std::string backend, std::string address = "")
      : core_(std::move(backend)), address_(std::move(address)) {}

  TransportCore core_;
  std::string address_;
};

}  // namespace pd::transport::transport_internal
