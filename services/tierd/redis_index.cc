#include "services/tierd/redis_index.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::tierd {

using redis::RedisClient;
using redis::RedisConfig;
using redis::RedisReply;
using redis_index_internal::PendingUpdates;

// ---- tiers and config ---------------------------------------------------------------------------

redis::PrefixTier ToPrefixTier(tier_shm::TierKind tier) {
  return tier == tier_shm::TierKind::kNvme ? redis::PrefixTier::kNvme : redis::PrefixTier::kDram;
}

tier_shm::TierKind FromPrefixTier(redis::PrefixTier tier) {
  return tier == redis::PrefixTier::kNvme ? tier_shm::TierKind::kNvme : tier_shm::TierKind::kDram;
}

absl::Status RedisIndexConfig::Validate() const {
  if (absl::Status s = redis::ValidatePrefixNodeName(node); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("RedisIndexConfig.node: ", s.message()));
  }
  if (entry_ttl < absl::Seconds(1) || entry_ttl == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisIndexConfig.entry_ttl must be finite and >= 1s, got ",
                     absl::FormatDuration(entry_ttl)));
  }
  if (max_batch < 1 || max_batch > 1'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisIndexConfig.max_batch must be in [1, 1000000], got ", max_batch));
  }
  if (max_pending < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisIndexConfig.max_pending must be >= 1, got ", max_pending));
  }
  if (flush_interval <= absl::ZeroDuration() || flush_interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisIndexConfig.flush_interval must be finite and > 0, got ",
                     absl::FormatDuration(flush_interval)));
  }
  if (retry_interval <= absl::ZeroDuration() || retry_interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisIndexConfig.retry_interval must be finite and > 0, got ",
                     absl::FormatDuration(retry_interval)));
  }
  return absl::OkStatus();
}

// ---- PendingUpdates -----------------------------------------------------------------------------

namespace redis_index_internal {

bool PendingUpdates::Add(const BlockHash& hash, bool publish, tier_shm::TierKind tier) {
  auto it = map_.find(hash);
  if (it != map_.end()) {
    it->second = Op{publish, tier};
    return true;
  }
  if (static_cast<int64_t>(map_.size()) >= max_size_) {
    return false;
  }
  map_.emplace(hash, Op{publish, tier});
  return true;
}

std::vector<PendingUpdates::Update> PendingUpdates::TakeAll() {
  std::vector<Update> out;
  out.reserve(map_.size());
  for (const auto& [hash, op] : map_) {
    out.push_back(Update{hash, op.publish, op.tier});
  }
  map_.clear();
  return out;
}

std::vector<std::vector<std::string>> BuildUpdateCommands(
    const RedisConfig& config, absl::string_view node, int64_t ttl_seconds,
    absl::Span<const PendingUpdates::Update> updates) {
  const std::string ttl = absl::StrCat(ttl_seconds);
  const std::string set_key = config.Key(redis::PrefixNodeBlocksKey(node));
  const std::string key_head = config.Key(absl::StrCat("blk:", node, ":"));
  std::vector<std::vector<std::string>> commands;
  commands.reserve(updates.size() + 2);
  std::vector<std::string> sadd = {"SADD", set_key};
  std::vector<std::string> srem = {"SREM", set_key};
  for (const PendingUpdates::Update& u : updates) {
    std::string hex = u.hash.ToHex();
    std::string key = absl::StrCat(key_head, hex);
    if (u.publish) {
      commands.push_back({"SET", std::move(key),
                          std::string(redis::PrefixTierValue(ToPrefixTier(u.tier))), "EX", ttl});
      sadd.push_back(std::move(hex));
    } else {
      commands.push_back({"DEL", std::move(key)});
      srem.push_back(std::move(hex));
    }
  }
  if (sadd.size() > 2) {
    commands.push_back(std::move(sadd));
  }
  if (srem.size() > 2) {
    commands.push_back(std::move(srem));
  }
  return commands;
}

}  // namespace redis_index_internal

// ---- RedisIndex ---------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisIndex>> RedisIndex::Create(RedisConfig redis,
                                                               RedisIndexConfig config,
                                                               SnapshotFn snapshot) {
  PD_RETURN_IF_ERROR(redis.Validate());
  PD_RETURN_IF_ERROR(config.Validate());
  if (!snapshot) {
    return absl::InvalidArgumentError("redis index: the snapshot function must not be null");
  }
  std::unique_ptr<RedisIndex> index(
      new RedisIndex(std::move(redis), std::move(config), std::move(snapshot)));
  index->thread_ = std::thread([raw = index.get()] { raw->Run(); });
  return index;
}

RedisIndex::RedisIndex(RedisConfig redis, RedisIndexConfig config, SnapshotFn snapshot)
    : redis_config_(std::move(redis)),
      config_(std::move(config)),
      ttl_seconds_(absl::ToInt64Seconds(config_.entry_ttl)),
      snapshot_(std::move(snapshot)),
      pending_(config_.max_pending) {}

RedisIndex::~RedisIndex() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) {
    thread_.join();
  }
}

void RedisIndex::Publish(const BlockHash& hash, tier_shm::TierKind tier) {
  absl::MutexLock lock(&mu_);
  if (!pending_.Add(hash, /*publish=*/true, tier)) {
    ++stats_.dropped_total;
    overflowed_ = true;
  }
}

void RedisIndex::Unpublish(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  if (!pending_.Add(hash, /*publish=*/false, tier_shm::TierKind::kDram)) {
    ++stats_.dropped_total;
    overflowed_ = true;
  }
}

absl::Status RedisIndex::Flush() {
  absl::MutexLock io(&io_mu_);
  return RunOnce(/*force=*/true);
}

RedisIndexStats RedisIndex::Stats() const {
  absl::MutexLock lock(&mu_);
  RedisIndexStats stats = stats_;
  stats.pending = pending_.size();
  return stats;
}

void RedisIndex::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), config_.flush_interval);
      if (stop_) {
        return;
      }
    }
    absl::MutexLock io(&io_mu_);
    // Failures are counted, logged and retried by RunOnce itself.
    RunOnce(/*force=*/false).IgnoreError();
  }
}

absl::Status RedisIndex::RunOnce(bool force) {
  const absl::Time now = absl::Now();
  if (client_ == nullptr) {
    if (!force && now < next_connect_) {
      return absl::UnavailableError(absl::StrCat(
          "redis index: disconnected from ", redis_config_.host, ":", redis_config_.port,
          ", next attempt in ", absl::FormatDuration(next_connect_ - now)));
    }
    // No reconnect inside a call: a dropped connection may mean a restarted (empty) Redis, so
    // it must surface here and lead to a resync, not be retried silently by the client.
    redis::RedisConfig config = redis_config_;
    config.max_reconnect_attempts = 0;
    absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(config);
    if (!client.ok()) {
      OnFailure(client.status());
      return client.status();
    }
    client_ = *std::move(client);
    seen_reconnects_ = 0;
    need_resync_ = true;
    next_probe_ = now + config_.retry_interval;
  } else if (now >= next_probe_) {
    // Ask Redis every retry_interval even when idle, so an outage or a restart (which loses
    // every entry) is noticed without waiting for the next update.
    next_probe_ = now + config_.retry_interval;
    if (absl::StatusOr<RedisReply> pong = client_->Command({"PING"}); !pong.ok()) {
      OnFailure(pong.status());
      return pong.status();
    }
  }
  NoteReconnects();
  bool overflowed;
  {
    absl::MutexLock lock(&mu_);
    overflowed = overflowed_;
  }
  if (need_resync_ || overflowed || now >= next_refresh_) {
    if (absl::Status s = Resync(); !s.ok()) {
      OnFailure(s);
      return s;
    }
    need_resync_ = false;
    next_refresh_ = absl::Now() + config_.entry_ttl / 2;
    bool recovered;
    {
      absl::MutexLock lock(&mu_);
      recovered = !stats_.connected;
      stats_.connected = true;
      ++stats_.resyncs_total;
    }
    if (recovered) {
      LOG(INFO) << "redis index: node " << config_.node << " mirrored to redis "
                << client_->address() << " (key prefix \""
                << absl::CEscape(redis_config_.key_prefix) << "\")";
    }
  }
  if (absl::Status s = SendPending(); !s.ok()) {
    OnFailure(s);
    return s;
  }
  NoteReconnects();  // a pipeline that rode through a reconnect: resync in the next round
  return absl::OkStatus();
}

void RedisIndex::NoteReconnects() {
  // RedisClient reconnects inside a call and then succeeds, hiding that the server may have
  // restarted empty: treat every reconnect like an outage.
  const uint64_t reconnects = client_->Stats().num_reconnects;
  if (reconnects != seen_reconnects_) {
    seen_reconnects_ = reconnects;
    need_resync_ = true;
  }
}

absl::Status RedisIndex::Resync() {
  {
    // The snapshot taken next supersedes everything queued so far (see the ordering contract).
    absl::MutexLock lock(&mu_);
    pending_.Clear();
    overflowed_ = false;
  }
  std::vector<std::pair<BlockHash, tier_shm::TierKind>> snapshot = snapshot_();
  absl::flat_hash_set<BlockHash> held;
  held.reserve(snapshot.size());
  for (const auto& entry : snapshot) {
    held.insert(entry.first);
  }

  // Members of the old set the node no longer holds: delete their keys, drop them from the set.
  const std::string set_key = redis_config_.Key(redis::PrefixNodeBlocksKey(config_.node));
  PD_ASSIGN_OR_RETURN(std::vector<std::string> members,
                      redis::ScanSetMembers(*client_, set_key, config_.max_batch));
  std::vector<std::string> stale;
  for (std::string& m : members) {
    absl::StatusOr<BlockHash> hash = BlockHash::FromHex(m);
    if (!hash.ok()) {
      garbage_.Count(redis::PrefixGarbage::kSetMember, absl::StrCat(set_key, " member ", m));
    }
    if (!hash.ok() || !held.contains(*hash)) {  // a malformed member is stale too
      stale.push_back(std::move(m));
    }
  }
  const std::string key_head = redis_config_.Key(absl::StrCat("blk:", config_.node, ":"));
  for (size_t start = 0; start < stale.size(); start += config_.max_batch) {
    const size_t end = std::min(stale.size(), start + static_cast<size_t>(config_.max_batch));
    std::vector<std::string> del = {"DEL"};
    std::vector<std::string> srem = {"SREM", set_key};
    for (size_t i = start; i < end; ++i) {
      del.push_back(absl::StrCat(key_head, stale[i]));
      srem.push_back(stale[i]);
    }
    PD_RETURN_IF_ERROR(SendBatch({std::move(del), std::move(srem)}, 0, end - start));
  }

  // Republish the snapshot, then keep the set alive as long as its entries and list the node.
  std::vector<PendingUpdates::Update> updates;
  updates.reserve(snapshot.size());
  for (const auto& [hash, tier] : snapshot) {
    updates.push_back(PendingUpdates::Update{hash, /*publish=*/true, tier});
  }
  PD_RETURN_IF_ERROR(SendUpdates(updates));
  return SendBatch({{"EXPIRE", set_key, absl::StrCat(ttl_seconds_)},
                    {"SADD", redis_config_.Key(redis::kPrefixNodesKey), config_.node}},
                   0, 0);
}

absl::Status RedisIndex::SendPending() {
  std::vector<PendingUpdates::Update> updates;
  {
    absl::MutexLock lock(&mu_);
    updates = pending_.TakeAll();
  }
  // On failure the rest of `updates` is lost; the resync that follows covers it.
  return SendUpdates(updates);
}

absl::Status RedisIndex::SendUpdates(absl::Span<const PendingUpdates::Update> updates) {
  for (size_t start = 0; start < updates.size(); start += config_.max_batch) {
    const absl::Span<const PendingUpdates::Update> batch =
        updates.subspan(start, static_cast<size_t>(config_.max_batch));
    const auto num_publish = static_cast<uint64_t>(std::count_if(
        batch.begin(), batch.end(), [](const PendingUpdates::Update& u) { return u.publish; }));
    PD_RETURN_IF_ERROR(SendBatch(
        redis_index_internal::BuildUpdateCommands(redis_config_, config_.node, ttl_seconds_, batch),
        num_publish, batch.size() - num_publish));
  }
  return absl::OkStatus();
}

absl::Status RedisIndex::SendBatch(const std::vector<std::vector<std::string>>& commands,
                                   uint64_t num_set, uint64_t num_del) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<RedisReply>> replies = client_->Pipeline(commands);
  const absl::Duration elapsed = absl::Now() - start;
  absl::Status status = replies.status();
  if (status.ok()) {
    for (const RedisReply& r : *replies) {
      if (r.is_error()) {
        status = r.ToStatus();
        break;
      }
    }
  }
  absl::MutexLock lock(&mu_);
  ++stats_.batches_total;
  stats_.flush_time_total += elapsed;
  if (status.ok()) {
    stats_.published_total += num_set;
    stats_.unpublished_total += num_del;
  }
  return status;
}

void RedisIndex::OnFailure(const absl::Status& status) {
  client_.reset();
  need_resync_ = true;
  next_connect_ = absl::Now() + config_.retry_interval;
  bool was_connected;
  {
    absl::MutexLock lock(&mu_);
    was_connected = stats_.connected;
    stats_.connected = false;
    ++stats_.errors_total;
  }
  if (was_connected) {
    LOG(WARNING) << "redis index: node " << config_.node
                 << " lost redis, updates are queued and the node is resynced on reconnect: "
                 << status;
  } else {
    VLOG(1) << "redis index: node " << config_.node << " still without redis: " << status;
  }
}

// ---- static helpers -----------------------------------------------------------------------------

absl::StatusOr<std::vector<tier_shm::TierKind>> RedisIndex::Lookup(
    RedisClient& client, absl::string_view node, absl::Span<const BlockHash> chain, int64_t batch) {
  PD_ASSIGN_OR_RETURN(std::vector<redis::PrefixTier> tiers,
                      redis::LookupPrefixTiers(client, node, chain, batch));
  std::vector<tier_shm::TierKind> out;
  out.reserve(tiers.size());
  for (redis::PrefixTier t : tiers) {
    out.push_back(FromPrefixTier(t));
  }
  return out;
}

absl::Status RedisIndex::RemoveNode(RedisClient& client, absl::string_view node, int64_t batch) {
  return redis::RemovePrefixIndexNode(client, node, batch);
}

}  // namespace pd::tierd
