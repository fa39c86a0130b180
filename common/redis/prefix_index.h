// The Redis prefix index's key layout and its read side, shared by the writer (pd-tierd's
// RedisIndex, services/tierd/redis_index.h) and the readers (pd-router's lower-tier credit,
// operators' tools). Layout, under the cluster's key_prefix (RedisConfig::Key):
//   blk:<node>:<32 lower-case hex digits of the hash>  string "dram" or "nvme", with a TTL
//   node:<node>:blocks                                 SET of the hex hashes <node> published
//   nodes                                              SET of node names that published
//   peer:<node>                                        string: the gRPC address ("host:port") at
//                                                      which <node>'s pd-tierd serves PeerRead to
//                                                      other nodes, with a TTL it keeps renewing
// docs/redis_index.md describes how the writer keeps it current.
//
// Node names are 1..255 bytes without ':', ASCII spaces or control characters, so a key names
// exactly one node.
//
// All functions are thread-safe (RedisClient serializes calls on its connection).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/redis/redis_client.h"

namespace pd::redis {

// The tier a node holds a block in, below its workers' own pools.
enum class PrefixTier : uint8_t { kDram, kNvme };

// Key names without key_prefix (pass them through RedisConfig::Key / RedisClient::Key).
std::string PrefixBlockKey(absl::string_view node, const BlockHash& hash);  // blk:<node>:<hex>
std::string PrefixNodeBlocksKey(absl::string_view node);                    // node:<node>:blocks
inline constexpr absl::string_view kPrefixNodesKey = "nodes";
std::string PrefixPeerKey(absl::string_view node);  // peer:<node>

// "dram" / "nvme", the values of blk: keys. ParsePrefixTier is the inverse; it returns false
// (leaving *tier alone) for any other value.
absl::string_view PrefixTierValue(PrefixTier tier);
bool ParsePrefixTier(absl::string_view value, PrefixTier* tier);

// OK, or InvalidArgument naming the node when it is not a valid node name.
absl::Status ValidatePrefixNodeName(absl::string_view node);

// Entries that are not what pdserve writes, found by a reader and skipped:
//   kTierValue    a blk: value that is neither "dram" nor "nvme" (ends the chain there)
//   kNodeName     a member of `nodes` that is not a valid node name
//   kPeerAddress  a peer:<node> value that is not "host:port" with a port in 1..65535
//   kSetMember    a member of node:<node>:blocks that is not a block hash (tierd deletes it)
// (A key of the wrong type reads as absent through MGET, and fails SSCAN with WRONGTYPE.)
enum class PrefixGarbage : uint8_t { kTierValue, kNodeName, kPeerAddress, kSetMember };
inline constexpr size_t kNumPrefixGarbageKinds = 4;
// "tier_value", "node_name", "peer_address", "set_member" (metric labels).
absl::string_view PrefixGarbageName(PrefixGarbage kind);

// Counts garbage entries and logs them: a WARNING naming the kind and the (escaped, shortened)
// entry, at most once per `log_interval` per kind, with how many went unlogged in between.
// Thread-safe.
class PrefixGarbageCounter {
 public:
  explicit PrefixGarbageCounter(absl::Duration log_interval = absl::Seconds(10))
      : log_interval_(log_interval) {}
  void Count(PrefixGarbage kind, absl::string_view entry);
  uint64_t total(PrefixGarbage kind) const;

 private:
  const absl::Duration log_interval_;
  mutable absl::Mutex mu_;
  std::array<uint64_t, kNumPrefixGarbageKinds> totals_ ABSL_GUARDED_BY(mu_) = {};
  std::array<uint64_t, kNumPrefixGarbageKinds> unlogged_ ABSL_GUARDED_BY(mu_) = {};
  std::array<absl::Time, kNumPrefixGarbageKinds> next_log_ ABSL_GUARDED_BY(mu_) = {
      absl::InfinitePast(), absl::InfinitePast(), absl::InfinitePast(), absl::InfinitePast()};
};

// Tier of each leading block of `chain` held by `node`, stopping at the first miss (or at a
// value that is neither "dram" nor "nvme"). One MGET per `batch` hashes; later batches are
// asked only when the earlier ones all hit. Errors: InvalidArgument (node name, batch < 1),
// Internal (a reply that is not an array of the keys' size), or the client's errors
// (Unavailable, DeadlineExceeded, ...).
// A value that is not a tier counts as kTierValue garbage in `garbage` (when not null).
absl::StatusOr<std::vector<PrefixTier>> LookupPrefixTiers(RedisClient& client,
                                                          absl::string_view node,
                                                          absl::Span<const BlockHash> chain,
                                                          int64_t batch = 128,
                                                          PrefixGarbageCounter* garbage = nullptr);

// One question of LookupPrefixTiersBatch: what `node` holds of `chain`, from chain[0].
struct PrefixQuery {
  std::string node;
  absl::Span<const BlockHash> chain;  // not owned; outlives the call
};

// LookupPrefixTiers for several (node, chain) questions in one round trip: one pipeline of one
// MGET per question with a non-empty chain. Result i answers queries[i]. The call fails as a
// whole (no partial answers). Errors: InvalidArgument (a node name), Internal (a malformed
// reply), the client's errors, or the mapped Redis error reply of any MGET. Values that are not
// tiers count as in LookupPrefixTiers.
absl::StatusOr<std::vector<std::vector<PrefixTier>>> LookupPrefixTiersBatch(
    RedisClient& client, absl::Span<const PrefixQuery> queries,
    PrefixGarbageCounter* garbage = nullptr);

// Every member of the set `set_key` (a full key), read with SSCAN `count` at a time and
// deduplicated (sorted). Errors: the client's errors, Internal for a malformed reply.
absl::StatusOr<std::vector<std::string>> ScanSetMembers(RedisClient& client,
                                                        const std::string& set_key, int64_t count);

// The peer addresses of `nodes` (result i answers nodes[i]; "" when the node published none or
// it expired, or it is not "host:port": kPeerAddress garbage in `garbage` when not null), in one
// MGET. Errors: InvalidArgument (a node name), Internal (malformed reply), the client's errors.
absl::StatusOr<std::vector<std::string>> LookupPeerAddresses(
    RedisClient& client, absl::Span<const std::string> nodes,
    PrefixGarbageCounter* garbage = nullptr);

// Deletes every entry `node` published (its membership set's members), the set itself, its peer
// address, and the node's name from `nodes`. Keys written without reaching the set expire by their
// TTL. Errors: InvalidArgument (node name, batch < 1), or the client's errors.
absl::Status RemovePrefixIndexNode(RedisClient& client, absl::string_view node,
                                   int64_t batch = 1024);

}  // namespace pd::redis
