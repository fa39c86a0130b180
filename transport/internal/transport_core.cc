#include "transport/internal/transport_core.h"

#include <unistd.h>

#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace pd::transport::transport_internal {
namespace {

constexpr size_t kFinishedHistory = 4096;

}  // namespace

uint64_t RandomId() {
  static thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()) ^
           static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  }());
  uint64_t v = 0;
  while (v == 0) {
    v = gen();
  }
  return v;
}

absl::StatusOr<EndpointInfo> DecodePeerEndpoint(absl::string_view backend,
                                                absl::string_view endpoint) {
  absl::StatusOr<EndpointInfo> e = EndpointInfo::Decode(endpoint);
  if (e.ok() && e->backend != backend) {
    return absl::FailedPreconditionError(
        absl::StrCat(backend, " transport cannot connect to a ", e->backend, " endpoint"));
  }
  return e;
}

TransportCore::TransportCore(std::string backend)
    : backend_(std::move(backend)), instance_id_(RandomId()) {}

absl::StatusOr<RegionHandle> TransportCore::AddRegion(const MemoryRegion& region, bool allow_cuda,
                                                      std::string blob) {
  if (region.base == nullptr) {
    return absl::InvalidArgumentError("register: null base");
  }
  if (region.kind == MemoryKind::kCuda && !allow_cuda) {
    return absl::UnimplementedError(
        absl::StrCat(backend_, " transport cannot register CUDA memory"));
  }
  absl::Status s = region.geometry.Validate();
  if (!s.ok()) {
    return s;
  }
  const uint64_t need = region.geometry.block_bytes * region.geometry.num_blocks;
  if (region.size_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("register: size_bytes ", region.size_bytes,
                                                   " < num_blocks * block_bytes = ", need));
  }
  absl::MutexLock lock(&mu_);
  const uint64_t handle = next_region_++;
  regions_[handle] = RegionInfo{region, RandomId(), std::move(blob)};
  return RegionHandle(handle);
}

absl::StatusOr<RegionInfo> TransportCore::RemoveRegion(RegionHandle handle) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(handle.value());
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("deregister: unknown region ", handle.value()));
  }
  RegionInfo info = std::move(it->second);
  regions_.erase(it);
  std::vector<std::shared_ptr<ExpectationState>> victims;
  for (const auto& [tag, exp] : expectations_) {
    if (exp->region == handle) {
      victims.push_back(exp);
    }
  }
  for (const auto& exp : victims) {
    FinishLocked(exp->id, absl::FailedPreconditionError(absl::StrCat(
                              "region ", handle.value(), " was deregistered while transfer tag ",
                              exp->tag, " was pending")));
  }
  for (const auto& exp : victims) {
    WaitWritersLocked(*exp);
  }
  return info;
}

absl::StatusOr<RegionInfo> TransportCore::GetRegion(RegionHandle handle) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(handle.value());
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown region ", handle.value()));
  }
  return it->second;
}

TransferId TransportCore::NewTransfer(uint64_t bytes, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_transfer_++;
  Record& rec = transfers_[id];
  rec.state.bytes = bytes;
  rec.deadline = absl::Now() + timeout;
  return TransferId(id);
}

bool TransportCore::Finish(TransferId id, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  return FinishLocked(id, status);
}

bool TransportCore::FinishLocked(TransferId id, const absl::Status& status) {
  auto it = transfers_.find(id.value());
  if (it == transfers_.end() || it->second.state.finished()) {
    return false;
  }
  Record& rec = it->second;
  rec.state.phase = status.ok() ? TransferPhase::kDone : TransferPhase::kFailed;
  rec.state.status = status;
  if (rec.exp != nullptr) {
    // Pairs with the acquire in WriteGrant::Valid: writers stop at their next chunk.
    rec.exp->dead.store(true, std::memory_order_release);
    auto e = expectations_.find(rec.exp->tag);
    if (e != expectations_.end() && e->second == rec.exp) {
      expectations_.erase(e);
    }
    rec.exp.reset();
  }
  finished_order_.push_back(id.value());
  while (finished_order_.size() > kFinishedHistory) {
    transfers_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
  cv_.SignalAll();
  return true;
}

void TransportCore::ApplyDeadlineLocked(TransferId id, Record& rec) {
  if (!rec.state.finished() && absl::Now() >= rec.deadline) {
    FinishLocked(id, absl::DeadlineExceededError(absl::StrCat(backend_, " transfer ", id.value(),
                                                              " timed out before completing")));
  }
}

void TransportCore::WaitWritersLocked(const ExpectationState& exp) {
  while (exp.writers > 0) {
    cv_.Wait(&mu_);
  }
}

bool TransportCore::IsPending(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id.value());
  if (it == transfers_.end()) {
    return false;
  }
  ApplyDeadlineLocked(id, it->second);
  auto again = transfers_.find(id.value());
  return again != transfers_.end() && !again->second.state.finished();
}

absl::StatusOr<TransferState> TransportCore::Poll(TransferId id) {
  return Wait(id, absl::ZeroDuration());
}

absl::StatusOr<TransferState> TransportCore::Wait(TransferId id, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = transfers_.find(id.value());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown transfer ", id.value()));
    }
    ApplyDeadlineLocked(id, it->second);
    it = transfers_.find(id.value());
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown transfer ", id.value()));
    }
    const Record& rec = it->second;
    if (rec.state.finished() || absl::Now() >= until) {
      return rec.state;
    }
    cv_.WaitWithDeadline(&mu_, std::min(until, rec.deadline));
  }
}

absl::StatusOr<TransportCore::CancelResult> TransportCore::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id.value());
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("cancel: unknown transfer ", id.value()));
  }
  CancelResult result;
  std::shared_ptr<ExpectationState> exp = it->second.exp;
  if (exp != nullptr) {
    result.expectation = true;
    result.tag = exp->tag;
  }
  result.was_pending = FinishLocked(
      id, absl::CancelledError(absl::StrCat(backend_, " transfer ", id.value(), " cancelled")));
  if (exp != nullptr) {
    WaitWritersLocked(*exp);
  }
  return result;
}

absl::StatusOr<Expectation> TransportCore::Expect(uint64_t tag, RegionHandle dst,
                                                  absl::Span<const BlockId> dst_blocks,
                                                  const TransferOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("expect: timeout must be positive");
  }
  if (dst_blocks.empty()) {
    return absl::InvalidArgumentError("expect: no destination blocks");
  }
  absl::MutexLock lock(&mu_);
  auto rit = regions_.find(dst.value());
  if (rit == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("expect: unknown region ", dst.value()));
  }
  if (expectations_.contains(tag)) {
    return absl::AlreadyExistsError(absl::StrCat("expect: tag ", tag, " already pending"));
  }
  const RegionInfo& region = rit->second;
  auto exp = std::make_shared<ExpectationState>();
  exp->tag = tag;
  exp->region = dst;
  exp->nonce = region.nonce;
  exp->base = region.base();
  exp->block_bytes = region.region.geometry.block_bytes;
  for (BlockId b : dst_blocks) {
    if (!b.valid() || b.value() >= region.region.geometry.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("expect: block ", b.value(),
                                                     " out of range [0, ",
                                                     region.region.geometry.num_blocks, ")"));
    }
    if (!exp->blocks.emplace(b.value(), 0).second) {
      return absl::InvalidArgumentError(absl::StrCat("expect: duplicate block ", b.value()));
    }
  }
  exp->remaining = exp->blocks.size();
  const uint64_t id = next_transfer_++;
  Record& rec = transfers_[id];
  rec.state.bytes = exp->remaining * exp->block_bytes;
  rec.deadline = absl::Now() + options.timeout;
  rec.exp = exp;
  exp->id = TransferId(id);
  expectations_[tag] = exp;

  TransferDescriptor d;
  d.backend = backend_;
  d.receiver_instance_id = instance_id_;
  d.region_handle = dst.value();
  d.region_nonce = region.nonce;
  d.tag = tag;
  d.geometry = region.region.geometry;
  d.dst_blocks.assign(dst_blocks.begin(), dst_blocks.end());
  d.blob = region.blob;
  return Expectation{TransferId(id), d.Encode()};
}

absl::StatusOr<WriteGrant> TransportCore::BeginWrite(uint64_t tag, uint64_t nonce,
                                                     uint32_t dst_first, uint32_t num_blocks,
                                                     uint64_t source) {
  absl::MutexLock lock(&mu_);
  auto it = expectations_.find(tag);
  if (it == expectations_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no pending expectation for tag ", tag,
                                                      " (cancelled, timed out, ",
                                                      "deregistered or never announced)"));
  }
  std::shared_ptr<ExpectationState> exp = it->second;
  if (exp->nonce != nonce) {
    return absl::FailedPreconditionError(absl::StrCat("stale descriptor for tag ", tag,
                                                      ": region nonce ", nonce,
                                                      " does not match the current registration"));
  }
  if (num_blocks == 0) {
    return absl::InvalidArgumentError("empty run");
  }
  for (uint32_t i = 0; i < num_blocks; ++i) {
    auto b = exp->blocks.find(dst_first + i);
    if (b == exp->blocks.end() || b->second != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("write to block ", dst_first + i, " for tag ", tag,
                       b == exp->blocks.end() ? " which was not announced" : " twice"));
    }
  }
  for (uint32_t i = 0; i < num_blocks; ++i) {
    exp->blocks[dst_first + i] = 1;
  }
  ++exp->writers;
  exp->source = source;
  WriteGrant g;
  g.exp = exp;
  g.dst = exp->base + uint64_t{dst_first} * exp->block_bytes;
  g.length = uint64_t{num_blocks} * exp->block_bytes;
  g.dst_first = dst_first;
  g.num_blocks = num_blocks;
  return g;
}

void TransportCore::EndWrite(const WriteGrant& grant, bool ok, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  ExpectationState& exp = *grant.exp;
  --exp.writers;
  if (ok) {
    for (uint32_t i = 0; i < grant.num_blocks; ++i) {
      exp.blocks[grant.dst_first + i] = 2;
    }
    exp.remaining -= grant.num_blocks;
  } else {
    FinishLocked(exp.id, error.ok() ? absl::DataLossError("write failed") : error);
  }
  cv_.SignalAll();
}

absl::Status TransportCore::CompleteExpectation(uint64_t tag, uint64_t nonce) {
  absl::MutexLock lock(&mu_);
  auto it = expectations_.find(tag);
  if (it == expectations_.end() || it->second->nonce != nonce) {
    return absl::FailedPreconditionError(
        absl::StrCat("no pending expectation for tag ", tag, " with that registration"));
  }
  std::shared_ptr<ExpectationState> exp = it->second;
  if (exp->remaining != 0 || exp->writers != 0) {
    absl::Status s = absl::DataLossError(absl::StrCat("transfer tag ", tag, " ended with ",
                                                      exp->remaining, " announced blocks missing"));
    FinishLocked(exp->id, s);
    return s;
  }
  FinishLocked(exp->id, absl::OkStatus());
  return absl::OkStatus();
}

void TransportCore::FailExpectation(uint64_t tag, uint64_t nonce, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  auto it = expectations_.find(tag);
  if (it != expectations_.end() && (nonce == 0 || it->second->nonce == nonce)) {
    FinishLocked(it->second->id, status);
  }
}

void TransportCore::FailExpectationsFromSource(uint64_t source, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  std::vector<TransferId> ids;
  for (const auto& [tag, exp] : expectations_) {
    if (exp->source == source) {
      ids.push_back(exp->id);
    }
  }
  for (TransferId id : ids) {
    FinishLocked(id, status);
  }
}

absl::StatusOr<PreparedPost> TransportCore::PreparePost(uint64_t peer_instance_id, uint64_t tag,
                                                        RegionHandle src,
                                                        absl::Span<const BlockPair> pairs,
                                                        absl::string_view descriptor,
                                                        const TransferOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("post: timeout must be positive");
  }
  absl::StatusOr<TransferDescriptor> desc = TransferDescriptor::Decode(descriptor);
  if (!desc.ok()) {
    return desc.status();
  }
  if (desc->backend != backend_) {
    return absl::FailedPreconditionError(
        absl::StrCat("descriptor from a ", desc->backend, " transport given to ", backend_));
  }
  if (desc->receiver_instance_id != peer_instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("descriptor belongs to transport instance ", desc->receiver_instance_id,
                     " but the peer handle connects to instance ", peer_instance_id));
  }
  if (desc->tag != tag) {
    return absl::InvalidArgumentError(
        absl::StrCat("post: tag ", tag, " but the descriptor announces tag ", desc->tag));
  }
  absl::StatusOr<RegionInfo> region = GetRegion(src);
  if (!region.ok()) {
    return region.status();
  }
  const PoolGeometry& g = region->region.geometry;
  absl::Status s = CheckCompatible(g, desc->geometry, "sender", "receiver");
  if (!s.ok()) {
    return s;
  }
  if (pairs.size() != desc->dst_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("post: ", pairs.size(), " pairs but tag ", tag,
                                                   " announces ", desc->dst_blocks.size(),
                                                   " destination blocks"));
  }
  absl::flat_hash_set<uint32_t> announced;
  for (BlockId b : desc->dst_blocks) {
    announced.insert(b.value());
  }
  absl::flat_hash_set<uint32_t> seen;
  for (const BlockPair& p : pairs) {
    if (!p.src.valid() || p.src.value() >= g.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("post: source block ", p.src.value(),
                                                     " out of range [0, ", g.num_blocks, ")"));
    }
    if (!announced.contains(p.dst.value()) || !seen.insert(p.dst.value()).second) {
      return absl::InvalidArgumentError(absl::StrCat("post: destination block ", p.dst.value(),
                                                     " is not announced by tag ", tag,
                                                     " or appears twice"));
    }
  }
  PreparedPost post;
  post.desc = *std::move(desc);
  post.runs = CoalescePairs(pairs);
  post.src_base = region->base();
  post.block_bytes = g.block_bytes;
  post.bytes = g.block_bytes * pairs.size();
  post.id = NewTransfer(post.bytes, options.timeout);
  return post;
}

std::string CoreBackedTransport::LocalEndpoint() const {
  EndpointInfo e;
  e.backend = core_.backend();
  e.instance_id = core_.instance_id();
  e.address = address_;
  return e.Encode();
}

}  // namespace pd::transport::transport_internal
