// NvmeStore: pd-tierd's NVMe tier (G3, docs/architecture.md, "Tiers"): KV blocks in slab files of
// one directory, found again after a restart through an append-only manifest.
//
// On disk, in `dir`:
//   slab-000.dat, slab-001.dat, ...  slots_per_slab slots each (the last one may be shorter);
//                                    slot s is at byte (s % slots_per_slab) * slot_bytes of
//                                    slab s / slots_per_slab; slot_bytes = block_bytes rounded
//                                    up to the I/O alignment: the larger of O_DIRECT's (statx
//                                    STATX_DIOALIGN) and the filesystem block size, at most
//                                    4096 (4096 on ext4). The padding is never read as data.
//                                    A slab is created and preallocated (fallocate) when its
//                                    first slot is written, so the tier grows to its capacity.
//   manifest.log                     which block each slot holds (NvmeManifest: block hash,
//                                    slot, checksum, model fingerprint, time; record CRCs).
//
// I/O: O_DIRECT (no page cache: the blocks are cold by definition and DRAM is the tier above)
// through io_uring with queue_depth operations in flight, adjacent slots merged into one
// vectored operation. When io_uring_queue_init is refused (seccomp: EPERM, old kernel: ENOSYS)
// or io_backend is kPread, preadv/pwritev are used; when the filesystem refuses O_DIRECT
// (tmpfs on older kernels, some FUSE and network filesystems; probed at Open), buffered I/O.
// The mode is logged once at Open and reported by Stats().io_mode.
//
// Integrity: every read verifies the block's XXH3-64 against the checksum recorded at write;
// a mismatch drops the block, counts it (checksum_failures_total) and fails that read with
// DataLoss naming the slot. At Open the manifest is replayed: torn tail cut, corrupt records
// skipped, entries of another model fingerprint dropped (their slots reused), and, with
// verify_on_open, every block read and checked (otherwise lazily, on first read). The manifest
// is compacted (rewritten with only the live entries) when it holds more than
// compaction_factor times max(live entries, compaction_min_records) records.
//
// Capacity: capacity_blocks slots. A write into a full store evicts the least recently used
// block (LRU by last write or read) that no read is using, and records its drop.
//
// Disk full: a write failing with ENOSPC, EDQUOT or EFBIG (file-size limit) fails with
// ResourceExhausted naming the directory, and the store stops accepting spills (Stats says so,
// with the reason) for full_retry; then the next write tries again. Blocks already stored stay
// readable throughout.
//
// Buffers: a write's `data` / a read's `dst` is used in place when it starts on an O_DIRECT
// alignment boundary and spans at least slot_bytes() (DramPool slots do); otherwise the store
// copies through an aligned bounce buffer.
//
// Thread-safety: thread-safe. Metadata calls (Contains, Drop, Stats) never wait for disk I/O;
// batches of I/O run one at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "common/hash/block_hash.h"
#include "common/time/clock.h"
#include "services/tierd/nvme_manifest.h"
#include "services/tierd/slot_lru.h"

namespace pd::tierd {

class BlockIo;

// A slot of the NVMe tier, in [0, capacity_blocks).
using NvmeSlot = StrongId<struct NvmeSlotTag, uint32_t>;

// Which I/O engine to use. kAuto: io_uring when it works, else preadv/pwritev.
enum class NvmeIoBackend : uint8_t { kAuto, kPread };

struct NvmeStoreConfig {
  // Directory of the slabs and manifest; created if missing. Required.
  std::string dir;
  // Bytes of one KV block, in [1, 1 GiB] (kvcache::KvLayout::block_bytes()).
  int64_t block_bytes = 0;
  // Blocks the tier holds, in [1, 2^32 - 2].
  int64_t capacity_blocks = 0;
  // Slots per slab file, >= 1 (a slab is slots_per_slab * slot_bytes bytes).
  int64_t slots_per_slab = 256;
  // Model fingerprint (KvLayout.model_fingerprint); entries of any other are dropped at Open.
  // Non-empty.
  std::string model_fingerprint;
  NvmeIoBackend io_backend = NvmeIoBackend::kAuto;
  // false: never try O_DIRECT (buffered I/O).
  bool direct_io = true;
  // io_uring operations in flight, in [1, 4096].
  int queue_depth = 32;
  // Largest merged I/O operation, in bytes: >= 4096, a multiple of 4096. Reads are verified as
  // each operation completes, so a batch of several operations overlaps checksums with I/O;
  // but on the disk measured here (docs/benchmarks.md "Tiers") one 768 KiB operation beat three
  // of 256 KiB, so the default merges up to 1 MiB.
  int64_t max_io_bytes = int64_t{1} << 20;
  // Read and checksum every block at Open (slow for large tiers); otherwise on first read.
  bool verify_on_open = false;
  // Compaction threshold (see the class comment): factor >= 2, min_records >= 1.
  int64_t compaction_factor = 4;
  int64_t compaction_min_records = 4096;
  // fdatasync the manifest after every batch (not needed for correctness: reads verify).
  bool sync_manifest = false;
  // After a disk-full error, how long the store refuses spills before trying again. > 0.
  absl::Duration full_retry = absl::Minutes(1);

  // InvalidArgument naming the first bad field.
  absl::Status Validate() const;
};

// One block to store: `data` holds at least block_bytes (see "Buffers" above).
struct NvmeWrite {
  BlockHash hash;
  absl::Span<const uint8_t> data;
  uint64_t checksum = 0;  // XXH3-64 of data's first block_bytes, as the DRAM tier recorded it
};

// One block to load into `dst` (at least block_bytes; see "Buffers" above).
struct NvmeRead {
  BlockHash hash;
  absl::Span<uint8_t> dst;
};

// Snapshot for metrics and the Stats RPC. Gauges are current; *_total count since Open.
struct NvmeStoreStats {
  std::string io_mode;         // "io_uring+O_DIRECT", "pread+O_DIRECT", "io_uring+buffered", ...
  int64_t io_align_bytes = 0;  // I/O alignment in use (512 when buffered)
  int64_t slot_bytes = 0;      // bytes a block takes in a slab
  bool accepting_spills = true;
  std::string not_accepting_reason;  // empty while accepting
  int64_t capacity_blocks = 0;
  int64_t used_blocks = 0;  // stored + being written
  int64_t slab_files = 0;   // created so far
  uint64_t stored_blocks_total = 0;
  uint64_t evicted_blocks_total = 0;  // LRU victims of a full store
  uint64_t dropped_blocks_total = 0;  // Drop calls and checksum failures
  uint64_t hit_blocks_total = 0;      // reads that verified
  uint64_t read_bytes_total = 0;      // bytes read from the slabs
  uint64_t written_bytes_total = 0;   // bytes written to the slabs
  uint64_t checksum_failures_total = 0;
  uint64_t write_failures_total = 0;  // writes that failed (disk full included)
  uint64_t disk_full_total = 0;       // times the store stopped accepting spills
  // Manifest.
  int64_t manifest_records = 0;
  uint64_t compactions_total = 0;
  // What Open found.
  int64_t replayed_blocks = 0;         // entries restored
  int64_t replay_foreign_dropped = 0;  // entries of another model fingerprint
  int64_t replay_invalid_dropped = 0;  // slot beyond capacity or duplicate hash
  int64_t replay_corrupt_dropped = 0;  // failed verify_on_open
  int64_t replay_bad_records = 0;      // corrupt manifest records skipped
  int64_t replay_torn_bytes = 0;       // torn manifest tail cut
  // Slab space beyond the configured capacity (tierd restarted with a smaller --nvme_mib):
  // slab files past the last slab deleted, and the last slab cut to its size.
  int64_t reclaimed_slab_files = 0;
  int64_t reclaimed_bytes = 0;
};

// Where a block lives on disk (for logs, debugging and tests that damage a slab).
struct NvmeLocation {
  NvmeSlot slot;
  std::string slab_path;
  int64_t offset = 0;  // bytes into the slab
};

class NvmeStore {
 public:
  // Opens (creating) the directory, probes the I/O mode, replays the manifest. `clock` (not
  // owned, outlives the store) stamps records and times the disk-full back-off.
  //   InvalidArgument     bad config;
  //   NotFound / PermissionDenied / ResourceExhausted / Internal  the directory or manifest
  //                       cannot be created, read or written (message names the path).
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Open(NvmeStoreConfig config,
                                                         Clock* clock = Clock::Real());

  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;
  ~NvmeStore();

  // Stores `blocks` (one batch of I/O). results[i] answers blocks[i]:
  //   OK                 stored, or already stored / being stored (no second copy);
  //   InvalidArgument    data shorter than block_bytes;
  //   ResourceExhausted  disk full (names the directory; the store stops accepting spills), not
  //                      accepting spills right now, or every slot busy with reads and writes;
  //   Internal / ...     another I/O error (names the slab).
  std::vector<absl::Status> WriteBatch(absl::Span<const NvmeWrite> blocks);

  // Loads `blocks` (one batch of I/O), verifying each. results[i] answers blocks[i]: the
  // block's checksum, or
  //   NotFound         not stored (or still being written);
  //   DataLoss         checksum mismatch: the block was dropped (message names slot and slab);
  //   InvalidArgument  dst shorter than block_bytes;
  //   Internal / ...   I/O error (names the slab; the block is kept).
  std::vector<absl::StatusOr<uint64_t>> ReadBatch(absl::Span<const NvmeRead> blocks);

  // Whether `hash` is stored (not an access: LRU order unchanged).
  bool Contains(const BlockHash& hash) const;
  // The recorded checksum of a stored block.
  std::optional<uint64_t> ChecksumOf(const BlockHash& hash) const;
  // Forgets `hash` (records the drop). false when it was not stored.
  bool Drop(const BlockHash& hash);

  // Hashes of every stored block (the tier's contents, e.g. to republish an index). O(blocks).
  std::vector<BlockHash> StoredHashes() const;

  // Called with the hash of every block that leaves the store (LRU eviction of a full store,
  // checksum failure, Drop), under the store's lock: it must be quick and must not call into
  // the store. Set it once, before the store is shared between threads.
  void SetDropListener(absl::AnyInvocable<void(const BlockHash&)> listener) {
    drop_listener_ = std::move(listener);
  }

  // False while the store refuses spills after a disk-full error (see the class comment).
  bool accepting_spills() const;

  // Where a stored block is.
  std::optional<NvmeLocation> LocationOf(const BlockHash& hash) const;

  int64_t block_bytes() const { return config_.block_bytes; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t capacity_blocks() const { return config_.capacity_blocks; }
  const std::string& dir() const { return config_.dir; }

  NvmeStoreStats Stats() const;

 private:
  enum class SlotState : uint8_t { kFree, kWriting, kValid, kDropping };
  struct Slot {
    SlotState state = SlotState::kFree;
    BlockHash hash;
    uint64_t checksum = 0;
    int64_t unix_time_ms = 0;  // when it was stored (manifest records keep it)
    uint32_t readers = 0;      // ReadBatch calls using the slot's bytes
    uint32_t prev = kNone;     // LRU links, while kValid
    uint32_t next = kNone;
  };
  // A write or read admitted by phase 1 of a batch.
  struct Pending {
    size_t index = 0;  // into the caller's batch
    uint32_t slot = 0;
  };

  static constexpr uint32_t kNone = kSlotNone;

  NvmeStore(NvmeStoreConfig config, Clock* clock, bool direct, int64_t io_align);

  // Open's steps.
  void SetUpIo();
  absl::Status OpenExistingSlabs();
  // Deletes slab files numbered past the configured slabs, and cuts a last slab longer than its
  // geometry, counting what it freed (stats_.reclaimed_*) and logging it.
  absl::Status ReclaimSlabsBeyondCapacity() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status Replay();
  void VerifyAll();

  std::string SlabPath(int64_t slab) const;
  int64_t SlabBytes(int64_t slab) const;
  int64_t SlotOffset(uint32_t slot) const;
  // The slab file of `slot`, created and preallocated if needed. -1 and `*status` on failure.
  int SlabFd(uint32_t slot, absl::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  // Moves the pending blocks through the I/O engine (bounce buffers where needed): writes from
  // `writes` when `read_checksums` is null, else reads into `reads`, filling
  // (*read_checksums)[k] with the checksum of what pending[k] read. Per-pending status.
  std::vector<absl::Status> RunIo(absl::Span<const Pending> pending,
                                  absl::Span<const NvmeWrite> writes,
                                  absl::Span<const NvmeRead> reads,
                                  std::vector<uint64_t>* read_checksums) ABSL_LOCKS_EXCLUDED(mu_);

  // Metadata helpers (mu_ held).
  ManifestRecord MakeRecord(ManifestRecordType type, uint32_t slot, const BlockHash& hash,
                            uint64_t checksum) const;
  void LinkMru(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlink(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a valid block from the index and LRU; frees the slot unless a read uses it.
  void DropLocked(uint32_t slot, std::vector<ManifestRecord>* records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint32_t> AllocateSlot(std::vector<ManifestRecord>* records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshAccepting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDiskFull(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `records` to the manifest.
  absl::Status AppendRecords(const std::vector<ManifestRecord>& records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compacts when the manifest holds too many records (call once the metadata is final).
  void CompactIfDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites the manifest with the live entries only (a failure is logged and retried later).
  void Compact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NvmeStoreConfig config_;
  absl::AnyInvocable<void(const BlockHash&)> drop_listener_;  // may be empty
  const bool direct_;         // O_DIRECT (false: buffered)
  const int64_t io_align_;    // alignment of offsets, lengths and buffers (O_DIRECT)
  const int64_t slot_bytes_;  // block_bytes rounded up to io_align_
  const uint64_t fingerprint_id_;
  Clock* const clock_;
  std::string io_mode_;  // set at Open, then constant

  // Serialises I/O batches: the engine (a ring) and the slab descriptors.
  absl::Mutex io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<BlockIo> io_ ABSL_GUARDED_BY(io_mu_);
  std::vector<int> slab_fds_ ABSL_GUARDED_BY(io_mu_);  // -1 = not created yet

  mutable absl::Mutex mu_;
  std::unique_ptr<NvmeManifest> manifest_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  // Free slots, lowest first, so slabs fill in order and the tier grows one slab at a time.
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<uint32_t>> free_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockHash, uint32_t> index_ ABSL_GUARDED_BY(mu_);  // kWriting + kValid
  uint32_t lru_head_ ABSL_GUARDED_BY(mu_) = kNone;
  uint32_t lru_tail_ ABSL_GUARDED_BY(mu_) = kNone;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // kValid
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_);
  NvmeStoreStats stats_ ABSL_GUARDED_BY(mu_);  // counters; gauges filled by Stats()
  int64_t slab_files_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd::tierd
