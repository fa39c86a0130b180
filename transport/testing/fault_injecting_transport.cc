#include "transport/testing/fault_injecting_transport.h"

#include "absl/strings/str_cat.h"

namespace pd::transport {

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<KvTransport> inner,
                                                 FaultPolicy policy, Clock* clock)
    : inner_(std::move(inner)),
      clock_(clock != nullptr ? clock : Clock::Real()),
      policy_(std::move(policy)) {}

void FaultInjectingTransport::SetPolicy(FaultPolicy policy) {
  std::vector<TransferId> to_cancel;
  {
    absl::MutexLock lock(&mu_);
    policy_ = std::move(policy);
    if (policy_.drop_peers) {
      for (auto& [id, e] : entries_) {
        if (e.posted && e.inner.valid()) {
          to_cancel.push_back(e.inner);
        }
      }
    }
  }
  for (TransferId id : to_cancel) {
    inner_->Cancel(id).IgnoreError();  // best effort: the wrapped transfer may have finished
  }
}

int64_t FaultInjectingTransport::PostedBlocksForTest() const {
  absl::MutexLock lock(&mu_);
  return posted_blocks_;
}

absl::StatusOr<RegionHandle> FaultInjectingTransport::Register(const MemoryRegion& region) {
  return inner_->Register(region);
}

absl::Status FaultInjectingTransport::Deregister(RegionHandle region) {
  return inner_->Deregister(region);
}

absl::StatusOr<PeerHandle> FaultInjectingTransport::Connect(absl::string_view endpoint) {
  {
    absl::MutexLock lock(&mu_);
    if (policy_.drop_peers) {
      return absl::UnavailableError("injected fault: peer dropped (connect)");
    }
  }
  return inner_->Connect(endpoint);
}

absl::Status FaultInjectingTransport::Disconnect(PeerHandle peer) {
  return inner_->Disconnect(peer);
}

TransferId FaultInjectingTransport::AddEntry(Entry e) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  entries_[id] = std::move(e);
  return TransferId(id);
}

absl::StatusOr<FaultInjectingTransport::Entry> FaultInjectingTransport::Find(TransferId id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id.value());
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown transfer ", id.value()));
  }
  return it->second;
}

absl::StatusOr<Expectation> FaultInjectingTransport::ExpectTransfer(
    uint64_t tag, RegionHandle dst, absl::Span<const BlockId> dst_blocks,
    const TransferOptions& options) {
  absl::StatusOr<Expectation> e = inner_->ExpectTransfer(tag, dst, dst_blocks, options);
  if (!e.ok()) {
    return e;
  }
  Entry entry;
  entry.inner = e->id;
  e->id = AddEntry(entry);
  return e;
}

absl::StatusOr<TransferId> FaultInjectingTransport::PostTransfer(
    PeerHandle peer, uint64_t tag, RegionHandle src, absl::Span<const BlockPair> pairs,
    absl::string_view remote_descriptor, const TransferOptions& options) {
  Entry entry;
  entry.posted = true;
  {
    absl::MutexLock lock(&mu_);
    if (!policy_.fail_submit.ok()) {
      return policy_.fail_submit;
    }
    if (policy_.drop_peers) {
      return absl::UnavailableError(
          absl::StrCat("injected fault: peer ", peer.value(), " dropped (post)"));
    }
    entry.ready = clock_->Now() + policy_.delay;
    const int64_t n = static_cast<int64_t>(pairs.size());
    if (policy_.fail_after_blocks >= 0 && posted_blocks_ + n > policy_.fail_after_blocks) {
      entry.synthetic.phase = TransferPhase::kFailed;
      entry.synthetic.status = absl::UnavailableError(
          absl::StrCat("injected fault: failed after ", policy_.fail_after_blocks, " blocks"));
      posted_blocks_ = policy_.fail_after_blocks;
      const uint64_t id = next_id_++;
      entries_[id] = std::move(entry);
      return TransferId(id);
    }
    posted_blocks_ += n;
  }
  absl::StatusOr<TransferId> inner =
      inner_->PostTransfer(peer, tag, src, pairs, remote_descriptor, options);
  if (!inner.ok()) {
    return inner.status();
  }
  entry.inner = *inner;
  return AddEntry(std::move(entry));
}

absl::StatusOr<TransferState> FaultInjectingTransport::Adjust(TransferId id,
                                                              absl::StatusOr<TransferState> s) {
  if (!s.ok()) {
    return s;
  }
  absl::StatusOr<Entry> e = Find(id);
  if (!e.ok() || !e->posted) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (policy_.drop_peers &&
      (!s->finished() || s->phase == TransferPhase::kFailed || clock_->Now() < e->ready)) {
    s->phase = TransferPhase::kFailed;
    s->status = absl::UnavailableError("injected fault: peer dropped");
    return s;
  }
  if (s->finished() && clock_->Now() < e->ready) {
    return TransferState{TransferPhase::kPending, absl::OkStatus(), s->bytes};
  }
  if (s->phase == TransferPhase::kDone && !policy_.corrupt_status.ok()) {
    s->phase = TransferPhase::kFailed;
    s->status = policy_.corrupt_status;
  }
  return s;
}

absl::StatusOr<TransferState> FaultInjectingTransport::Poll(TransferId id) {
  absl::StatusOr<Entry> e = Find(id);
  if (!e.ok()) {
    return e.status();
  }
  if (!e->inner.valid()) {
    return e->synthetic;
  }
  return Adjust(id, inner_->Poll(e->inner));
}

absl::StatusOr<TransferState> FaultInjectingTransport::Wait(TransferId id, absl::Duration timeout) {
  absl::StatusOr<Entry> e = Find(id);
  if (!e.ok()) {
    return e.status();
  }
  if (!e->inner.valid()) {
    return e->synthetic;
  }
  const absl::Time until = clock_->Now() + timeout;
  absl::StatusOr<TransferState> s = Adjust(id, inner_->Wait(e->inner, timeout));
  if (s.ok() && !s->finished() && e->posted) {
    // Possibly held back by `delay`: sleep the rest of it (bounded by the caller's timeout).
    const absl::Time now = clock_->Now();
    const absl::Time wake = std::min(until, e->ready);
    if (wake > now) {
      clock_->SleepFor(wake - now);
    }
    s = Adjust(id, inner_->Poll(e->inner));
  }
  return s;
}

absl::Status FaultInjectingTransport::Cancel(TransferId id) {
  absl::StatusOr<Entry> e = Find(id);
  if (!e.ok()) {
    return e.status();
  }
  if (!e->inner.valid()) {
    return absl::OkStatus();
  }
  return inner_->Cancel(e->inner);
}

}  // namespace pd::transport
