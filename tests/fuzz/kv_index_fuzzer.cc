// Fuzzes the router's KV-event decoder, KvIndex::Apply (services/router/kv_index.h), with
// KvEventBatch messages parsed from the input, interleaved with RemoveWorker and Match.
//
// Input: byte 0 picks max_blocks (bit 7 set: 1..64, so the LRU bound evicts; clear: no bound
// reached), then records [op][u16 LE length][payload]: op % 4 in {0, 1} applies the payload
// as a KvEventBatch (protobuf wire format) for worker (op / 4) % 4 ("w0", "w1", "w2" or the
// invalid ""), 2 removes that worker, 3 matches the payload as a chain of 16-byte hashes.
//
// Oracle: a shadow index written from the contract in kv_index.h (entries per (worker, block,
// tier), recency per (worker, block) pair, snapshot and event rules, the error codes) must
// agree with KvIndex on every Apply status, on Stats() and on every Match.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/hash/block_hash.h"
#include "google/protobuf/stubs/logging.h"
#include "pd/v1/kv_events.pb.h"
#include "services/router/kv_index.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace iv1 = pdserve::internal::v1;
using pd::BlockHash;

constexpr uint8_t kHbm = 1, kDram = 2, kNvme = 4;

uint8_t TierBit(int tier) {
  return tier == iv1::TIER_HBM    ? kHbm
         : tier == iv1::TIER_DRAM ? kDram
         : tier == iv1::TIER_NVME ? kNvme
                                  : 0;
}

// The whole hashes of `bytes` (a trailing partial one is ignored).
std::vector<BlockHash> Hashes(absl::string_view bytes) {
  absl::StatusOr<std::vector<BlockHash>> out =
      pd::SplitBlockHashes(bytes.substr(0, bytes.size() / 16 * 16));
  CHECK(out.ok()) << out.status();
  return *std::move(out);
}

class ShadowIndex {
 public:
  explicit ShadowIndex(int64_t max_blocks) : max_blocks_(max_blocks) {}

  absl::StatusCode Apply(const std::string& worker, const iv1::KvEventBatch& batch) {
    if (!Valid(worker, batch)) {
      ++stats_.rejected_batches;
      return absl::StatusCode::kInvalidArgument;
    }
    auto known = workers_.find(worker);
    if (!batch.has_snapshot() && !batch.events().empty() && known != workers_.end() &&
        known->second.in_progress) {
      ++stats_.rejected_batches;
      return absl::StatusCode::kFailedPrecondition;
    }
    Worker& w = workers_[worker];
    if (batch.has_snapshot()) {
      const iv1::KvSnapshot& s = batch.snapshot();
      const bool first = !w.in_progress || w.epoch != batch.epoch() || w.sequence != s.sequence();
      w.in_progress = !s.complete();
      w.epoch = batch.epoch();
      w.sequence = s.sequence();
      if (first) {
        DropWorker(worker);
      }
      for (const iv1::BlockStored& run : s.blocks()) {
        AddRun(worker, run.block_hashes(), TierBit(run.tier()));
      }
      ++stats_.snapshot_chunks;
    }
    for (const iv1::KvEvent& e : batch.events()) {
      if (e.has_stored()) {
        AddRun(worker, e.stored().block_hashes(), TierBit(e.stored().tier()));
      } else if (e.has_removed()) {
        for (const BlockHash& h : Hashes(e.removed().block_hashes())) {
          Remove(worker, h, TierBit(e.removed().tier()));
        }
      } else {
        DropWorker(worker);
      }
      ++stats_.events_applied;
    }
    return absl::StatusCode::kOk;
  }

  void RemoveWorker(const std::string& worker) {
    if (workers_.erase(worker) > 0) {
      DropWorker(worker);
    }
  }

  std::vector<pd::router::WorkerOverlap> Match(const std::vector<BlockHash>& chain) const {
    std::vector<pd::router::WorkerOverlap> out;
    if (chain.empty()) {
      return out;
    }
    for (const auto& [key, pair] : pairs_) {
      if (std::get<1>(key) != chain[0].high || std::get<2>(key) != chain[0].low) {
        continue;
      }
      pd::router::WorkerOverlap o;
      o.worker_id = std::get<0>(key);
      bool lower = false;
      for (const BlockHash& h : chain) {
        auto it = pairs_.find(Key{o.worker_id, h.high, h.low});
        const uint8_t tiers = it == pairs_.end() ? 0 : it->second.tiers;
        if (!lower && (tiers & kHbm)) {
          ++o.hbm_blocks;
          continue;
        }
        lower = true;
        if (tiers & kDram) {
          ++o.dram_blocks;
        } else if (tiers & kNvme) {
          ++o.nvme_blocks;
        } else {
          break;
        }
      }
      out.push_back(o);
    }
    return out;
  }

  pd::router::KvIndexStats Stats() const {
    pd::router::KvIndexStats s = stats_;
    std::set<std::pair<uint64_t, uint64_t>> blocks;
    for (const auto& [key, pair] : pairs_) {
      blocks.emplace(std::get<1>(key), std::get<2>(key));
    }
    s.blocks = static_cast<int64_t>(blocks.size());
    s.workers = static_cast<int64_t>(workers_.size());
    return s;
  }

 private:
  using Key = std::tuple<std::string, uint64_t, uint64_t>;
  struct Pair {
    uint8_t tiers;
    std::list<Key>::iterator lru;
  };
  struct Worker {
    bool in_progress = false;
    uint64_t epoch = 0;
    uint64_t sequence = 0;
  };

  static bool ValidStored(const iv1::BlockStored& s) {
    return s.block_hashes().size() % 16 == 0 &&
           (s.parent_hash().empty() || s.parent_hash().size() == 16) && TierBit(s.tier()) != 0;
  }

  static bool Valid(const std::string& worker, const iv1::KvEventBatch& batch) {
    if (worker.empty() || (!batch.worker_id().empty() && batch.worker_id() != worker)) {
      return false;
    }
    if (batch.has_snapshot()) {
      for (const iv1::BlockStored& s : batch.snapshot().blocks()) {
        if (!ValidStored(s)) {
          return false;
        }
      }
      if (!batch.snapshot().complete() && !batch.events().empty()) {
        return false;
      }
    }
    for (const iv1::KvEvent& e : batch.events()) {
      if (!e.worker_id().empty() && e.worker_id() != worker) {
        return false;
      }
      switch (e.event_case()) {
        case iv1::KvEvent::kStored:
          if (!ValidStored(e.stored())) {
            return false;
          }
          break;
        case iv1::KvEvent::kRemoved:
          if (e.removed().block_hashes().size() % 16 != 0 || TierBit(e.removed().tier()) == 0) {
            return false;
          }
          break;
        case iv1::KvEvent::kCleared:
          break;
        case iv1::KvEvent::EVENT_NOT_SET:
          return false;
      }
    }
    return true;
  }

  void Erase(std::map<Key, Pair>::iterator it) {
    stats_.entries -= std::popcount(it->second.tiers);
    lru_.erase(it->second.lru);
    pairs_.erase(it);
  }

  void DropWorker(const std::string& worker) {
    for (auto it = pairs_.begin(); it != pairs_.end();) {
      if (std::get<0>(it->first) == worker) {
        Erase(it++);
      } else {
        ++it;
      }
    }
  }

  void Touch(Pair& p) { lru_.splice(lru_.end(), lru_, p.lru); }

  // Stored last block first (kv_index.h: chains lose their tails first).
  void AddRun(const std::string& worker, absl::string_view bytes, uint8_t bit) {
    const std::vector<BlockHash> hashes = Hashes(bytes);
    for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) {
      Add(Key{worker, h->high, h->low}, bit);
    }
  }

  void Add(const Key& key, uint8_t bit) {
    auto it = pairs_.find(key);
    if (it != pairs_.end() && (it->second.tiers & bit)) {
      Touch(it->second);
      return;
    }
    if (stats_.entries >= max_blocks_) {
      while (stats_.entries >= max_blocks_ && !lru_.empty()) {
        auto victim = pairs_.find(lru_.front());
        stats_.evictions += std::popcount(victim->second.tiers);
        Erase(victim);
      }
      it = pairs_.find(key);
    }
    if (it != pairs_.end()) {
      it->second.tiers |= bit;
      Touch(it->second);
    } else {
      lru_.push_back(key);
      pairs_.emplace(key, Pair{bit, std::prev(lru_.end())});
    }
    ++stats_.entries;
  }

  void Remove(const std::string& worker, const BlockHash& h, uint8_t bit) {
    auto it = pairs_.find(Key{worker, h.high, h.low});
    if (it == pairs_.end() || !(it->second.tiers & bit)) {
      return;
    }
    if (it->second.tiers == bit) {
      Erase(it);
    } else {
      it->second.tiers &= static_cast<uint8_t>(~bit);
      --stats_.entries;
    }
  }

  const int64_t max_blocks_;
  std::map<Key, Pair> pairs_;
  std::list<Key> lru_;  // least recently stored first
  std::map<std::string, Worker> workers_;
  pd::router::KvIndexStats stats_;
};

void CompareMatch(const pd::router::KvIndex& index, const ShadowIndex& shadow,
                  const std::vector<BlockHash>& chain) {
  auto key = [](const pd::router::WorkerOverlap& o) {
    return std::make_tuple(o.worker_id, o.hbm_blocks, o.dram_blocks, o.nvme_blocks);
  };
  std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> got, want;
  for (const auto& o : index.Match(chain)) {
    got.push_back(key(o));
  }
  for (const auto& o : shadow.Match(chain)) {
    want.push_back(key(o));
  }
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got == want) << "Match differs from the shadow index (" << got.size() << " vs "
                     << want.size() << " workers)";
}

void CompareStats(const pd::router::KvIndex& index, const ShadowIndex& shadow) {
  const pd::router::KvIndexStats got = index.Stats();
  const pd::router::KvIndexStats want = shadow.Stats();
  CHECK_EQ(got.entries, want.entries);
  CHECK_EQ(got.blocks, want.blocks);
  CHECK_EQ(got.workers, want.workers);
  CHECK_EQ(got.evictions, want.evictions);
  CHECK_EQ(got.events_applied, want.events_applied);
  CHECK_EQ(got.snapshot_chunks, want.snapshot_chunks);
  CHECK_EQ(got.rejected_batches, want.rejected_batches);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in string fields logs per input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input = pd::fuzz::AsView(data, size);
  if (input.empty()) {
    return 0;
  }
  const uint8_t config = static_cast<uint8_t>(input[0]);
  input.remove_prefix(1);
  pd::router::KvIndexConfig cfg;
  cfg.max_blocks = (config & 0x80) ? 1 + (config & 0x3F) : 1 << 20;
  auto index = pd::router::KvIndex::Create(cfg);
  CHECK(index.ok());
  ShadowIndex shadow(cfg.max_blocks);
  static const std::string kWorkers[] = {"w0", "w1", "w2", ""};
  while (input.size() >= 3) {
    const uint8_t op = static_cast<uint8_t>(input[0]);
    uint16_t len;
    std::memcpy(&len, input.data() + 1, sizeof(len));
    input.remove_prefix(3);
    const absl::string_view payload = input.substr(0, len);
    input.remove_prefix(payload.size());
    const std::string& worker = kWorkers[(op >> 2) % 4];
    std::vector<BlockHash> chain;
    switch (op % 4) {
      case 0:
      case 1: {
        iv1::KvEventBatch batch;
        if (!batch.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          continue;
        }
        const absl::Status status = (*index)->Apply(worker, batch);
        const absl::StatusCode want = shadow.Apply(worker, batch);
        CHECK_EQ(status.code(), want) << status << "\n" << batch.ShortDebugString();
        // The batch's own stored chains, in order.
        for (const iv1::KvEvent& e : batch.events()) {
          if (e.has_stored() && e.stored().block_hashes().size() % 16 == 0) {
            chain = Hashes(e.stored().block_hashes());
            CompareMatch(**index, shadow, chain);
          }
        }
        if (batch.has_snapshot()) {
          std::string all;
          for (const iv1::BlockStored& run : batch.snapshot().blocks()) {
            all += run.block_hashes().substr(0, run.block_hashes().size() / 16 * 16);
          }
          chain = Hashes(all);
        }
        break;
      }
      case 2:
        (*index)->RemoveWorker(worker);
        shadow.RemoveWorker(worker);
        break;
      case 3:
        chain = Hashes(payload);
        break;
    }
    CompareMatch(**index, shadow, chain);
    CompareStats(**index, shadow);
  }
  return 0;
}
