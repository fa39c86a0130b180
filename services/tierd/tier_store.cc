#include "services/tierd/tier_store.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"

namespace pd::tierd {

TierStore::TierStore(DramPool* dram, NvmeStore* nvme, AdmissionGuard* guard, TierStoreConfig config,
                     Clock* clock)
    : dram_(dram), nvme_(nvme), guard_(guard), config_(config), clock_(clock) {
  CHECK(dram_ != nullptr && guard_ != nullptr);
  CHECK_GE(config_.io_batch_blocks, 1);
  CHECK_GE(config_.max_disputed_blocks, 1);
  if (nvme_ != nullptr) {
    CHECK_EQ(nvme_->block_bytes(), dram_->block_bytes()) << "DRAM and NVMe tiers disagree";
  }
}

TierStore::~TierStore() {
  if (nvme_ != nullptr) {
    nvme_->SetDropListener(nullptr);
  }
}

void TierStore::SetChangeListener(TierChangeListener listener) {
  listener_ = std::move(listener);
  if (nvme_ != nullptr) {
    nvme_->SetDropListener([this](const BlockHash& hash) {
      if (listener_) {
        listener_(absl::MakeConstSpan(&hash, 1));
      }
    });
  }
}

std::vector<std::pair<BlockHash, tier_shm::TierKind>> TierStore::Snapshot() const {
  std::vector<std::pair<BlockHash, tier_shm::TierKind>> out;
  absl::flat_hash_set<BlockHash> in_dram;
  for (const BlockHash& h : dram_->StoredHashes()) {
    in_dram.insert(h);
    out.emplace_back(h, tier_shm::TierKind::kDram);
  }
  if (nvme_ != nullptr) {
    for (const BlockHash& h : nvme_->StoredHashes()) {
      if (!in_dram.contains(h)) {
        out.emplace_back(h, tier_shm::TierKind::kNvme);
      }
    }
  }
  return out;
}

std::vector<tier_shm::TierKind> TierStore::Lookup(absl::Span<const BlockHash> chain) const {
  std::vector<tier_shm::TierKind> tiers;
  for (const BlockHash& hash : chain) {
    if (dram_->Contains(hash)) {
      tiers.push_back(tier_shm::TierKind::kDram);
    } else if (nvme_ != nullptr && nvme_->Contains(hash)) {
      tiers.push_back(tier_shm::TierKind::kNvme);
    } else {
      break;
    }
  }
  return tiers;
}

std::optional<uint64_t> TierStore::HeldChecksum(const BlockHash& hash) const {
  if (std::optional<uint64_t> c = dram_->ChecksumOf(hash); c.has_value()) {
    return c;
  }
  return nvme_ != nullptr ? nvme_->ChecksumOf(hash) : std::nullopt;
}

bool TierStore::IsDisputed(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  return disputed_.contains(hash);
}

bool TierStore::RefuseIfDisputed(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  if (!disputed_.contains(hash)) {
    return false;
  }
  ++counters_.refused_disputed_total;
  return true;
}

void TierStore::OnConflict(SessionId session, const BlockHash& hash, uint64_t held,
                           uint64_t offered) {
  // Exactness beats hit rate: neither content is served; the next restore recomputes it.
  const bool from_dram = dram_->Drop(hash);
  const bool from_nvme = nvme_ != nullptr && nvme_->Drop(hash);
  if (from_dram && listener_) {
    listener_(absl::MakeConstSpan(&hash, 1));  // NvmeStore's drop listener tells its own
  }
  absl::MutexLock lock(&mu_);
  ++counters_.conflicting_commits_total;
  if (disputed_.insert(hash).second) {
    disputed_order_.push_back(hash);
    if (static_cast<int64_t>(disputed_order_.size()) > config_.max_disputed_blocks) {
      disputed_.erase(disputed_order_.front());
      disputed_order_.pop_front();
    }
  }
  const absl::Time now = clock_->Now();
  if (now < next_conflict_log_) {
    ++unlogged_conflicts_;
    return;
  }
  next_conflict_log_ = now + absl::Seconds(1);
  LOG(WARNING) << "tier store: block " << hash.ToHex() << " offered by session " << session
               << " with checksum " << offered << " but held (" << (from_dram ? "dram" : "")
               << (from_dram && from_nvme ? "+" : "") << (from_nvme ? "nvme" : "")
               << ") with checksum " << held
               << ": two contents under one hash (a planted block or a faulty worker); dropped, "
               << "and the hash is refused from now on (" << counters_.conflicting_commits_total
               << " conflicting commits so far, " << unlogged_conflicts_
               << " not logged since the last line)";
  unlogged_conflicts_ = 0;
}

std::vector<Reservation> TierStore::AllocateSlots(SessionId session,
                                                  absl::Span<const BlockHash> hashes,
                                                  int64_t unbound,
                                                  absl::Span<const uint64_t> checksums) {
  std::vector<Reservation> out(hashes.size() + static_cast<size_t>(std::max<int64_t>(0, unbound)));
  std::vector<size_t> no_space;
  const bool with_checksums = checksums.size() == hashes.size();
  for (size_t i = 0; i < hashes.size(); ++i) {
    guard_->Record(hashes[i]);
    if (RefuseIfDisputed(hashes[i])) {
      out[i].outcome = ReserveOutcome::kRefused;
      continue;
    }
    if (with_checksums) {
      if (std::optional<uint64_t> held = HeldChecksum(hashes[i]);
          held.has_value() && *held != checksums[i]) {
        OnConflict(session, hashes[i], *held, checksums[i]);
        out[i].outcome = ReserveOutcome::kRefused;
        continue;
      }
    }
    if (nvme_ != nullptr && nvme_->Contains(hashes[i])) {
      out[i].outcome = ReserveOutcome::kAlreadyHeld;
      continue;
    }
    out[i] = dram_->Reserve(hashes[i], session);
    if (out[i].outcome == ReserveOutcome::kNoSpace) {
      no_space.push_back(i);
    }
  }
  for (size_t i = hashes.size(); i < out.size(); ++i) {
    out[i] = dram_->ReserveUnbound(session);
    if (out[i].outcome == ReserveOutcome::kNoSpace) {
      no_space.push_back(i);
    }
  }
  if (!no_space.empty()) {
    Evict(static_cast<int64_t>(no_space.size()));
    for (size_t i : no_space) {
      out[i] =
          i < hashes.size() ? dram_->Reserve(hashes[i], session) : dram_->ReserveUnbound(session);
    }
  }
  return out;
}

CommitOutcome TierStore::Commit(SessionId session, DramSlot slot, const BlockHash& hash,
                                uint64_t checksum) {
  const bool unbound = dram_->IsUnboundReservation(session, slot);
  if (unbound) {
    guard_->Record(hash);  // the visit AllocateSlots counts for a named block
  }
  if (RefuseIfDisputed(hash)) {
    dram_->Release(session, absl::MakeConstSpan(&slot, 1));
    return CommitOutcome::kRefused;
  }
  if (unbound) {
    if (std::optional<uint64_t> held = HeldChecksum(hash); held.has_value() && *held != checksum) {
      OnConflict(session, hash, *held, checksum);
      dram_->Release(session, absl::MakeConstSpan(&slot, 1));
      return CommitOutcome::kRefused;
    }
    if (nvme_ != nullptr && nvme_->Contains(hash)) {
      dram_->Release(session, absl::MakeConstSpan(&slot, 1));
      return CommitOutcome::kAlreadyHeld;
    }
  }
  const CommitOutcome outcome = dram_->Commit(session, slot, hash, checksum);
  if (outcome == CommitOutcome::kStored && listener_) {
    listener_(absl::MakeConstSpan(&hash, 1));
  }
  return outcome;
}

std::vector<PromotedBlock> TierStore::Promote(SessionId session,
                                              absl::Span<const BlockHash> chain) {
  std::vector<PromotedBlock> out;
  size_t i = 0;
  while (i < chain.size()) {
    if (std::optional<PinnedBlock> pin = dram_->Pin(chain[i], session); pin.has_value()) {
      guard_->Record(chain[i]);
      out.push_back(PromotedBlock{pin->slot, pin->checksum, tier_shm::TierKind::kDram});
      ++i;
      continue;
    }
    if (nvme_ == nullptr) {
      break;
    }
    // A run of blocks only NVMe has, read as one batch.
    size_t j = i;
    while (j < chain.size() && j - i < static_cast<size_t>(config_.io_batch_blocks) &&
           !dram_->Contains(chain[j]) && nvme_->Contains(chain[j])) {
      ++j;
    }
    if (j == i) {
      break;  // miss
    }
    const size_t restored = RestoreRun(session, chain.subspan(i, j - i), &out);
    if (restored < j - i) {
      break;
    }
    i = j;
  }
  return out;
}

size_t TierStore::RestoreRun(SessionId session, absl::Span<const BlockHash> run,
                             std::vector<PromotedBlock>* out) {
  // Reserve DRAM slots for a prefix of the run (stop at the first block we cannot reserve).
  std::vector<DramSlot> slots;
  for (size_t k = 0; k < run.size(); ++k) {
    Reservation r = dram_->Reserve(run[k], kTierdSession);
    if (r.outcome == ReserveOutcome::kNoSpace) {
      Evict(static_cast<int64_t>(run.size() - k));
      r = dram_->Reserve(run[k], kTierdSession);
    }
    if (r.outcome != ReserveOutcome::kGranted) {
      break;  // no room, or another session is restoring it right now
    }
    slots.push_back(r.slot);
  }
  if (slots.empty()) {
    return 0;
  }
  std::vector<NvmeRead> reads;
  reads.reserve(slots.size());
  for (size_t k = 0; k < slots.size(); ++k) {
    reads.push_back(NvmeRead{run[k], absl::MakeSpan(dram_->SlotData(slots[k]),
                                                    static_cast<size_t>(dram_->slot_bytes()))});
  }
  const absl::Time start = clock_->Now();
  std::vector<absl::StatusOr<uint64_t>> results = nvme_->ReadBatch(reads);
  const absl::Duration took = clock_->Now() - start;
  size_t restored = 0;
  bool chain_ok = true;
  uint64_t failures = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (chain_ok && results[k].ok()) {
      const CommitOutcome c =
          dram_->Commit(kTierdSession, slots[k], run[k], *results[k],
                        CommitOptions{/*verify_checksum=*/false, /*pin_for=*/session});
      if (c == CommitOutcome::kStored) {
        guard_->Record(run[k]);
        out->push_back(PromotedBlock{slots[k], *results[k], tier_shm::TierKind::kNvme});
        ++restored;
        continue;
      }
    }
    if (!results[k].ok()) {
      ++failures;
      VLOG(1) << "tier store: restore of " << run[k].ToHex() << " failed: " << results[k].status();
    }
    chain_ok = false;
    const DramSlot slot[] = {slots[k]};
    dram_->Release(kTierdSession, slot);
  }
  if (restored > 0 && listener_) {
    listener_(run.subspan(0, restored));
  }
  absl::MutexLock lock(&mu_);
  counters_.restored_blocks_total += restored;
  counters_.restore_bytes_total += restored * static_cast<uint64_t>(dram_->block_bytes());
  counters_.restore_time_total += took;
  counters_.restore_failures_total += failures;
  return restored;
}

int TierStore::Release(SessionId session, absl::Span<const DramSlot> slots) {
  return dram_->Release(session, slots);
}

int TierStore::ReleaseSession(SessionId session) { return dram_->ReleaseSession(session); }

int TierStore::ExpireClaims() { return dram_->ExpireClaims(); }

SpillResult TierStore::SpillToWatermark() {
  SpillResult total;
  int64_t want = dram_->BlocksToSpill();
  while (want > 0) {
    const SpillResult r = Evict(std::min(want, config_.io_batch_blocks));
    if (r.total() == 0) {
      break;  // everything left is pinned or reserved
    }
    total.written += r.written;
    total.already_on_nvme += r.already_on_nvme;
    total.dropped += r.dropped;
    total.failed += r.failed;
    total.corrupt += r.corrupt;
    want -= r.total();
  }
  return total;
}

SpillResult TierStore::Evict(int64_t max_blocks) {
  SpillResult result;
  std::vector<EvictionCandidate> candidates = dram_->TakeEvictionCandidates(max_blocks);
  if (candidates.empty()) {
    return result;
  }
  std::vector<NvmeWrite> writes;
  const bool nvme_open = nvme_ != nullptr && nvme_->accepting_spills();
  for (const EvictionCandidate& c : candidates) {
    if (nvme_ != nullptr && nvme_->Contains(c.hash)) {
      ++result.already_on_nvme;
    } else if (!nvme_open || !guard_->Admit(c.hash)) {
      ++result.dropped;
    } else if (tier_shm::BlockChecksum(dram_->BlockSpan(c.slot)) != c.checksum) {
      ++result.corrupt;
      LOG(WARNING) << "tier store: dram block " << c.hash.ToHex() << " in slot " << c.slot
                   << " no longer matches its checksum (a worker wrote into it?); dropped";
    } else {
      writes.push_back(NvmeWrite{
          c.hash,
          absl::MakeConstSpan(dram_->SlotData(c.slot), static_cast<size_t>(dram_->slot_bytes())),
          c.checksum});
    }
  }
  const absl::Time start = clock_->Now();
  for (size_t first = 0; first < writes.size();
       first += static_cast<size_t>(config_.io_batch_blocks)) {
    const size_t n = std::min(writes.size() - first, static_cast<size_t>(config_.io_batch_blocks));
    for (const absl::Status& s : nvme_->WriteBatch(absl::MakeConstSpan(writes).subspan(first, n))) {
      if (s.ok()) {
        ++result.written;
      } else {
        ++result.failed;
        VLOG(1) << "tier store: spill failed: " << s;
      }
    }
  }
  const absl::Duration took = clock_->Now() - start;
  std::vector<DramSlot> slots;
  slots.reserve(candidates.size());
  for (const EvictionCandidate& c : candidates) {
    slots.push_back(c.slot);
  }
  dram_->FinishEviction(slots);
  if (listener_) {
    std::vector<BlockHash> moved;
    moved.reserve(candidates.size());
    for (const EvictionCandidate& c : candidates) {
      moved.push_back(c.hash);
    }
    listener_(moved);
  }
  absl::MutexLock lock(&mu_);
  counters_.spilled_blocks_total += static_cast<uint64_t>(result.written);
  counters_.spill_dropped_blocks_total +=
      static_cast<uint64_t>(result.dropped + result.failed + result.corrupt);
  counters_.dram_corrupt_total += static_cast<uint64_t>(result.corrupt);
  counters_.spill_bytes_total +=
      static_cast<uint64_t>(result.written) * static_cast<uint64_t>(dram_->block_bytes());
  if (!writes.empty()) {
    counters_.spill_time_total += took;
  }
  return result;
}

TierStoreStats TierStore::Stats() const {
  TierStoreStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = counters_;
  }
  stats.dram = dram_->Stats();
  if (nvme_ != nullptr) {
    stats.nvme = nvme_->Stats();
  }
  stats.guard = guard_->Stats();
  absl::MutexLock lock(&mu_);
  stats.disputed_blocks = static_cast<int64_t>(disputed_.size());
  return stats;
}

}  // namespace pd::tierd
