#include "services/tierd/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tierd/block_io.h"
#include "services/tierd/dram_pool.h"
#include "services/tierd/file_util.h"
#include "services/tierd/nvme_manifest.h"

namespace pd::tierd {
namespace {

constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;
constexpr int64_t kMaxSlots = int64_t{std::numeric_limits<uint32_t>::max()} - 1;
constexpr char kManifestName[] = "manifest.log";
constexpr char kProbeName[] = ".direct-probe";
constexpr size_t kVerifyBatch = 64;

// Frees an aligned_alloc'ed buffer.
struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

// aligned_alloc needs a size that is a multiple of the alignment (C11; ASan enforces it), and
// bounce buffers of 512-byte-aligned (buffered-mode) slots need not be one: round up.
AlignedBuffer AllocAligned(size_t bytes) {
  const size_t align = static_cast<size_t>(tier_shm::kSlotAlignBytes);
  return AlignedBuffer(static_cast<uint8_t*>(
      std::aligned_alloc(align, std::max(align, (bytes + align - 1) / align * align))));
}

bool UsableInPlace(const uint8_t* p, size_t size, int64_t slot_bytes, int64_t align) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align) == 0 &&
         size >= static_cast<size_t>(slot_bytes);
}

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// O_DIRECT alignment bounds: 512 (the smallest logical block) to 4096 (any device we expect).
constexpr int64_t kMinIoAlign = 512;
constexpr int64_t kMaxIoAlign = 4096;

// Whether `dir` takes O_DIRECT, and the alignment its I/O then uses (offsets, lengths and
// buffer addresses). Some filesystems refuse O_DIRECT at open (EINVAL), others at the first
// I/O: both are tried on a scratch file. The alignment is the larger of what O_DIRECT demands
// (statx STATX_DIOALIGN, Linux 6.1+) and the filesystem block size: ext4 accepts 512-byte
// aligned O_DIRECT, but a write that is not block-aligned makes it serialise all direct I/O on
// the file and zero partial blocks (measured here: 10 KiB slots at 512-byte alignment filled
// fresh slabs ~10x slower than 12 KiB slots). 4096 when unknown.
absl::Status ProbeDirectIo(const std::string& dir, bool* direct, int64_t* align) {
  *align = kMinIoAlign;
  if (!*direct) {
    return absl::OkStatus();
  }
  const std::string probe = absl::StrCat(dir, "/", kProbeName);
  ScopedFd fd(
      open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, kPrivateFileMode));
  int err = fd.valid() ? 0 : errno;
  if (fd.valid()) {
    *align = kMaxIoAlign;
#ifdef STATX_DIOALIGN
    struct statx stx {};
    if (statx(fd.get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align > 0) {
      const int64_t want =
          std::max<int64_t>({stx.stx_dio_offset_align, stx.stx_dio_mem_align, stx.stx_blksize});
      *align =
          std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>(want)), kMinIoAlign, kMaxIoAlign);
    }
#endif
    AlignedBuffer buf = AllocAligned(kMaxIoAlign);
    std::memset(buf.get(), 0, kMaxIoAlign);
    if (pwrite(fd.get(), buf.get(), static_cast<size_t>(*align), 0) != *align) {
      err = errno;
    }
  }
  unlink(probe.c_str());
  if (err == EINVAL || err == EOPNOTSUPP) {
    LOG(WARNING) << "nvme store: " << dir
                 << " refuses O_DIRECT; using buffered I/O (blocks go through the page cache)";
    *direct = false;
    *align = kMinIoAlign;
    return absl::OkStatus();
  }
  return err == 0 ? absl::OkStatus() : FileError(err, "write", probe);
}

}  // namespace

absl::Status NvmeStoreConfig::Validate() const {
  if (dir.empty()) {
    return absl::InvalidArgumentError("nvme store: dir is required");
  }
  if (block_bytes < 1 || block_bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat("nvme store: block_bytes must be in [1, ",
                                                   kMaxBlockBytes, "], got ", block_bytes));
  }
  if (capacity_blocks < 1 || capacity_blocks > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("nvme store: capacity_blocks must be in [1, ",
                                                   kMaxSlots, "], got ", capacity_blocks));
  }
  if (slots_per_slab < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nvme store: slots_per_slab must be >= 1, got ", slots_per_slab));
  }
  if (model_fingerprint.empty()) {
    return absl::InvalidArgumentError("nvme store: model_fingerprint is required");
  }
  if (queue_depth < 1 || queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("nvme store: queue_depth must be in [1, 4096], got ", queue_depth));
  }
  if (max_io_bytes < tier_shm::kSlotAlignBytes || max_io_bytes % tier_shm::kSlotAlignBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nvme store: max_io_bytes must be a positive multiple of 4096, got ", max_io_bytes));
  }
  if (compaction_factor < 2 || compaction_min_records < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nvme store: compaction_factor must be >= 2 and compaction_min_records >= 1, got ",
        compaction_factor, " and ", compaction_min_records));
  }
  if (full_retry <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nvme store: full_retry must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(NvmeStoreConfig config, Clock* clock) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::error_code ec;
  const bool created = std::filesystem::create_directories(config.dir, ec);
  if (ec) {
    return FileError(ec.value(), "create directory", config.dir);
  }
  // Every tenant's KV lands here: tierd's user only (folder 0700, files 0600). A new folder
  // quietly; one that existed (an older tierd's) with a warning.
  if (created && chmod(config.dir.c_str(), kPrivateDirMode) != 0) {
    return FileError(errno, "chmod 0700", config.dir);
  }
  PD_RETURN_IF_ERROR(RestrictDirMode(config.dir));
  bool direct = config.direct_io;
  int64_t align = kMinIoAlign;
  PD_RETURN_IF_ERROR(ProbeDirectIo(config.dir, &direct, &align));
  std::unique_ptr<NvmeStore> store(new NvmeStore(std::move(config), clock, direct, align));
  store->SetUpIo();
  PD_RETURN_IF_ERROR(store->OpenExistingSlabs());
  PD_RETURN_IF_ERROR(store->Replay());
  if (store->config_.verify_on_open) {
    store->VerifyAll();
  }
  NvmeStoreStats s = store->Stats();
  LOG(INFO) << "nvme store: " << store->config_.dir << ", " << s.io_mode << ", "
            << s.capacity_blocks << " slots of " << store->slot_bytes_ << " bytes in slabs of "
            << store->config_.slots_per_slab << "; replayed " << s.replayed_blocks
            << " blocks (dropped " << s.replay_foreign_dropped << " foreign, "
            << s.replay_invalid_dropped << " invalid, " << s.replay_corrupt_dropped << " corrupt; "
            << s.replay_bad_records << " bad records, " << s.replay_torn_bytes << " torn bytes)";
  return store;
}

NvmeStore::NvmeStore(NvmeStoreConfig config, Clock* clock, bool direct, int64_t io_align)
    : config_(std::move(config)),
      direct_(direct),
      io_align_(io_align),
      slot_bytes_(RoundUp(config_.block_bytes, io_align)),
      fingerprint_id_(FingerprintId(config_.model_fingerprint)),
      clock_(clock),
      slots_(static_cast<size_t>(config_.capacity_blocks)) {
  const int64_t num_slabs =
      (config_.capacity_blocks + config_.slots_per_slab - 1) / config_.slots_per_slab;
  absl::MutexLock lock(&io_mu_);
  slab_fds_.assign(static_cast<size_t>(num_slabs), -1);
}

NvmeStore::~NvmeStore() {
  absl::MutexLock lock(&io_mu_);
  for (int fd : slab_fds_) {
    if (fd >= 0) {
      close(fd);
    }
  }
}

std::string NvmeStore::SlabPath(int64_t slab) const {
  return absl::StrFormat("%s/slab-%03d.dat", config_.dir, slab);
}

int64_t NvmeStore::SlabBytes(int64_t slab) const {
  const int64_t first = slab * config_.slots_per_slab;
  return std::min(config_.slots_per_slab, config_.capacity_blocks - first) * slot_bytes_;
}

int64_t NvmeStore::SlotOffset(uint32_t slot) const {
  return static_cast<int64_t>(slot) % config_.slots_per_slab * slot_bytes_;
}

void NvmeStore::SetUpIo() {
  absl::MutexLock lock(&io_mu_);
  const auto max_op = static_cast<size_t>(config_.max_io_bytes);
  if (config_.io_backend == NvmeIoBackend::kAuto) {
    absl::StatusOr<std::unique_ptr<BlockIo>> uring =
        CreateUringBlockIo(config_.queue_depth, max_op);
    if (uring.ok()) {
      io_ = *std::move(uring);
    } else {
      LOG(WARNING) << "nvme store: io_uring unavailable (" << uring.status().message()
                   << "); using preadv/pwritev";
    }
  }
  if (io_ == nullptr) {
    io_ = CreatePreadBlockIo(max_op);
  }
  io_mode_ = absl::StrCat(io_->Name(), direct_ ? "+O_DIRECT" : "+buffered");
}

absl::Status NvmeStore::ReclaimSlabsBeyondCapacity() {
  const auto num_slabs = static_cast<int64_t>(slab_fds_.size());
  int64_t files = 0;
  int64_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(config_.dir, ec)) {
    const std::string file = entry.path().filename().string();
    absl::string_view name = file;
    int64_t slab = 0;
    if (!absl::ConsumePrefix(&name, "slab-") || !absl::ConsumeSuffix(&name, ".dat") ||
        !absl::SimpleAtoi(name, &slab) || slab < 0 ||
        absl::StrFormat("slab-%03d.dat", slab) != file) {
      continue;  // not a slab file of ours (or "slab-7.dat": not how we name slab 7)
    }
    struct stat st {};
    const int64_t size = stat(entry.path().c_str(), &st) == 0 ? st.st_size : 0;
    if (slab >= num_slabs) {
      if (unlink(entry.path().c_str()) != 0) {
        return FileError(errno, "delete the slab beyond capacity", entry.path().native());
      }
      ++files;
      bytes += size;
    } else if (size > SlabBytes(slab)) {
      if (truncate(entry.path().c_str(), SlabBytes(slab)) != 0) {
        return FileError(errno, "cut the slab to capacity", entry.path().native());
      }
      bytes += size - SlabBytes(slab);
    }
  }
  if (ec) {
    return FileError(ec.value(), "list", config_.dir);
  }
  if (files > 0 || bytes > 0) {
    LOG(INFO) << "nvme store: " << config_.dir << " held slabs beyond the configured capacity ("
              << config_.capacity_blocks << " blocks in " << num_slabs << " slabs): deleted "
              << files << " slab files and freed " << bytes
              << " bytes in all; their blocks are dropped at replay";
  }
  absl::MutexLock meta(&mu_);
  stats_.reclaimed_slab_files = files;
  stats_.reclaimed_bytes = bytes;
  return absl::OkStatus();
}

absl::Status NvmeStore::OpenExistingSlabs() {
  absl::MutexLock lock(&io_mu_);
  PD_RETURN_IF_ERROR(ReclaimSlabsBeyondCapacity());
  int64_t opened = 0;
  for (size_t slab = 0; slab < slab_fds_.size(); ++slab) {
    const std::string path = SlabPath(static_cast<int64_t>(slab));
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | (direct_ ? O_DIRECT : 0));
    if (fd < 0) {
      if (errno == ENOENT) {
        continue;
      }
      return FileError(errno, "open", path);
    }
    if (absl::Status s = RestrictFileMode(fd, path); !s.ok()) {
      close(fd);
      return s;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_size < SlabBytes(static_cast<int64_t>(slab))) {
      // Shorter than this geometry wants (capacity grew, or a crash during creation): extend.
      if (ftruncate(fd, SlabBytes(static_cast<int64_t>(slab))) != 0) {
        const int err = errno;
        close(fd);
        return FileError(err, "extend", path);
      }
    }
    slab_fds_[slab] = fd;
    ++opened;
  }
  absl::MutexLock meta(&mu_);
  slab_files_ = opened;
  return absl::OkStatus();
}

int NvmeStore::SlabFd(uint32_t slot, absl::Status* status) {
  const int64_t slab = static_cast<int64_t>(slot) / config_.slots_per_slab;
  int& fd = slab_fds_[static_cast<size_t>(slab)];
  if (fd >= 0) {
    return fd;
  }
  const std::string path = SlabPath(slab);
  ScopedFd f(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (direct_ ? O_DIRECT : 0),
                  kPrivateFileMode));
  if (!f.valid()) {
    *status = FileError(errno, "create", path);
    return -1;
  }
  if (absl::Status s = RestrictFileMode(f.get(), path); !s.ok()) {  // created meanwhile
    *status = s;
    return -1;
  }
  // Preallocate, so the slab's blocks are contiguous and later writes cannot hit ENOSPC.
  int err = posix_fallocate(f.get(), 0, SlabBytes(slab));
  if (err == EOPNOTSUPP || err == EINVAL) {
    err = ftruncate(f.get(), SlabBytes(slab)) == 0 ? 0 : errno;
  }
  if (err != 0) {
    unlink(path.c_str());  // a half-allocated slab is retried next time
    *status = FileError(err, "preallocate", path);
    return -1;
  }
  // No directory fsync: if a crash loses the slab's name, its blocks read back as zeros and fail
  // their checksums (dropped), like any block whose data did not reach the disk.
  fd = f.release();
  absl::MutexLock meta(&mu_);
  ++slab_files_;
  return fd;
}

absl::Status NvmeStore::Replay() {
  ManifestReplay replay;
  const ManifestGeometry geometry{config_.block_bytes, slot_bytes_, config_.slots_per_slab};
  PD_ASSIGN_OR_RETURN(std::unique_ptr<NvmeManifest> manifest,
                      NvmeManifest::Open(absl::StrCat(config_.dir, "/", kManifestName), geometry,
                                         config_.sync_manifest, &replay));
  absl::MutexLock lock(&mu_);
  manifest_ = std::move(manifest);
  stats_.replay_bad_records = replay.bad_records;
  stats_.replay_torn_bytes = replay.torn_bytes;
  // Later entries win a duplicate hash (the block was stored again after the older copy).
  absl::flat_hash_set<uint32_t> used;
  for (auto it = replay.live.rbegin(); it != replay.live.rend(); ++it) {
    const ManifestRecord& r = *it;
    if (r.fingerprint_id != fingerprint_id_) {
      ++stats_.replay_foreign_dropped;
      continue;
    }
    if (r.slot >= slots_.size() || index_.contains(r.hash)) {
      ++stats_.replay_invalid_dropped;
      continue;
    }
    Slot& slot = slots_[r.slot];
    slot.state = SlotState::kValid;
    slot.hash = r.hash;
    slot.checksum = r.checksum;
    slot.unix_time_ms = r.unix_time_ms;
    index_.emplace(r.hash, r.slot);
    used.insert(r.slot);
  }
  // Oldest first, so the newest ends at the MRU end.
  for (const ManifestRecord& r : replay.live) {
    auto it = index_.find(r.hash);
    if (it != index_.end() && it->second == r.slot && r.fingerprint_id == fingerprint_id_) {
      LinkMru(r.slot);
      ++live_;
    }
  }
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (!used.contains(s)) {
      free_.push(s);
    }
  }
  stats_.replayed_blocks = live_;
  if (manifest_->num_records() != live_) {
    Compact();  // drops, foreign entries and overwritten commits go away now
  }
  if (replay.created) {
    LOG(INFO) << "nvme store: new manifest in " << config_.dir;
  }
  return absl::OkStatus();
}

void NvmeStore::VerifyAll() {
  std::vector<BlockHash> hashes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [hash, slot] : index_) {
      hashes.push_back(hash);
    }
  }
  AlignedBuffer buf = AllocAligned(kVerifyBatch * static_cast<size_t>(slot_bytes_));
  int64_t corrupt = 0;
  for (size_t i = 0; i < hashes.size(); i += kVerifyBatch) {
    std::vector<NvmeRead> reads;
    for (size_t j = i; j < std::min(hashes.size(), i + kVerifyBatch); ++j) {
      reads.push_back(
          NvmeRead{hashes[j], absl::MakeSpan(buf.get() + (j - i) * slot_bytes_, slot_bytes_)});
    }
    for (const absl::StatusOr<uint64_t>& r : ReadBatch(reads)) {
      corrupt += r.status().code() == absl::StatusCode::kDataLoss ? 1 : 0;
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.replay_corrupt_dropped = corrupt;
  stats_.replayed_blocks -= corrupt;
  // Verification reads are not hits.
  stats_.hit_blocks_total = 0;
  stats_.read_bytes_total = 0;
}

ManifestRecord NvmeStore::MakeRecord(ManifestRecordType type, uint32_t slot, const BlockHash& hash,
                                     uint64_t checksum) const {
  ManifestRecord r;
  r.type = type;
  r.slot = slot;
  r.hash = hash;
  r.checksum = checksum;
  r.fingerprint_id = fingerprint_id_;
  r.unix_time_ms = absl::ToUnixMillis(clock_->Now());
  return r;
}

void NvmeStore::LinkMru(uint32_t s) { SlotLruLinkFront(slots_, s, lru_head_, lru_tail_); }

void NvmeStore::Unlink(uint32_t s) { SlotLruUnlink(slots_, s, lru_head_, lru_tail_); }

void NvmeStore::FreeSlot(uint32_t s) {
  slots_[s] = Slot{};
  free_.push(s);
}

void NvmeStore::DropLocked(uint32_t s, std::vector<ManifestRecord>* records) {
  Slot& slot = slots_[s];
  records->push_back(MakeRecord(ManifestRecordType::kDrop, s, slot.hash, 0));
  if (drop_listener_) {
    drop_listener_(slot.hash);
  }
  Unlink(s);
  index_.erase(slot.hash);
  --live_;
  if (slot.readers > 0) {
    slot.state = SlotState::kDropping;  // the last reader frees it
  } else {
    FreeSlot(s);
  }
}

std::optional<uint32_t> NvmeStore::AllocateSlot(std::vector<ManifestRecord>* records) {
  if (free_.empty()) {
    // Full: the coldest block nobody is reading makes room.
    uint32_t s = lru_tail_;
    while (s != kNone && slots_[s].readers > 0) {
      s = slots_[s].prev;
    }
    if (s == kNone) {
      return std::nullopt;
    }
    VLOG(2) << "nvme store: evicting " << slots_[s].hash.ToHex() << " from slot " << s;
    DropLocked(s, records);
    ++stats_.evicted_blocks_total;
  }
  const uint32_t s = free_.top();
  free_.pop();
  return s;
}

void NvmeStore::RefreshAccepting() {
  if (!accepting_ && clock_->Now() >= retry_at_) {
    LOG(INFO) << "nvme store: " << config_.dir << ": retrying spills after disk full";
    accepting_ = true;
    stats_.not_accepting_reason.clear();
  }
}

void NvmeStore::MarkDiskFull(const absl::Status& cause) {
  if (!accepting_) {
    return;
  }
  accepting_ = false;
  retry_at_ = clock_->Now() + config_.full_retry;
  ++stats_.disk_full_total;
  stats_.not_accepting_reason = absl::StrCat("disk full in ", config_.dir, " (", cause.message(),
                                             "); retrying after ", absl::FormatTime(retry_at_));
  LOG(ERROR) << "nvme store: not accepting spills: " << stats_.not_accepting_reason;
}

void NvmeStore::Compact() {
  const int64_t live = live_;
  std::vector<ManifestRecord> records;
  records.reserve(static_cast<size_t>(live));
  // Oldest first, so a replay rebuilds the same LRU order.
  for (uint32_t s = lru_tail_; s != kNone; s = slots_[s].prev) {
    const Slot& slot = slots_[s];
    ManifestRecord r = MakeRecord(ManifestRecordType::kCommit, s, slot.hash, slot.checksum);
    r.unix_time_ms = slot.unix_time_ms;  // keep when it was stored
    records.push_back(r);
  }
  const int64_t before = manifest_->num_records();
  if (absl::Status s = manifest_->Rewrite(records); !s.ok()) {
    LOG(WARNING) << "nvme store: manifest compaction failed (will retry): " << s;
    return;
  }
  ++stats_.compactions_total;
  VLOG(1) << "nvme store: compacted manifest from " << before << " to " << records.size()
          << " records";
}

absl::Status NvmeStore::AppendRecords(const std::vector<ManifestRecord>& records) {
  return manifest_->Append(records);
}

void NvmeStore::CompactIfDue() {
  if (manifest_->num_records() >
      config_.compaction_factor * std::max(live_, config_.compaction_min_records)) {
    Compact();
  }
}

std::vector<absl::Status> NvmeStore::RunIo(absl::Span<const Pending> pending,
                                           absl::Span<const NvmeWrite> writes,
                                           absl::Span<const NvmeRead> reads,
                                           std::vector<uint64_t>* read_checksums) {
  const bool write = read_checksums == nullptr;
  std::vector<absl::Status> results(pending.size());
  // In buffered mode any buffer works and exactly block_bytes move; with O_DIRECT a buffer not
  // usable in place goes through a bounce slot.
  const size_t io_bytes = static_cast<size_t>(direct_ ? slot_bytes_ : config_.block_bytes);
  std::vector<size_t> bounce_of(pending.size(), SIZE_MAX);
  size_t num_bounce = 0;
  for (size_t i = 0; i < pending.size(); ++i) {
    const uint8_t* p =
        write ? writes[pending[i].index].data.data() : reads[pending[i].index].dst.data();
    const size_t size =
        write ? writes[pending[i].index].data.size() : reads[pending[i].index].dst.size();
    if (direct_ && !UsableInPlace(p, size, slot_bytes_, io_align_)) {
      bounce_of[i] = num_bounce++;
    }
  }
  AlignedBuffer bounce;  // slot_bytes_ is a multiple of io_align_, so every bounce slot is aligned
  if (num_bounce > 0) {
    bounce = AllocAligned(num_bounce * static_cast<size_t>(slot_bytes_));
  }
  auto buffer_of = [&](size_t i) -> uint8_t* {
    if (bounce_of[i] != SIZE_MAX) {
      return bounce.get() + bounce_of[i] * static_cast<size_t>(slot_bytes_);
    }
    return write ? const_cast<uint8_t*>(writes[pending[i].index].data.data())
                 : reads[pending[i].index].dst.data();
  };
  if (write) {
    for (size_t i = 0; i < pending.size(); ++i) {
      if (bounce_of[i] != SIZE_MAX) {
        uint8_t* b = buffer_of(i);
        std::memcpy(b, writes[pending[i].index].data.data(), config_.block_bytes);
        std::memset(b + config_.block_bytes, 0, slot_bytes_ - config_.block_bytes);
      }
    }
  }
  std::vector<IoRequest> requests;
  std::vector<size_t> request_of(pending.size(), SIZE_MAX);
  std::vector<size_t> pending_of;  // inverse of request_of
  // A read block is checksummed as soon as its operation completes, while the batch's other
  // operations are still in flight.
  auto on_done = [&](size_t r) {
    const size_t i = pending_of[r];
    if (write || requests[r].result != 0) {
      return;
    }
    absl::Span<uint8_t> dst = reads[pending[i].index].dst;
    if (bounce_of[i] != SIZE_MAX) {
      std::memcpy(dst.data(), buffer_of(i), static_cast<size_t>(config_.block_bytes));
    }
    (*read_checksums)[i] =
        tier_shm::BlockChecksum(dst.subspan(0, static_cast<size_t>(config_.block_bytes)));
  };
  if (!write) {
    read_checksums->assign(pending.size(), 0);
  }
  {
    absl::MutexLock lock(&io_mu_);
    for (size_t i = 0; i < pending.size(); ++i) {
      const int fd = SlabFd(pending[i].slot, &results[i]);
      if (fd < 0) {
        continue;
      }
      request_of[i] = requests.size();
      pending_of.push_back(i);
      requests.push_back(IoRequest{fd, SlotOffset(pending[i].slot), buffer_of(i), io_bytes, 0});
    }
    io_->Run(absl::MakeSpan(requests), write, on_done);
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    if (request_of[i] == SIZE_MAX) {
      continue;
    }
    const int res = requests[request_of[i]].result;
    const uint32_t slot = pending[i].slot;
    if (res < 0) {
      results[i] = FileError(-res, write ? "write" : "read",
                             absl::StrCat(SlabPath(slot / config_.slots_per_slab), " slot ", slot));
    }
  }
  return results;
}

std::vector<absl::Status> NvmeStore::WriteBatch(absl::Span<const NvmeWrite> blocks) {
  std::vector<absl::Status> results(blocks.size());
  std::vector<Pending> pending;
  std::vector<ManifestRecord> records;
  {
    absl::MutexLock lock(&mu_);
    RefreshAccepting();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const NvmeWrite& w = blocks[i];
      if (w.data.size() < static_cast<size_t>(config_.block_bytes)) {
        results[i] = absl::InvalidArgumentError(
            absl::StrCat("nvme write of ", w.hash.ToHex(), ": ", w.data.size(),
                         " bytes given, block is ", config_.block_bytes));
        continue;
      }
      if (auto it = index_.find(w.hash); it != index_.end()) {
        // Stored or being stored (also a duplicate within the batch): no second copy, but a
        // stored one counts as used now.
        if (slots_[it->second].state == SlotState::kValid) {
          Unlink(it->second);
          LinkMru(it->second);
        }
        continue;
      }
      if (!accepting_) {
        results[i] = absl::ResourceExhaustedError(
            absl::StrCat("nvme store not accepting spills: ", stats_.not_accepting_reason));
        continue;
      }
      std::optional<uint32_t> slot = AllocateSlot(&records);
      if (!slot.has_value()) {
        results[i] = absl::ResourceExhaustedError(absl::StrCat("nvme store ", config_.dir, ": all ",
                                                               slots_.size(),
                                                               " slots are being read or written"));
        continue;
      }
      Slot& s = slots_[*slot];
      s.state = SlotState::kWriting;
      s.hash = w.hash;
      s.checksum = w.checksum;
      s.unix_time_ms = absl::ToUnixMillis(clock_->Now());
      index_.emplace(w.hash, *slot);
      pending.push_back(Pending{i, *slot});
    }
  }
  std::vector<absl::Status> io = RunIo(pending, blocks, {}, /*read_checksums=*/nullptr);
  absl::MutexLock lock(&mu_);
  std::vector<size_t> stored;  // into pending
  for (size_t k = 0; k < pending.size(); ++k) {
    const uint32_t s = pending[k].slot;
    if (io[k].ok()) {
      records.push_back(
          MakeRecord(ManifestRecordType::kCommit, s, slots_[s].hash, slots_[s].checksum));
      stored.push_back(k);
      continue;
    }
    index_.erase(slots_[s].hash);
    FreeSlot(s);
    ++stats_.write_failures_total;
    if (io[k].code() == absl::StatusCode::kResourceExhausted) {
      MarkDiskFull(io[k]);
      results[pending[k].index] = absl::ResourceExhaustedError(absl::StrCat(
          "nvme store ", config_.dir, ": disk full, not accepting spills (", io[k].message(), ")"));
    } else {
      results[pending[k].index] = io[k];
    }
  }
  if (absl::Status append = AppendRecords(records); !append.ok()) {
    // The bytes are on disk but no record says so: forget them (the slots get reused).
    const absl::Status failure =
        append.code() == absl::StatusCode::kResourceExhausted
            ? absl::ResourceExhaustedError(absl::StrCat("nvme store ", config_.dir,
                                                        ": disk full, not accepting spills (",
                                                        append.message(), ")"))
            : append;
    for (size_t k : stored) {
      const uint32_t s = pending[k].slot;
      results[pending[k].index] = failure;
      index_.erase(slots_[s].hash);
      FreeSlot(s);
      ++stats_.write_failures_total;
    }
    if (append.code() == absl::StatusCode::kResourceExhausted) {
      MarkDiskFull(append);
    }
    return results;
  }
  for (size_t k : stored) {
    const uint32_t s = pending[k].slot;
    slots_[s].state = SlotState::kValid;
    LinkMru(s);
    ++live_;
    ++stats_.stored_blocks_total;
    stats_.written_bytes_total +=
        static_cast<uint64_t>(direct_ ? slot_bytes_ : config_.block_bytes);
  }
  CompactIfDue();  // after the batch's blocks are live, so the rewrite includes them
  return results;
}

std::vector<absl::StatusOr<uint64_t>> NvmeStore::ReadBatch(absl::Span<const NvmeRead> blocks) {
  std::vector<absl::StatusOr<uint64_t>> results(blocks.size(), uint64_t{0});
  std::vector<Pending> pending;
  std::vector<uint64_t> expected;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const NvmeRead& r = blocks[i];
      if (r.dst.size() < static_cast<size_t>(config_.block_bytes)) {
        results[i] = absl::InvalidArgumentError(
            absl::StrCat("nvme read of ", r.hash.ToHex(), ": ", r.dst.size(),
                         " bytes of room, block is ", config_.block_bytes));
        continue;
      }
      auto it = index_.find(r.hash);
      if (it == index_.end() || slots_[it->second].state != SlotState::kValid) {
        results[i] =
            absl::NotFoundError(absl::StrCat("nvme block ", r.hash.ToHex(), " is not stored"));
        continue;
      }
      const uint32_t s = it->second;
      ++slots_[s].readers;
      Unlink(s);
      LinkMru(s);
      pending.push_back(Pending{i, s});
      expected.push_back(slots_[s].checksum);
    }
  }
  std::vector<uint64_t> actual;  // checksums of what was read, computed as reads complete
  std::vector<absl::Status> io = RunIo(pending, {}, blocks, &actual);
  absl::MutexLock lock(&mu_);
  std::vector<ManifestRecord> records;
  for (size_t k = 0; k < pending.size(); ++k) {
    const uint32_t s = pending[k].slot;
    Slot& slot = slots_[s];
    --slot.readers;
    const bool still_ours =
        slot.state == SlotState::kValid && slot.hash == blocks[pending[k].index].hash;
    if (!io[k].ok()) {
      results[pending[k].index] = io[k];
    } else if (actual[k] != expected[k]) {
      ++stats_.checksum_failures_total;
      results[pending[k].index] = absl::DataLossError(absl::StrFormat(
          "nvme block %s in slot %d (%s offset %d): checksum mismatch (recorded %016x, read "
          "%016x); block dropped",
          blocks[pending[k].index].hash.ToHex(), s, SlabPath(s / config_.slots_per_slab),
          SlotOffset(s), expected[k], actual[k]));
      LOG(WARNING) << results[pending[k].index].status().message();
      if (still_ours) {
        DropLocked(s, &records);
        ++stats_.dropped_blocks_total;
      }
    } else {
      results[pending[k].index] = actual[k];
      ++stats_.hit_blocks_total;
      stats_.read_bytes_total += static_cast<uint64_t>(direct_ ? slot_bytes_ : config_.block_bytes);
    }
    if (slot.state == SlotState::kDropping && slot.readers == 0) {
      FreeSlot(s);
    }
  }
  if (absl::Status s = AppendRecords(records); !s.ok()) {
    // Without the drop record a restart brings the entry back; its next read fails and drops
    // it again, so this costs a read, never wrong bytes.
    LOG(WARNING) << "nvme store: cannot record dropped blocks: " << s;
  }
  CompactIfDue();
  return results;
}

bool NvmeStore::Contains(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  return it != index_.end() && slots_[it->second].state == SlotState::kValid;
}

std::optional<uint64_t> NvmeStore::ChecksumOf(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != SlotState::kValid) {
    return std::nullopt;
  }
  return slots_[it->second].checksum;
}

std::vector<BlockHash> NvmeStore::StoredHashes() const {
  absl::MutexLock lock(&mu_);
  std::vector<BlockHash> out;
  out.reserve(index_.size());
  for (const auto& [hash, slot] : index_) {
    if (slots_[slot].state == SlotState::kValid) {
      out.push_back(hash);
    }
  }
  return out;
}

bool NvmeStore::Drop(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != SlotState::kValid) {
    return false;
  }
  std::vector<ManifestRecord> records;
  DropLocked(it->second, &records);
  ++stats_.dropped_blocks_total;
  if (absl::Status s = AppendRecords(records); !s.ok()) {
    LOG(WARNING) << "nvme store: cannot record a dropped block: " << s;
  }
  CompactIfDue();
  return true;
}

bool NvmeStore::accepting_spills() const {
  absl::MutexLock lock(&mu_);
  return accepting_ || clock_->Now() >= retry_at_;
}

std::optional<NvmeLocation> NvmeStore::LocationOf(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != SlotState::kValid) {
    return std::nullopt;
  }
  const uint32_t s = it->second;
  return NvmeLocation{NvmeSlot(s), SlabPath(s / config_.slots_per_slab), SlotOffset(s)};
}

NvmeStoreStats NvmeStore::Stats() const {
  absl::MutexLock lock(&mu_);
  NvmeStoreStats stats = stats_;
  stats.io_mode = io_mode_;
  stats.io_align_bytes = io_align_;
  stats.slot_bytes = slot_bytes_;
  stats.accepting_spills = accepting_;
  stats.capacity_blocks = config_.capacity_blocks;
  stats.used_blocks = static_cast<int64_t>(slots_.size() - free_.size());
  stats.slab_files = slab_files_;
  stats.manifest_records = manifest_ != nullptr ? manifest_->num_records() : 0;
  return stats;
}

}  // namespace pd::tierd
