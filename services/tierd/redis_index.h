// RedisIndex: pd-tierd's half of the cluster-wide prefix index in Redis (issue #6 item 4).
//
// Every node's tierd mirrors which blocks its DRAM and NVMe tiers hold into Redis, so the router
// can credit lower-tier hits when it places a request (docs/architecture.md, "Router scoring"
// and "Tiers"; the keys are in docs/redis_index.md).
//
// Key layout (common/redis/prefix_index.h, which also holds the read side; every key goes through
// RedisConfig::Key, i.e. is prefixed with key_prefix, so clusters sharing one Redis never see
// each other's keys):
//   blk:<node>:<32 lower-case hex digits of the hash>  string "dram" or "nvme", SET ... EX ttl.
//       One key per (node, block): an update is one command and a lookup of a chain on one
//       node is one MGET. The TTL (entry_ttl) bounds how long a dead node's entries outlive it.
//   node:<node>:blocks  SET of the hex hashes the node published (membership, for clean-up:
//       resync and RemoveNode delete exactly these keys). Its TTL is also entry_ttl, refreshed
//       with the entries, so a node that never comes back leaves nothing behind.
//   nodes               SET of node names that published (for the router and operators); no TTL,
//       RemoveNode takes a node out.
// Node names are non-empty, at most 255 bytes, and contain no ':' or ASCII space/control
// characters (so a key names exactly one node).
//
// Updates: Publish/Unpublish only queue into a pending map keyed by hash, where the last
// operation per hash wins (so a block moving DRAM -> NVMe -> gone in one flush interval costs one
// DEL). A background thread sends the pending map every flush_interval in pipelined batches of
// max_batch updates: per batch one `SET blk:.. tier EX ttl` or `DEL blk:..` per update, plus one
// SADD and one SREM on node:<node>:blocks carrying all the batch's members.
//
// Resync: on the first connect, after every failed call (connection lost, timeout, error reply)
// and every reconnect (RedisClient may reconnect within a call that then succeeds: the server may
// have restarted empty), after updates were dropped (pending map full) and every entry_ttl/2
// (TTL refresh), the thread re-mirrors the node from `snapshot` (what TierStore holds now).
// While idle, a PING every retry_interval notices an outage or restart. A resync:
//   1. the pending map is cleared (the snapshot supersedes everything queued so far),
//   2. the old membership set is read (SSCAN) and every member not in the snapshot has its
//      blk: key deleted and is removed from the set (batches of max_batch),
//   3. every snapshot entry is written again (SET EX + SADD, batches of max_batch), then the set's
//      TTL is refreshed and the node is added to `nodes`.
// Step 2 deviates from "delete everything, then republish" on purpose: entries the node still
// holds stay visible to the router throughout the resync. Cost of a refresh: one SET + one set
// member per held block per entry_ttl/2; Redis spends ~3.3 us of CPU on each (docs/benchmarks.md
// "Redis prefix index"), so a million blocks every 5 minutes is ~1% of one Redis core.
//
// Availability: Redis being down never fails tierd. Create succeeds without a server; the thread
// retries the connection every retry_interval, updates keep being queued (up to max_pending, then
// dropped, counted, and covered by the resync that follows), and Stats().connected says whether
// the index is live. When Redis comes back (even empty, e.g. restarted), the resync repopulates it.
//
// Ordering contract: call Publish/Unpublish after the change is visible to `snapshot` (e.g. after
// TierStore committed or dropped the block). Then a resync racing with updates is correct: an
// update queued before the pending map was cleared is in the snapshot, one queued after is sent
// after the resync.
//
// Thread-safety: thread-safe. Publish, Unpublish and Stats never block on Redis (they take a
// short internal mutex); Flush and the background thread serialize their Redis work on a second
// (I/O) mutex. `snapshot` is called on the background thread or inside Flush with only the I/O
// mutex held, so it may take the store's own locks while other threads Publish; it must not call
// Flush.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/redis/prefix_index.h"
#include "common/redis/redis_client.h"
#include "services/tierd/tier_store.h"

namespace pd::tierd {

// The tier as stored in Redis, and back.
redis::PrefixTier ToPrefixTier(tier_shm::TierKind tier);
tier_shm::TierKind FromPrefixTier(redis::PrefixTier tier);

struct RedisIndexConfig {
  std::string node;  // this node's name, e.g. the Kubernetes node or host name; required
  // TTL of every entry and of the membership set; finite and >= 1s, truncated to whole seconds
  // (Redis EX). Entries are refreshed every entry_ttl/2, so a live node's entries never expire.
  absl::Duration entry_ttl = absl::Minutes(10);
  int64_t max_batch = 1024;         // updates per pipelined round trip, in [1, 1'000'000]
  int64_t max_pending = 1'000'000;  // distinct hashes queued; beyond it updates are dropped; >= 1
  absl::Duration flush_interval = absl::Milliseconds(10);  // background flush period, > 0
  // Reconnect period while Redis is down, and PING period while it is up and idle; > 0.
  absl::Duration retry_interval = absl::Seconds(1);

  // InvalidArgument naming the first bad field and its value.
  absl::Status Validate() const;
};

// Counters since Create; the *_total fields only grow. tierd turns them into
// pd_tierd_redis_index_* metrics.
struct RedisIndexStats {
  bool connected = false;           // the last Redis call succeeded (false until the first resync)
  int64_t pending = 0;              // distinct hashes queued now
  uint64_t published_total = 0;     // SET commands acknowledged (updates and resyncs)
  uint64_t unpublished_total = 0;   // DEL of a blk: key acknowledged (updates and resyncs)
  uint64_t dropped_total = 0;       // updates dropped because the pending map was full
  uint64_t resyncs_total = 0;       // completed resyncs (connects, recoveries, TTL refreshes)
  uint64_t errors_total = 0;        // failed connects and failed calls (each starts a resync)
  uint64_t batches_total = 0;       // pipelined round trips sent for updates and resyncs
  absl::Duration flush_time_total;  // wall time inside those round trips
};

namespace redis_index_internal {

// The pending map: last operation per hash wins, bounded size. Not thread-safe (RedisIndex
// guards it).
class PendingUpdates {
 public:
  struct Update {
    BlockHash hash;
    bool publish = false;                                 // false: unpublish
    tier_shm::TierKind tier = tier_shm::TierKind::kDram;  // when publish
  };

  explicit PendingUpdates(int64_t max_size) : max_size_(max_size) {}

  // Records the operation, replacing any queued one for the same hash. Returns false (and
  // records nothing) when `hash` is not queued yet and max_size hashes already are.
  bool Add(const BlockHash& hash, bool publish, tier_shm::TierKind tier);
  // Removes and returns everything queued (unspecified order).
  std::vector<Update> TakeAll();
  void Clear() { map_.clear(); }
  int64_t size() const { return static_cast<int64_t>(map_.size()); }

 private:
  struct Op {
    bool publish = false;
    tier_shm::TierKind tier = tier_shm::TierKind::kDram;
  };
  const int64_t max_size_;
  absl::flat_hash_map<BlockHash, Op> map_;
};

// The Redis commands of one batch of updates for `node` (see "Updates" above), keys through
// `config.Key`. `ttl_seconds` >= 1.
std::vector<std::vector<std::string>> BuildUpdateCommands(
    const redis::RedisConfig& config, absl::string_view node, int64_t ttl_seconds,
    absl::Span<const PendingUpdates::Update> updates);

}  // namespace redis_index_internal

class RedisIndex {
 public:
  // What the node holds now (every block of TierStore's DRAM and NVMe tiers, with its tier).
  using SnapshotFn = absl::AnyInvocable<std::vector<std::pair<BlockHash, tier_shm::TierKind>>()>;

  // Validates both configs and starts the background thread, which connects (Redis being down is
  // not an error: the thread keeps retrying). Errors: InvalidArgument (a config, or a null
  // snapshot function).
  static absl::StatusOr<std::unique_ptr<RedisIndex>> Create(redis::RedisConfig redis,
                                                            RedisIndexConfig config,
                                                            SnapshotFn snapshot);

  RedisIndex(const RedisIndex&) = delete;
  RedisIndex& operator=(const RedisIndex&) = delete;
  // Stops and joins the background thread. Pending updates are not sent (call Flush first for a
  // clean shutdown); entries in Redis stay until their TTL or a RemoveNode.
  ~RedisIndex();

  // Queue "this node holds `hash` in `tier`" / "no longer holds `hash`". Non-blocking.
  void Publish(const BlockHash& hash, tier_shm::TierKind tier);
  void Unpublish(const BlockHash& hash);

  // Synchronously does what one background round does, without waiting for retry_interval:
  // connects if disconnected, resyncs if one is due, then sends every pending update. For tests
  // and shutdown. Errors: Unavailable / DeadlineExceeded / the mapped error reply of the call
  // that failed (the index is then disconnected and resyncs on the next round).
  absl::Status Flush();

  RedisIndexStats Stats() const;
  const RedisIndexConfig& config() const { return config_; }
  // Members of this node's set that are no block hash, found by resyncs (and deleted there).
  const redis::PrefixGarbageCounter& garbage() const { return garbage_; }

  // redis::LookupPrefixTiers in tier_shm::TierKind: tier of each leading block of `chain` held by
  // `node` according to Redis, stopping at the first miss (or at a value that is neither "dram" nor
  // "nvme"). One MGET per `batch` hashes; later batches are asked only when the earlier ones all
  // hit. Errors: InvalidArgument (node name, batch < 1), or the client's errors (Unavailable,
  // DeadlineExceeded, ...).
  static absl::StatusOr<std::vector<tier_shm::TierKind>> Lookup(redis::RedisClient& client,
                                                                absl::string_view node,
                                                                absl::Span<const BlockHash> chain,
                                                                int64_t batch = 128);

  // redis::RemovePrefixIndexNode: deletes every entry `node` published (its membership set's
  // members), the set itself, and the node's name from `nodes`. For operators and for clean-up
  // of a dead node; a live node's RedisIndex republishes at its next resync. Keys written
  // without reaching the set expire by TTL. Errors: InvalidArgument (node name, batch < 1), or
  // the client's errors.
  static absl::Status RemoveNode(redis::RedisClient& client, absl::string_view node,
                                 int64_t batch = 1024);

 private:
  RedisIndex(redis::RedisConfig redis, RedisIndexConfig config, SnapshotFn snapshot);

  void Run();  // background thread body
  // One round (see Flush). `force`: connect now even if retry_interval has not passed.
  absl::Status RunOnce(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status Resync() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status SendPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Sends `updates` in pipelines of max_batch.
  absl::Status SendUpdates(absl::Span<const redis_index_internal::PendingUpdates::Update> updates)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Sends one pipeline; counts a batch and its time, and on success `num_set` published and
  // `num_del` unpublished entries. A failed call or any error reply is an error.
  absl::Status SendBatch(const std::vector<std::vector<std::string>>& commands, uint64_t num_set,
                         uint64_t num_del) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Schedules a resync when the client reconnected since the last check.
  void NoteReconnects() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Drops the connection and schedules a reconnect + resync.
  void OnFailure(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  const redis::RedisConfig redis_config_;
  const RedisIndexConfig config_;
  const int64_t ttl_seconds_;

  // Held for all Redis I/O (background round or Flush), never while taking mu_ for long.
  // Lock order: io_mu_ before mu_.
  absl::Mutex io_mu_;
  SnapshotFn snapshot_ ABSL_GUARDED_BY(io_mu_);
  std::unique_ptr<redis::RedisClient> client_ ABSL_GUARDED_BY(io_mu_);  // null: disconnected
  bool need_resync_ ABSL_GUARDED_BY(io_mu_) = true;
  absl::Time next_connect_ ABSL_GUARDED_BY(io_mu_) = absl::InfinitePast();
  absl::Time next_refresh_ ABSL_GUARDED_BY(io_mu_) = absl::InfinitePast();
  absl::Time next_probe_ ABSL_GUARDED_BY(io_mu_) = absl::InfinitePast();  // next idle PING
  uint64_t seen_reconnects_ ABSL_GUARDED_BY(io_mu_) = 0;  // client_->Stats().num_reconnects

  redis::PrefixGarbageCounter garbage_;

  mutable absl::Mutex mu_;  // pending updates, stats, stop flag
  redis_index_internal::PendingUpdates pending_ ABSL_GUARDED_BY(mu_);
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;  // updates were dropped since the last resync
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RedisIndexStats stats_ ABSL_GUARDED_BY(mu_);  // `pending` is filled in by Stats()

  std::thread thread_;
};

}  // namespace pd::tierd
