#include "services/kv_events/kv_event_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::kv_events {
namespace {

namespace iv1 = pdserve::internal::v1;

constexpr int64_t kHashBytes = 16;
// Upper bounds of the protobuf framing around a run in a snapshot chunk (tags, lengths, parent,
// tier, num_tokens, the repeated field's own tag and length) and around a chunk's blocks
// (worker_id's framing, epoch, sequence, reason, complete, the snapshot's tag and length).
constexpr int64_t kRunOverheadBytes = 40;
constexpr int64_t kChunkOverheadBytes = 64;
// Estimated bytes of one event besides its hashes (sequence, framing, the deque entry).
constexpr int64_t kEventOverheadBytes = 48;

void FillStored(absl::Span<const HeldBlock* const> run, const std::optional<BlockHash>& parent,
                int64_t block_size, iv1::BlockStored* stored) {
  std::vector<BlockHash> hashes;
  hashes.reserve(run.size());
  for (const HeldBlock* b : run) {
    hashes.push_back(b->hash);
  }
  stored->set_block_hashes(ConcatBlockHashes(hashes));
  if (parent.has_value()) {
    stored->set_parent_hash(parent->ToBytes());
  }
  stored->set_tier(iv1::TIER_HBM);
  stored->set_num_tokens(static_cast<uint32_t>(static_cast<int64_t>(run.size()) * block_size));
}

// Orders `blocks` into runs of one chain each (see BuildSnapshotBatches). Returns the runs as
// index ranges into the returned order.
std::vector<std::vector<const HeldBlock*>> ChainRuns(const std::vector<HeldBlock>& blocks) {
  const size_t n = blocks.size();
  absl::flat_hash_map<BlockHash, int32_t> index;
  index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    index.emplace(blocks[i].hash, static_cast<int32_t>(i));
  }
  std::vector<int32_t> parent_index(n, -1);
  std::vector<int32_t> num_children(n, 0);
  std::vector<int32_t> only_child(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (!blocks[i].parent.has_value()) {
      continue;
    }
    auto it = index.find(*blocks[i].parent);
    if (it == index.end()) {
      continue;
    }
    parent_index[i] = it->second;
    ++num_children[it->second];
    only_child[it->second] = static_cast<int32_t>(i);
  }
  std::vector<bool> visited(n, false);
  std::vector<std::vector<const HeldBlock*>> runs;
  auto walk = [&](int32_t head) {
    std::vector<const HeldBlock*> run;
    int32_t cur = head;
    while (true) {
      visited[cur] = true;
      run.push_back(&blocks[cur]);
      if (num_children[cur] != 1 || visited[only_child[cur]]) {
        break;
      }
      cur = only_child[cur];
    }
    runs.push_back(std::move(run));
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = parent_index[i];
    if (p < 0 || num_children[p] != 1) {
      walk(static_cast<int32_t>(i));
    }
  }
  // Only blocks on a parent cycle (a hash collision) are left; they go out one per run.
  for (size_t i = 0; i < n; ++i) {
    if (!visited[i]) {
      visited[i] = true;
      runs.push_back({&blocks[i]});
    }
  }
  return runs;
}

}  // namespace

absl::Status KvEventLogConfig::Validate() const {
  if (history_events <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("history_events is ", history_events, ", want > 0"));
  }
  if (history_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("history_bytes is ", history_bytes, ", want > 0"));
  }
  if (block_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_size is ", block_size, ", want >= 0"));
  }
  return absl::OkStatus();
}

KvEventLog::KvEventLog(uint64_t epoch, KvEventLogConfig config)
    : epoch_(epoch), config_(std::move(config)) {
  CHECK_NE(epoch_, 0u);
  const absl::Status valid = config_.Validate();
  CHECK(valid.ok()) << valid;
}

int KvEventLog::Stored(absl::Span<const BlockHash> hashes, std::optional<BlockHash> parent) {
  int appended = 0;
  for (size_t begin = 0; begin < hashes.size(); begin += kMaxHashesPerEvent) {
    const size_t end = std::min(hashes.size(), begin + static_cast<size_t>(kMaxHashesPerEvent));
    iv1::KvEvent event;
    iv1::BlockStored* stored = event.mutable_stored();
    stored->set_block_hashes(ConcatBlockHashes(hashes.subspan(begin, end - begin)));
    std::optional<BlockHash> prev =
        begin == 0 ? parent : std::optional<BlockHash>(hashes[begin - 1]);
    if (prev.has_value()) {
      stored->set_parent_hash(prev->ToBytes());
    }
    for (size_t i = begin; i < end; ++i) {
      held_.insert_or_assign(hashes[i], prev);
      prev = hashes[i];
    }
    stored->set_tier(iv1::TIER_HBM);
    stored->set_num_tokens(
        static_cast<uint32_t>(static_cast<int64_t>(end - begin) * config_.block_size));
    const int64_t size = static_cast<int64_t>(stored->block_hashes().size()) + kEventOverheadBytes;
    Append(std::move(event), size);
    ++appended;
  }
  return appended;
}

int KvEventLog::Removed(absl::Span<const BlockHash> hashes) {
  if (hashes.empty()) {
    return 0;
  }
  iv1::KvEvent event;
  iv1::BlockRemoved* removed = event.mutable_removed();
  removed->set_block_hashes(ConcatBlockHashes(hashes));
  for (const BlockHash& h : hashes) {
    held_.erase(h);
  }
  removed->set_tier(iv1::TIER_HBM);
  const int64_t size = static_cast<int64_t>(removed->block_hashes().size()) + kEventOverheadBytes;
  Append(std::move(event), size);
  return 1;
}

int KvEventLog::Cleared() {
  held_.clear();
  iv1::KvEvent event;
  event.mutable_cleared();
  Append(std::move(event), kEventOverheadBytes);
  return 1;
}

void KvEventLog::Append(iv1::KvEvent event, int64_t size_bytes) {
  event.set_sequence(next_sequence_++);
  history_.push_back(Entry{std::move(event), size_bytes});
  history_bytes_ += size_bytes;
  while (history_.size() > 1 && (static_cast<int64_t>(history_.size()) > config_.history_events ||
                                 history_bytes_ > config_.history_bytes)) {
    history_bytes_ -= history_.front().size_bytes;
    history_.pop_front();
  }
}

StreamStart KvEventLog::Resume(uint64_t epoch, uint64_t from_sequence) const {
  StreamStart start;
  start.sequence = last_sequence();
  if (from_sequence == 0) {
    start.reason = iv1::SNAPSHOT_REASON_REQUESTED;
  } else if (epoch != epoch_ || from_sequence > last_sequence()) {
    start.reason = iv1::SNAPSHOT_REASON_EPOCH_CHANGED;
  } else if (from_sequence + 1 < first_retained_sequence()) {
    start.reason = iv1::SNAPSHOT_REASON_HISTORY_TRUNCATED;
  } else {
    start.sequence = from_sequence;  // replay
  }
  return start;
}

std::vector<HeldBlock> KvEventLog::HeldBlocks() const {
  std::vector<HeldBlock> blocks;
  blocks.reserve(held_.size());
  for (const auto& [hash, parent] : held_) {
    blocks.push_back(HeldBlock{hash, parent});
  }
  return blocks;
}

absl::StatusOr<int> KvEventLog::CopyEvents(
    uint64_t after, int max_events, int64_t max_bytes, absl::string_view worker_id,
    google::protobuf::RepeatedPtrField<iv1::KvEvent>* events) const {
  if (after > last_sequence()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv events: position ", after, " is ahead of the last event ", last_sequence()));
  }
  if (after + 1 < first_retained_sequence()) {
    return absl::OutOfRangeError(absl::StrCat(
        "kv events: event ", after + 1,
        " is no longer in the history (oldest kept: ", first_retained_sequence(), ")"));
  }
  size_t i = after + 1 - first_retained_sequence();
  int copied = 0;
  int64_t bytes = 0;
  const int64_t worker_id_bytes = static_cast<int64_t>(worker_id.size());
  while (i < history_.size() && copied < max_events && (copied == 0 || bytes < max_bytes)) {
    const Entry& e = history_[i];
    if (copied > 0 && bytes + e.size_bytes + worker_id_bytes > max_bytes) {
      break;
    }
    iv1::KvEvent* out = events->Add();
    *out = e.event;
    out->set_worker_id(std::string(worker_id));
    bytes += e.size_bytes + worker_id_bytes;
    ++copied;
    ++i;
  }
  return copied;
}

std::vector<iv1::KvEventBatch> BuildSnapshotBatches(absl::string_view worker_id, uint64_t epoch,
                                                    uint64_t sequence, iv1::SnapshotReason reason,
                                                    std::vector<HeldBlock> blocks,
                                                    int64_t block_size, int64_t max_chunk_bytes) {
  CHECK_GE(max_chunk_bytes, 4096);
  const int64_t header_bytes = static_cast<int64_t>(worker_id.size()) + kChunkOverheadBytes;
  std::vector<iv1::KvEventBatch> chunks;
  int64_t chunk_bytes = 0;
  auto new_chunk = [&] {
    iv1::KvEventBatch& b = chunks.emplace_back();
    b.set_worker_id(std::string(worker_id));
    b.set_epoch(epoch);
    b.mutable_snapshot()->set_sequence(sequence);
    b.mutable_snapshot()->set_reason(reason);
    chunk_bytes = header_bytes;
  };
  new_chunk();
  for (const std::vector<const HeldBlock*>& run : ChainRuns(blocks)) {
    absl::Span<const HeldBlock* const> rest(run);
    std::optional<BlockHash> parent = run.front()->parent;
    while (!rest.empty()) {
      const int64_t fit = (max_chunk_bytes - chunk_bytes - kRunOverheadBytes) / kHashBytes;
      if (fit < 1) {
        new_chunk();
        continue;
      }
      const size_t take = std::min(rest.size(), static_cast<size_t>(fit));
      FillStored(rest.subspan(0, take), parent, block_size,
                 chunks.back().mutable_snapshot()->add_blocks());
      chunk_bytes += static_cast<int64_t>(take) * kHashBytes + kRunOverheadBytes;
      parent = rest[take - 1]->hash;
      rest.remove_prefix(take);
    }
  }
  chunks.back().mutable_snapshot()->set_complete(true);
  return chunks;
}

}  // namespace pd::kv_events
