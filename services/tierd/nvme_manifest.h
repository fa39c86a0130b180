// NvmeManifest: the append-only log that says which block each NVMe slot holds, so pd-tierd
// finds its NVMe blocks again after a restart (issue #6 item 5). Internal to NvmeStore.
//
// File (little-endian):
//   header, 64 bytes: "PDTIERM1" | u32 version (1) | u32 0 | u64 block_bytes | u64 slot_bytes |
//                     u64 slots_per_slab | 20 zero bytes | u32 CRC-32C of bytes [0, 60)
//   records, 56 bytes each:
//     u8 type (1 commit, 2 drop) | u8 version (1) | u16 0 | u32 slot | 16 bytes block hash
//     (BlockHash::ToBytes) | u64 checksum (XXH3-64 of the block) | u64 fingerprint id (XXH3-64
//     of the model fingerprint string) | i64 unix time (ms) | u32 0 | u32 CRC-32C of [0, 52)
//
// A commit record says "slot S holds block H with checksum C for model F since T"; a later
// commit of the same slot replaces it; a drop record for (S, H) removes it. Replay keeps, per
// slot, the last commit not followed by its drop. Records are fixed-size, so a record with a
// bad CRC is skipped without losing its successors, and a torn tail (a crash in the middle of
// an append) is cut off: the file is truncated to the end of its last good record. The header
// fixes the slab geometry; a manifest written for another geometry replays as empty.
//
// Nothing here depends on durability ordering: NvmeStore verifies every block's checksum when
// it reads it, so a record that outlived its data (or data that outlived its record) costs at
// most one failed read, never wrong bytes.
//
// Thread-safety: thread-compatible (NvmeStore calls it under its mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"

namespace pd::tierd {

inline constexpr size_t kManifestHeaderBytes = 64;
inline constexpr size_t kManifestRecordBytes = 56;

enum class ManifestRecordType : uint8_t { kCommit = 1, kDrop = 2 };

struct ManifestRecord {
  ManifestRecordType type = ManifestRecordType::kCommit;
  uint32_t slot = 0;
  BlockHash hash;
  uint64_t checksum = 0;        // meaningful for kCommit
  uint64_t fingerprint_id = 0;  // FingerprintId(model fingerprint)
  int64_t unix_time_ms = 0;

  friend bool operator==(const ManifestRecord&, const ManifestRecord&) = default;
};

// The slab geometry a manifest was written for.
struct ManifestGeometry {
  int64_t block_bytes = 0;
  int64_t slot_bytes = 0;
  int64_t slots_per_slab = 0;

  friend bool operator==(const ManifestGeometry&, const ManifestGeometry&) = default;
};

// What Open found.
struct ManifestReplay {
  // Commit records standing after replay, one per slot, in log order (oldest first).
  std::vector<ManifestRecord> live;
  int64_t records = 0;      // good records read (commits and drops)
  int64_t bad_records = 0;  // records with a bad CRC or type before the last good one: skipped
  int64_t torn_bytes = 0;   // bytes after the last good record: truncated away
  bool created = false;     // there was no manifest (or an empty one): a new store
  bool geometry_mismatch = false;  // header unreadable or for another geometry: started empty
};

// XXH3-64 of a model fingerprint, the form records carry.
uint64_t FingerprintId(absl::string_view model_fingerprint);

// The 56-byte encoding of `record`, and its inverse (false when the CRC, type or version is
// wrong). Exposed for tests.
void EncodeManifestRecord(const ManifestRecord& record, uint8_t* out);
bool DecodeManifestRecord(const uint8_t* in, ManifestRecord* record);

class NvmeManifest {
 public:
  // Opens (or creates) the manifest at `path` for `geometry` and replays it into `*replay`.
  // The file is truncated to its good part, or reset to an empty log (header only) when it was
  // missing, unreadable or for another geometry. `sync`: fdatasync after every append.
  // Errors (open, read, write, truncate) carry the path; ResourceExhausted for ENOSPC/EFBIG.
  static absl::StatusOr<std::unique_ptr<NvmeManifest>> Open(std::string path,
                                                            ManifestGeometry geometry, bool sync,
                                                            ManifestReplay* replay);

  NvmeManifest(const NvmeManifest&) = delete;
  NvmeManifest& operator=(const NvmeManifest&) = delete;
  ~NvmeManifest();

  // Appends `records` with one write. On failure the file is cut back to its previous end, so a
  // failed append never leaves a torn record in front of later ones. ResourceExhausted (naming
  // the path) for ENOSPC, EDQUOT and EFBIG; Internal for other errors.
  absl::Status Append(absl::Span<const ManifestRecord> records);

  // Compaction: atomically replaces the log with a header and `live` (written to a temporary
  // file, synced, renamed over, directory synced). On failure the old log stays in use.
  absl::Status Rewrite(absl::Span<const ManifestRecord> live);

  // Records in the file now.
  int64_t num_records() const { return num_records_; }
  const std::string& path() const { return path_; }

 private:
  NvmeManifest(std::string path, ManifestGeometry geometry, bool sync, int fd, int64_t file_bytes,
               int64_t num_records);

  const std::string path_;
  const ManifestGeometry geometry_;
  const bool sync_;
  int fd_;
  int64_t file_bytes_;
  int64_t num_records_;
};

}  // namespace pd::tierd
