#include "services/tierd/admission_guard.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::tierd {
namespace {

constexpr int64_t kMaxExpectedBlocks = int64_t{1} << 28;

// Odd 64-bit constants, one per row: row r hashes with a different multiplier so the rows'
// collisions are independent.
constexpr uint64_t kRowSalt[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                                  0x165667b19e3779f9ull, 0xd6e8feb86659fd93ull};

}  // namespace

absl::Status AdmissionGuardConfig::Validate() const {
  if (expected_blocks < 1 || expected_blocks > kMaxExpectedBlocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission guard: expected_blocks must be in [1, ", kMaxExpectedBlocks,
                     "], got ", expected_blocks));
  }
  if (min_count < 1 || min_count > 15) {
    return absl::InvalidArgumentError(
        absl::StrCat("admission guard: min_count must be in [1, 15], got ", min_count));
  }
  return absl::OkStatus();
}

AdmissionGuard::AdmissionGuard(AdmissionGuardConfig config)
    : config_(config),
      // Four counters per expected block and row keep the chance that all four rows of a
      // one-time block collide with others (a false "seen twice") near 0.2%.
      width_(
          std::bit_ceil(static_cast<uint64_t>(4 * std::max<int64_t>(config.expected_blocks, 16)))),
      sample_(static_cast<uint64_t>(width_) * 2),
      counters_(kDepth * width_, 0) {
  const absl::Status valid = config.Validate();
  CHECK(valid.ok()) << valid;
}

size_t AdmissionGuard::IndexOf(const BlockHash& hash, int row) const {
  // Block hashes are already uniform (XXH3-128): mixing both halves with a per-row odd
  // multiplier and taking the top bits gives independent-enough rows.
  const uint64_t x = (hash.low ^ std::rotl(hash.high, 17 * row + 7)) * kRowSalt[row];
  return static_cast<size_t>(x >> (64 - std::countr_zero(width_))) & (width_ - 1);
}

int AdmissionGuard::EstimateLocked(const BlockHash& hash) const {
  int est = kMaxCount;
  for (int r = 0; r < kDepth; ++r) {
    est = std::min<int>(est, counters_[r * width_ + IndexOf(hash, r)]);
  }
  return est;
}

void AdmissionGuard::Record(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  ++stats_.records_total;
  // Conservative update: raise only the counters at the current minimum, which keeps
  // over-counting from collisions low.
  const int est = EstimateLocked(hash);
  if (est < kMaxCount) {
    for (int r = 0; r < kDepth; ++r) {
      uint8_t& c = counters_[r * width_ + IndexOf(hash, r)];
      if (c == est) {
        ++c;
      }
    }
  }
  if (++since_reset_ >= sample_) {
    for (uint8_t& c : counters_) {
      c = static_cast<uint8_t>(c >> 1);
    }
    since_reset_ = 0;
    ++stats_.resets_total;
  }
}

int AdmissionGuard::Estimate(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  return EstimateLocked(hash);
}

bool AdmissionGuard::Admit(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  const bool admit = EstimateLocked(hash) >= config_.min_count;
  ++(admit ? stats_.admitted_total : stats_.rejected_total);
  return admit;
}

AdmissionGuardStats AdmissionGuard::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace pd::tierd
