#include "common/redis/prefix_index.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

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

absl::string_view PrefixGarbageName(PrefixGarbage kind) {
  switch (kind) {
    case PrefixGarbage::kTierValue:
      return "tier_value";
    case PrefixGarbage::kNodeName:
      return "node_name";
    case PrefixGarbage::kPeerAddress:
      return "peer_address";
    case PrefixGarbage::kSetMember:
      return "set_member";
  }
  return "unknown";
}

void PrefixGarbageCounter::Count(PrefixGarbage kind, absl::string_view entry) {
  const auto k = static_cast<size_t>(kind);
  const absl::Time now = absl::Now();
  uint64_t unlogged = 0;
  uint64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    total = ++totals_[k];
    if (now < next_log_[k]) {
      ++unlogged_[k];
      return;
    }
    next_log_[k] = now + log_interval_;
    unlogged = unlogged_[k];
    unlogged_[k] = 0;
  }
  // Whoever can write Redis can write anything: the entry is escaped and cut.
  LOG(WARNING) << "redis prefix index: ignored " << PrefixGarbageName(kind) << " garbage \""
               << absl::CEscape(entry.substr(0, 200)) << "\" (" << total << " so far, " << unlogged
               << " more not logged since the last line); pdserve never writes this";
}

uint64_t PrefixGarbageCounter::total(PrefixGarbage kind) const {
  absl::MutexLock lock(&mu_);
  return totals_[static_cast<size_t>(kind)];
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

// Appends the leading hits of an MGET reply for the keys `mget[1..]` to `tiers`; returns false
// when it stopped at a miss (or at garbage, counted). Internal when the reply is not an array of
// that many elements.
absl::StatusOr<bool> AppendHits(const RedisClient& client, const RedisReply& reply,
                                const std::vector<std::string>& mget,
                                std::vector<PrefixTier>* tiers, PrefixGarbageCounter* garbage) {
  const size_t num_keys = mget.size() - 1;
  if (reply.type != RedisReply::Type::kArray || reply.elements.size() != num_keys) {
    return absl::InternalError(absl::StrCat("redis ", client.address(), ": MGET of ", num_keys,
                                            " keys answered ", reply.DebugString().substr(0, 200)));
  }
  for (size_t i = 0; i < num_keys; ++i) {
    const RedisReply& value = reply.elements[i];
    PrefixTier tier;
    if (value.type != RedisReply::Type::kString) {
      return false;  // a miss (or a key of another type, which MGET cannot tell apart)
    }
    if (!ParsePrefixTier(value.str, &tier)) {
      if (garbage != nullptr) {
        garbage->Count(PrefixGarbage::kTierValue, absl::StrCat(mget[i + 1], " = ", value.str));
      }
      return false;
    }
    tiers->push_back(tier);
  }
  return true;
}

// "host:port" with a non-empty host and a port in 1..65535 (what PeerLink announces).
bool LooksLikeHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(address.substr(colon + 1), &port) && port >= 1 && port <= 65535;
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
                                                          int64_t batch,
                                                          PrefixGarbageCounter* garbage) {
  PD_RETURN_IF_ERROR(ValidatePrefixNodeName(node));
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix index lookup batch must be >= 1, got ", batch));
  }
  std::vector<PrefixTier> tiers;
  for (size_t start = 0; start < chain.size(); start += static_cast<size_t>(batch)) {
    const absl::Span<const BlockHash> part = chain.subspan(start, static_cast<size_t>(batch));
    std::vector<std::string> mget = MgetCommand(client, node, part);
    PD_ASSIGN_OR_RETURN(RedisReply reply, client.Command(mget));
    PD_ASSIGN_OR_RETURN(bool all_hit, AppendHits(client, reply, mget, &tiers, garbage));
    if (!all_hit) {
      break;
    }
  }
  return tiers;
}

absl::StatusOr<std::vector<std::vector<PrefixTier>>> LookupPrefixTiersBatch(
    RedisClient& client, absl::Span<const PrefixQuery> queries, PrefixGarbageCounter* garbage) {
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
    PD_ASSIGN_OR_RETURN(bool all_hit,
                        AppendHits(client, reply, commands[next - 1], &out[i], garbage));
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
                                                             absl::Span<const std::string> nodes,
                                                             PrefixGarbageCounter* garbage) {
  if (nodes.empty()) {
    return std::vector<std::string>();
  }
  std::vector<std::string> mget = {"MGET"};
  for (const std::string& node : nodes) {
    PD_RETURN_IF_ERROR(ValidatePrefixNodeName(node));
    mget.push_back(client.Key(PrefixPeerKey(node)));
  }
  PD_ASSIGN_OR_RETURN(RedisReply reply, client.Command(mget));
  if (reply.type != RedisReply::Type::kArray || reply.elements.size() != nodes.size()) {
    return absl::InternalError(absl::StrCat(
        "MGET of ", nodes.size(), " peer addresses: unexpected reply ", reply.DebugString()));
  }
  std::vector<std::string> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const RedisReply& r = reply.elements[i];
    if (r.type != RedisReply::Type::kString) {
      out.emplace_back();
    } else if (!LooksLikeHostPort(r.str)) {
      if (garbage != nullptr) {
        garbage->Count(PrefixGarbage::kPeerAddress, absl::StrCat(mget[i + 1], " = ", r.str));
      }
      out.emplace_back();
    } else {
      out.push_back(r.str);
    }
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
