#include "services/tierd/nvme_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log/log.h"
#include "common/testing/temp_dir.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tierd/block_io.h"
#include "services/tierd/dram_pool.h"

namespace pd::tierd {
namespace {

BlockHash H(uint64_t i) { return BlockHash{0x1234 + i, i * 0x9e3779b97f4a7c15ull}; }

// 4096-aligned memory for `n` slots (the zero-copy path), freed on destruction.
class AlignedSlots {
 public:
  AlignedSlots(size_t n, size_t slot_bytes)
      : slot_bytes_(slot_bytes),
        // aligned_alloc's size must be a multiple of the alignment.
        data_(static_cast<uint8_t*>(
            std::aligned_alloc(4096, (n * slot_bytes + 4095) / 4096 * 4096))) {
    std::memset(data_, 0, n * slot_bytes);
  }
  ~AlignedSlots() { std::free(data_); }
  AlignedSlots(const AlignedSlots&) = delete;
  AlignedSlots& operator=(const AlignedSlots&) = delete;
  absl::Span<uint8_t> Slot(size_t i) {
    return absl::MakeSpan(data_ + i * slot_bytes_, slot_bytes_);
  }

 private:
  size_t slot_bytes_;
  uint8_t* data_;
};

void FillBlock(const BlockHash& hash, absl::Span<uint8_t> out, size_t block_bytes) {
  uint64_t x = hash.high ^ (hash.low * 3);
  for (size_t i = 0; i < block_bytes; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<uint8_t>(x >> 56);
  }
}

class NvmeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create("pd-tierd-nvme-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<testing::TempDir>(*std::move(dir));
  }

  NvmeStoreConfig Config(int64_t block_bytes = 10240, int64_t capacity = 512,
                         int64_t slots_per_slab = 64) {
    NvmeStoreConfig c;
    c.dir = dir_->File("g3");
    c.block_bytes = block_bytes;
    c.capacity_blocks = capacity;
    c.slots_per_slab = slots_per_slab;
    c.model_fingerprint = "model-a";
    c.queue_depth = 8;
    return c;
  }

  std::unique_ptr<NvmeStore> Open(const NvmeStoreConfig& config) {
    absl::StatusOr<std::unique_ptr<NvmeStore>> store = NvmeStore::Open(config, &clock_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Writes blocks first..first+n in batches of `batch` from aligned memory; all must succeed.
  void WriteBlocks(NvmeStore& store, uint64_t first, int n, int batch = 64) {
    const size_t block = static_cast<size_t>(store.block_bytes());
    AlignedSlots mem(static_cast<size_t>(batch), static_cast<size_t>(store.slot_bytes()));
    for (int done = 0; done < n; done += batch) {
      std::vector<NvmeWrite> writes;
      for (int k = 0; k < std::min(batch, n - done); ++k) {
        const BlockHash h = H(first + done + k);
        FillBlock(h, mem.Slot(k), block);
        writes.push_back(
            NvmeWrite{h, mem.Slot(k), tier_shm::BlockChecksum(mem.Slot(k).subspan(0, block))});
      }
      std::vector<absl::Status> results = store.WriteBatch(writes);
      for (size_t k = 0; k < results.size(); ++k) {
        ASSERT_TRUE(results[k].ok()) << "block " << first + done + k << ": " << results[k];
      }
    }
  }

  // Reads block `i` into unaligned memory (the bounce path) and checks its bytes.
  absl::Status ReadAndCheck(NvmeStore& store, uint64_t i) {
    const size_t block = static_cast<size_t>(store.block_bytes());
    std::vector<uint8_t> got(block + 1);
    std::vector<uint8_t> want(block);
    FillBlock(H(i), absl::MakeSpan(want), block);
    const NvmeRead read{H(i), absl::MakeSpan(got).subspan(1)};  // deliberately misaligned
    std::vector<absl::StatusOr<uint64_t>> results = store.ReadBatch({&read, 1});
    if (!results[0].ok()) {
      return results[0].status();
    }
    if (*results[0] != tier_shm::BlockChecksum(want) ||
        std::memcmp(got.data() + 1, want.data(), block) != 0) {
      return absl::InternalError(absl::StrCat("block ", i, " came back different"));
    }
    return absl::OkStatus();
  }

  // Reads blocks first..first+n in one aligned batch and checks every byte.
  void ReadBlocksAligned(NvmeStore& store, uint64_t first, int n) {
    const size_t block = static_cast<size_t>(store.block_bytes());
    AlignedSlots mem(static_cast<size_t>(n), static_cast<size_t>(store.slot_bytes()));
    std::vector<NvmeRead> reads;
    for (int k = 0; k < n; ++k) {
      reads.push_back(NvmeRead{H(first + k), mem.Slot(k)});
    }
    std::vector<absl::StatusOr<uint64_t>> results = store.ReadBatch(reads);
    std::vector<uint8_t> want(block);
    for (int k = 0; k < n; ++k) {
      ASSERT_TRUE(results[k].ok()) << "block " << first + k << ": " << results[k].status();
      FillBlock(H(first + k), absl::MakeSpan(want), block);
      ASSERT_EQ(std::memcmp(mem.Slot(k).data(), want.data(), block), 0) << "block " << first + k;
      EXPECT_EQ(*results[k], tier_shm::BlockChecksum(want));
    }
  }

  FakeClock clock_;
  std::unique_ptr<testing::TempDir> dir_;
};

bool UringWorksHere() { return CreateUringBlockIo(4, 1 << 20).ok(); }

TEST_F(NvmeStoreTest, RoundTripManyBlocksThroughIoUring) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  const NvmeStoreStats before = store->Stats();
  if (UringWorksHere()) {
    EXPECT_TRUE(absl::StartsWith(before.io_mode, "io_uring+")) << before.io_mode;
  }
  WriteBlocks(*store, 0, 300);
  ReadBlocksAligned(*store, 0, 64);
  ReadBlocksAligned(*store, 64, 236);
  for (uint64_t i : {0, 63, 64, 150, 299}) {
    EXPECT_TRUE(ReadAndCheck(*store, i).ok()) << i;
  }
  const NvmeStoreStats stats = store->Stats();
  EXPECT_EQ(stats.used_blocks, 300);
  EXPECT_EQ(stats.stored_blocks_total, 300u);
  EXPECT_EQ(stats.slab_files, 5);  // 300 blocks in slabs of 64
  EXPECT_EQ(stats.hit_blocks_total, 305u);
  EXPECT_EQ(stats.checksum_failures_total, 0u);
  EXPECT_TRUE(std::filesystem::exists(dir_->File("g3/slab-004.dat")));
  EXPECT_FALSE(std::filesystem::exists(dir_->File("g3/slab-005.dat")));
  // 10240-byte blocks take 12288 bytes with 4096-byte alignment (ext4), 10240 with 512 or
  // 1024 (filesystems with smaller blocks).
  EXPECT_EQ(stats.slot_bytes % stats.io_align_bytes, 0);
  EXPECT_GE(stats.slot_bytes, 10240);
  EXPECT_LE(stats.slot_bytes, 12288);
  EXPECT_EQ(std::filesystem::file_size(dir_->File("g3/slab-000.dat")), 64u * stats.slot_bytes);
}

TEST_F(NvmeStoreTest, RoundTripThroughForcedPreadFallback) {
  NvmeStoreConfig config = Config(524288, 200, 32);  // 1B-like blocks: 512 KiB
  config.io_backend = NvmeIoBackend::kPread;
  auto store = Open(config);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(absl::StartsWith(store->Stats().io_mode, "pread+")) << store->Stats().io_mode;
  WriteBlocks(*store, 0, 100, 16);
  ReadBlocksAligned(*store, 0, 100);
  EXPECT_TRUE(ReadAndCheck(*store, 42).ok());
}

TEST_F(NvmeStoreTest, RoundTripWithBufferedIo) {
  NvmeStoreConfig config = Config(5000, 64, 16);  // not a multiple of 4096
  config.direct_io = false;
  auto store = Open(config);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(absl::EndsWith(store->Stats().io_mode, "+buffered")) << store->Stats().io_mode;
  WriteBlocks(*store, 0, 50, 7);
  ReadBlocksAligned(*store, 0, 50);
  EXPECT_TRUE(ReadAndCheck(*store, 49).ok());
}

TEST_F(NvmeStoreTest, UnalignedWriteBuffersGoThroughABounceBuffer) {
  auto store = Open(Config(6000, 16, 8));
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> data(6000 + 3);
  absl::Span<uint8_t> block = absl::MakeSpan(data).subspan(3);
  FillBlock(H(1), block, 6000);
  const NvmeWrite w{H(1), block, tier_shm::BlockChecksum(block)};
  ASSERT_TRUE(store->WriteBatch({&w, 1})[0].ok());
  EXPECT_TRUE(ReadAndCheck(*store, 1).ok());
  // Too short a buffer is refused, for writes and reads.
  const NvmeWrite short_write{H(2), block.subspan(0, 100), 0};
  EXPECT_EQ(store->WriteBatch({&short_write, 1})[0].code(), absl::StatusCode::kInvalidArgument);
  const NvmeRead short_read{H(1), block.subspan(0, 100)};
  EXPECT_EQ(store->ReadBatch({&short_read, 1})[0].status().code(),
            absl::StatusCode::kInvalidArgument);
  const NvmeRead missing{H(99), block};
  EXPECT_EQ(store->ReadBatch({&missing, 1})[0].status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NvmeStoreTest, WritingAStoredBlockAgainIsANoOp) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  WriteBlocks(*store, 0, 3);
  WriteBlocks(*store, 0, 3);
  EXPECT_EQ(store->Stats().stored_blocks_total, 3u);
  EXPECT_EQ(store->Stats().used_blocks, 3);
}

TEST_F(NvmeStoreTest, ReopenReplaysTheManifest) {
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    WriteBlocks(*store, 0, 100);
    for (uint64_t i = 0; i < 10; ++i) {
      EXPECT_TRUE(store->Drop(H(i)));
    }
    EXPECT_FALSE(store->Drop(H(5)));
  }
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  const NvmeStoreStats stats = store->Stats();
  EXPECT_EQ(stats.replayed_blocks, 90);
  EXPECT_EQ(stats.used_blocks, 90);
  EXPECT_EQ(stats.manifest_records, 90);  // drops compacted away at open
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_FALSE(store->Contains(H(i)));
  }
  ReadBlocksAligned(*store, 10, 90);
  // Freed slots are reused, and the tier keeps working after the restart.
  WriteBlocks(*store, 1000, 20);
  ReadBlocksAligned(*store, 1000, 20);
  EXPECT_EQ(store->Stats().slab_files, 2);
}

// tierd restarted with a smaller --nvme_mib: the slab files past the new last slab are deleted
// and the last slab is cut to its size at open (not left on disk), and what is still in range
// keeps serving.
TEST_F(NvmeStoreTest, ShrunkCapacityReclaimsSlabSpaceBeyondIt) {
  int64_t slot_bytes = 0;
  {
    auto store = Open(Config(10240, /*capacity=*/64, /*slots_per_slab=*/16));
    ASSERT_NE(store, nullptr);
    WriteBlocks(*store, 0, 64);
    slot_bytes = store->slot_bytes();
    ASSERT_EQ(store->Stats().slab_files, 4);
    EXPECT_EQ(store->Stats().reclaimed_slab_files, 0);
  }
  const std::string dir = dir_->File("g3");
  std::ofstream(dir + "/slab-7.dat") << "not ours";  // not how slab 7 is named: left alone
  auto store = Open(Config(10240, /*capacity=*/20, /*slots_per_slab=*/16));
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(std::filesystem::exists(dir + "/slab-000.dat"));
  EXPECT_EQ(std::filesystem::file_size(dir + "/slab-001.dat"),
            static_cast<uintmax_t>(4 * slot_bytes));
  EXPECT_FALSE(std::filesystem::exists(dir + "/slab-002.dat"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/slab-003.dat"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/slab-7.dat"));
  const NvmeStoreStats stats = store->Stats();
  EXPECT_EQ(stats.reclaimed_slab_files, 2);
  EXPECT_EQ(stats.reclaimed_bytes, (2 * 16 + 12) * slot_bytes);
  EXPECT_EQ(stats.replayed_blocks, 20);
  EXPECT_EQ(stats.replay_invalid_dropped, 44);
  // The tier keeps working in its new size.
  WriteBlocks(*store, 1000, 20);
  ReadBlocksAligned(*store, 1000, 20);
}

// "name mode" of the folder and each file in it, e.g. {"g3 700", "slab-000.dat 600", ...}.
std::vector<std::string> Modes(const std::string& dir) {
  auto mode = [](const std::filesystem::path& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? absl::StrFormat("%o", st.st_mode & 07777) : "?";
  };
  std::vector<std::string> out = {
      absl::StrCat(std::filesystem::path(dir).filename().string(), " ", mode(dir))};
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(absl::StrCat(e.path().filename().string(), " ", mode(e.path())));
  }
  std::sort(out.begin() + 1, out.end());
  return out;
}

// The NVMe tier holds every tenant's KV: its folder is 0700 and its slabs and manifest 0600,
// even under a umask of 0, and a folder and files an older tierd left open are closed at start.
TEST_F(NvmeStoreTest, TierFilesArePrivateToTierdsUser) {
  const mode_t old_umask = ::umask(0);
  NvmeStoreConfig config = Config(4096, 8, 4);  // two slabs
  {
    auto store = Open(config);
    ASSERT_NE(store, nullptr);
    WriteBlocks(*store, 0, 8);
  }
  const std::vector<std::string> want = {"g3 700", "manifest.log 600", "slab-000.dat 600",
                                         "slab-001.dat 600"};
  EXPECT_EQ(Modes(config.dir), want);
  // As an older tierd left them: world-readable.
  ASSERT_EQ(::chmod(config.dir.c_str(), 0755), 0);
  for (const auto& e : std::filesystem::directory_iterator(config.dir)) {
    ASSERT_EQ(::chmod(e.path().c_str(), 0644), 0);
  }
  {
    auto store = Open(config);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(Modes(config.dir), want);
    ReadBlocksAligned(*store, 0, 8);
    EXPECT_TRUE(store->Drop(H(0)));  // the next open rewrites the manifest
  }
  {
    auto store = Open(config);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Stats().replayed_blocks, 7);
  }
  EXPECT_EQ(Modes(config.dir), want);
  ::umask(old_umask);
}

TEST_F(NvmeStoreTest, FlippedByteFailsThatBlockOnlyAndDropsIt) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  WriteBlocks(*store, 0, 20);
  std::optional<NvmeLocation> loc = store->LocationOf(H(7));
  ASSERT_TRUE(loc.has_value());
  {
    std::fstream f(loc->slab_path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(loc->offset + 1234);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(loc->offset + 1234);
    f.write(&c, 1);
  }
  absl::Status bad = ReadAndCheck(*store, 7);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), absl::StrCat("slot ", loc->slot.value()))) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "slab-000.dat")) << bad;
  EXPECT_FALSE(store->Contains(H(7)));
  EXPECT_EQ(ReadAndCheck(*store, 7).code(), absl::StatusCode::kNotFound);
  for (uint64_t i = 0; i < 20; ++i) {
    if (i != 7) {
      EXPECT_TRUE(ReadAndCheck(*store, i).ok()) << i;
    }
  }
  EXPECT_EQ(store->Stats().checksum_failures_total, 1u);
  EXPECT_EQ(store->Stats().used_blocks, 19);
  store.reset();
  // The drop was recorded: a restart does not bring the block back.
  store = Open(Config());
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Contains(H(7)));
  EXPECT_EQ(store->Stats().replayed_blocks, 19);
}

TEST_F(NvmeStoreTest, VerifyOnOpenDropsCorruptBlocks) {
  std::optional<NvmeLocation> loc;
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    WriteBlocks(*store, 0, 10);
    loc = store->LocationOf(H(3));
  }
  ASSERT_TRUE(loc.has_value());
  {
    std::fstream f(loc->slab_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(loc->offset);
    f.write("garbage!", 8);
  }
  NvmeStoreConfig config = Config();
  config.verify_on_open = true;
  auto store = Open(config);
  ASSERT_NE(store, nullptr);
  const NvmeStoreStats stats = store->Stats();
  EXPECT_EQ(stats.replay_corrupt_dropped, 1);
  EXPECT_EQ(stats.replayed_blocks, 9);
  EXPECT_EQ(stats.hit_blocks_total, 0u);
  EXPECT_FALSE(store->Contains(H(3)));
  EXPECT_TRUE(store->Contains(H(4)));
}

TEST_F(NvmeStoreTest, TornManifestTailIsTolerated) {
  const std::string manifest = dir_->File("g3/manifest.log");
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    WriteBlocks(*store, 0, 10, 1);  // one record per batch
  }
  {
    std::ofstream f(manifest, std::ios::app | std::ios::binary);
    f.write("half a record, torn by a crash", 30);
  }
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Stats().replay_torn_bytes, 30);
    EXPECT_EQ(store->Stats().replayed_blocks, 10);
    WriteBlocks(*store, 10, 1);  // appends land on a record boundary again
  }
  // Now tear the last real record (block 10) in the middle.
  std::filesystem::resize_file(manifest, std::filesystem::file_size(manifest) - 20);
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().replay_torn_bytes, 36);
  EXPECT_EQ(store->Stats().replayed_blocks, 10);
  EXPECT_FALSE(store->Contains(H(10)));
  ReadBlocksAligned(*store, 0, 10);
}

TEST_F(NvmeStoreTest, ForeignFingerprintEntriesAreDropped) {
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    WriteBlocks(*store, 0, 10);
  }
  NvmeStoreConfig other = Config();
  other.model_fingerprint = "model-b";
  {
    auto store = Open(other);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Stats().replay_foreign_dropped, 10);
    EXPECT_EQ(store->Stats().used_blocks, 0);
    EXPECT_FALSE(store->Contains(H(0)));
    WriteBlocks(*store, 100, 5);  // model-b's own blocks reuse the slots
  }
  // model-a's entries were compacted away; model-b's are foreign to model-a.
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().replay_foreign_dropped, 5);
  EXPECT_EQ(store->Stats().used_blocks, 0);
}

TEST_F(NvmeStoreTest, FullStoreEvictsTheLeastRecentlyUsed) {
  auto store = Open(Config(4096, 8, 4));
  ASSERT_NE(store, nullptr);
  WriteBlocks(*store, 0, 8);
  ASSERT_TRUE(ReadAndCheck(*store, 0).ok());  // 0 becomes the most recently used
  WriteBlocks(*store, 8, 2);
  EXPECT_TRUE(store->Contains(H(0)));
  EXPECT_FALSE(store->Contains(H(1)));
  EXPECT_FALSE(store->Contains(H(2)));
  EXPECT_TRUE(store->Contains(H(3)));
  EXPECT_EQ(store->Stats().evicted_blocks_total, 2u);
  ReadBlocksAligned(*store, 8, 2);
  store.reset();
  store = Open(Config(4096, 8, 4));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().replayed_blocks, 8);
  EXPECT_FALSE(store->Contains(H(1)));
  EXPECT_TRUE(ReadAndCheck(*store, 9).ok());
}

TEST_F(NvmeStoreTest, ManifestIsCompacted) {
  NvmeStoreConfig config = Config(4096, 4, 4);
  config.compaction_factor = 2;
  config.compaction_min_records = 8;
  auto store = Open(config);
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < 40; ++i) {
    WriteBlocks(*store, i, 1);  // each write past 4 evicts: a commit and a drop record
    ASSERT_LE(store->Stats().manifest_records, 2 * 8) << i;
  }
  EXPECT_GE(store->Stats().compactions_total, 1u);
  store.reset();
  store = Open(config);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().replayed_blocks, 4);
  ReadBlocksAligned(*store, 36, 4);
}

TEST_F(NvmeStoreTest, ConfigValidation) {
  NvmeStoreConfig c = Config();
  EXPECT_TRUE(c.Validate().ok());
  NvmeStoreConfig bad = c;
  bad.dir.clear();
  EXPECT_FALSE(bad.Validate().ok());
  bad = c;
  bad.model_fingerprint.clear();
  EXPECT_FALSE(bad.Validate().ok());
  bad = c;
  bad.max_io_bytes = 5000;
  EXPECT_FALSE(bad.Validate().ok());
  bad = c;
  bad.compaction_factor = 1;
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_EQ(NvmeStore::Open(bad, &clock_).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- disk full --------------------------------------------------------------------------------

// Lowers this process's file-size limit (writes past it fail with EFBIG, which tierd treats as
// a full disk) with SIGXFSZ ignored; restores both on destruction. Needs no privilege.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

// A tiny tmpfs at `dir` in a private mount namespace (so nothing leaks to the host if the test
// dies). Needs CAP_SYS_ADMIN; ok() is false without it.
class TinyTmpfs {
 public:
  TinyTmpfs(const std::string& dir, const std::string& size) : dir_(dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    ok_ = !ec && unshare(CLONE_NEWNS) == 0 &&
          mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
          mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~TinyTmpfs() {
    if (ok_) {
      umount2(dir_.c_str(), MNT_DETACH);
    }
  }
  bool ok() const { return ok_; }

 private:
  std::string dir_;
  bool ok_ = false;
};

// The disk fills up while blocks are being spilled: the failing write says ResourceExhausted
// naming the directory, the store stops accepting spills and says so, the blocks stored before
// stay readable, and after full_retry it tries again.
void ExpectDiskFullBehaviour(NvmeStore& store, FakeClock& clock, const std::string& dir,
                             uint64_t first_new) {
  const size_t block = static_cast<size_t>(store.block_bytes());
  AlignedSlots mem(8, static_cast<size_t>(store.slot_bytes()));
  absl::Status failure;
  for (uint64_t i = first_new; i < first_new + 64 && failure.ok(); i += 8) {
    std::vector<NvmeWrite> writes;
    for (int k = 0; k < 8; ++k) {
      FillBlock(H(i + k), mem.Slot(k), block);
      writes.push_back(
          NvmeWrite{H(i + k), mem.Slot(k), tier_shm::BlockChecksum(mem.Slot(k).subspan(0, block))});
    }
    for (const absl::Status& s : store.WriteBatch(writes)) {
      if (!s.ok() && failure.ok()) {
        failure = s;
      }
    }
  }
  ASSERT_FALSE(failure.ok()) << "the disk never filled up";
  EXPECT_EQ(failure.code(), absl::StatusCode::kResourceExhausted) << failure;
  EXPECT_TRUE(absl::StrContains(failure.message(), dir)) << failure;
  NvmeStoreStats stats = store.Stats();
  EXPECT_FALSE(stats.accepting_spills);
  EXPECT_FALSE(store.accepting_spills());
  EXPECT_TRUE(absl::StrContains(stats.not_accepting_reason, "disk full"))
      << stats.not_accepting_reason;
  EXPECT_EQ(stats.disk_full_total, 1u);
  // Further spills are refused without touching the disk.
  FillBlock(H(5000), mem.Slot(0), block);
  const NvmeWrite w{H(5000), mem.Slot(0), tier_shm::BlockChecksum(mem.Slot(0).subspan(0, block))};
  absl::Status refused = store.WriteBatch({&w, 1})[0];
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.message(), "not accepting spills")) << refused;
  // Everything stored before (and during) stays readable.
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(store.Contains(H(i)));
  }
  clock.Advance(absl::Minutes(1));
  EXPECT_TRUE(store.accepting_spills());
}

TEST_F(NvmeStoreTest, DiskFullStopsSpillsAndKeepsBlocksReadable) {
  const std::string dir = dir_->File("g3");
  TinyTmpfs tmpfs(dir, "600k");
  std::unique_ptr<FileSizeLimit> limit;
  NvmeStoreConfig config = Config(65536, 64, 2);  // slabs of 128 KiB
  auto store = Open(config);
  ASSERT_NE(store, nullptr);
  WriteBlocks(*store, 0, 4, 4);  // two slabs
  if (!tmpfs.ok()) {
    // No CAP_SYS_ADMIN: fake the full disk with a file-size limit below the next slab's size.
    limit = std::make_unique<FileSizeLimit>(64 * 1024);
    ASSERT_TRUE(limit->ok());
  }
  LOG(INFO) << "disk full via " << (tmpfs.ok() ? "a 600 KiB tmpfs" : "RLIMIT_FSIZE");
  ExpectDiskFullBehaviour(*store, clock_, dir, 100);
  ReadBlocksAligned(*store, 0, 4);
  limit.reset();
  store.reset();
  // A restart sees every block that made it.
  store = Open(config);
  ASSERT_NE(store, nullptr);
  ReadBlocksAligned(*store, 0, 4);
}

TEST_F(NvmeStoreTest, FileSizeLimitCountsAsDiskFull) {
  const std::string dir = dir_->File("g3");
  NvmeStoreConfig config = Config(65536, 64, 2);
  auto store = Open(config);
  ASSERT_NE(store, nullptr);
  WriteBlocks(*store, 0, 4, 4);
  FileSizeLimit limit(64 * 1024);
  ASSERT_TRUE(limit.ok());
  ExpectDiskFullBehaviour(*store, clock_, dir, 100);
  ReadBlocksAligned(*store, 0, 4);
}

}  // namespace
}  // namespace pd::tierd
