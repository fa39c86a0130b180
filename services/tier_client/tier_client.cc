#include "services/tier_client/tier_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tier_shm/dram_slots.h"

namespace pd::tier_client {

namespace v1 = pdserve::internal::v1;

absl::Status TierClientConfig::Validate() const {
  if (tierd_address.empty()) {
    return absl::InvalidArgumentError("tier client: tierd_address is empty");
  }
  if (worker_id.empty()) {
    return absl::InvalidArgumentError("tier client: worker_id is empty");
  }
  if (layout.block_bytes() == 0) {
    return absl::InvalidArgumentError("tier client: layout.block_bytes is 0");
  }
  if (unbound_slots < 0 || unbound_slots > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("tier client: unbound_slots must be in [0, 4096], got ", unbound_slots));
  }
  if (max_staged_blocks < 1 || offer_batch_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tier client: max_staged_blocks and offer_batch_blocks must be >= 1, got ",
                     max_staged_blocks, " and ", offer_batch_blocks));
  }
  if (rpc_timeout <= absl::ZeroDuration() || reattach_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("tier client: timeouts must be > 0");
  }
  return absl::OkStatus();
}

bool ShmPromotedRun::CopyOut(size_t k, uint8_t* dst) const {
  const uint8_t* src = region_->data() + static_cast<size_t>(slots_[k]) * slot_bytes_;
  std::memcpy(dst, src, static_cast<size_t>(block_bytes_));
  if (tier_shm::BlockChecksum(absl::MakeConstSpan(dst, static_cast<size_t>(block_bytes_))) !=
      checksums_[k]) {
    client_->CountChecksumFailure();
    return false;
  }
  return true;
}

const uint8_t* ShmPromotedRun::BlockBytes(size_t k) const {
  return region_->data() + static_cast<size_t>(slots_[k]) * slot_bytes_;
}

bool ShmPromotedRun::Verify(size_t k) const {
  if (tier_shm::BlockChecksum(
          absl::MakeConstSpan(BlockBytes(k), static_cast<size_t>(block_bytes_))) != checksums_[k]) {
    client_->CountChecksumFailure();
    return false;
  }
  return true;
}

TierClient::TierClient(TierClientConfig config) : config_(std::move(config)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  const std::shared_ptr<const services::ClientSecurity> security =
      config_.security != nullptr ? config_.security : services::ClientSecurity::Insecure();
  stub_ = v1::TierService::NewStub(security->CreateChannel(config_.tierd_address, args));
}

absl::StatusOr<std::unique_ptr<TierClient>> TierClient::Start(TierClientConfig config) {
  if (absl::Status s = config.Validate(); !s.ok()) {
    return s;
  }
  std::unique_ptr<TierClient> c(new TierClient(std::move(config)));
  TierClient* self = c.get();
  c->thread_ = std::thread([self] { self->Loop(); });
  return c;
}

TierClient::~TierClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  std::deque<PrepareJob> left;
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mu_);
    left.swap(prepares_);
    session = attached_ ? session_ : 0;
  }
  for (PrepareJob& job : left) {
    job.done(nullptr);
  }
  if (session != 0) {
    v1::DetachRequest req;
    req.set_session_id(session);
    v1::DetachResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
    (void)stub_->Detach(&ctx, req, &resp);  // best effort: leases end the claims anyway
  }
}

void TierClient::Offer(const BlockHash& hash, absl::Span<const uint8_t> block) {
  if (static_cast<int64_t>(block.size()) != static_cast<int64_t>(config_.layout.block_bytes())) {
    absl::MutexLock lock(&mu_);
    ++stats_.offer_dropped_blocks_total;
    return;
  }
  Offer(hash, [&](uint8_t* dst) {
    std::memcpy(dst, block.data(), block.size());
    return true;
  });
}

int64_t TierClient::UnboundTargetLocked() const {
  // At most an eighth of a small pool, so a few workers' reserves never crowd out the blocks.
  return std::min(config_.unbound_slots, num_slots_ / 8);
}

void TierClient::DropStaleUnboundLocked() {
  const absl::Time now = absl::Now();
  Releases stale{session_, {}};
  while (!unbound_.empty()) {
    const Unbound& u = unbound_.front();
    const bool old_session = u.session != session_;
    // Half the lease left at least: a fill and the Commit that follows fit well inside it.
    if (!old_session && now - u.granted < lease_ / 2) {
      break;
    }
    if (!old_session) {
      stale.slots.push_back(u.slot);
    }
    unbound_.pop_front();
  }
  if (!stale.slots.empty()) {
    releases_.push_back(std::move(stale));
  }
}

void TierClient::Offer(const BlockHash& hash, BlockFill fill) {
  const int64_t block_bytes = config_.layout.block_bytes();
  std::optional<Unbound> slot;
  std::shared_ptr<tier_shm::ShmRegion> region;
  int64_t slot_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!attached_) {
      ++stats_.offer_dropped_blocks_total;
      return;
    }
    DropStaleUnboundLocked();
    if (!unbound_.empty()) {
      slot = unbound_.front();
      unbound_.pop_front();
      region = region_;
      slot_bytes = slot_bytes_;
    } else if (static_cast<int64_t>(staged_.size()) >= config_.max_staged_blocks) {
      ++stats_.offer_dropped_blocks_total;
      return;
    }
  }
  if (slot.has_value()) {
    // Straight into tierd's shared memory: the slot is ours until Commit, Release or its lease
    // (which has at least half left, see DropStaleUnboundLocked).
    const bool ok = fill(region->data() + static_cast<size_t>(slot->slot) * slot_bytes);
    absl::MutexLock lock(&mu_);
    if (ok) {
      filled_.push_back(Filled{slot->session, slot->slot, hash});
      ++stats_.offered_in_place_blocks_total;
    } else {
      releases_.push_back(Releases{slot->session, {slot->slot}});
      ++stats_.offer_dropped_blocks_total;
    }
    return;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(block_bytes));
  if (!fill(bytes.data())) {
    absl::MutexLock lock(&mu_);
    ++stats_.offer_dropped_blocks_total;
    return;
  }
  absl::MutexLock lock(&mu_);
  if (!attached_ || static_cast<int64_t>(staged_.size()) >= config_.max_staged_blocks) {
    ++stats_.offer_dropped_blocks_total;
    return;
  }
  staged_.push_back(Staged{hash, std::move(bytes)});
}

void TierClient::Prepare(std::vector<BlockHash> chain, PrepareDone done,
                         double recompute_seconds_per_block) {
  {
    absl::MutexLock lock(&mu_);
    if (attached_ && !stopping_ && !chain.empty()) {
      prepares_.push_back(
          PrepareJob{std::move(chain), std::move(done), recompute_seconds_per_block});
      return;
    }
    ++stats_.prepares_total;
  }
  done(nullptr);  // tierd not reachable (or nothing asked): compute instead, right away
}

void TierClient::Release(const PromotedRun& run) {
  // Every run this client hands out is a ShmPromotedRun (the TierLink contract: `run` came from
  // this link's Prepare).
  const auto& shm_run = static_cast<const ShmPromotedRun&>(run);
  absl::MutexLock lock(&mu_);
  releases_.push_back(Releases{shm_run.session_, shm_run.slots_});
}

bool TierClient::WaitAttached(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&attached_), timeout);
}

bool TierClient::FlushOffers(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !attached_ ||
           (staged_.empty() && filled_.empty() && releases_.empty() && !sending_);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

void TierClient::FlushOffersForTest() { FlushOffers(absl::InfiniteDuration()); }

bool TierClient::AwaitStatsForTest(absl::FunctionRef<bool(const TierLinkStats&)> done,
                                   absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(StatsLocked()); };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

TierLinkStats TierClient::Stats() const {
  absl::MutexLock lock(&mu_);
  return StatsLocked();
}

TierLinkStats TierClient::StatsLocked() const {
  TierLinkStats st = stats_;
  st.attached = attached_;
  st.unbound_slots_held = static_cast<int64_t>(unbound_.size());
  return st;
}

void TierClient::CountChecksumFailure() {
  absl::MutexLock lock(&mu_);
  ++stats_.checksum_failures_total;
}

void TierClient::OnRpcFailure(const grpc::Status& status, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  ++stats_.rpc_failures_total;
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
      status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    if (attached_) {
      LOG(WARNING) << "tier client: " << what << " failed (" << status.error_message()
                   << "); re-attaching to " << config_.tierd_address;
    }
    attached_ = false;
    region_.reset();
  } else {
    LOG_EVERY_N(WARNING, 100) << "tier client: " << what << " failed: " << status.error_message();
  }
}

bool TierClient::Attach() {
  v1::AttachRequest req;
  req.set_worker_id(config_.worker_id);
  *req.mutable_layout() = config_.layout;
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
  grpc::Status s = stub_->Attach(&ctx, req, &resp);
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.rpc_failures_total;
    LOG_EVERY_N(WARNING, 30) << "tier client: cannot attach to tierd at " << config_.tierd_address
                             << ": " << s.error_message() << " (running without lower tiers)";
    return false;
  }
  absl::StatusOr<std::unique_ptr<tier_shm::ShmRegion>> region = tier_shm::MapDramPool(
      resp.shm_name(), resp.num_slots(), static_cast<int64_t>(resp.slot_bytes()));
  if (!region.ok()) {
    LOG_EVERY_N(WARNING, 30) << "tier client: cannot map tierd's pool " << resp.shm_name() << ": "
                             << region.status() << " (is tierd on this node?)";
    absl::MutexLock lock(&mu_);
    ++stats_.rpc_failures_total;
    return false;
  }
  std::shared_ptr<tier_shm::ShmRegion> mapped;
  if (config_.on_map) {
    // The hook's cleanup runs before the unmap, whoever drops the mapping last (this client on
    // re-attach, or a PromotedRun still in use).
    absl::AnyInvocable<void()> before_unmap =
        config_.on_map((*region)->data(), (*region)->size_bytes());
    mapped = std::shared_ptr<tier_shm::ShmRegion>(
        region->release(),
        [before_unmap = std::move(before_unmap)](tier_shm::ShmRegion* r) mutable {
          if (before_unmap) {
            before_unmap();
          }
          std::default_delete<tier_shm::ShmRegion>()(r);
        });
  } else {
    mapped = std::shared_ptr<tier_shm::ShmRegion>(std::move(*region));
  }
  absl::MutexLock lock(&mu_);
  session_ = resp.session_id();
  region_ = std::move(mapped);
  num_slots_ = resp.num_slots();
  slot_bytes_ = static_cast<int64_t>(resp.slot_bytes());
  lease_ = absl::Milliseconds(resp.lease_ms());
  unbound_.clear();  // an older session's reservations ended with it
  attached_ = true;
  stats_.node_mismatch = !config_.node_name.empty() && !resp.node_name().empty() &&
                         resp.node_name() != config_.node_name;
  if (stats_.node_mismatch) {
    LOG(ERROR) << "tier client: tierd at " << config_.tierd_address << " is node '"
               << resp.node_name() << "' but this worker is node '" << config_.node_name
               << "': the router credits blocks spilled there to '" << resp.node_name()
               << "', never to this worker; give pd-worker and pd-tierd the same --node_name";
  }
  ++stats_.attaches_total;
  LOG(INFO) << "tier client: attached to tierd at " << config_.tierd_address << " (pool "
            << resp.shm_name() << ", " << resp.num_slots() << " slots)";
  return true;
}

void TierClient::Loop() {
  absl::Time next_attach = absl::InfinitePast();
  while (true) {
    std::vector<PrepareJob> prepares;
    std::vector<Staged> offers;
    std::vector<Releases> releases;
    std::vector<Filled> filled;
    int64_t reserve = 0;
    bool attached = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !prepares_.empty() || !staged_.empty() || !releases_.empty() ||
               !filled_.empty() ||
               (attached_ && static_cast<int64_t>(unbound_.size()) * 2 < UnboundTargetLocked() &&
                absl::Now() >= next_reserve_);
      };
      const absl::Duration wait =
          attached_ ? absl::Seconds(1) : std::max(absl::ZeroDuration(), next_attach - absl::Now());
      mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      if (stopping_) {
        return;
      }
      attached = attached_;
      if (attached) {
        DropStaleUnboundLocked();
        filled.swap(filled_);
        // Refill once half the reserve is used (one AllocateSlots for many evictions).
        if (static_cast<int64_t>(unbound_.size()) * 2 < UnboundTargetLocked() &&
            absl::Now() >= next_reserve_) {
          reserve = UnboundTargetLocked() - static_cast<int64_t>(unbound_.size());
        }
        releases.swap(releases_);
        if (!prepares_.empty()) {
          // Every waiting request at once: several streams moved here together (migration)
          // each wait for their blocks, so none queues behind another's Promote.
          prepares.assign(std::make_move_iterator(prepares_.begin()),
                          std::make_move_iterator(prepares_.end()));
          prepares_.clear();
        } else {
          while (!staged_.empty() &&
                 static_cast<int64_t>(offers.size()) < config_.offer_batch_blocks) {
            offers.push_back(std::move(staged_.front()));
            staged_.pop_front();
          }
        }
        sending_ = !offers.empty() || !filled.empty() || !releases.empty();
      } else {
        // Detached: nothing queued can be served; requests compute instead.
        stats_.offer_dropped_blocks_total += staged_.size() + filled_.size();
        staged_.clear();
        filled_.clear();
        unbound_.clear();
        releases_.clear();  // the old session's pins end with it (tierd restarted or lease)
      }
    }
    if (!attached) {
      std::deque<PrepareJob> failed;
      {
        absl::MutexLock lock(&mu_);
        failed.swap(prepares_);
        stats_.prepares_total += failed.size();
      }
      for (PrepareJob& job : failed) {
        job.done(nullptr);
      }
      if (absl::Now() >= next_attach && !Attach()) {
        next_attach = absl::Now() + config_.reattach_interval;
      }
      continue;
    }
    // Requests wait for their prepares: they go first.
    if (!prepares.empty()) {
      RunPrepares(std::move(prepares));
    }
    const bool released = !releases.empty();
    if (released) {
      RunReleases(std::move(releases));
    }
    const bool committed = !filled.empty();
    if (committed) {
      RunCommits(std::move(filled));
    }
    if (reserve > 0) {
      RunReserve(reserve);
    }
    const bool offered = !offers.empty();  // read before the move empties it
    if (offered) {
      RunOffers(std::move(offers));
    }
    if (offered || committed || released) {
      absl::MutexLock lock(&mu_);
      sending_ = false;
    }
  }
}

void TierClient::RunCommits(std::vector<Filled> filled) {
  uint64_t session = 0;
  std::shared_ptr<tier_shm::ShmRegion> region;
  int64_t slot_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    session = session_;
    region = region_;
    slot_bytes = slot_bytes_;
  }
  const auto block_bytes = static_cast<size_t>(config_.layout.block_bytes());
  v1::CommitRequest req;
  req.set_session_id(session);
  uint64_t dropped = 0;
  for (const Filled& f : filled) {
    if (f.session != session) {
      ++dropped;  // filled under a session that has ended (tierd restarted)
      continue;
    }
    v1::CommitEntry* e = req.add_entries();
    e->set_block_hash(f.hash.ToBytes());
    e->set_slot(f.slot);
    e->set_checksum(tier_shm::BlockChecksum(absl::MakeConstSpan(
        region->data() + static_cast<size_t>(f.slot) * slot_bytes, block_bytes)));
  }
  uint64_t stored = 0;
  uint64_t skipped = 0;
  if (req.entries_size() > 0) {
    v1::CommitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
    if (grpc::Status s = stub_->Commit(&ctx, req, &resp); !s.ok()) {
      OnRpcFailure(s, "Commit");  // the reservations expire with their lease
      dropped += static_cast<uint64_t>(req.entries_size());
    } else {
      for (int r : resp.results()) {
        if (r == v1::COMMIT_STATUS_STORED) {
          ++stored;
        } else if (r == v1::COMMIT_STATUS_ALREADY_HELD) {
          ++skipped;
        } else {
          ++dropped;
        }
      }
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.offered_blocks_total += filled.size();
  stats_.offer_stored_blocks_total += stored;
  stats_.offer_skipped_blocks_total += skipped;
  stats_.offer_dropped_blocks_total += dropped;
}

void TierClient::RunReserve(int64_t count) {
  uint64_t session = 0;
  int64_t num_slots = 0;
  {
    absl::MutexLock lock(&mu_);
    session = session_;
    num_slots = num_slots_;
  }
  v1::AllocateSlotsRequest req;
  req.set_session_id(session);
  req.set_unbound_slots(static_cast<uint32_t>(std::min(count, num_slots)));
  v1::AllocateSlotsResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
  const absl::Time granted = absl::Now();  // before tierd starts the leases
  // A short pause before the next try when tierd could not grant them all (every slot pinned or
  // reserved): offers go through staging meanwhile.
  constexpr absl::Duration kRetry = absl::Milliseconds(200);
  if (grpc::Status s = stub_->AllocateSlots(&ctx, req, &resp); !s.ok()) {
    OnRpcFailure(s, "AllocateSlots");
    absl::MutexLock lock(&mu_);
    next_reserve_ = absl::Now() + kRetry;
    return;
  }
  absl::MutexLock lock(&mu_);
  int64_t granted_slots = 0;
  for (const v1::SlotGrant& g : resp.grants()) {
    if (g.status() == v1::SLOT_GRANT_STATUS_GRANTED && static_cast<int64_t>(g.slot()) < num_slots) {
      unbound_.push_back(Unbound{session, g.slot(), granted});
      ++granted_slots;
    }
  }
  if (granted_slots < req.unbound_slots()) {
    next_reserve_ = absl::Now() + kRetry;
  }
}

void TierClient::RunReleases(std::vector<Releases> releases) {
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mu_);
    session = session_;
  }
  v1::ReleaseRequest req;
  req.set_session_id(session);
  for (const Releases& r : releases) {
    if (r.session == session) {  // pins of an older session ended with it
      req.mutable_slots()->Add(r.slots.begin(), r.slots.end());
    }
  }
  if (req.slots_size() == 0) {
    return;
  }
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
  if (grpc::Status s = stub_->Release(&ctx, req, &resp); !s.ok()) {
    OnRpcFailure(s, "Release");
  }
}

void TierClient::RunPrepares(std::vector<PrepareJob> jobs) {
  struct Call {
    PrepareJob job;
    std::shared_ptr<ShmPromotedRun> run = std::make_shared<ShmPromotedRun>();
    v1::PromoteRequest req;
    v1::PromoteResponse resp;
    grpc::ClientContext ctx;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  calls.reserve(jobs.size());
  {
    absl::MutexLock lock(&mu_);
    for (PrepareJob& job : jobs) {
      auto c = std::make_unique<Call>();
      c->job = std::move(job);
      c->run->client_ = this;
      c->run->region_ = region_;
      c->run->session_ = session_;
      c->run->slot_bytes_ = slot_bytes_;
      c->run->block_bytes_ = static_cast<int64_t>(config_.layout.block_bytes());
      calls.push_back(std::move(c));
    }
  }
  // The Promotes run concurrently (tierd serves them in parallel); each answer is handled here,
  // on the client thread, as it comes.
  struct Answers {  // shared with the callbacks, which may still be unlocking when this returns
    absl::Mutex mu;
    std::vector<Call*> calls ABSL_GUARDED_BY(mu);
  };
  auto answers = std::make_shared<Answers>();
  for (std::unique_ptr<Call>& c : calls) {
    c->req.set_session_id(c->run->session_);
    c->req.set_block_hashes(ConcatBlockHashes(c->job.chain));
    c->req.set_recompute_seconds_per_block(c->job.recompute_seconds_per_block);
    c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
    stub_->async()->Promote(&c->ctx, &c->req, &c->resp,
                            [call = c.get(), answers](grpc::Status s) {
                              absl::MutexLock lock(&answers->mu);
                              call->status = std::move(s);
                              answers->calls.push_back(call);
                            });
  }
  for (size_t handled = 0; handled < calls.size();) {
    std::vector<Call*> batch;
    {
      absl::MutexLock lock(&answers->mu);
      answers->mu.Await(absl::Condition(
          +[](std::vector<Call*>* a) { return !a->empty(); }, &answers->calls));
      batch.swap(answers->calls);
    }
    for (Call* c : batch) {
      FinishPrepare(std::move(c->job), std::move(c->run), c->status, c->resp);
    }
    handled += batch.size();
  }
}

void TierClient::FinishPrepare(PrepareJob job, std::shared_ptr<ShmPromotedRun> run,
                               const grpc::Status& s, const v1::PromoteResponse& resp) {
  if (!s.ok()) {
    OnRpcFailure(s, "Promote");
  }
  uint64_t from_nvme = 0;
  for (const v1::PromotedBlock& b : resp.blocks()) {
    if (static_cast<int64_t>(b.slot()) >=
        static_cast<int64_t>(run->region_->size_bytes()) / std::max<int64_t>(1, run->slot_bytes_)) {
      break;  // never read outside the mapping
    }
    run->slots_.push_back(b.slot());
    run->checksums_.push_back(b.checksum());
    run->sources_.push_back(b.source_tier() == v1::TIER_NVME ? tier_shm::TierKind::kNvme
                                                             : tier_shm::TierKind::kDram);
    from_nvme += b.source_tier() == v1::TIER_NVME;
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.prepares_total;
    stats_.promoted_blocks_total += run->slots_.size();
    stats_.promoted_from_nvme_total += from_nvme;
  }
  if (run->slots_.empty()) {
    job.done(nullptr);
  } else {
    job.done(std::move(run));
  }
}

void TierClient::RunOffers(std::vector<Staged> batch) {
  // One AllocateSlots may not name a hash twice.
  absl::flat_hash_set<BlockHash> seen;
  std::vector<Staged> unique;
  for (Staged& s : batch) {
    if (seen.insert(s.hash).second) {
      unique.push_back(std::move(s));
    }
  }
  std::vector<BlockHash> hashes;
  // Sent with the hashes, so tierd can tell a held block with other bytes (a planted one).
  std::vector<uint64_t> checksums;
  for (const Staged& s : unique) {
    hashes.push_back(s.hash);
    checksums.push_back(tier_shm::BlockChecksum(s.bytes));
  }
  uint64_t session = 0;
  std::shared_ptr<tier_shm::ShmRegion> region;
  int64_t slot_bytes = 0;
  int64_t num_slots = 0;
  {
    absl::MutexLock lock(&mu_);
    session = session_;
    region = region_;
    slot_bytes = slot_bytes_;
    num_slots = num_slots_;
    stats_.offered_blocks_total += unique.size();
  }
  v1::AllocateSlotsRequest areq;
  areq.set_session_id(session);
  areq.set_block_hashes(ConcatBlockHashes(hashes));
  areq.mutable_checksums()->Add(checksums.begin(), checksums.end());
  v1::AllocateSlotsResponse aresp;
  grpc::ClientContext actx;
  actx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
  if (grpc::Status s = stub_->AllocateSlots(&actx, areq, &aresp); !s.ok()) {
    OnRpcFailure(s, "AllocateSlots");
    absl::MutexLock lock(&mu_);
    stats_.offer_dropped_blocks_total += unique.size();
    return;
  }
  v1::CommitRequest creq;
  creq.set_session_id(session);
  uint64_t skipped = 0;
  uint64_t dropped = 0;
  for (int i = 0; i < aresp.grants_size() && i < static_cast<int>(unique.size()); ++i) {
    const v1::SlotGrant& g = aresp.grants(i);
    if (g.status() == v1::SLOT_GRANT_STATUS_ALREADY_HELD) {
      ++skipped;
      continue;
    }
    if (g.status() != v1::SLOT_GRANT_STATUS_GRANTED ||
        static_cast<int64_t>(g.slot()) >= num_slots) {
      ++dropped;
      continue;
    }
    const Staged& st = unique[static_cast<size_t>(i)];
    std::memcpy(region->data() + static_cast<size_t>(g.slot()) * slot_bytes, st.bytes.data(),
                st.bytes.size());
    v1::CommitEntry* e = creq.add_entries();
    e->set_block_hash(st.hash.ToBytes());
    e->set_slot(g.slot());
    e->set_checksum(checksums[static_cast<size_t>(i)]);
  }
  uint64_t stored = 0;
  if (creq.entries_size() > 0) {
    v1::CommitResponse cresp;
    grpc::ClientContext cctx;
    cctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
    if (grpc::Status s = stub_->Commit(&cctx, creq, &cresp); !s.ok()) {
      OnRpcFailure(s, "Commit");  // the reservations expire with their lease
      dropped += static_cast<uint64_t>(creq.entries_size());
    } else {
      for (int r : cresp.results()) {
        if (r == v1::COMMIT_STATUS_STORED) {
          ++stored;
        } else {
          ++dropped;
        }
      }
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.offer_stored_blocks_total += stored;
  stats_.offer_skipped_blocks_total += skipped;
  stats_.offer_dropped_blocks_total += dropped;
}

}  // namespace pd::tier_client
