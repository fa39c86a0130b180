#include "services/tierd/nvme_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tierd/checksum.h"
#include "services/tierd/file_util.h"

namespace pd::tierd {
namespace {

constexpr char kMagic[8] = {'P', 'D', 'T', 'I', 'E', 'R', 'M', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint8_t kRecordVersion = 1;
constexpr size_t kReadChunkRecords = 16384;  // ~900 KiB per read during replay

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}

void EncodeHeader(const ManifestGeometry& g, uint8_t* out) {
  std::memset(out, 0, kManifestHeaderBytes);
  std::memcpy(out, kMagic, sizeof(kMagic));
  PutU32(out + 8, kVersion);
  PutU64(out + 16, static_cast<uint64_t>(g.block_bytes));
  PutU64(out + 24, static_cast<uint64_t>(g.slot_bytes));
  PutU64(out + 32, static_cast<uint64_t>(g.slots_per_slab));
  PutU32(out + 60, Crc32c(absl::MakeConstSpan(out, 60)));
}

bool DecodeHeader(const uint8_t* in, ManifestGeometry* g) {
  if (std::memcmp(in, kMagic, sizeof(kMagic)) != 0 || GetU32(in + 8) != kVersion ||
      GetU32(in + 60) != Crc32c(absl::MakeConstSpan(in, 60))) {
    return false;
  }
  g->block_bytes = static_cast<int64_t>(GetU64(in + 16));
  g->slot_bytes = static_cast<int64_t>(GetU64(in + 24));
  g->slots_per_slab = static_cast<int64_t>(GetU64(in + 32));
  return true;
}

// Writes all of `bytes` at `offset`. 0 or errno.
int PwriteAll(int fd, const uint8_t* bytes, size_t len, int64_t offset) {
  while (len > 0) {
    const ssize_t n = pwrite(fd, bytes, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return errno;
    }
    bytes += n;
    len -= static_cast<size_t>(n);
    offset += n;
  }
  return 0;
}

// Reads up to `len` bytes at `offset`; the count read (short only at end of file) or -errno.
ssize_t PreadFull(int fd, uint8_t* bytes, size_t len, int64_t offset) {
  size_t got = 0;
  while (got < len) {
    const ssize_t n = pread(fd, bytes + got, len - got, static_cast<off_t>(offset) + got);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return -errno;
    }
    if (n == 0) {
      break;
    }
    got += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(got);
}

// A fresh log: header only, synced.
absl::Status WriteEmptyLog(int fd, const std::string& path, const ManifestGeometry& g) {
  uint8_t header[kManifestHeaderBytes];
  EncodeHeader(g, header);
  if (ftruncate(fd, 0) != 0) {
    return FileError(errno, "truncate", path);
  }
  if (const int err = PwriteAll(fd, header, sizeof(header), 0); err != 0) {
    return FileError(err, "write", path);
  }
  if (fdatasync(fd) != 0) {
    return FileError(errno, "fdatasync", path);
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t FingerprintId(absl::string_view model_fingerprint) {
  return tier_shm::BlockChecksum(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(model_fingerprint.data()), model_fingerprint.size()));
}

void EncodeManifestRecord(const ManifestRecord& r, uint8_t* out) {
  std::memset(out, 0, kManifestRecordBytes);
  out[0] = static_cast<uint8_t>(r.type);
  out[1] = kRecordVersion;
  PutU32(out + 4, r.slot);
  const std::string hash = r.hash.ToBytes();
  std::memcpy(out + 8, hash.data(), 16);
  PutU64(out + 24, r.checksum);
  PutU64(out + 32, r.fingerprint_id);
  PutU64(out + 40, static_cast<uint64_t>(r.unix_time_ms));
  PutU32(out + 52, Crc32c(absl::MakeConstSpan(out, 52)));
}

bool DecodeManifestRecord(const uint8_t* in, ManifestRecord* r) {
  if (GetU32(in + 52) != Crc32c(absl::MakeConstSpan(in, 52)) || in[1] != kRecordVersion ||
      (in[0] != static_cast<uint8_t>(ManifestRecordType::kCommit) &&
       in[0] != static_cast<uint8_t>(ManifestRecordType::kDrop))) {
    return false;
  }
  r->type = static_cast<ManifestRecordType>(in[0]);
  r->slot = GetU32(in + 4);
  absl::StatusOr<BlockHash> hash =
      BlockHash::FromBytes(absl::string_view(reinterpret_cast<const char*>(in + 8), 16));
  r->hash = *hash;  // 16 bytes by construction
  r->checksum = GetU64(in + 24);
  r->fingerprint_id = GetU64(in + 32);
  r->unix_time_ms = static_cast<int64_t>(GetU64(in + 40));
  return true;
}

absl::StatusOr<std::unique_ptr<NvmeManifest>> NvmeManifest::Open(std::string path,
                                                                 ManifestGeometry geometry,
                                                                 bool sync,
                                                                 ManifestReplay* replay) {
  *replay = ManifestReplay{};
  ScopedFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, kPrivateFileMode));
  if (!fd.valid()) {
    return FileError(errno, "open", path);
  }
  PD_RETURN_IF_ERROR(RestrictFileMode(fd.get(), path));  // one an older tierd left 0644
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return FileError(errno, "fstat", path);
  }
  const auto size = static_cast<int64_t>(st.st_size);
  uint8_t header[kManifestHeaderBytes];
  ManifestGeometry found;
  const bool have_header =
      size >= static_cast<int64_t>(kManifestHeaderBytes) &&
      PreadFull(fd.get(), header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)) &&
      DecodeHeader(header, &found);
  if (!have_header || found != geometry) {
    replay->created = size == 0;
    replay->geometry_mismatch = size != 0;
    if (size != 0) {
      LOG(WARNING) << "nvme manifest " << path << ": "
                   << (have_header ? "written for another slab geometry" : "unreadable header")
                   << "; starting an empty store";
    }
    PD_RETURN_IF_ERROR(WriteEmptyLog(fd.get(), path, geometry));
    return std::unique_ptr<NvmeManifest>(
        new NvmeManifest(std::move(path), geometry, sync, fd.release(), kManifestHeaderBytes, 0));
  }

  // Latest standing commit per slot, with its log position for ordering.
  absl::flat_hash_map<uint32_t, std::pair<int64_t, ManifestRecord>> by_slot;
  std::vector<uint8_t> buf(kReadChunkRecords * kManifestRecordBytes);
  int64_t pos = kManifestHeaderBytes;
  int64_t good_end = kManifestHeaderBytes;
  int64_t bad_since_good = 0;
  int64_t seq = 0;
  while (pos + static_cast<int64_t>(kManifestRecordBytes) <= size) {
    const ssize_t got = PreadFull(fd.get(), buf.data(), buf.size(), pos);
    if (got < 0) {
      return FileError(static_cast<int>(-got), "read", path);
    }
    const size_t n = static_cast<size_t>(got) / kManifestRecordBytes;
    if (n == 0) {
      break;
    }
    for (size_t i = 0; i < n; ++i, pos += kManifestRecordBytes) {
      ManifestRecord r;
      if (!DecodeManifestRecord(buf.data() + i * kManifestRecordBytes, &r)) {
        ++bad_since_good;
        continue;
      }
      replay->bad_records += bad_since_good;  // bad records with a good one after them
      bad_since_good = 0;
      good_end = pos + static_cast<int64_t>(kManifestRecordBytes);
      ++replay->records;
      if (r.type == ManifestRecordType::kCommit) {
        by_slot[r.slot] = {seq++, r};
      } else if (auto it = by_slot.find(r.slot);
                 it != by_slot.end() && it->second.second.hash == r.hash) {
        by_slot.erase(it);
      }
    }
  }
  replay->torn_bytes = size - good_end;
  if (replay->torn_bytes > 0) {
    LOG(WARNING) << "nvme manifest " << path << ": cutting " << replay->torn_bytes
                 << " bytes of torn or corrupt tail after record " << replay->records;
    if (ftruncate(fd.get(), static_cast<off_t>(good_end)) != 0) {
      return FileError(errno, "truncate", path);
    }
  }
  if (replay->bad_records > 0) {
    LOG(WARNING) << "nvme manifest " << path << ": skipped " << replay->bad_records
                 << " corrupt records";
  }
  std::vector<std::pair<int64_t, ManifestRecord>> live;
  live.reserve(by_slot.size());
  for (const auto& [slot, entry] : by_slot) {
    live.push_back(entry);
  }
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  replay->live.reserve(live.size());
  for (auto& [unused_seq, r] : live) {
    replay->live.push_back(r);
  }
  const int64_t num_records =
      (good_end - static_cast<int64_t>(kManifestHeaderBytes)) / kManifestRecordBytes;
  return std::unique_ptr<NvmeManifest>(
      new NvmeManifest(std::move(path), geometry, sync, fd.release(), good_end, num_records));
}

NvmeManifest::NvmeManifest(std::string path, ManifestGeometry geometry, bool sync, int fd,
                           int64_t file_bytes, int64_t num_records)
    : path_(std::move(path)),
      geometry_(geometry),
      sync_(sync),
      fd_(fd),
      file_bytes_(file_bytes),
      num_records_(num_records) {}

NvmeManifest::~NvmeManifest() { close(fd_); }

absl::Status NvmeManifest::Append(absl::Span<const ManifestRecord> records) {
  if (records.empty()) {
    return absl::OkStatus();
  }
  std::vector<uint8_t> buf(records.size() * kManifestRecordBytes);
  for (size_t i = 0; i < records.size(); ++i) {
    EncodeManifestRecord(records[i], buf.data() + i * kManifestRecordBytes);
  }
  int err = PwriteAll(fd_, buf.data(), buf.size(), file_bytes_);
  if (err == 0 && sync_ && fdatasync(fd_) != 0) {
    err = errno;
  }
  if (err != 0) {
    // Cut a partial append off, so later appends stay record-aligned. If even that fails, the
    // next replay cuts the tail (at worst losing the records after it: their blocks are then
    // simply unknown, their slots reused).
    if (ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0) {
      LOG(WARNING) << "nvme manifest " << path_
                   << ": cannot cut a failed append back: " << std::strerror(errno);
    }
    return FileError(err, "append to", path_);
  }
  file_bytes_ += static_cast<int64_t>(buf.size());
  num_records_ += static_cast<int64_t>(records.size());
  return absl::OkStatus();
}

absl::Status NvmeManifest::Rewrite(absl::Span<const ManifestRecord> live) {
  const std::string tmp = absl::StrCat(path_, ".tmp");
  ScopedFd fd(open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, kPrivateFileMode));
  if (!fd.valid()) {
    return FileError(errno, "open", tmp);
  }
  if (absl::Status s = RestrictFileMode(fd.get(), tmp); !s.ok()) {  // a leftover .tmp
    unlink(tmp.c_str());
    return s;
  }
  std::vector<uint8_t> buf(kManifestHeaderBytes + live.size() * kManifestRecordBytes);
  EncodeHeader(geometry_, buf.data());
  for (size_t i = 0; i < live.size(); ++i) {
    EncodeManifestRecord(live[i], buf.data() + kManifestHeaderBytes + i * kManifestRecordBytes);
  }
  auto fail = [&](int err, absl::string_view op) {
    unlink(tmp.c_str());
    return FileError(err, op, tmp);
  };
  if (const int err = PwriteAll(fd.get(), buf.data(), buf.size(), 0); err != 0) {
    return fail(err, "write");
  }
  if (fdatasync(fd.get()) != 0) {
    return fail(errno, "fdatasync");
  }
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    return fail(errno, "rename");
  }
  // The new file is in place: from here on it is the log, whatever the directory sync says.
  close(fd_);
  fd_ = fd.release();
  file_bytes_ = static_cast<int64_t>(buf.size());
  num_records_ = static_cast<int64_t>(live.size());
  return SyncDir(std::filesystem::path(path_).parent_path().string());
}

}  // namespace pd::tierd
