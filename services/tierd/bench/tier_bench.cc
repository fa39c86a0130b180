// tier_bench: DRAM -> NVMe spill and NVMe -> DRAM restore bandwidth of pd-tierd's storage layer
// (TierStore over DramPool + NvmeStore), each divided by the bandwidth `dd` reaches with
// O_DIRECT on the same directory, measured in the same run (issue #6 benchmarks; target >= 0.8).
//
//   tier_bench --dir=/var/tmp/pd-tier-bench [--target_mib=512] [--repetitions=5]
//              [--batch_blocks=64] [--io_backend=auto|pread] [--queue_depth=32]
//              [--max_io_kib=1024]
//
// For each block size (stories260K-like: 16 tokens x 2 (K,V) x 5 layers x 4 kv heads x 8 x f32
// = 10240 bytes; 1B-like: 16 x 2 x 16 layers x 8 kv heads x 64 x bf16 = 524288 bytes) and
// repetition:
//   1. fill the DRAM pool (POSIX shm) with fresh random blocks (committed with checksums);
//   2. spill: TierStore::Evict(batch_blocks) until DRAM is empty, i.e. one NVMe write batch of
//      batch_blocks blocks per call (admission + DRAM checksum check + io_uring/O_DIRECT +
//      manifest append);
//   3. restore: TierStore::Promote of chains of batch_blocks blocks, i.e. one NVMe read batch
//      each, into DRAM slots (checksum verify + commit + pin), released after each chain;
//   4. dd if=/dev/zero of=DIR/ddtest bs=B count=N oflag=direct, then dd if=DIR/ddtest
//      of=/dev/null bs=B iflag=direct, with B = batch_blocks x the bytes a block takes on disk
//      (one of our batches) and N batches (the same volume); dd's own reported time is used.
// Bandwidth counts the bytes moved on disk (slot bytes: block bytes rounded up to the O_DIRECT
// alignment; equal to the block bytes for both sizes on 512-byte-sector ext4). The ratio is
// taken per repetition (tierd and dd measured back to back), then the median. Repetition 0
// writes into freshly preallocated slabs (unwritten extents: the filesystem converts them on
// first write) and is reported apart as "first fill"; the medians are over repetitions 1..n-1,
// the steady state of a tier that has filled its slabs once. One JSON object per block size on
// stdout, plus the load averages at start and end.
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tierd/tier_store.h"

ABSL_FLAG(std::string, dir, "/var/tmp/pd-tier-bench",
          "directory on the disk under test (created; its content is removed at exit)");
ABSL_FLAG(int64_t, target_mib, 512, "bytes moved per measurement and block size, in MiB");
ABSL_FLAG(int, repetitions, 5, "repetitions, >= 2 (the first is reported apart as first fill)");
ABSL_FLAG(int64_t, batch_blocks, 64, "blocks per NVMe batch (spill and restore)");
ABSL_FLAG(std::string, io_backend, "auto", "auto (io_uring when allowed) or pread");
ABSL_FLAG(int, queue_depth, 32, "io_uring queue depth");
ABSL_FLAG(int64_t, max_io_kib, 1024, "largest merged NVMe operation, KiB (NvmeStoreConfig)");

namespace pd::tierd {
namespace {

constexpr uint64_t kTmpfsMagic = 0x01021994;
constexpr SessionId kBenchSession{1};

struct Size {
  const char* name;
  int64_t block_bytes;
};

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs a dd command and returns its own elapsed seconds ("..., 0.123 s, ..."), or -1.
double RunDd(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    return -1;
  }
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) {
    out += buf;
  }
  if (pclose(p) != 0) {
    LOG(ERROR) << "failed: " << cmd << "\n" << out;
    return -1;
  }
  const size_t copied = out.rfind("copied, ");
  const size_t s = out.find(" s,", copied);
  double seconds = -1;
  if (copied == std::string::npos || s == std::string::npos ||
      !absl::SimpleAtod(out.substr(copied + 8, s - copied - 8), &seconds)) {
    LOG(ERROR) << "cannot parse dd output: " << out;
    return -1;
  }
  return seconds;
}

BlockHash HashOf(uint64_t rep, uint64_t i) {
  return BlockHash{rep + 1, i * 0x9e3779b97f4a7c15ull + 7};
}

struct Figures {
  // Per steady-state repetition.
  std::vector<double> spill_gibs, restore_gibs, dd_write_gibs, dd_read_gibs;
  std::vector<double> spill_ratios, restore_ratios;
  // Repetition 0 (fresh slabs).
  double first_spill_gibs = 0, first_dd_write_gibs = 0;
};

int RunSize(const Size& size, const std::string& dir, Figures* fig, std::string* io_mode) {
  const int64_t batch = absl::GetFlag(FLAGS_batch_blocks);
  const int64_t target = absl::GetFlag(FLAGS_target_mib) << 20;
  const int64_t batches = std::max<int64_t>(4, target / (batch * size.block_bytes));
  const int64_t blocks = batches * batch;

  DramPoolConfig dc;
  dc.shm_name = absl::StrCat("/pd-tier-bench-", getpid());
  dc.num_slots = blocks;
  dc.block_bytes = size.block_bytes;
  dc.high_watermark = 1.0;
  dc.low_watermark = 0.0;
  absl::StatusOr<std::unique_ptr<DramPool>> dram = DramPool::Create(dc);
  if (!dram.ok()) {
    LOG(ERROR) << dram.status();
    return 1;
  }
  NvmeStoreConfig nc;
  nc.dir = absl::StrCat(dir, "/g3-", size.name);
  nc.block_bytes = size.block_bytes;
  nc.capacity_blocks = blocks;
  nc.slots_per_slab = 256;
  nc.model_fingerprint = "tier-bench";
  nc.queue_depth = absl::GetFlag(FLAGS_queue_depth);
  nc.max_io_bytes = absl::GetFlag(FLAGS_max_io_kib) << 10;
  nc.io_backend =
      absl::GetFlag(FLAGS_io_backend) == "pread" ? NvmeIoBackend::kPread : NvmeIoBackend::kAuto;
  absl::StatusOr<std::unique_ptr<NvmeStore>> nvme = NvmeStore::Open(nc);
  if (!nvme.ok()) {
    LOG(ERROR) << nvme.status();
    return 1;
  }
  *io_mode = (*nvme)->Stats().io_mode;
  // Bytes one block takes on disk (block_bytes rounded up to the O_DIRECT alignment).
  const int64_t slot_bytes = (*nvme)->slot_bytes();
  AdmissionGuard guard({.expected_blocks = blocks, .min_count = 1});  // bandwidth, not policy
  TierStore store(dram->get(), nvme->get(), &guard, TierStoreConfig{.io_batch_blocks = batch});
  std::mt19937_64 rng(42);
  const double disk_gib = static_cast<double>(blocks * slot_bytes) / (1 << 30);
  const std::string dd_file = absl::StrCat(dir, "/ddtest");
  const int64_t dd_bs = batch * slot_bytes;
  const double dd_gib = static_cast<double>(dd_bs * batches) / (1 << 30);

  for (int rep = 0; rep < absl::GetFlag(FLAGS_repetitions); ++rep) {
    // 1. Fill DRAM.
    for (int64_t i = 0; i < blocks; ++i) {
      const BlockHash h = HashOf(rep, i);
      Reservation r = (*dram)->Reserve(h, kBenchSession);
      CHECK(r.outcome == ReserveOutcome::kGranted);
      auto* words = reinterpret_cast<uint64_t*>((*dram)->SlotData(r.slot));
      for (int64_t w = 0; w < size.block_bytes / 8; ++w) {
        words[w] = rng();
      }
      const uint64_t checksum = tier_shm::BlockChecksum((*dram)->BlockSpan(r.slot));
      guard.Record(h);
      CHECK((*dram)->Commit(kBenchSession, r.slot, h, checksum) == CommitOutcome::kStored);
    }
    // 2. Spill.
    absl::Time start = absl::Now();
    int64_t written = 0;
    for (int64_t b = 0; b < batches; ++b) {
      written += store.Evict(batch).written;
    }
    const double spill_s = absl::ToDoubleSeconds(absl::Now() - start);
    CHECK_EQ(written, blocks) << "spill did not write every block";
    // 3. Restore.
    int64_t restored = 0;
    absl::Duration restore_time;
    for (int64_t b = 0; b < batches; ++b) {
      std::vector<BlockHash> chain;
      for (int64_t i = b * batch; i < (b + 1) * batch; ++i) {
        chain.push_back(HashOf(rep, i));
      }
      start = absl::Now();
      std::vector<PromotedBlock> got = store.Promote(kBenchSession, chain);
      restore_time += absl::Now() - start;
      restored += static_cast<int64_t>(got.size());
      std::vector<DramSlot> slots;
      for (const PromotedBlock& p : got) {
        slots.push_back(p.slot);
      }
      store.Release(kBenchSession, slots);
    }
    CHECK_EQ(restored, blocks) << "restore did not return every block";
    store.Evict(blocks);  // empty DRAM again (all on NVMe already: nothing written)
    // 4. The ceiling, same directory, same volume.
    const double ddw = RunDd(absl::StrFormat("dd if=/dev/zero of=%s bs=%d count=%d oflag=direct",
                                             dd_file, dd_bs, batches));
    const double ddr = RunDd(absl::StrFormat("dd if=%s of=/dev/null bs=%d count=%d iflag=direct",
                                             dd_file, dd_bs, batches));
    std::error_code ec;
    std::filesystem::remove(dd_file, ec);
    if (ddw <= 0 || ddr <= 0) {
      return 1;
    }
    const double spill = disk_gib / spill_s;
    const double restore = disk_gib / absl::ToDoubleSeconds(restore_time);
    std::cerr << absl::StrFormat(
        "%s rep %d: spill %.3f GiB/s, restore %.3f GiB/s, dd write %.3f GiB/s, dd read %.3f "
        "GiB/s\n",
        size.name, rep, spill, restore, dd_gib / ddw, dd_gib / ddr);
    if (rep == 0) {
      fig->first_spill_gibs = spill;
      fig->first_dd_write_gibs = dd_gib / ddw;
      continue;
    }
    fig->spill_gibs.push_back(spill);
    fig->restore_gibs.push_back(restore);
    fig->dd_write_gibs.push_back(dd_gib / ddw);
    fig->dd_read_gibs.push_back(dd_gib / ddr);
    fig->spill_ratios.push_back(spill / fig->dd_write_gibs.back());
    fig->restore_ratios.push_back(restore / fig->dd_read_gibs.back());
  }
  std::cout << absl::StrFormat(
      "{\"block\": \"%s\", \"block_bytes\": %d, \"slot_bytes\": %d, \"batch_blocks\": %d, "
      "\"batches\": %d, \"steady_repetitions\": %d, \"io_mode\": \"%s\", \"dd_bs\": %d, "
      "\"spill_gib_s\": %.3f, \"dd_write_gib_s\": %.3f, \"spill_ratio\": %.2f, "
      "\"restore_gib_s\": %.3f, \"dd_read_gib_s\": %.3f, \"restore_ratio\": %.2f, "
      "\"first_fill_spill_gib_s\": %.3f, \"first_fill_dd_write_gib_s\": %.3f}\n",
      size.name, size.block_bytes, slot_bytes, batch, batches, fig->spill_ratios.size(), *io_mode,
      dd_bs, Median(fig->spill_gibs), Median(fig->dd_write_gibs), Median(fig->spill_ratios),
      Median(fig->restore_gibs), Median(fig->dd_read_gibs), Median(fig->restore_ratios),
      fig->first_spill_gibs, fig->first_dd_write_gibs);
  std::error_code ec;
  std::filesystem::remove_all(nc.dir, ec);
  return 0;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (absl::GetFlag(FLAGS_repetitions) < 2) {
    LOG(ERROR) << "--repetitions must be >= 2";
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    LOG(ERROR) << "cannot create " << dir << ": " << ec.message();
    return 2;
  }
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) == 0 && static_cast<uint64_t>(fs.f_type) == kTmpfsMagic) {
    LOG(WARNING) << dir << " is on tmpfs: this measures memory, not a disk";
  }
  std::cout << "{\"load_start\": \"" << LoadAverage() << "\", \"dir\": \"" << dir << "\"}\n";
  const Size sizes[] = {{"stories260K", 10240}, {"1b", 524288}};
  int rc = 0;
  for (const Size& size : sizes) {
    Figures fig;
    std::string io_mode;
    rc |= RunSize(size, dir, &fig, &io_mode);
  }
  std::cout << "{\"load_end\": \"" << LoadAverage() << "\"}\n";
  return rc;
}

}  // namespace
}  // namespace pd::tierd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pd::InitLogging(argv[0]);
  return pd::tierd::Main();
}
