#include "services/tierd/dram_pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"

namespace pd::tierd {
namespace {

constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;
constexpr int64_t kMaxSlots = tier_shm::kMaxDramSlots;

}  // namespace

absl::Status DramPoolConfig::Validate() const {
  PD_RETURN_IF_ERROR(tier_shm::ShmRegion::ValidateName(shm_name));
  if (num_slots < 1 || num_slots > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram pool: num_slots must be in [1, ", kMaxSlots, "], got ", num_slots));
  }
  if (block_bytes < 1 || block_bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat("dram pool: block_bytes must be in [1, ",
                                                   kMaxBlockBytes, "], got ", block_bytes));
  }
  // Written with negations so that NaN fails too.
  if (!(high_watermark > 0.0 && high_watermark <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram pool: high_watermark must be in (0, 1], got ", high_watermark));
  }
  if (!(low_watermark >= 0.0 && low_watermark < high_watermark)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram pool: low_watermark must be in [0, high_watermark = ", high_watermark,
                     "), got ", low_watermark));
  }
  if (lease < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram pool: lease must be at least 1ms, got ", absl::FormatDuration(lease)));
  }
  return absl::OkStatus();
}

std::string DramPoolConfig::DefaultShmName(absl::string_view node) {
  std::string name = "/pdserve-";
  for (char c : node) {
    const bool ok =
        absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    name.push_back(ok ? c : '_');
  }
  absl::StrAppend(&name, "-g2");
  return name;
}

absl::StatusOr<std::unique_ptr<DramPool>> DramPool::Create(DramPoolConfig config, Clock* clock) {
  PD_RETURN_IF_ERROR(config.Validate());
  const int64_t slot_bytes = tier_shm::SlotBytesFor(config.block_bytes);
  size_t size_bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(slot_bytes), static_cast<size_t>(config.num_slots),
                             &size_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram pool: ", config.num_slots, " slots of ", slot_bytes, " bytes overflow"));
  }
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<tier_shm::ShmRegion> region,
      tier_shm::ShmRegion::Create(config.shm_name, size_bytes, config.reserve_memory));
  LOG(INFO) << "dram pool: shm " << config.shm_name << ", " << config.num_slots << " slots of "
            << slot_bytes << " bytes (block " << config.block_bytes << " bytes, " << size_bytes
            << " bytes in all), watermarks " << config.low_watermark << ".."
            << config.high_watermark << ", lease " << absl::FormatDuration(config.lease);
  return std::unique_ptr<DramPool>(new DramPool(std::move(config), clock, std::move(region)));
}

DramPool::DramPool(DramPoolConfig config, Clock* clock, std::unique_ptr<tier_shm::ShmRegion> region)
    : config_(std::move(config)),
      slot_bytes_(tier_shm::SlotBytesFor(config_.block_bytes)),
      clock_(clock),
      region_(std::move(region)),
      slots_(static_cast<size_t>(config_.num_slots)) {
  free_.reserve(slots_.size());
  // Pushed in reverse so that low slots are handed out first (easier to read in tests/logs).
  for (int64_t i = config_.num_slots - 1; i >= 0; --i) {
    free_.push_back(static_cast<uint32_t>(i));
  }
}

DramPool::~DramPool() = default;

uint8_t* DramPool::SlotData(DramSlot slot) const {
  CHECK_LT(static_cast<int64_t>(slot.value()), config_.num_slots) << "dram slot out of range";
  return region_->data() + static_cast<size_t>(slot.value()) * static_cast<size_t>(slot_bytes_);
}

absl::Span<uint8_t> DramPool::BlockSpan(DramSlot slot) const {
  return absl::Span<uint8_t>(SlotData(slot), static_cast<size_t>(config_.block_bytes));
}

absl::Time DramPool::DeadlineFor(SessionId session) const {
  return session == kTierdSession ? absl::InfiniteFuture() : clock_->Now() + config_.lease;
}

void DramPool::LinkMru(uint32_t s) { SlotLruLinkFront(slots_, s, lru_head_, lru_tail_); }

void DramPool::Unlink(uint32_t s) { SlotLruUnlink(slots_, s, lru_head_, lru_tail_); }

void DramPool::FreeSlot(uint32_t s) {
  Slot& slot = slots_[s];
  slot = Slot{};
  free_.push_back(s);
}

Reservation DramPool::Reserve(const BlockHash& hash, SessionId session) {
  absl::MutexLock lock(&mu_);
  if (index_.contains(hash)) {
    return {ReserveOutcome::kAlreadyHeld, DramSlot()};
  }
  const std::optional<uint32_t> s = TakeFreeSlotLocked(session);
  if (!s.has_value()) {
    return {ReserveOutcome::kNoSpace, DramSlot()};
  }
  slots_[*s].hash = hash;
  index_.emplace(hash, *s);
  return {ReserveOutcome::kGranted, DramSlot(*s)};
}

std::optional<uint32_t> DramPool::TakeFreeSlotLocked(SessionId session) {
  if (free_.empty()) {
    return std::nullopt;
  }
  const uint32_t s = free_.back();
  free_.pop_back();
  Slot& slot = slots_[s];
  slot.state = SlotState::kWriting;
  slot.claims.push_back(Claim{session, DeadlineFor(session)});
  ++writing_;
  return s;
}

Reservation DramPool::ReserveUnbound(SessionId session) {
  absl::MutexLock lock(&mu_);
  const std::optional<uint32_t> s = TakeFreeSlotLocked(session);
  if (!s.has_value()) {
    return {ReserveOutcome::kNoSpace, DramSlot()};
  }
  slots_[*s].unbound = true;
  ++unbound_;
  return {ReserveOutcome::kGranted, DramSlot(*s)};
}

bool DramPool::IsUnboundReservation(SessionId session, DramSlot slot_id) const {
  absl::MutexLock lock(&mu_);
  if (slot_id.value() >= slots_.size()) {
    return false;
  }
  const Slot& slot = slots_[slot_id.value()];
  return slot.state == SlotState::kWriting && slot.unbound &&
         slot.claims.front().session == session;
}

CommitOutcome DramPool::Commit(SessionId session, DramSlot slot_id, const BlockHash& hash,
                               uint64_t checksum, CommitOptions options) {
  if (slot_id.value() >= slots_.size()) {
    return CommitOutcome::kNotReserved;
  }
  const uint32_t s = slot_id.value();
  {
    absl::MutexLock lock(&mu_);
    Slot& slot = slots_[s];
    if (slot.state != SlotState::kWriting || slot.claims.front().session != session) {
      return CommitOutcome::kNotReserved;
    }
    if (slot.unbound) {
      // The block is named now: held already (or being filled) ends it, else the hash is taken
      // as if reserved for it from the start.
      --unbound_;
      if (index_.contains(hash)) {
        --writing_;
        FreeSlot(s);
        return CommitOutcome::kAlreadyHeld;
      }
      slot.unbound = false;
      slot.hash = hash;
      index_.emplace(hash, s);
    } else if (slot.hash != hash) {
      return CommitOutcome::kNotReserved;
    }
  }
  // Hash outside the lock: the reservation keeps the slot ours (only this session may commit or
  // release it; a concurrent lease expiry is re-checked below).
  const bool match =
      !options.verify_checksum || tier_shm::BlockChecksum(BlockSpan(slot_id)) == checksum;
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[s];
  if (slot.state != SlotState::kWriting || slot.hash != hash ||
      slot.claims.front().session != session) {
    return CommitOutcome::kNotReserved;  // the lease expired while we hashed
  }
  --writing_;
  if (!match) {
    ++totals_.checksum_failures_total;
    index_.erase(hash);
    FreeSlot(s);
    VLOG(2) << "dram pool: commit of " << hash.ToHex() << " in slot " << s << ": checksum mismatch";
    return CommitOutcome::kChecksumMismatch;
  }
  slot.state = SlotState::kValid;
  slot.checksum = checksum;
  slot.hits = 0;
  slot.claims.clear();
  ++valid_;
  if (options.pin_for.valid()) {
    slot.claims.push_back(Claim{options.pin_for, DeadlineFor(options.pin_for)});
    ++pinned_;
  }
  LinkMru(s);
  ++totals_.stored_blocks_total;
  totals_.written_bytes_total += static_cast<uint64_t>(config_.block_bytes);
  return CommitOutcome::kStored;
}

std::optional<PinnedBlock> DramPool::Pin(const BlockHash& hash, SessionId session) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) {
    return std::nullopt;
  }
  const uint32_t s = it->second;
  Slot& slot = slots_[s];
  if (slot.state != SlotState::kValid) {
    return std::nullopt;  // still being written
  }
  if (slot.claims.empty()) {
    ++pinned_;
  }
  slot.claims.push_back(Claim{session, DeadlineFor(session)});
  ++slot.hits;
  Unlink(s);
  LinkMru(s);
  ++totals_.hit_blocks_total;
  totals_.read_bytes_total += static_cast<uint64_t>(config_.block_bytes);
  return PinnedBlock{DramSlot(s), slot.checksum};
}

std::optional<uint64_t> DramPool::ChecksumOf(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != SlotState::kValid) {
    return std::nullopt;
  }
  return slots_[it->second].checksum;
}

bool DramPool::Drop(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != SlotState::kValid) {
    return false;
  }
  const uint32_t s = it->second;
  index_.erase(it);
  Unlink(s);
  --valid_;
  Slot& slot = slots_[s];
  if (slot.claims.empty()) {
    FreeSlot(s);
  } else {
    slot.dropped = true;  // DropClaims frees it with its last pin; pinned_ still counts it
  }
  return true;
}

std::vector<BlockHash> DramPool::StoredHashes() const {
  absl::MutexLock lock(&mu_);
  std::vector<BlockHash> out;
  for (const Slot& slot : slots_) {
    if (slot.state == SlotState::kValid && !slot.dropped) {
      out.push_back(slot.hash);
    }
  }
  return out;
}

bool DramPool::Contains(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  return it != index_.end() && slots_[it->second].state == SlotState::kValid;
}

template <typename Pred>
int DramPool::DropClaims(uint32_t s, Pred pred) {
  Slot& slot = slots_[s];
  if (slot.state == SlotState::kWriting) {
    if (!pred(slot.claims.front())) {
      return 0;
    }
    if (slot.unbound) {
      --unbound_;
    } else {
      index_.erase(slot.hash);
    }
    --writing_;
    FreeSlot(s);
    return 1;
  }
  if (slot.state != SlotState::kValid || slot.claims.empty()) {
    return 0;
  }
  const size_t before = slot.claims.size();
  // One pin per call for Release (a session may pin a block twice and release it once), so
  // the predicate decides how many match; see Release.
  slot.claims.erase(std::remove_if(slot.claims.begin(), slot.claims.end(), pred),
                    slot.claims.end());
  const int dropped = static_cast<int>(before - slot.claims.size());
  if (dropped > 0 && slot.claims.empty()) {
    --pinned_;
    if (slot.dropped) {
      FreeSlot(s);  // taken out by Drop while pinned: out of the index and LRU already
    }
  }
  return dropped;
}

int DramPool::Release(SessionId session, absl::Span<const DramSlot> slots) {
  absl::MutexLock lock(&mu_);
  int dropped = 0;
  for (DramSlot slot : slots) {
    if (slot.value() >= slots_.size()) {
      continue;
    }
    bool taken = false;  // one claim per listed slot
    dropped += DropClaims(slot.value(), [&](const Claim& c) {
      if (taken || c.session != session) {
        return false;
      }
      taken = true;
      return true;
    });
  }
  return dropped;
}

int DramPool::ReleaseSession(SessionId session) {
  absl::MutexLock lock(&mu_);
  int dropped = 0;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    dropped += DropClaims(s, [&](const Claim& c) { return c.session == session; });
  }
  return dropped;
}

int DramPool::ExpireClaims() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  int dropped = 0;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    dropped += DropClaims(s, [&](const Claim& c) { return c.deadline <= now; });
  }
  totals_.expired_claims_total += static_cast<uint64_t>(dropped);
  if (dropped > 0) {
    VLOG(1) << "dram pool: " << dropped << " claims expired";
  }
  return dropped;
}

int64_t DramPool::BlocksToSpill() const {
  absl::MutexLock lock(&mu_);
  const int64_t occupied = writing_ + valid_;
  const double n = static_cast<double>(config_.num_slots);
  if (static_cast<double>(occupied) <= config_.high_watermark * n) {
    return 0;
  }
  const auto target = static_cast<int64_t>(std::floor(config_.low_watermark * n));
  return std::max<int64_t>(0, occupied - target);
}

std::vector<EvictionCandidate> DramPool::TakeEvictionCandidates(int64_t max_blocks) {
  std::vector<EvictionCandidate> out;
  absl::MutexLock lock(&mu_);
  uint32_t s = lru_tail_;
  while (s != kNone && static_cast<int64_t>(out.size()) < max_blocks) {
    Slot& slot = slots_[s];
    const uint32_t prev = slot.prev;
    if (slot.claims.empty()) {
      out.push_back(EvictionCandidate{DramSlot(s), slot.hash, slot.checksum, slot.hits});
      Unlink(s);
      index_.erase(slot.hash);
      slot.state = SlotState::kEvicting;
      --valid_;
      ++evicting_;
      totals_.read_bytes_total += static_cast<uint64_t>(config_.block_bytes);
    }
    s = prev;
  }
  return out;
}

void DramPool::FinishEviction(absl::Span<const DramSlot> slots) {
  absl::MutexLock lock(&mu_);
  for (DramSlot slot : slots) {
    CHECK_LT(slot.value(), slots_.size());
    CHECK(slots_[slot.value()].state == SlotState::kEvicting)
        << "dram slot " << slot << " is not being evicted";
    FreeSlot(slot.value());
    --evicting_;
    ++totals_.evicted_blocks_total;
  }
}

SlotState DramPool::StateOf(DramSlot slot) const {
  absl::MutexLock lock(&mu_);
  CHECK_LT(slot.value(), slots_.size());
  const Slot& s = slots_[slot.value()];
  if (s.state == SlotState::kValid && !s.claims.empty()) {
    return SlotState::kPinned;
  }
  return s.state;
}

DramPoolStats DramPool::Stats() const {
  absl::MutexLock lock(&mu_);
  DramPoolStats stats = totals_;
  stats.capacity_blocks = config_.num_slots;
  stats.used_blocks = config_.num_slots - static_cast<int64_t>(free_.size());
  stats.valid_blocks = valid_;
  stats.pinned_blocks = writing_ + pinned_;
  stats.unbound_blocks = unbound_;
  stats.evicting_blocks = evicting_;
  return stats;
}

}  // namespace pd::tierd
