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
                                                         absl::Duration timeout) {
  transport::TransferOptions options;
  options.timeout = timeout;
  return transport_->ExpectTransfer(tag, region_, dst, options);
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
  absl::StatusOr<TransferId> id =
      transport_->PostTransfer(peer, tag, region_, pairs, descriptor, options);
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
  done(s);
}

absl::Status KvHandoff::Cancel(TransferId id) {
  absl::Status s = transport_->Cancel(id);
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
