// Layout. blocks_ maps a block hash to its holders, one Holder {worker slot, tier bits, node}
// per worker holding it in any tier; Match reads only this map. Each (worker, block) pair also
// has a Node in nodes_ (a vector with a free list, linked by 32-bit indices so that growth does
// not invalidate links), threaded on two intrusive lists: the global LRU list in store order
// (what the max_blocks bound evicts from) and the worker's own list (what a snapshot, cleared
// event or RemoveWorker walks, so dropping a worker costs its own entries, not the index).
// Worker ids are interned to 16-bit slots; a slot is reused after RemoveWorker, and its
// incarnation tells a writer that released the lock whether its slot is still the same worker.
#include "services/router/kv_index.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log/log.h"

namespace pd::router {
namespace {

using pdserve::internal::v1::BlockStored;
using pdserve::internal::v1::KvEvent;
using pdserve::internal::v1::KvEventBatch;
using pdserve::internal::v1::Tier;

constexpr uint8_t kTierBitHbm = 1;
constexpr uint8_t kTierBitDram = 2;
constexpr uint8_t kTierBitNvme = 4;
constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
constexpr size_t kMaxWorkers = std::numeric_limits<uint16_t>::max();
constexpr size_t kHashBytes = 16;

// Blocks added or removed between two checks for waiting readers (and, if there are any, two
// writer-lock holds). 32 blocks cost ~3-10 µs, about what a reader waits at most behind a
// large snapshot, plus its wake-up.
constexpr int kOpsPerLockHold = 32;

// 0 for TIER_UNSPECIFIED and for values this build does not know.
uint8_t TierBit(int tier) {
  switch (tier) {
    case pdserve::internal::v1::TIER_HBM:
      return kTierBitHbm;
    case pdserve::internal::v1::TIER_DRAM:
      return kTierBitDram;
    case pdserve::internal::v1::TIER_NVME:
      return kTierBitNvme;
    default:
      return 0;
  }
}

// Hash `i` of a validated concatenation (BlockHash::ToBytes layout: big-endian high, low);
// inlined because FromBytes' StatusOr costs more than the decoding.
BlockHash HashAt(absl::string_view hashes, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(hashes.data() + i * kHashBytes);
  BlockHash h;
  for (int k = 0; k < 8; ++k) {
    h.high = (h.high << 8) | p[k];
    h.low = (h.low << 8) | p[8 + k];
  }
  return h;
}

absl::Status ValidateHashes(absl::string_view worker_id, absl::string_view field,
                            absl::string_view hashes) {
  if (hashes.size() % kHashBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv events of worker ", worker_id, ": ", field,
                                                   " has ", hashes.size(),
                                                   " bytes, not a multiple of 16"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTier(absl::string_view worker_id, absl::string_view field, int tier) {
  if (TierBit(tier) == 0) {
    const std::string& name = Tier_Name(static_cast<Tier>(tier));
    return absl::InvalidArgumentError(absl::StrCat(
        "kv events of worker ", worker_id, ": ", field, " is ", name.empty() ? "unknown" : name,
        " (", tier, "), want TIER_HBM, TIER_DRAM or TIER_NVME"));
  }
  return absl::OkStatus();
}

absl::Status ValidateStored(absl::string_view worker_id, absl::string_view field,
                            const BlockStored& stored) {
  absl::Status status =
      ValidateHashes(worker_id, absl::StrCat(field, ".block_hashes"), stored.block_hashes());
  if (!status.ok()) {
    return status;
  }
  if (!stored.parent_hash().empty() && stored.parent_hash().size() != kHashBytes) {
    return absl::InvalidArgumentError(absl::StrCat("kv events of worker ", worker_id, ": ", field,
                                                   ".parent_hash has ", stored.parent_hash().size(),
                                                   " bytes, want 0 or 16"));
  }
  return ValidateTier(worker_id, absl::StrCat(field, ".tier"), stored.tier());
}

absl::Status ValidateBatch(absl::string_view worker_id, const KvEventBatch& batch) {
  if (worker_id.empty()) {
    return absl::InvalidArgumentError("kv events: worker_id is empty");
  }
  if (!batch.worker_id().empty() && batch.worker_id() != worker_id) {
    return absl::InvalidArgumentError(absl::StrCat("kv events of worker ", worker_id,
                                                   ": batch.worker_id is ", batch.worker_id()));
  }
  if (batch.has_snapshot()) {
    const auto& blocks = batch.snapshot().blocks();
    for (int i = 0; i < blocks.size(); ++i) {
      absl::Status status =
          ValidateStored(worker_id, absl::StrCat("snapshot.blocks[", i, "]"), blocks[i]);
      if (!status.ok()) {
        return status;
      }
    }
    if (!batch.snapshot().complete() && !batch.events().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv events of worker ", worker_id, ": ", batch.events_size(),
                       " events in a snapshot chunk whose snapshot.complete is false"));
    }
  }
  for (int i = 0; i < batch.events_size(); ++i) {
    const KvEvent& event = batch.events(i);
    const std::string field = absl::StrCat("events[", i, "]");
    if (!event.worker_id().empty() && event.worker_id() != worker_id) {
      return absl::InvalidArgumentError(absl::StrCat("kv events of worker ", worker_id, ": ", field,
                                                     ".worker_id is ", event.worker_id()));
    }
    absl::Status status;
    switch (event.event_case()) {
      case KvEvent::kStored:
        status = ValidateStored(worker_id, absl::StrCat(field, ".stored"), event.stored());
        break;
      case KvEvent::kRemoved:
        status = ValidateHashes(worker_id, absl::StrCat(field, ".removed.block_hashes"),
                                event.removed().block_hashes());
        if (status.ok()) {
          status =
              ValidateTier(worker_id, absl::StrCat(field, ".removed.tier"), event.removed().tier());
        }
        break;
      case KvEvent::kCleared:
        break;
      case KvEvent::EVENT_NOT_SET:
        status = absl::InvalidArgumentError(absl::StrCat(
            "kv events of worker ", worker_id, ": ", field,
            " has none of stored, removed, cleared set (sequence ", event.sequence(), ")"));
        break;
    }
    if (!status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// Per-thread scratch of Match: for the block being matched, which worker slots hold it (stamp
// equal to the current round) and in which tiers. Stamps avoid clearing per block.
struct MatchScratch {
  std::vector<uint32_t> stamp;
  std::vector<uint8_t> tiers;
  uint32_t round = 0;

  void Reserve(size_t num_slots) {
    if (stamp.size() < num_slots) {
      stamp.resize(num_slots, 0);
      tiers.resize(num_slots, 0);
    }
  }
  uint32_t NextRound() {
    if (++round == 0) {  // wrapped: old stamps could collide with new rounds
      std::fill(stamp.begin(), stamp.end(), 0);
      round = 1;
    }
    return round;
  }
};

}  // namespace

struct KvIndex::Node {
  BlockHash hash;
  uint32_t lru_prev = kNil;
  uint32_t lru_next = kNil;  // also the free list link
  uint32_t worker_prev = kNil;
  uint32_t worker_next = kNil;
  uint16_t worker = 0;
};

KvIndex::Holders::Holders(Holders&& other) noexcept { *this = std::move(other); }

KvIndex::Holders& KvIndex::Holders::operator=(Holders&& other) noexcept {
  if (this == &other) {
    return *this;
  }
  if (capacity_ > 1) {
    std::allocator<Holder>().deallocate(many_, capacity_);
  }
  size_ = other.size_;
  capacity_ = other.capacity_;
  if (capacity_ > 1) {
    many_ = other.many_;
  } else {
    one_ = other.one_;
  }
  other.size_ = 0;
  other.capacity_ = 1;
  return *this;
}

KvIndex::Holders::~Holders() {
  if (capacity_ > 1) {
    std::allocator<Holder>().deallocate(many_, capacity_);
  }
}

void KvIndex::Holders::push_back(const Holder& holder) {
  if (size_ == capacity_) {
    // Grow x2: a hot prefix block gains holders one worker at a time.
    const uint32_t capacity = capacity_ * 2;
    Holder* many = std::allocator<Holder>().allocate(capacity);
    std::copy(begin(), end(), many);
    if (capacity_ > 1) {
      std::allocator<Holder>().deallocate(many_, capacity_);
    }
    many_ = many;
    capacity_ = capacity;
  }
  begin()[size_++] = holder;
}

struct KvIndex::WorkerSlot {
  std::string id;
  bool in_use = false;
  // Bumped each time the slot is given to a worker, so that a writer that released the lock
  // can tell that its worker was removed (and the slot perhaps reused) meanwhile.
  uint32_t incarnation = 0;
  uint32_t head = kNil;  // first node of the worker's list
  int64_t entries = 0;
  bool snapshot_in_progress = false;
  uint64_t snapshot_epoch = 0;
  uint64_t snapshot_sequence = 0;
};

// Holds mu_ exclusively for its lifetime, except that Tick() lets waiting readers in every
// kOpsPerLockHold units of work. References into the index do not survive a Tick().
class KvIndex::WriteSection {
 public:
  explicit WriteSection(KvIndex* index) : index_(index) { index_->mu_.Lock(); }
  ~WriteSection() { index_->mu_.Unlock(); }
  WriteSection(const WriteSection&) = delete;
  WriteSection& operator=(const WriteSection&) = delete;

  // The worker whose removal makes Tick() return false.
  void Watch(uint16_t worker) {
    worker_ = worker;
    incarnation_ = index_->slots_[worker].incarnation;
    watching_ = true;
  }

  // Counts one unit of work. false when the watched worker was removed while the lock was
  // released.
  bool Tick() {
    if (++ops_ < kOpsPerLockHold) {
      return true;
    }
    ops_ = 0;
    if (index_->readers_waiting_.load(std::memory_order_relaxed) == 0) {
      return true;
    }
    // Unlocking alone is not enough: this thread would take the lock back long before the
    // readers it woke are scheduled. Wait (briefly, bounded) until they hold it.
    index_->mu_.Unlock();
    const absl::Time deadline = absl::Now() + kMaxReaderWait;
    while (index_->readers_waiting_.load(std::memory_order_relaxed) > 0 && absl::Now() < deadline) {
      std::this_thread::yield();
    }
    index_->mu_.Lock();
    if (!watching_) {
      return true;
    }
    const WorkerSlot& slot = index_->slots_[worker_];
    return slot.in_use && slot.incarnation == incarnation_;
  }

 private:
  static constexpr absl::Duration kMaxReaderWait = absl::Microseconds(50);

  KvIndex* const index_;
  int ops_ = 0;
  bool watching_ = false;
  uint16_t worker_ = 0;
  uint32_t incarnation_ = 0;
};

// A reader lock on mu_ that writers can see coming (readers_waiting_), so that a long write
// lets it in at its next Tick().
class KvIndex::ReadSection {
  static constexpr int kReaderSpins = 50;

 public:
  explicit ReadSection(const KvIndex* index) : index_(index) {
    // Relaxed: a hint for WriteSection::Tick; the mutex orders the data.
    if (!index_->mu_.ReaderTryLock()) {
      index_->readers_waiting_.fetch_add(1, std::memory_order_relaxed);
      // Spin briefly before sleeping: a writer lets readers in every few microseconds, much
      // sooner than a blocked thread is woken up on a busy machine.
      bool locked = false;
      for (int i = 0; i < kReaderSpins && !locked; ++i) {
        std::this_thread::yield();
        locked = index_->mu_.ReaderTryLock();
      }
      if (!locked) {
        index_->mu_.ReaderLock();
      }
      index_->readers_waiting_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  ~ReadSection() { index_->mu_.ReaderUnlock(); }
  ReadSection(const ReadSection&) = delete;
  ReadSection& operator=(const ReadSection&) = delete;

 private:
  const KvIndex* const index_;
};

absl::Status KvIndexConfig::Validate() const {
  if (max_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv index: max_blocks must be > 0, got ", max_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvIndex>> KvIndex::Create(KvIndexConfig config) {
  absl::Status status = config.Validate();
  if (!status.ok()) {
    return status;
  }
  return std::unique_ptr<KvIndex>(new KvIndex(std::move(config)));
}

KvIndex::KvIndex(KvIndexConfig config)
    : config_(std::move(config)),
      max_blocks_(config_.max_blocks),
      free_nodes_(kNil),
      lru_head_(kNil),
      lru_tail_(kNil) {}

KvIndex::~KvIndex() = default;

absl::StatusOr<uint16_t> KvIndex::InternLocked(absl::string_view worker_id) {
  auto it = slot_by_id_.find(worker_id);
  if (it != slot_by_id_.end()) {
    return it->second;
  }
  uint16_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (slots_.size() < kMaxWorkers) {
    slot = static_cast<uint16_t>(slots_.size());
    slots_.emplace_back();
  } else {
    return absl::ResourceExhaustedError(absl::StrCat("kv index: cannot add worker ", worker_id,
                                                     ": ", kMaxWorkers, " workers already known"));
  }
  WorkerSlot& s = slots_[slot];
  const uint32_t incarnation = s.incarnation + 1;
  s = WorkerSlot{};
  s.id = std::string(worker_id);
  s.in_use = true;
  s.incarnation = incarnation;
  slot_by_id_.emplace(s.id, slot);
  return slot;
}

uint32_t KvIndex::AllocNodeLocked(const BlockHash& hash, uint16_t worker) {
  uint32_t index;
  if (free_nodes_ != kNil) {
    index = free_nodes_;
    free_nodes_ = nodes_[index].lru_next;
  } else {
    CHECK_LT(nodes_.size(), size_t{kNil}) << "kv index: node space exhausted";
    index = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[index];
  n = Node{};
  n.hash = hash;
  n.worker = worker;
  // Push front on the worker's list.
  WorkerSlot& slot = slots_[worker];
  n.worker_next = slot.head;
  if (slot.head != kNil) {
    nodes_[slot.head].worker_prev = index;
  }
  slot.head = index;
  LruPushBackLocked(index);
  return index;
}

void KvIndex::FreeNodeLocked(uint32_t index) {
  Node& n = nodes_[index];
  LruUnlinkLocked(index);
  WorkerSlot& slot = slots_[n.worker];
  if (n.worker_prev != kNil) {
    nodes_[n.worker_prev].worker_next = n.worker_next;
  } else {
    slot.head = n.worker_next;
  }
  if (n.worker_next != kNil) {
    nodes_[n.worker_next].worker_prev = n.worker_prev;
  }
  n.worker_prev = n.worker_next = kNil;
  n.lru_next = free_nodes_;
  free_nodes_ = index;
}

void KvIndex::LruUnlinkLocked(uint32_t index) {
  Node& n = nodes_[index];
  if (n.lru_prev != kNil) {
    nodes_[n.lru_prev].lru_next = n.lru_next;
  } else {
    lru_head_ = n.lru_next;
  }
  if (n.lru_next != kNil) {
    nodes_[n.lru_next].lru_prev = n.lru_prev;
  } else {
    lru_tail_ = n.lru_prev;
  }
  n.lru_prev = n.lru_next = kNil;
}

void KvIndex::LruPushBackLocked(uint32_t index) {
  Node& n = nodes_[index];
  n.lru_prev = lru_tail_;
  n.lru_next = kNil;
  if (lru_tail_ != kNil) {
    nodes_[lru_tail_].lru_next = index;
  } else {
    lru_head_ = index;
  }
  lru_tail_ = index;
}

int KvIndex::DropNodeLocked(uint32_t index) {
  const Node& n = nodes_[index];
  auto it = blocks_.find(n.hash);
  CHECK(it != blocks_.end()) << "kv index: node without its block " << n.hash.ToHex();
  Holders& holders = it->second;
  uint8_t tiers = 0;
  for (size_t k = 0; k < holders.size(); ++k) {
    if (holders[k].worker == n.worker) {
      tiers = holders[k].tiers;
      holders[k] = holders.back();
      holders.pop_back();
      break;
    }
  }
  if (holders.empty()) {
    blocks_.erase(it);
  }
  const int dropped = std::popcount(tiers);
  entries_ -= dropped;
  slots_[n.worker].entries -= dropped;
  FreeNodeLocked(index);
  return dropped;
}

void KvIndex::AddEntryLocked(uint16_t worker, const BlockHash& hash, uint8_t tier_bit) {
  auto find_holder = [&](Holders& holders) -> Holder* {
    for (Holder& h : holders) {
      if (h.worker == worker) {
        return &h;
      }
    }
    return nullptr;
  };
  auto it = blocks_.find(hash);
  Holder* holder = it == blocks_.end() ? nullptr : find_holder(it->second);
  if (holder != nullptr && (holder->tiers & tier_bit) != 0) {
    // Already held: only refresh its recency.
    LruUnlinkLocked(holder->node);
    LruPushBackLocked(holder->node);
    return;
  }
  if (entries_ >= max_blocks_) {
    while (entries_ >= max_blocks_ && lru_head_ != kNil) {
      evictions_ += DropNodeLocked(lru_head_);
    }
    // Eviction may have dropped this very block or pair.
    it = blocks_.find(hash);
    holder = it == blocks_.end() ? nullptr : find_holder(it->second);
  }
  if (holder != nullptr) {
    holder->tiers |= tier_bit;
    LruUnlinkLocked(holder->node);
    LruPushBackLocked(holder->node);
  } else {
    const uint32_t node = AllocNodeLocked(hash, worker);
    blocks_[hash].push_back(Holder{node, worker, tier_bit});
  }
  ++entries_;
  ++slots_[worker].entries;
}

void KvIndex::RemoveEntryLocked(uint16_t worker, const BlockHash& hash, uint8_t tier_bit) {
  auto it = blocks_.find(hash);
  if (it == blocks_.end()) {
    return;
  }
  for (Holder& h : it->second) {
    if (h.worker != worker) {
      continue;
    }
    if ((h.tiers & tier_bit) == 0) {
      return;
    }
    if (h.tiers == tier_bit) {
      DropNodeLocked(h.node);  // last tier: the pair goes
      return;
    }
    h.tiers &= static_cast<uint8_t>(~tier_bit);
    --entries_;
    --slots_[worker].entries;
    return;
  }
}

bool KvIndex::DropWorkerEntriesLocked(WriteSection& section, uint16_t worker) {
  while (slots_[worker].head != kNil) {
    DropNodeLocked(slots_[worker].head);
    if (!section.Tick()) {
      return false;
    }
  }
  return true;
}

bool KvIndex::AddRunLocked(WriteSection& section, uint16_t worker, absl::string_view hashes,
                           uint8_t tier_bit) {
  // Last block first: parents end up more recently stored than their children, so the bound
  // evicts chain tails before the prefixes that make them reachable by Match.
  for (size_t i = hashes.size() / kHashBytes; i-- > 0;) {
    AddEntryLocked(worker, HashAt(hashes, i), tier_bit);
    if (!section.Tick()) {
      return false;
    }
  }
  return true;
}

bool KvIndex::RemoveRunLocked(WriteSection& section, uint16_t worker, absl::string_view hashes,
                              uint8_t tier_bit) {
  for (size_t i = 0; i < hashes.size() / kHashBytes; ++i) {
    RemoveEntryLocked(worker, HashAt(hashes, i), tier_bit);
    if (!section.Tick()) {
      return false;
    }
  }
  return true;
}

absl::Status KvIndex::Apply(absl::string_view worker_id, const KvEventBatch& batch) {
  absl::Status status = ValidateBatch(worker_id, batch);
  WriteSection section(this);
  if (!status.ok()) {
    ++rejected_batches_;
    return status;
  }
  if (!batch.has_snapshot() && !batch.events().empty()) {
    auto it = slot_by_id_.find(worker_id);
    if (it != slot_by_id_.end() && slots_[it->second].snapshot_in_progress) {
      ++rejected_batches_;
      return absl::FailedPreconditionError(
          absl::StrCat("kv events of worker ", worker_id, ": ", batch.events_size(),
                       " events while its snapshot at sequence ",
                       slots_[it->second].snapshot_sequence, " is incomplete"));
    }
  }
  absl::StatusOr<uint16_t> interned = InternLocked(worker_id);
  if (!interned.ok()) {
    ++rejected_batches_;
    return interned.status();
  }
  const uint16_t worker = *interned;
  section.Watch(worker);
  auto worker_removed = [worker_id] {
    return absl::AbortedError(
        absl::StrCat("kv events of worker ", worker_id, ": worker removed during Apply"));
  };

  if (batch.has_snapshot()) {
    const auto& snapshot = batch.snapshot();
    WorkerSlot& slot = slots_[worker];
    const bool first = !slot.snapshot_in_progress || slot.snapshot_epoch != batch.epoch() ||
                       slot.snapshot_sequence != snapshot.sequence();
    slot.snapshot_in_progress = !snapshot.complete();
    slot.snapshot_epoch = batch.epoch();
    slot.snapshot_sequence = snapshot.sequence();
    if (first && !DropWorkerEntriesLocked(section, worker)) {
      return worker_removed();
    }
    for (const BlockStored& run : snapshot.blocks()) {
      if (!AddRunLocked(section, worker, run.block_hashes(), TierBit(run.tier()))) {
        return worker_removed();
      }
    }
    ++snapshot_chunks_;
  }

  for (const KvEvent& event : batch.events()) {
    bool alive = true;
    switch (event.event_case()) {
      case KvEvent::kStored:
        alive = AddRunLocked(section, worker, event.stored().block_hashes(),
                             TierBit(event.stored().tier()));
        break;
      case KvEvent::kRemoved:
        alive = RemoveRunLocked(section, worker, event.removed().block_hashes(),
                                TierBit(event.removed().tier()));
        break;
      case KvEvent::kCleared:
        alive = DropWorkerEntriesLocked(section, worker);
        break;
      case KvEvent::EVENT_NOT_SET:
        break;  // rejected by ValidateBatch
    }
    if (!alive) {
      return worker_removed();
    }
    ++events_applied_;
  }
  return absl::OkStatus();
}

void KvIndex::RemoveWorker(absl::string_view worker_id) {
  WriteSection section(this);
  auto it = slot_by_id_.find(worker_id);
  if (it == slot_by_id_.end()) {
    return;
  }
  const uint16_t worker = it->second;
  section.Watch(worker);
  // Another RemoveWorker of the same worker may finish the job while the lock is released.
  if (!DropWorkerEntriesLocked(section, worker)) {
    return;
  }
  WorkerSlot& slot = slots_[worker];
  slot_by_id_.erase(slot.id);
  slot.in_use = false;
  slot.id.clear();
  slot.snapshot_in_progress = false;
  free_slots_.push_back(worker);
}

std::vector<WorkerOverlap> KvIndex::Match(absl::Span<const BlockHash> chain) const {
  std::vector<WorkerOverlap> out;
  if (chain.empty()) {
    return out;
  }
  struct Active {
    uint16_t worker;
    bool lower;  // past the HBM prefix
    int32_t hbm, dram, nvme;
  };
  // Advances `a` by one block held in `tiers` (0 = not held); false when its match ends.
  auto step = [](Active& a, uint8_t tiers) {
    if (!a.lower) {
      if ((tiers & kTierBitHbm) != 0) {
        ++a.hbm;
        return true;
      }
      a.lower = true;
    }
    if ((tiers & kTierBitDram) != 0) {
      ++a.dram;
      return true;
    }
    if ((tiers & kTierBitNvme) != 0) {
      ++a.nvme;
      return true;
    }
    return false;
  };
  thread_local MatchScratch scratch;
  absl::InlinedVector<Active, 16> active;

  ReadSection lock(this);
  auto finish = [&](const Active& a) {
    out.push_back(WorkerOverlap{slots_[a.worker].id, a.hbm, a.dram, a.nvme});
  };
  auto it = blocks_.find(chain[0]);
  if (it == blocks_.end()) {
    return out;
  }
  for (const Holder& h : it->second) {
    Active a{h.worker, false, 0, 0, 0};
    step(a, h.tiers);  // tiers is never 0: the pair would have been dropped
    active.push_back(a);
  }
  scratch.Reserve(slots_.size());
  // Lookups go in groups: the lookups of a group do not depend on each other, so their cache
  // misses overlap (the walk is memory-latency bound; a group of 8 measured ~2x faster than
  // one lookup at a time). At most kGroup - 1 lookups past the end of the match are wasted.
  constexpr size_t kGroup = 8;
  const Holders* group[kGroup];
  bool ended = false;
  for (size_t base = 1; base < chain.size() && !active.empty() && !ended; base += kGroup) {
    const size_t count = std::min(kGroup, chain.size() - base);
    for (size_t k = 0; k < count; ++k) {
      auto found = blocks_.find(chain[base + k]);
      group[k] = found == blocks_.end() ? nullptr : &found->second;
    }
    for (size_t k = 0; k < count && !active.empty(); ++k) {
      if (group[k] == nullptr) {
        ended = true;
        break;
      }
      const uint32_t round = scratch.NextRound();
      for (const Holder& h : *group[k]) {
        scratch.stamp[h.worker] = round;
        scratch.tiers[h.worker] = h.tiers;
      }
      for (size_t j = 0; j < active.size();) {
        Active& a = active[j];
        const uint8_t tiers = scratch.stamp[a.worker] == round ? scratch.tiers[a.worker] : 0;
        if (step(a, tiers)) {
          ++j;
        } else {
          finish(a);
          a = active.back();
          active.pop_back();
        }
      }
    }
  }
  for (const Active& a : active) {
    finish(a);
  }
  return out;
}

void KvIndex::RaiseMaxBlocks(int64_t max_blocks) {
  WriteSection section(this);
  max_blocks_ = std::max(max_blocks_, max_blocks);
}

KvIndexStats KvIndex::Stats() const {
  ReadSection lock(this);
  KvIndexStats stats;
  stats.entries = entries_;
  stats.blocks = static_cast<int64_t>(blocks_.size());
  stats.workers = static_cast<int64_t>(slot_by_id_.size());
  stats.evictions = evictions_;
  stats.max_blocks = max_blocks_;
  stats.events_applied = events_applied_;
  stats.snapshot_chunks = snapshot_chunks_;
  stats.rejected_batches = rejected_batches_;
  return stats;
}

}  // namespace pd::router
