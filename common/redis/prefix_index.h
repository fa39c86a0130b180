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

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// Tier of each leading block of `chain` held by `node`, stopping at the first miss (or at a
// value that is neither "dram" nor "nvme"). One MGET per `batch` hashes; later batches are
// asked only when the earlier ones all hit. Errors: InvalidArgument (node name, batch < 1),
// Internal (a reply that is not an array of the keys' size), or the client's errors
// (Unavailable, DeadlineExceeded, ...).
absl::StatusOr<std::vector<PrefixTier>> LookupPrefixTiers(RedisClient& client,
                                                          absl::string_view node,
                                                          absl::Span<const BlockHash> chain,
                                                          int64_t batch = 128);

// One question of LookupPrefixTiersBatch: what `node` holds of `chain`, from chain[0].
struct PrefixQuery {
  std::string node;
  absl::Span<const BlockHash> chain;  // not owned; outlives the call
};

// LookupPrefixTiers for several (node, chain) questions in one round trip: one pipeline of one
// MGET per question with a non-empty chain. Result i answers queries[i]. The call fails as a
// whole (no partial answers). Errors: InvalidArgument (a node name), Internal (a malformed
// reply), the client's errors, or the mapped Redis error reply of any MGET.
absl::StatusOr<std::vector<std::vector<PrefixTier>>> LookupPrefixTiersBatch(
    RedisClient& client, absl::Span<const PrefixQuery> queries);

// Every member of the set `set_key` (a full key), read with SSCAN `count` at a time and
// deduplicated (sorted). Errors: the client's errors, Internal for a malformed reply.
absl::StatusOr<std::vector<std::string>> ScanSetMembers(RedisClient& client,
                                                        const std::string& set_key, int64_t count);

// The peer addresses of `nodes` (result i answers nodes[i]; "" when the node published none or
// it expired), in one MGET. Errors: InvalidArgument (a node name), Internal (malformed reply),
// the client's errors.
absl::StatusOr<std::vector<std::string>> LookupPeerAddresses(RedisClient& client,
                                                             absl::Span<const std::string> nodes);

// Deletes every entry `node` published (its membership set's members), the set itself, its peer
// address, and the node's name from `nodes`. Keys written without reaching the set expire by their
// TTL. Errors: InvalidArgument (node name, batch < 1), or the client's errors.
absl::Status RemovePrefixIndexNode(RedisClient& client, absl::string_view node,
                                   int64_t batch = 1024);

}  // namespace pd::redis
