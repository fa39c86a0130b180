#include "engine/disagg/kv_handoff.h"

#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "kernels/type_names.h"

namespace pd::disagg {

absl::StatusOr<transport::PoolGeometry> GeometryFor(const kvcache::KvLayout& layout,
                                                    absl::string_view fingerprint_hex,
                                                    int64_t num_blocks) {
  PD_RETURN_IF_ERROR(layout.Validate());
  transport::PoolGeometry g;
  uint64_t fp = 0;
  if (fingerprint_hex.size() < 16 || !absl::SimpleHexAtoi(fingerprint_hex.substr(0, 16), &fp)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model fingerprint '", fingerprint_hex, "' is not >= 16 hex digits"));
  }
  g.model_fingerprint = fp;
  g.dtype = std::string(kernels::DTypeName(layout.dtype));
  g.block_size = static_cast<uint32_t>(layout.block_size);
  g.num_layers = static_cast<uint32_t>(layout.num_layers);
  g.num_kv_heads = static_cast<uint32_t>(layout.num_kv_heads);
  g.head_dim = static_cast<uint32_t>(layout.head_dim);
  g.block_bytes = static_cast<uint64_t>(layout.block_bytes());
  g.num_blocks = static_cast<uint64_t>(num_blocks);
  PD_RETURN_IF_ERROR(g.Validate());
  return g;
}

absl::StatusOr<std::unique_ptr<KvHandoff>> KvHandoff::Create(
    const KvHandoffConfig& config, void* base, uint64_t size_bytes,
    const transport::PoolGeometry& geometry) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<KvHandoff> h, CreateUnregistered(config));
  PD_RETURN_IF_ERROR(h->RegisterPool(base, size_bytes, geometry));
  return h;
}

absl::Status KvHandoff::RegisterPool(void* base, uint64_t size_bytes,
                                     const transport::PoolGeometry& geometry) {
  if (registered_) {
    return absl::FailedPreconditionError("kv handoff: the pool is registered already");
  }
  transport::MemoryRegion region;
  region.base = base;
  region.size_bytes = size_bytes;
  region.kind = memory_kind_;
  region.device = cuda_device_;
  region.geometry = geometry;
  PD_ASSIGN_OR_RETURN(region_, transport_->Register(region));
  geometry_ = geometry;
  registered_ = true;
  return absl::OkStatus();
}

absl::Status KvHandoff::RegisterStagedPool(memory::KvPoolMemory* pool, int64_t staging_blocks,
                                           const transport::PoolGeometry& geometry) {
  if (registered_) {
    return absl::FailedPreconditionError("kv handoff: the pool is registered already");
  }
  if (pool == nullptr || staging_blocks < 1 || pool->block_bytes() != geometry.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv handoff: a staged pool needs a pool of ", geometry.block_bytes,
                     "-byte blocks and at least 1 staging block, got ",
                     pool == nullptr ? std::string("no pool")
                                     : absl::StrCat(pool->block_bytes(), "-byte blocks"),
                     " and ", staging_blocks));
  }
  transport::PoolGeometry g = geometry;
  g.num_blocks = static_cast<uint64_t>(staging_blocks);
  PD_RETURN_IF_ERROR(g.Validate());
  PD_ASSIGN_OR_RETURN(std::unique_ptr<transport::HostAllocation> area,
                      transport_->AllocateHost(g.num_blocks * g.block_bytes));
  staging_ = std::move(area);
  PD_RETURN_IF_ERROR(RegisterPool(staging_->data(), g.num_blocks * g.block_bytes, g));
  staged_pool_ = pool;
  absl::MutexLock lock(&mu_);
  for (int64_t b = staging_blocks - 1; b >= 0; --b) {
    free_slots_.push_back(BlockId(static_cast<uint32_t>(b)));
  }
  return absl::OkStatus();
}

KvHandoff::StagingStats KvHandoff::staging_stats() {
  absl::MutexLock lock(&mu_);
  StagingStats s = staging_stats_;
  s.blocks = staged() ? static_cast<int64_t>(geometry_.num_blocks) : 0;
  s.free_blocks = static_cast<int64_t>(free_slots_.size());
  return s;
}

absl::StatusOr<std::vector<BlockId>> KvHandoff::TakeSlots(size_t n) {
  absl::MutexLock lock(&mu_);
  if (free_slots_.size() < n) {
    ++staging_stats_.refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv handoff: a transfer of ", n, " blocks needs as many staging blocks, ",
        free_slots_.size(), " of ", geometry_.num_blocks, " are free (--kv_staging_blocks)"));
  }
  // The free list ends with the lowest ids, descending: taken reversed, a transfer's slots
  // ascend, so that the transport coalesces them into runs.
  const auto first = free_slots_.end() - static_cast<std::ptrdiff_t>(n);
  std::vector<BlockId> slots(std::make_reverse_iterator(free_slots_.end()),
                             std::make_reverse_iterator(first));
  free_slots_.erase(first, free_slots_.end());
  return slots;
}

// Slots go back in descending order, so the lowest are taken first again (a few warm pages
// serve most transfers).
void KvHandoff::ReturnSlots(const std::vector<BlockId>& slots) {
  absl::MutexLock lock(&mu_);
  free_slots_.insert(free_slots_.end(), slots.rbegin(), slots.rend());
}

void KvHandoff::FinishStaged(TransferId id, transport::TransferState* state) {
  Staged staged;
  {
    absl::MutexLock lock(&mu_);
    auto it = staged_ids_.find(id.value());
    if (it == staged_ids_.end()) return;
    if (it->second.cancelled && state->phase == transport::TransferPhase::kDone) {
      state->phase = transport::TransferPhase::kFailed;
      state->status = absl::CancelledError("kv transfer cancelled");
    }
    it->second.copying = state->phase == transport::TransferPhase::kDone && !it->second.dst.empty();
    staged = it->second;
  }
  const absl::Time start = absl::Now();
  if (staged.copying) {
    const size_t bb = static_cast<size_t>(geometry_.block_bytes);
    const uint8_t* area = static_cast<const uint8_t*>(staging_->data());
    for (size_t i = 0; i < staged.dst.size(); ++i) {
      absl::Status s = staged_pool_->WriteBlock(staged.dst[i], area + staged.slots[i].value() * bb);
      if (!s.ok()) {
        state->phase = transport::TransferPhase::kFailed;
        state->status =
            absl::InternalError(absl::StrCat("kv handoff: copying block ", staged.dst[i].value(),
                                             " out of the staging area: ", s.message()));
        break;
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (staged.copying) {
      staging_stats_.blocks_in += static_cast<int64_t>(staged.dst.size());
      staging_stats_.seconds_in += absl::ToDoubleSeconds(absl::Now() - start);
    }
    staged_ids_.erase(id.value());
    free_slots_.insert(free_slots_.end(), staged.slots.rbegin(), staged.slots.rend());
  }
}

std::function<absl::StatusOr<std::shared_ptr<transport::HostAllocation>>(uint64_t)>
KvHandoff::PoolAllocator() {
  if (memory_kind_ != transport::MemoryKind::kHost || !transport_->Caps().fast_host_allocation) {
    return {};
  }
  return [t = transport_.get()](
             uint64_t bytes) -> absl::StatusOr<std::shared_ptr<transport::HostAllocation>> {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<transport::HostAllocation> a, t->AllocateHost(bytes));
    return std::shared_ptr<transport::HostAllocation>(std::move(a));
  };
}

absl::StatusOr<std::unique_ptr<KvHandoff>> KvHandoff::CreateUnregistered(
    const KvHandoffConfig& config) {
  std::unique_ptr<KvHandoff> h(new KvHandoff());
  h->memory_kind_ = config.memory_kind;
  h->cuda_device_ = config.cuda_device;
  PD_ASSIGN_OR_RETURN(h->transport_, transport::CreateTransport(config.transport));
  {
    std::random_device rd;
    absl::MutexLock lock(&h->mu_);
    h->next_tag_ = (static_cast<uint64_t>(rd()) << 32) | 1;  // distinct across restarts
  }
  h->completions_ = std::thread([p = h.get()] { p->RunCompletions(); });
  return h;
}

KvHandoff::~KvHandoff() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (completions_.joinable()) {
    completions_.join();
  }
  if (transport_ != nullptr && registered_) {
    absl::Status s = transport_->Deregister(region_);
    if (!s.ok()) {
      LOG(WARNING) << "kv handoff: deregister: " << s;
    }
  }
}

uint64_t KvHandoff::NextTag() {
  absl::MutexLock lock(&mu_);
  return next_tag_++;
}

absl::StatusOr<transport::Expectation> KvHandoff::Expect(uint64_t tag,
                                                         absl::Span<const BlockId> dst,
                                                         absl::Duration timeout,
                                                         std::vector<BlockId>* wire_dst) {
  transport::TransferOptions options;
  options.timeout = timeout;
  if (!staged()) {
    if (wire_dst != nullptr) wire_dst->assign(dst.begin(), dst.end());
    return transport_->ExpectTransfer(tag, region_, dst, options);
  }
  for (const BlockId b : dst) {
    if (!b.valid() || b.value() >= static_cast<uint64_t>(staged_pool_->num_blocks())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv handoff: block ", b.value(), " is outside the pool of ", staged_pool_->num_blocks()));
    }
  }
  PD_ASSIGN_OR_RETURN(std::vector<BlockId> slots, TakeSlots(dst.size()));
  absl::StatusOr<transport::Expectation> e =
      transport_->ExpectTransfer(tag, region_, slots, options);
  if (!e.ok()) {
    ReturnSlots(slots);
    return e;
  }
  if (wire_dst != nullptr) *wire_dst = slots;
  absl::MutexLock lock(&mu_);
  staged_ids_[e->id.value()] = Staged{std::move(slots), {dst.begin(), dst.end()}};
  return e;
}

absl::StatusOr<transport::PeerHandle> KvHandoff::PeerFor(absl::string_view peer_endpoint) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(std::string(peer_endpoint));
    if (it != peers_.end()) {
      return it->second;
    }
  }
  PD_ASSIGN_OR_RETURN(transport::PeerHandle peer, transport_->Connect(peer_endpoint));
  absl::MutexLock lock(&mu_);
  peers_[std::string(peer_endpoint)] = peer;
  return peer;
}

absl::Status KvHandoff::EnsureConnected(absl::string_view peer_endpoint) {
  return PeerFor(peer_endpoint).status();
}

absl::StatusOr<TransferId> KvHandoff::Send(absl::string_view peer_endpoint, uint64_t tag,
                                           absl::Span<const transport::BlockPair> pairs,
                                           absl::string_view descriptor, absl::Duration timeout) {
  PD_ASSIGN_OR_RETURN(transport::PeerHandle peer, PeerFor(peer_endpoint));
  transport::TransferOptions options;
  options.timeout = timeout;
  std::vector<BlockId> slots;
  std::vector<transport::BlockPair> staged_pairs;
  if (staged()) {
    // The blocks go up from the ranks into the staging area, in the TP = 1 layout, and leave
    // from there.
    PD_ASSIGN_OR_RETURN(slots, TakeSlots(pairs.size()));
    const absl::Time start = absl::Now();
    const size_t bb = static_cast<size_t>(geometry_.block_bytes);
    uint8_t* area = static_cast<uint8_t*>(staging_->data());
    for (size_t i = 0; i < pairs.size(); ++i) {
      absl::Status s = staged_pool_->ReadBlock(pairs[i].src, area + slots[i].value() * bb);
      if (!s.ok()) {
        ReturnSlots(slots);
        return s;
      }
      staged_pairs.push_back({slots[i], pairs[i].dst});
    }
    pairs = staged_pairs;
    absl::MutexLock lock(&mu_);
    staging_stats_.blocks_out += static_cast<int64_t>(pairs.size());
    staging_stats_.seconds_out += absl::ToDoubleSeconds(absl::Now() - start);
  }
  absl::StatusOr<TransferId> id =
      transport_->PostTransfer(peer, tag, region_, pairs, descriptor, options);
  if (staged()) {
    if (id.ok()) {
      absl::MutexLock lock(&mu_);
      staged_ids_[id->value()] = Staged{std::move(slots), {}};
    } else {
      ReturnSlots(slots);
    }
  }
  if (absl::IsUnavailable(id.status())) {
    // The peer went away (e.g. a restarted decode worker): forget the connection so that the
    // next request reconnects.
    absl::MutexLock lock(&mu_);
    peers_.erase(std::string(peer_endpoint));
  }
  return id;
}

void KvHandoff::WhenDone(TransferId id, absl::Time deadline, DoneCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      pending_.push_back({id, deadline, std::move(done)});
      return;
    }
  }
  (void)transport_->Cancel(id);
  transport::TransferState s;
  s.phase = transport::TransferPhase::kFailed;
  s.status = absl::CancelledError("kv handoff is shutting down");
  FinishStaged(id, &s);
  done(s);
}

absl::Status KvHandoff::Cancel(TransferId id) {
  absl::Status s = transport_->Cancel(id);
  if (staged()) {
    // No copy out of the staging area may start after this, nor be running when it returns.
    absl::MutexLock lock(&mu_);
    auto it = staged_ids_.find(id.value());
    if (it != staged_ids_.end()) {
      it->second.cancelled = true;
      auto idle = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto i = staged_ids_.find(id.value());
        return i == staged_ids_.end() || !i->second.copying;
      };
      mu_.Await(absl::Condition(&idle));
    }
  }
  if (absl::IsNotFound(s)) {
    return absl::OkStatus();
  }
  return s;
}

void KvHandoff::RunCompletions() {
  while (true) {
    std::vector<Pending> work;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pending_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      stopping = stopping_;
      work.swap(pending_);
    }
    if (stopping) {
      for (Pending& p : work) {
        (void)transport_->Cancel(p.id);
        transport::TransferState s;
        s.phase = transport::TransferPhase::kFailed;
        s.status = absl::CancelledError("kv handoff is shutting down");
        FinishStaged(p.id, &s);
        p.done(s);
      }
      return;
    }
    std::vector<Pending> still;
    bool progressed = false;
    const absl::Time now = absl::Now();
    for (Pending& p : work) {
      absl::StatusOr<transport::TransferState> st = transport_->Poll(p.id);
      transport::TransferState state;
      if (!st.ok()) {
        state.phase = transport::TransferPhase::kFailed;
        state.status = st.status();
      } else {
        state = *st;
      }
      if (!state.finished() && now >= p.deadline) {
        (void)transport_->Cancel(p.id);
        state.phase = transport::TransferPhase::kFailed;
        state.status = absl::DeadlineExceededError("kv transfer did not finish in time");
      }
      if (state.finished()) {
        FinishStaged(p.id, &state);
        p.done(state);
        progressed = true;
      } else {
        still.push_back(std::move(p));
      }
    }
    if (!still.empty()) {
      if (!progressed) {
        (void)transport_->Wait(still.front().id, absl::Microseconds(500));
      }
      absl::MutexLock lock(&mu_);
      for (Pending& p : still) {
        pending_.push_back(std::move(p));
      }
    }
  }
}

}  // namespace pd::disagg
