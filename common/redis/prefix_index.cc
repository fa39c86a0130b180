#include "common/redis/prefix_index.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pd::redis {

std::string PrefixBlockKey(absl::string_view node, const BlockHash& hash) {
  return absl::StrCat("blk:", node, ":", hash.ToHex());
}

std::string PrefixNodeBlocksKey(absl::string_view node) {
  return absl::StrCat("node:", node, ":blocks");
}

std::string PrefixPeerKey(absl::string_view node) { return absl::StrCat("peer:", node); }

absl::string_view PrefixTierValue(PrefixTier tier) {
  return tier == PrefixTier::kNvme ? "nvme" : "dram";
}

bool ParsePrefixTier(absl::string_view value, PrefixTier* tier) {
  if (value == "dram") {
    *tier = PrefixTier::kDram;
    return true;
  }
  if (value == "nvme") {
    *tier = PrefixTier::kNvme;
    return true;
  }
  return false;
}

absl::Status ValidatePrefixNodeName(absl::string_view node) {
  if (node.empty() || node.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix index node name must have 1..255 bytes, got ", node.size()));
  }
  for (char c : node) {
    const auto u = static_cast<unsigned char>(c);
    if (c == ':' || u <= 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix index node name \"", absl::CEscape(node),
                       "\" must not contain ':', spaces or control characters"));
    }
  }
  return absl::OkStatus();
}

namespace {

std::vector<std::string> MgetCommand(const RedisClient& client, absl::string_view node,
                                     absl::Span<const BlockHash> hashes) {
  const std::string key_head = client.Key(absl::StrCat("blk:", node, ":"));
  std::vector<std::string> mget;
  mget.reserve(hashes.size() + 1);
  mget.push_back("MGET");
  for (const BlockHash& h : hashes) {
    mget.push_back(absl::StrCat(key_head, h.ToHex()));
  }
  return mget;
}

// Appends the leading hits of an MGET reply for `num_keys` keys to `tiers`; returns false when
// it stopped at a miss. Internal when the reply is not an array of num_keys elements.
absl::StatusOr<bool> AppendHits(const RedisClient& client, const RedisReply& reply, size_t num_keys,
                                std::vector<PrefixTier>* tiers) {
  if (reply.type != RedisReply::Type::kArray || reply.elements.size() != num_keys) {
    return absl::InternalError(absl::StrCat("redis ", client.address(), ": MGET of ", num_keys,
                                            " keys answered ", reply.DebugString().substr(0, 200)));
  }
  for (const RedisReply& value : reply.elements) {
    PrefixTier tier;
    if (value.type != RedisReply::Type::kString || !ParsePrefixTier(value.str, &tier)) {
      return false;
    }
    tiers->push_back(tier);
  }
  return true;
}

// Parses an SSCAN reply ([cursor, [member...]]), appending the members.
absl::Status ParseScanReply(const RedisReply& reply, std::string* cursor,
                            std::vector<std::string>* members) {
  if (reply.type != RedisReply::Type::kArray || reply.elements.size() != 2 ||
      reply.elements[0].type != RedisReply::Type::kString ||
      reply.elements[1].type != RedisReply::Type::kArray) {
    return absl::InternalError(
        absl::StrCat("unexpected SSCAN reply: ", reply.DebugString().substr(0, 200)));
  }
  *cursor = reply.elements[0].str;
  for (const RedisReply& m : reply.elements[1].elements) {
    if (m.type == RedisReply::Type::kString) {
      members->push_back(m.str);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PrefixTier>> LookupPrefixTiers(RedisClient& client,
                                                          absl::string_view node,
                                                          absl::Span<const BlockHash> chain,
                                                          int64_t batch) {
  PD_RETURN_IF_ERROR(ValidatePrefixNodeName(node));
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix index lookup batch must be >= 1, got ", batch));
  }
  std::vector<PrefixTier> tiers;
  for (size_t start = 0; start < chain.size(); start += static_cast<size_t>(batch)) {
    const absl::Span<const BlockHash> part = chain.subspan(start, static_cast<size_t>(batch));
    PD_ASSIGN_OR_RETURN(RedisReply reply, client.Command(MgetCommand(client, node, part)));
    PD_ASSIGN_OR_RETURN(bool all_hit, AppendHits(client, reply, part.size(), &tiers));
    if (!all_hit) {
      break;
    }
  }
  return tiers;
}

absl::StatusOr<std::vector<std::vector<PrefixTier>>> LookupPrefixTiersBatch(
    RedisClient& client, absl::Span<const PrefixQuery> queries) {
  std::vector<std::vector<std::string>> commands;
  commands.reserve(queries.size());
  for (const PrefixQuery& q : queries) {
    PD_RETURN_IF_ERROR(ValidatePrefixNodeName(q.node));
    if (!q.chain.empty()) {
      commands.push_back(MgetCommand(client, q.node, q.chain));
    }
  }
  PD_ASSIGN_OR_RETURN(std::vector<RedisReply> replies, client.Pipeline(commands));
  std::vector<std::vector<PrefixTier>> out(queries.size());
  size_t next = 0;
  for (size_t i = 0; i < queries.size(); ++i) {
    if (queries[i].chain.empty()) {
      continue;
    }
    const RedisReply& reply = replies[next++];
    PD_RETURN_IF_ERROR(reply.ToStatus());
    PD_ASSIGN_OR_RETURN(bool all_hit, AppendHits(client, reply, queries[i].chain.size(), &out[i]));
    (void)all_hit;
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ScanSetMembers(RedisClient& client,
                                                        const std::string& set_key, int64_t count) {
  std::vector<std::string> members;
  std::string cursor = "0";
  const std::string count_arg = absl::StrCat(std::max<int64_t>(count, 10));
  do {
    PD_ASSIGN_OR_RETURN(RedisReply reply,
                        client.Command({"SSCAN", set_key, cursor, "COUNT", count_arg}));
    PD_RETURN_IF_ERROR(ParseScanReply(reply, &cursor, &members));
  } while (cursor != "0");
  // SSCAN may return a member more than once.
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  return members;
}

absl::StatusOr<std::vector<std::string>> LookupPeerAddresses(RedisClient& client,
                                                             absl::Span<const std::string> nodes) {
  if (nodes.empty()) {
    return std::vector<std::string>();
  }
  std::vector<std::string> mget = {"MGET"};
  for (const std::string& node : nodes) {
    PD_RETURN_IF_ERROR(ValidatePrefixNodeName(node));
    mget.push_back(client.Key(PrefixPeerKey(node)));
  }
  PD_ASSIGN_OR_RETURN(RedisReply reply, client.Command(std::move(mget)));
  if (reply.type != RedisReply::Type::kArray || reply.elements.size() != nodes.size()) {
    return absl::InternalError(absl::StrCat(
        "MGET of ", nodes.size(), " peer addresses: unexpected reply ", reply.DebugString()));
  }
  std::vector<std::string> out;
  out.reserve(nodes.size());
  for (const RedisReply& r : reply.elements) {
    out.push_back(r.type == RedisReply::Type::kString ? r.str : std::string());
  }
  return out;
}

absl::Status RemovePrefixIndexNode(RedisClient& client, absl::string_view node, int64_t batch) {
  PD_RETURN_IF_ERROR(ValidatePrefixNodeName(node));
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix index remove batch must be >= 1, got ", batch));
  }
  const std::string set_key = client.Key(PrefixNodeBlocksKey(node));
  PD_ASSIGN_OR_RETURN(std::vector<std::string> members, ScanSetMembers(client, set_key, batch));
  const std::string key_head = client.Key(absl::StrCat("blk:", node, ":"));
  for (size_t start = 0; start < members.size(); start += static_cast<size_t>(batch)) {
    const size_t end = std::min(members.size(), start + static_cast<size_t>(batch));
    std::vector<std::string> del = {"DEL"};
    for (size_t i = start; i < end; ++i) {
      del.push_back(absl::StrCat(key_head, members[i]));
    }
    PD_ASSIGN_OR_RETURN(RedisReply reply, client.Command(std::move(del)));
    (void)reply;
  }
  PD_ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                      client.Pipeline({{"DEL", set_key, client.Key(PrefixPeerKey(node))},
                                       {"SREM", client.Key(kPrefixNodesKey), std::string(node)}}));
  for (const RedisReply& r : replies) {
    PD_RETURN_IF_ERROR(r.ToStatus());
  }
  return absl::OkStatus();
}

}  // namespace pd::redis
