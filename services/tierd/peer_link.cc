#include "services/tierd/peer_link.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/hash/block_hash.h"
#include "common/log/log.h"
#include "common/redis/prefix_index.h"
#include "services/base/grpc_status.h"

namespace pd::tierd {

namespace v1 = pdserve::internal::v1;

namespace {

// Reads a peer's sessions never collide with a worker's (random ids below 2^63).
constexpr uint64_t kPeerSessionBit = uint64_t{1} << 63;

// A fetch chunk must end within kBudgetFactor x the recompute time of the blocks fetched so far,
// plus kSlack (RPC and scheduling noise on small chunks).
constexpr double kBudgetFactor = 1.0;
constexpr absl::Duration kSlack = absl::Milliseconds(5);

grpc::Status ToGrpc(absl::Status s) { return services::ToGrpcStatus(s); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// RedisPeerDirectory

RedisPeerDirectory::RedisPeerDirectory(redis::RedisConfig redis, std::string node,
                                       std::string address, absl::Duration ttl,
                                       absl::Duration refresh)
    : config_(std::move(redis)),
      node_(std::move(node)),
      ttl_(ttl),
      refresh_(refresh),
      address_(std::move(address)) {}

void RedisPeerDirectory::SetAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  address_ = std::move(address);
}

absl::StatusOr<redis::RedisClient*> RedisPeerDirectory::Client() {
  if (client_ == nullptr) {
    redis::RedisConfig c = config_;
    c.max_reconnect_attempts = 0;  // one try per call: the next call connects again
    PD_ASSIGN_OR_RETURN(client_, redis::RedisClient::Connect(std::move(c)));
  }
  return client_.get();
}

absl::StatusOr<PeerHolder> RedisPeerDirectory::FindHolder(absl::Span<const BlockHash> chain) {
  absl::MutexLock lock(&mu_);
  auto fail = [this](absl::Status s) {
    client_.reset();  // reconnect next time
    return s;
  };
  absl::StatusOr<redis::RedisClient*> client = Client();
  if (!client.ok()) {
    return fail(client.status());
  }
  if (absl::Now() - others_read_ > refresh_) {
    absl::StatusOr<std::vector<std::string>> nodes =
        redis::ScanSetMembers(**client, (*client)->Key(redis::kPrefixNodesKey), /*count=*/256);
    if (!nodes.ok()) {
      return fail(nodes.status());
    }
    others_.clear();
    for (std::string& n : *nodes) {
      if (!redis::ValidatePrefixNodeName(n).ok()) {
        garbage_.Count(redis::PrefixGarbage::kNodeName,
                       absl::StrCat((*client)->Key(redis::kPrefixNodesKey), " member ", n));
      } else if (n != node_) {
        others_.push_back(std::move(n));
      }
    }
    others_read_ = absl::Now();
  }
  PeerHolder best;
  if (others_.empty() || chain.empty()) {
    return best;
  }
  std::vector<redis::PrefixQuery> queries;
  queries.reserve(others_.size());
  for (const std::string& n : others_) {
    queries.push_back({n, chain});
  }
  absl::StatusOr<std::vector<std::vector<redis::PrefixTier>>> tiers =
      redis::LookupPrefixTiersBatch(**client, queries, &garbage_);
  if (!tiers.ok()) {
    return fail(tiers.status());
  }
  // Nodes by run length, longest first; the first with an address wins.
  std::vector<size_t> order;
  for (size_t i = 0; i < others_.size(); ++i) {
    if (!(*tiers)[i].empty()) {
      order.push_back(i);
    }
  }
  if (order.empty()) {
    return best;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return (*tiers)[a].size() > (*tiers)[b].size(); });
  std::vector<std::string> names;
  for (size_t i : order) {
    names.push_back(others_[i]);
  }
  absl::StatusOr<std::vector<std::string>> addresses =
      redis::LookupPeerAddresses(**client, names, &garbage_);
  if (!addresses.ok()) {
    return fail(addresses.status());
  }
  for (size_t k = 0; k < order.size(); ++k) {
    if (!(*addresses)[k].empty()) {
      best.node = names[k];
      best.address = (*addresses)[k];
      best.blocks = static_cast<int64_t>((*tiers)[order[k]].size());
      break;
    }
  }
  return best;
}

absl::Status RedisPeerDirectory::Announce() {
  absl::MutexLock lock(&mu_);
  if (address_.empty()) {
    return absl::FailedPreconditionError("no peer address to announce yet");
  }
  absl::StatusOr<redis::RedisClient*> client = Client();
  if (!client.ok()) {
    client_.reset();
    return client.status();
  }
  absl::StatusOr<redis::RedisReply> reply =
      (*client)->Command({"SET", (*client)->Key(redis::PrefixPeerKey(node_)), address_, "PX",
                          absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(ttl_)))});
  if (!reply.ok()) {
    client_.reset();
    return reply.status();
  }
  return reply->ToStatus();
}

// ---------------------------------------------------------------------------------------------
// PeerLink

absl::Status PeerLinkConfig::Validate() const {
  if (max_reads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_max_reads must be >= 1, got ", max_reads));
  }
  if (chunk_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_fetch_chunk_blocks must be >= 1, got ", chunk_blocks));
  }
  if (max_fetch_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_fetch_max_blocks must be >= 1, got ", max_fetch_blocks));
  }
  if (fetch_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_fetch_timeout must be > 0, got ",
                                                   absl::FormatDuration(fetch_timeout)));
  }
  if (absl::Status s = transport.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_transport: ", s.message()));
  }
  return absl::OkStatus();
}

PeerLink::PeerLink(PeerLinkConfig config, TierStore* store,
                   std::unique_ptr<PeerDirectory> directory,
                   std::shared_ptr<const services::ClientSecurity> security)
    : config_(std::move(config)),
      store_(store),
      directory_(std::move(directory)),
      security_(security != nullptr ? std::move(security) : services::ClientSecurity::Insecure()) {}

absl::StatusOr<std::unique_ptr<PeerLink>> PeerLink::Create(
    PeerLinkConfig config, TierStore* store, transport::PoolGeometry geometry,
    std::unique_ptr<PeerDirectory> directory,
    std::shared_ptr<const services::ClientSecurity> security) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<PeerLink> link(
      new PeerLink(std::move(config), store, std::move(directory), std::move(security)));
  absl::StatusOr<std::unique_ptr<transport::KvTransport>> t =
      transport::CreateTransport(link->config_.transport);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("--peer_transport ", link->config_.transport.backend, ": ",
                                     t.status().message()));
  }
  link->transport_ = *std::move(t);

  DramPool* dram = store->dram();
  link->slot_bytes_ = static_cast<uint64_t>(dram->slot_bytes());
  link->block_bytes_ = static_cast<uint64_t>(dram->block_bytes());
  // One transport block per DRAM slot: the slot's padding travels too, so that slot i of one
  // tierd maps onto slot j of another without a second geometry.
  geometry.block_bytes = link->slot_bytes_;
  geometry.num_blocks = static_cast<uint64_t>(dram->num_slots());
  transport::MemoryRegion region;
  region.base = dram->SlotData(DramSlot(0));
  region.size_bytes = geometry.block_bytes * geometry.num_blocks;
  region.kind = transport::MemoryKind::kHost;
  region.geometry = geometry;
  absl::StatusOr<transport::RegionHandle> handle = link->transport_->Register(region);
  if (!handle.ok()) {
    return absl::Status(
        handle.status().code(),
        absl::StrCat("--peer_transport: registering the DRAM pool: ", handle.status().message()));
  }
  link->region_ = *handle;
  return link;
}

PeerLink::~PeerLink() {
  if (transport_ != nullptr && region_.valid()) {
    if (absl::Status s = transport_->Deregister(region_); !s.ok()) {
      LOG(WARNING) << "tierd: peer transport deregister: " << s;
    }
  }
}

uint64_t PeerLink::NextId() {
  absl::MutexLock lock(&mu_);
  return absl::Uniform<uint64_t>(rng_);
}

void PeerLink::Announce() {
  if (directory_ == nullptr) {
    return;
  }
  if (absl::Status s = directory_->Announce(); !s.ok()) {
    VLOG(1) << "tierd: peer address not announced: " << s;
  }
}

grpc::Status PeerLink::Serve(const v1::PeerReadRequest& req, v1::PeerReadResponse* resp) {
  absl::StatusOr<std::vector<BlockHash>> chain = SplitBlockHashes(req.block_hashes());
  auto refuse = [this](absl::Status s) {
    absl::MutexLock lock(&mu_);
    ++stats_.reads_failed_total;
    return ToGrpc(std::move(s));
  };
  if (!chain.ok()) {
    return refuse(
        absl::InvalidArgumentError(absl::StrCat("block_hashes: ", chain.status().message())));
  }
  if (chain->empty() || static_cast<int64_t>(chain->size()) > store_->dram()->num_slots()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "peer read: ", chain->size(), " blocks asked; must be 1..", store_->dram()->num_slots())));
  }
  if (req.dst_slots_size() != static_cast<int>(chain->size())) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "peer read: ", req.dst_slots_size(), " dst_slots for ", chain->size(), " blocks")));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stats_.reads_in_flight >= config_.max_reads) {
      ++stats_.reads_busy_total;
      return ToGrpc(absl::ResourceExhaustedError(
          absl::StrCat("peer read: ", config_.max_reads, " reads in progress (--peer_max_reads)")));
    }
    ++stats_.reads_in_flight;
  }
  absl::Cleanup done = [this] {
    absl::MutexLock lock(&mu_);
    --stats_.reads_in_flight;
  };

  const SessionId session(NextId() | kPeerSessionBit);
  const std::vector<PromotedBlock> pinned = store_->Promote(session, *chain);
  std::vector<DramSlot> slots;
  slots.reserve(pinned.size());
  for (const PromotedBlock& b : pinned) {
    slots.push_back(b.slot);
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.pinned_blocks += static_cast<int64_t>(slots.size());
  }
  absl::Cleanup unpin = [this, session, &slots] {
    store_->Release(session, slots);
    absl::MutexLock lock(&mu_);
    stats_.pinned_blocks -= static_cast<int64_t>(slots.size());
  };
  resp->set_available(static_cast<uint32_t>(pinned.size()));
  if (pinned.size() < chain->size()) {
    absl::MutexLock lock(&mu_);
    ++stats_.reads_short_total;
    return grpc::Status::OK;
  }
  absl::StatusOr<transport::PeerHandle> peer = transport_->Connect(req.endpoint());
  if (!peer.ok()) {
    return refuse(
        absl::Status(peer.status().code(), absl::StrCat("peer read from node ", req.node_name(),
                                                        ": connect: ", peer.status().message())));
  }
  std::vector<transport::BlockPair> pairs;
  pairs.reserve(pinned.size());
  for (size_t i = 0; i < pinned.size(); ++i) {
    pairs.push_back({BlockId(pinned[i].slot.value()), BlockId(req.dst_slots(static_cast<int>(i)))});
  }
  transport::TransferOptions options;
  options.timeout = config_.fetch_timeout;
  absl::StatusOr<TransferId> id = transport_->PostTransfer(*peer, req.tag(), region_, pairs,
                                                           req.transfer_descriptor(), options);
  if (!id.ok()) {
    return refuse(id.status());
  }
  absl::StatusOr<transport::TransferState> state =
      transport_->Wait(*id, config_.fetch_timeout + absl::Seconds(1));
  if (!state.ok()) {
    return refuse(state.status());
  }
  if (state->phase != transport::TransferPhase::kDone) {
    if (!state->finished()) {
      (void)transport_->Cancel(*id);
      return refuse(absl::DeadlineExceededError("peer read: transfer did not finish in time"));
    }
    return refuse(state->status);
  }
  for (const PromotedBlock& b : pinned) {
    resp->add_checksums(b.checksum);
  }
  absl::MutexLock lock(&mu_);
  ++stats_.reads_total;
  stats_.read_blocks_total += pinned.size();
  stats_.read_bytes_total += pinned.size() * block_bytes_;
  return grpc::Status::OK;
}

v1::TierService::Stub* PeerLink::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<v1::TierService::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::TierService::NewStub(security_->CreateChannel(address, grpc::ChannelArguments()));
  }
  return stub.get();
}

int64_t PeerLink::Fetch(absl::Span<const BlockHash> chain, absl::Time deadline,
                        double recompute_seconds_per_block) {
  if (directory_ == nullptr || chain.empty()) {
    return 0;
  }
  // What is left of the caller's deadline, less a margin for the pins and the answer.
  const absl::Duration timeout =
      std::min(config_.fetch_timeout, deadline - absl::Now() - absl::Milliseconds(250));
  if (timeout < absl::Milliseconds(50)) {
    return 0;
  }
  chain =
      chain.first(std::min<size_t>(chain.size(), static_cast<size_t>(config_.max_fetch_blocks)));
  absl::StatusOr<PeerHolder> holder = directory_->FindHolder(chain);
  if (!holder.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.lookup_failures_total;
    if (absl::Now() - last_failure_log_ > absl::Seconds(10)) {
      last_failure_log_ = absl::Now();
      LOG(WARNING) << "tierd: peer lookup failed (no remote restore until it works): "
                   << holder.status();
    }
    return 0;
  }
  if (holder->blocks <= 0) {
    return 0;
  }
  const int64_t n = holder->blocks;
  const double r =
      recompute_seconds_per_block > 0 && !config_.always_fetch ? recompute_seconds_per_block : 0;
  // The decision: the fetch time this holder's path predicts (a latency per chunk plus the
  // bytes over its measured bandwidth) against the worker's measured time to compute the
  // blocks. No measurement yet on either side: fetch (bounded below), which gives the first.
  {
    absl::MutexLock lock(&mu_);
    const auto it = paths_.find(holder->node);
    const int64_t chunks = (n + config_.chunk_blocks - 1) / config_.chunk_blocks;
    const double estimate =
        it == paths_.end()
            ? 0
            : it->second.Predict(static_cast<double>(n) * static_cast<double>(block_bytes_),
                                 chunks);
    stats_.estimated_fetch_seconds_total += estimate;
    stats_.recompute_seconds_total += r * static_cast<double>(n);
    if (r > 0 && estimate > r * static_cast<double>(n)) {
      ++stats_.decided_recompute_total;
      return 0;
    }
    ++stats_.decided_fetch_total;
  }
  // Chunk by chunk; with a recompute cost known, each chunk must end by the time computing the
  // blocks fetched so far would have taken (plus kSlack): a fetch that falls behind is
  // abandoned at that chunk's boundary, the blocks before it kept. The worst case costs the
  // request one chunk's recompute time plus kSlack over computing everything.
  const absl::Time start = absl::Now();
  const absl::Time end = start + timeout;
  int64_t stored = 0;
  bool abandoned = false;
  while (stored < n) {
    const int64_t c = std::min<int64_t>(config_.chunk_blocks, n - stored);
    absl::Time chunk_deadline = end;
    if (r > 0) {
      chunk_deadline = std::min(
          chunk_deadline,
          start + absl::Seconds(r * static_cast<double>(stored + c) * kBudgetFactor) + kSlack);
    }
    const absl::Time chunk_start = absl::Now();
    if (chunk_deadline - chunk_start < absl::Milliseconds(1)) {
      abandoned = true;
      break;
    }
    const int64_t got =
        FetchFrom(*holder, chain.subspan(static_cast<size_t>(stored), static_cast<size_t>(c)),
                  chunk_deadline - chunk_start);
    stored += got;
    if (got < c) {
      abandoned = got > 0 || r > 0;  // a failure within a budget is an abandonment
      break;
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - chunk_start);
    absl::MutexLock lock(&mu_);
    paths_[holder->node].Add(static_cast<double>(c) * static_cast<double>(block_bytes_), seconds);
  }
  absl::MutexLock lock(&mu_);
  ++stats_.fetches_total;
  if (abandoned && stored < n) {
    ++stats_.fetch_abandoned_total;
  }
  if (stored == 0) {
    ++stats_.fetch_failures_total;
  } else {
    stats_.fetched_blocks_total += static_cast<uint64_t>(stored);
    stats_.fetched_bytes_total += static_cast<uint64_t>(stored) * block_bytes_;
    stats_.fetch_time_total += absl::Now() - start;
  }
  return stored;
}

int64_t PeerLink::FetchFrom(const PeerHolder& holder, absl::Span<const BlockHash> chain,
                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const SessionId session(NextId() | kPeerSessionBit);
  // The leading run of slots granted for the chain; anything after the first refusal (held
  // already: someone else fetches or offers it; no space) is given back.
  const std::vector<Reservation> grants = store_->AllocateSlots(session, chain);
  std::vector<DramSlot> slots;
  std::vector<DramSlot> unused;
  for (const Reservation& r : grants) {
    if (r.outcome != ReserveOutcome::kGranted) {
      break;
    }
    slots.push_back(r.slot);
  }
  for (size_t i = slots.size(); i < grants.size(); ++i) {
    if (grants[i].outcome == ReserveOutcome::kGranted) {
      unused.push_back(grants[i].slot);
    }
  }
  // Whatever is not committed below goes back, on every path.
  absl::Cleanup release = [&] {
    unused.insert(unused.end(), slots.begin(), slots.end());
    if (!unused.empty()) {
      store_->Release(session, unused);
    }
  };
  auto log_failure = [&](const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (absl::Now() - last_failure_log_ > absl::Seconds(10)) {
      last_failure_log_ = absl::Now();
      LOG(WARNING) << "tierd: fetch of " << slots.size() << " blocks from node " << holder.node
                   << " (" << holder.address << ") failed, the worker recomputes them: " << s;
    }
  };

  for (int attempt = 0; attempt < 2 && !slots.empty(); ++attempt) {
    std::vector<BlockId> dst;
    dst.reserve(slots.size());
    for (DramSlot s : slots) {
      dst.push_back(BlockId(s.value()));
    }
    const uint64_t tag = NextId();
    transport::TransferOptions options;
    options.timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    absl::StatusOr<transport::Expectation> exp =
        transport_->ExpectTransfer(tag, region_, dst, options);
    if (!exp.ok()) {
      log_failure(exp.status());
      return 0;
    }
    v1::PeerReadRequest req;
    req.set_block_hashes(ConcatBlockHashes(chain.first(slots.size())));
    req.set_endpoint(transport_->LocalEndpoint());
    req.set_transfer_descriptor(exp->descriptor);
    req.set_tag(tag);
    for (DramSlot s : slots) {
      req.add_dst_slots(s.value());
    }
    req.set_node_name(config_.node);
    v1::PeerReadResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    const grpc::Status rpc = StubFor(holder.address)->PeerRead(&ctx, req, &resp);
    if (!rpc.ok() || resp.available() < slots.size() ||
        resp.checksums_size() != static_cast<int>(slots.size())) {
      (void)transport_->Cancel(exp->id);
      if (!rpc.ok()) {
        log_failure(services::FromGrpcStatus(rpc));
        return 0;
      }
      // The holder lost some blocks since the directory said so: ask for what it still has.
      const size_t keep = std::min<size_t>(resp.available(), slots.size());
      unused.insert(unused.end(), slots.begin() + static_cast<std::ptrdiff_t>(keep), slots.end());
      slots.resize(keep);
      continue;
    }
    absl::StatusOr<transport::TransferState> state =
        transport_->Wait(exp->id, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!state.ok() || state->phase != transport::TransferPhase::kDone) {
      (void)transport_->Cancel(exp->id);
      log_failure(!state.ok()
                      ? state.status()
                      : (state->finished()
                             ? state->status
                             : absl::DeadlineExceededError("the transfer did not complete")));
      return 0;
    }
    int64_t stored = 0;
    size_t i = 0;
    for (; i < slots.size(); ++i) {
      const CommitOutcome c =
          store_->Commit(session, slots[i], chain[i], resp.checksums(static_cast<int>(i)));
      if (c != CommitOutcome::kStored) {
        if (c == CommitOutcome::kChecksumMismatch) {
          absl::MutexLock lock(&mu_);
          ++stats_.fetch_corrupt_total;
          LOG(WARNING) << "tierd: block " << i << " fetched from node " << holder.node
                       << " failed its checksum; the rest of the run is dropped";
        }
        ++i;  // a failed Commit freed (or never held) this slot
        break;
      }
      ++stored;
    }
    // Slots [0, i) are committed or freed by Commit; the rest go back.
    slots.erase(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(i));
    return stored;
  }
  return 0;
}

PeerLinkStats PeerLink::Stats() const {
  absl::MutexLock lock(&mu_);
  PeerLinkStats s = stats_;
  for (const auto& [node, e] : paths_) {
    const double spb = e.seconds_per_byte();
    s.paths.push_back({node, e.latency_seconds(), spb > 0 ? 1 / spb : 0});
  }
  return s;
}

}  // namespace pd::tierd
