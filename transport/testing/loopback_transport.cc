#include "transport/testing/loopback_transport.h"

#include <cstring>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "transport/internal/transport_core.h"

namespace pd::transport {

using transport_internal::PreparedPost;
using transport_internal::TransportCore;

void LoopbackHub::Attach(uint64_t instance_id, CorePtr core) {
  absl::MutexLock lock(&mu_);
  cores_[instance_id] = std::move(core);
}

void LoopbackHub::Detach(uint64_t instance_id) {
  absl::MutexLock lock(&mu_);
  cores_.erase(instance_id);
}

LoopbackHub::CorePtr LoopbackHub::Find(uint64_t instance_id) const {
  absl::MutexLock lock(&mu_);
  auto it = cores_.find(instance_id);
  return it == cores_.end() ? nullptr : it->second;
}

class LoopbackTransport::Impl {
 public:
  explicit Impl(std::shared_ptr<LoopbackHub> hub)
      : hub_(std::move(hub)), core_(std::make_shared<TransportCore>("loopback")) {
    hub_->Attach(core_->instance_id(), core_);
    worker_ = std::thread([this] { Run(); });
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    worker_.join();
    hub_->Detach(core_->instance_id());
  }

  TransportCore& core() { return *core_; }

  std::string Endpoint() const {
    EndpointInfo e;
    e.backend = "loopback";
    e.instance_id = core_->instance_id();
    e.address = "in-process";
    return e.Encode();
  }

  absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) {
    absl::StatusOr<EndpointInfo> e = transport_internal::DecodePeerEndpoint("loopback", endpoint);
    if (!e.ok()) {
      return e.status();
    }
    if (hub_->Find(e->instance_id) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("loopback peer ", e->instance_id, " is not attached to this hub"));
    }
    absl::MutexLock lock(&mu_);
    for (const auto& [handle, instance] : peers_) {
      if (instance == e->instance_id) {
        return PeerHandle(handle);
      }
    }
    const uint32_t handle = next_peer_++;
    peers_[handle] = e->instance_id;
    return PeerHandle(handle);
  }

  absl::Status Disconnect(PeerHandle peer) {
    absl::MutexLock lock(&mu_);
    if (peers_.erase(peer.value()) == 0) {
      return absl::NotFoundError(absl::StrCat("disconnect: unknown peer ", peer.value()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<TransferId> Post(PeerHandle peer, uint64_t tag, RegionHandle src,
                                  absl::Span<const BlockPair> pairs, absl::string_view desc,
                                  const TransferOptions& options) {
    uint64_t instance = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = peers_.find(peer.value());
      if (it == peers_.end()) {
        return absl::NotFoundError(absl::StrCat("post: unknown peer ", peer.value()));
      }
      instance = it->second;
    }
    absl::StatusOr<PreparedPost> post =
        core_->PreparePost(instance, tag, src, pairs, desc, options);
    if (!post.ok()) {
      return post.status();
    }
    const TransferId id = post->id;
    absl::MutexLock lock(&mu_);
    queue_.push_back(*std::move(post));
    return id;
  }

 private:
  void Run() {
    while (true) {
      PreparedPost post;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Impl* self) { return self->stopping_ || !self->queue_.empty(); }, this));
        if (queue_.empty()) {
          return;
        }
        post = std::move(queue_.front());
        queue_.pop_front();
      }
      Deliver(post);
    }
  }

  // Copies run by run into the receiver's core, checking for cancel/timeout in between.
  void Deliver(const PreparedPost& post) {
    const uint64_t tag = post.desc.tag;
    const uint64_t nonce = post.desc.region_nonce;
    LoopbackHub::CorePtr dst = hub_->Find(post.desc.receiver_instance_id);
    if (dst == nullptr) {
      core_->Finish(post.id, absl::UnavailableError(absl::StrCat(
                                 "loopback peer ", post.desc.receiver_instance_id, " is gone")));
      return;
    }
    for (const BlockRun& run : post.runs) {
      if (!core_->IsPending(post.id)) {
        dst->FailExpectation(tag, nonce,
                             absl::CancelledError(absl::StrCat("sender stopped transfer tag ", tag,
                                                               " before completion")));
        return;
      }
      absl::StatusOr<transport_internal::WriteGrant> grant =
          dst->BeginWrite(tag, nonce, run.dst_first, run.num_blocks, core_->instance_id());
      if (!grant.ok()) {
        core_->Finish(post.id, grant.status());
        return;
      }
      std::memcpy(grant->dst, post.src_base + uint64_t{run.src_first} * post.block_bytes,
                  grant->length);
      dst->EndWrite(*grant, true);
    }
    core_->Finish(post.id, dst->CompleteExpectation(tag, nonce));
  }

  std::shared_ptr<LoopbackHub> hub_;
  LoopbackHub::CorePtr core_;  // shared with the hub (deliveries from other transports)
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint32_t, uint64_t> peers_ ABSL_GUARDED_BY(mu_);
  std::deque<PreparedPost> queue_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

std::unique_ptr<LoopbackTransport> LoopbackTransport::Create(std::shared_ptr<LoopbackHub> hub) {
  if (hub == nullptr) {
    hub = std::make_shared<LoopbackHub>();
  }
  return std::unique_ptr<LoopbackTransport>(
      new LoopbackTransport(std::make_unique<Impl>(std::move(hub))));
}

LoopbackTransport::LoopbackTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoopbackTransport::~LoopbackTransport() = default;

TransportCaps LoopbackTransport::Caps() const {
  TransportCaps c;
  c.host_memory = true;
  c.one_sided = true;
  c.notifications = true;
  c.cancel = true;
  return c;
}

absl::StatusOr<RegionHandle> LoopbackTransport::Register(const MemoryRegion& region) {
  return impl_->core().AddRegion(region, /*allow_cuda=*/false);
}

absl::Status LoopbackTransport::Deregister(RegionHandle region) {
  return impl_->core().RemoveRegion(region).status();
}

std::string LoopbackTransport::LocalEndpoint() const { return impl_->Endpoint(); }

absl::StatusOr<PeerHandle> LoopbackTransport::Connect(absl::string_view endpoint) {
  return impl_->Connect(endpoint);
}

absl::Status LoopbackTransport::Disconnect(PeerHandle peer) { return impl_->Disconnect(peer); }

absl::StatusOr<Expectation> LoopbackTransport::ExpectTransfer(uint64_t tag, RegionHandle dst,
                                                              absl::Span<const BlockId> dst_blocks,
                                                              const TransferOptions& options) {
  return impl_->core().Expect(tag, dst, dst_blocks, options);
}

absl::StatusOr<TransferId> LoopbackTransport::PostTransfer(PeerHandle peer, uint64_t tag,
                                                           RegionHandle src,
                                                           absl::Span<const BlockPair> pairs,
                                                           absl::string_view remote_descriptor,
                                                           const TransferOptions& options) {
  return impl_->Post(peer, tag, src, pairs, remote_descriptor, options);
}

absl::StatusOr<TransferState> LoopbackTransport::Poll(TransferId id) {
  return impl_->core().Poll(id);
}

absl::StatusOr<TransferState> LoopbackTransport::Wait(TransferId id, absl::Duration timeout) {
  return impl_->core().Wait(id, timeout);
}

absl::Status LoopbackTransport::Cancel(TransferId id) {
  // A cancelled sender transfer is noticed by its worker before the next run; the receiver's
  // expectation then fails too. A cancelled expectation rejects further runs.
  return impl_->core().Cancel(id).status();
}

}  // namespace pd::transport
