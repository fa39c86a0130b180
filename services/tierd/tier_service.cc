#include "services/tierd/tier_service.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"
#include "services/base/kv_layout_proto.h"
#include "services/tierd/peer_link.h"

namespace pd::tierd {

namespace v1 = pdserve::internal::v1;

namespace {

v1::Tier TierToProto(tier_shm::TierKind tier) {
  return tier == tier_shm::TierKind::kDram ? v1::TIER_DRAM : v1::TIER_NVME;
}

grpc::Status Invalid(std::string message) {
  return services::ToGrpcStatus(absl::InvalidArgumentError(std::move(message)));
}

}  // namespace

absl::StatusOr<std::vector<BlockHash>> ParseHashes(const std::string& bytes,
                                                   absl::string_view field) {
  absl::StatusOr<std::vector<BlockHash>> hashes = SplitBlockHashes(bytes);
  if (!hashes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", hashes.status().message()));
  }
  return hashes;
}

TierServiceImpl::TierServiceImpl(TierStore* store, v1::KvLayout layout,
                                 services::ClusterTokenVerifier auth, Clock* clock)
    : store_(store), layout_(std::move(layout)), auth_(std::move(auth)), clock_(clock) {}

absl::Status TierServiceImpl::CheckSession(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    ++counters_.unknown_session_total;
    return absl::FailedPreconditionError(absl::StrCat(
        "unknown tierd session ", id,
        " (tierd restarted or the session was closed): attach again and forget held slots"));
  }
  it->second.last_call = clock_->Now();
  return absl::OkStatus();
}

grpc::Status TierServiceImpl::Attach(grpc::ServerContext* context, const v1::AttachRequest* req,
                                     v1::AttachResponse* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.Attach"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  if (req->worker_id().empty()) {
    absl::MutexLock lock(&mu_);
    ++counters_.attach_rejected_total;
    return Invalid("attach: worker_id is empty");
  }
  if (absl::Status s = services::CheckLayout(layout_, req->layout(), "tierd", "worker"); !s.ok()) {
    LOG(WARNING) << "tierd: refused worker " << req->worker_id() << ": " << s.message();
    absl::MutexLock lock(&mu_);
    ++counters_.attach_rejected_total;
    return services::ToGrpcStatus(s);
  }
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    do {
      id = absl::Uniform<uint64_t>(rng_);
    } while (id == 0 || sessions_.contains(id));
    sessions_[id] = Session{req->worker_id(), clock_->Now()};
    ++counters_.attaches_total;
  }
  LOG(INFO) << "tierd: worker " << req->worker_id() << " attached (session " << id << ")";
  DramPool* dram = store_->dram();
  resp->set_session_id(id);
  resp->set_shm_name(dram->shm_name());
  resp->set_num_slots(static_cast<uint32_t>(dram->num_slots()));
  resp->set_slot_bytes(static_cast<uint64_t>(dram->slot_bytes()));
  resp->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(dram->lease())));
  resp->set_node_name(node_name_);
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::Detach(grpc::ServerContext* context, const v1::DetachRequest* req,
                                     v1::DetachResponse*) {
  if (absl::Status s = auth_.Check(*context, "TierService.Detach"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  std::string worker;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(req->session_id());
    if (it == sessions_.end()) {
      return grpc::Status::OK;  // unknown sessions are ignored
    }
    worker = it->second.worker_id;
    sessions_.erase(it);
  }
  const int dropped = store_->ReleaseSession(SessionId(req->session_id()));
  LOG(INFO) << "tierd: worker " << worker << " detached (session " << req->session_id() << ", "
            << dropped << " claims released)";
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::Lookup(grpc::ServerContext* context, const v1::LookupRequest* req,
                                     v1::LookupResponse* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.Lookup"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<BlockHash>> chain = ParseHashes(req->block_hashes(), "block_hashes");
  if (!chain.ok()) {
    return services::ToGrpcStatus(chain.status());
  }
  const std::vector<tier_shm::TierKind> tiers = store_->Lookup(*chain);
  for (tier_shm::TierKind t : tiers) {
    resp->add_tiers(TierToProto(t));
  }
  absl::MutexLock lock(&mu_);
  ++counters_.lookups_total;
  counters_.lookup_hit_blocks_total += tiers.size();
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::AllocateSlots(grpc::ServerContext* context,
                                            const v1::AllocateSlotsRequest* req,
                                            v1::AllocateSlotsResponse* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.AllocateSlots"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  if (absl::Status s = CheckSession(req->session_id()); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<BlockHash>> hashes = ParseHashes(req->block_hashes(), "block_hashes");
  if (!hashes.ok()) {
    return services::ToGrpcStatus(hashes.status());
  }
  if (static_cast<int64_t>(hashes->size()) + req->unbound_slots() > store_->dram()->num_slots()) {
    return Invalid(absl::StrCat("allocate_slots: ", hashes->size(), " blocks and ",
                                req->unbound_slots(), " unbound slots requested but the pool has ",
                                store_->dram()->num_slots(), " slots"));
  }
  absl::flat_hash_set<BlockHash> seen;
  for (const BlockHash& h : *hashes) {
    if (!seen.insert(h).second) {
      return Invalid(absl::StrCat("allocate_slots: block ", h.ToHex(), " is listed twice"));
    }
  }
  if (req->checksums_size() != 0 && static_cast<size_t>(req->checksums_size()) != hashes->size()) {
    return Invalid(absl::StrCat("allocate_slots: ", req->checksums_size(), " checksums for ",
                                hashes->size(), " blocks (send one per block, or none)"));
  }
  for (const Reservation& r :
       store_->AllocateSlots(SessionId(req->session_id()), *hashes, req->unbound_slots(),
                             absl::MakeConstSpan(req->checksums().data(),
                                                 static_cast<size_t>(req->checksums_size())))) {
    v1::SlotGrant* g = resp->add_grants();
    switch (r.outcome) {
      case ReserveOutcome::kGranted:
        g->set_status(v1::SLOT_GRANT_STATUS_GRANTED);
        g->set_slot(r.slot.value());
        break;
      case ReserveOutcome::kAlreadyHeld:
        g->set_status(v1::SLOT_GRANT_STATUS_ALREADY_HELD);
        break;
      case ReserveOutcome::kNoSpace:
        g->set_status(v1::SLOT_GRANT_STATUS_NO_SPACE);
        break;
      case ReserveOutcome::kRefused:
        g->set_status(v1::SLOT_GRANT_STATUS_REFUSED);
        break;
    }
  }
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::Commit(grpc::ServerContext* context, const v1::CommitRequest* req,
                                     v1::CommitResponse* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.Commit"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  if (absl::Status s = CheckSession(req->session_id()); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  for (int i = 0; i < req->entries_size(); ++i) {
    const v1::CommitEntry& e = req->entries(i);
    absl::StatusOr<BlockHash> hash = BlockHash::FromBytes(e.block_hash());
    if (!hash.ok()) {
      return Invalid(
          absl::StrCat("commit: entries[", i, "].block_hash: ", hash.status().message()));
    }
    if (static_cast<int64_t>(e.slot()) >= store_->dram()->num_slots()) {
      resp->add_results(v1::COMMIT_STATUS_NOT_RESERVED);
      continue;
    }
    switch (store_->Commit(SessionId(req->session_id()), DramSlot(e.slot()), *hash, e.checksum())) {
      case CommitOutcome::kStored:
        resp->add_results(v1::COMMIT_STATUS_STORED);
        break;
      case CommitOutcome::kChecksumMismatch:
        resp->add_results(v1::COMMIT_STATUS_CHECKSUM_MISMATCH);
        break;
      case CommitOutcome::kNotReserved:
        resp->add_results(v1::COMMIT_STATUS_NOT_RESERVED);
        break;
      case CommitOutcome::kAlreadyHeld:
        resp->add_results(v1::COMMIT_STATUS_ALREADY_HELD);
        break;
      case CommitOutcome::kRefused:
        resp->add_results(v1::COMMIT_STATUS_REFUSED);
        break;
    }
  }
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::Promote(grpc::ServerContext* context, const v1::PromoteRequest* req,
                                      v1::PromoteResponse* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.Promote"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  if (absl::Status s = CheckSession(req->session_id()); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<BlockHash>> chain = ParseHashes(req->block_hashes(), "block_hashes");
  if (!chain.ok()) {
    return services::ToGrpcStatus(chain.status());
  }
  const SessionId session(req->session_id());
  std::vector<PromotedBlock> blocks = store_->Promote(session, *chain);
  const size_t local = blocks.size();
  if (peer_ != nullptr && local < chain->size()) {
    // The rest of the chain from other nodes, into this node's DRAM, then pinned like the rest.
    const absl::Span<const BlockHash> rest = absl::MakeConstSpan(*chain).subspan(local);
    if (const int64_t fetched = peer_->Fetch(rest, absl::FromChrono(context->deadline()),
                                             req->recompute_seconds_per_block());
        fetched > 0) {
      std::vector<PromotedBlock> more =
          store_->Promote(session, rest.first(static_cast<size_t>(fetched)));
      blocks.insert(blocks.end(), more.begin(), more.end());
    }
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const PromotedBlock& b = blocks[i];
    v1::PromotedBlock* p = resp->add_blocks();
    p->set_slot(b.slot.value());
    p->set_checksum(b.checksum);
    p->set_source_tier(TierToProto(b.source));
    p->set_remote(i >= local);
  }
  absl::MutexLock lock(&mu_);
  ++counters_.promotes_total;
  counters_.promote_hit_blocks_total += blocks.size();
  counters_.promote_remote_blocks_total += blocks.size() - local;
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::Release(grpc::ServerContext* context, const v1::ReleaseRequest* req,
                                      v1::ReleaseResponse*) {
  if (absl::Status s = auth_.Check(*context, "TierService.Release"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  if (absl::Status s = CheckSession(req->session_id()); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  std::vector<DramSlot> slots;
  slots.reserve(static_cast<size_t>(req->slots_size()));
  for (uint32_t slot : req->slots()) {
    if (static_cast<int64_t>(slot) < store_->dram()->num_slots()) {
      slots.push_back(DramSlot(slot));
    }
  }
  store_->Release(SessionId(req->session_id()), slots);
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::Stats(grpc::ServerContext* context, const v1::StatsRequest*,
                                    v1::TierStats* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.Stats"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  FillStats(resp);
  return grpc::Status::OK;
}

grpc::Status TierServiceImpl::PeerRead(grpc::ServerContext* context, const v1::PeerReadRequest* req,
                                       v1::PeerReadResponse* resp) {
  if (absl::Status s = auth_.Check(*context, "TierService.PeerRead"); !s.ok()) {
    return services::ToGrpcStatus(s);
  }
  if (peer_ == nullptr) {
    return services::ToGrpcStatus(absl::UnimplementedError(
        "this pd-tierd serves no peers: start it with --peer_transport (and --redis_address)"));
  }
  return peer_->Serve(*req, resp);
}

void TierServiceImpl::FillStats(v1::TierStats* resp) const {
  const TierStoreStats st = store_->Stats();
  v1::TierUsage* dram = resp->add_tiers();
  dram->set_tier(v1::TIER_DRAM);
  dram->set_capacity_blocks(static_cast<uint64_t>(st.dram.capacity_blocks));
  dram->set_used_blocks(static_cast<uint64_t>(st.dram.used_blocks));
  dram->set_pinned_blocks(static_cast<uint64_t>(st.dram.pinned_blocks));
  dram->set_stored_blocks_total(st.dram.stored_blocks_total);
  dram->set_evicted_blocks_total(st.dram.evicted_blocks_total);
  dram->set_hit_blocks_total(st.dram.hit_blocks_total);
  dram->set_read_bytes_total(st.dram.read_bytes_total);
  dram->set_written_bytes_total(st.dram.written_bytes_total);
  dram->set_checksum_failures_total(st.dram.checksum_failures_total + st.dram_corrupt_total);
  if (st.nvme.has_value()) {
    v1::TierUsage* nvme = resp->add_tiers();
    nvme->set_tier(v1::TIER_NVME);
    nvme->set_capacity_blocks(static_cast<uint64_t>(st.nvme->capacity_blocks));
    nvme->set_used_blocks(static_cast<uint64_t>(st.nvme->used_blocks));
    nvme->set_stored_blocks_total(st.nvme->stored_blocks_total);
    nvme->set_evicted_blocks_total(st.nvme->evicted_blocks_total);
    nvme->set_hit_blocks_total(st.nvme->hit_blocks_total);
    nvme->set_read_bytes_total(st.nvme->read_bytes_total);
    nvme->set_written_bytes_total(st.nvme->written_bytes_total);
    nvme->set_checksum_failures_total(st.nvme->checksum_failures_total);
  }
  if (redis_index_ != nullptr) {
    const RedisIndexStats r = redis_index_->Stats();
    resp->set_redis_connected(r.connected);
    resp->set_redis_pending_updates(static_cast<uint64_t>(r.pending));
  }
  absl::MutexLock lock(&mu_);
  resp->set_num_sessions(static_cast<uint32_t>(sessions_.size()));
  resp->set_lookups_total(counters_.lookups_total);
  resp->set_lookup_hit_blocks_total(counters_.lookup_hit_blocks_total);
}

int TierServiceImpl::PruneIdleSessions(absl::Duration idle) {
  std::vector<std::pair<uint64_t, std::string>> dropped;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time cutoff = clock_->Now() - idle;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second.last_call < cutoff) {
        dropped.emplace_back(it->first, it->second.worker_id);
        sessions_.erase(it++);
      } else {
        ++it;
      }
    }
    counters_.sessions_pruned_total += dropped.size();
  }
  for (const auto& [id, worker] : dropped) {
    store_->ReleaseSession(SessionId(id));
    LOG(WARNING) << "tierd: dropped session " << id << " of worker " << worker << " (idle for "
                 << idle << ")";
  }
  return static_cast<int>(dropped.size());
}

TierServiceStats TierServiceImpl::ServiceStats() const {
  absl::MutexLock lock(&mu_);
  TierServiceStats st = counters_;
  st.sessions = static_cast<int64_t>(sessions_.size());
  return st;
}

}  // namespace pd::tierd
