#include "loadtest/sim/sim_worker.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "loadtest/sim/remote_fetch.h"

namespace pd::loadtest::sim {
namespace {

namespace iv1 = ::pdserve::internal::v1;

// Decode steps left below this count as none: the next decode end is rounded up to a whole
// nanosecond, so a finishing request is left with rounding noise, never a real step.
constexpr double kStepEpsilon = 1e-6;

kvcache::SequenceId Seq(const SimRequest& r) {
  return kvcache::SequenceId(static_cast<uint64_t>(r.id));
}

}  // namespace

absl::Status TimeModel::Validate() const {
  if (!(prefill_tokens_per_s > 0) || !std::isfinite(prefill_tokens_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefill_tokens_per_s must be > 0, got ", prefill_tokens_per_s));
  }
  if (prefill_overhead < absl::ZeroDuration() || decode_step_per_seq < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--prefill_overhead and --decode_step_per_seq must be >= 0");
  }
  if (decode_step <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--decode_step must be > 0, got ", absl::FormatDuration(decode_step)));
  }
  return absl::OkStatus();
}

SimWorker::SimWorker(std::string worker_id, uint64_t epoch, const TimeModel& time,
                     int64_t block_size)
    : worker_id_(std::move(worker_id)), epoch_(epoch), time_(time), block_size_(block_size) {}

absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> SimWorker::MakeSharedPool(
    int64_t num_blocks, int64_t block_size) {
  kvcache::KvCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  return kvcache::KvCacheManager::Create(config);
}

absl::StatusOr<std::unique_ptr<SimWorker>> SimWorker::Create(std::string worker_id, uint64_t epoch,
                                                             const TimeModel& time,
                                                             int64_t block_size,
                                                             int64_t capacity_blocks,
                                                             kvcache::KvCacheManager* shared_pool) {
  if (absl::Status s = time.Validate(); !s.ok()) {
    return s;
  }
  std::unique_ptr<SimWorker> w(new SimWorker(std::move(worker_id), epoch, time, block_size));
  if (shared_pool != nullptr) {
    if (shared_pool->block_size() != block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("shared pool block size ", shared_pool->block_size(), " != ", block_size));
    }
    w->pool_ = shared_pool;
    return w;
  }
  kvcache::KvCacheConfig config;
  config.num_blocks = capacity_blocks;
  config.block_size = block_size;
  absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> pool =
      kvcache::KvCacheManager::Create(config, w.get());
  if (!pool.ok()) {
    return pool.status();
  }
  w->own_pool_ = *std::move(pool);
  w->pool_ = w->own_pool_.get();
  return w;
}

int64_t SimWorker::BlocksNeeded(const SimRequest& request) const {
  return pool_->NumBlocksForTokens(request.prompt_tokens + request.output_tokens);
}

double SimWorker::StepNs() const {
  return absl::ToDoubleNanoseconds(time_.decode_step) +
         absl::ToDoubleNanoseconds(time_.decode_step_per_seq) *
             static_cast<double>(decoding_.size());
}

std::optional<int64_t> SimWorker::NextEventNs() const {
  std::optional<int64_t> next;
  if (prefilling_ != nullptr) {
    next = prefill_end_ns_;
  }
  if (!decoding_.empty()) {
    double min_steps = decoding_.front()->remaining_steps;
    for (const SimRequest* r : decoding_) {
      min_steps = std::min(min_steps, r->remaining_steps);
    }
    const int64_t end = std::max<int64_t>(
        last_advance_ns_ + 1,
        last_advance_ns_ + static_cast<int64_t>(std::ceil(std::max(0.0, min_steps) * StepNs())));
    next = next.has_value() ? std::min(*next, end) : end;
  }
  return next;
}

void SimWorker::Advance(int64_t now_ns, std::vector<SimRequest*>* finished) {
  // Internal events (a decode or the prefill ending) up to now_ns, in time order: each changes
  // the decode batch, hence the step time of what follows.
  for (;;) {
    int64_t step_to = now_ns;
    std::optional<int64_t> next = NextEventNs();
    if (next.has_value() && *next < step_to) {
      step_to = std::max(*next, last_advance_ns_);
    }
    AdvanceDecode(step_to, finished);
    if (prefilling_ != nullptr && prefill_end_ns_ <= step_to) {
      FinishPrefill(finished);
    }
    TryStartPrefill(step_to);
    if (step_to >= now_ns) {
      return;
    }
  }
}

void SimWorker::Enqueue(SimRequest* request, int64_t now_ns, std::vector<SimRequest*>* finished) {
  Advance(now_ns, finished);
  queue_.push_back(request);
  TryStartPrefill(now_ns);
}

void SimWorker::AdvanceDecode(int64_t now_ns, std::vector<SimRequest*>* finished) {
  if (now_ns <= last_advance_ns_) {
    return;
  }
  if (!decoding_.empty()) {
    const double steps = static_cast<double>(now_ns - last_advance_ns_) / StepNs();
    for (SimRequest* r : decoding_) {
      r->remaining_steps -= steps;
    }
  }
  last_advance_ns_ = now_ns;
  auto done = std::stable_partition(decoding_.begin(), decoding_.end(), [](const SimRequest* r) {
    return r->remaining_steps > kStepEpsilon;
  });
  std::vector<SimRequest*> ended(done, decoding_.end());
  decoding_.erase(done, decoding_.end());
  for (SimRequest* r : ended) {
    Release(r, now_ns, finished);
  }
}

void SimWorker::FinishPrefill(std::vector<SimRequest*>* finished) {
  SimRequest* r = prefilling_;
  prefilling_ = nullptr;
  // The prompt's full blocks are computed: they become prefix hits (BlockStored).
  const absl::Status committed = pool_->CommitBlocks(Seq(*r), r->chain);
  CHECK(committed.ok()) << committed;  // the chain was validated by AllocatePrompt
  r->first_token_ns = prefill_end_ns_;
  stats_.prefill_busy_ns += prefill_end_ns_ - r->prefill_start_ns;
  r->remaining_steps = static_cast<double>(r->output_tokens - 1);
  if (r->remaining_steps <= kStepEpsilon) {
    Release(r, prefill_end_ns_, finished);
    return;
  }
  // Joins the batch at prefill_end_ns_ <= last_advance_ns_; the rounding of event times is
  // at most 1 ns.
  decoding_.push_back(r);
}

void SimWorker::Release(SimRequest* request, int64_t now_ns, std::vector<SimRequest*>* finished) {
  const absl::Status freed = pool_->Free(Seq(*request));
  CHECK(freed.ok()) << freed;  // allocated in TryStartPrefill
  request->end_ns = now_ns;
  request->chain.clear();
  request->chain.shrink_to_fit();
  finished->push_back(request);
}

void SimWorker::TryStartPrefill(int64_t now_ns) {
  if (prefilling_ != nullptr || queue_.empty()) {
    blocked_ = false;
    return;
  }
  SimRequest* r = queue_.front();
  const kvcache::SequenceId seq = Seq(*r);
  absl::StatusOr<int64_t> cached = pool_->AllocatePrompt(seq, r->chain, r->prompt_tokens);
  if (!cached.ok()) {
    CHECK(absl::IsResourceExhausted(cached.status())) << cached.status();
    blocked_ = true;
    return;
  }
  // Reserve the output's blocks now: no preemption in this model.
  if (!pool_->AppendTokens(seq, r->output_tokens).ok()) {
    const absl::Status freed = pool_->Free(seq);
    CHECK(freed.ok()) << freed;
    blocked_ = true;
    return;
  }
  blocked_ = false;
  queue_.pop_front();
  prefilling_ = r;
  r->cached_tokens = *cached;
  r->prefill_start_ns = now_ns;
  int64_t compute_start_ns = now_ns;
  if (fetcher_ != nullptr) {
    // AllocatePrompt leaves at least one token to compute; so does the fetch.
    const int64_t max_blocks = (r->prompt_tokens - 1) / block_size_;
    const FetchPlan plan =
        fetcher_->Plan(fetcher_index_, r->chain, *cached / block_size_, max_blocks, now_ns);
    r->fetched_tokens = plan.blocks * block_size_;
    r->recompute_chosen = plan.available_blocks > 0 && plan.blocks == 0;
    if (plan.blocks > 0) {
      r->fetch_ns = plan.end_ns - now_ns;
      compute_start_ns = plan.end_ns;
      ++stats_.fetches;
      stats_.fetch_ns += r->fetch_ns;
    }
    stats_.fetched_tokens += r->fetched_tokens;
    stats_.recompute_chosen += r->recompute_chosen ? 1 : 0;
  }
  prefill_tokens_ = r->prompt_tokens - *cached - r->fetched_tokens;
  const double prefill_ns = static_cast<double>(prefill_tokens_) / time_.prefill_tokens_per_s * 1e9;
  prefill_end_ns_ = compute_start_ns + absl::ToInt64Nanoseconds(time_.prefill_overhead) +
                    static_cast<int64_t>(std::ceil(prefill_ns));
  ++stats_.requests;
  stats_.prompt_tokens += r->prompt_tokens;
  stats_.cached_tokens += *cached;
  stats_.prefill_tokens += prefill_tokens_;
}

int64_t SimWorker::QueuedPrefillTokens(int64_t now_ns) const {
  // As the engine counts it: waiting prompts in full, the prefilling one's uncomputed tokens.
  int64_t tokens = 0;
  for (const SimRequest* r : queue_) {
    tokens += r->prompt_tokens;
  }
  if (prefilling_ != nullptr) {
    const double left_s = static_cast<double>(prefill_end_ns_ - now_ns) / 1e9;
    tokens += std::clamp<int64_t>(static_cast<int64_t>(left_s * time_.prefill_tokens_per_s), 0,
                                  prefill_tokens_);
  }
  return tokens;
}

int64_t SimWorker::NumRequests() const {
  return static_cast<int64_t>(queue_.size() + decoding_.size()) + (prefilling_ != nullptr ? 1 : 0);
}

SimLoad SimWorker::Load(int64_t now_ns) const {
  SimLoad load;
  load.queued_prefill_tokens = QueuedPrefillTokens(now_ns);
  load.active_kv_blocks = pool_->Stats().num_blocks_used;
  load.free_kv_blocks = pool_->NumFreeBlocks();
  load.total_kv_blocks = pool_->num_blocks();
  load.running = static_cast<int64_t>(decoding_.size()) + (prefilling_ != nullptr ? 1 : 0);
  load.waiting = static_cast<int64_t>(queue_.size());
  return load;
}

iv1::KvEvent* SimWorker::NewEvent() {
  iv1::KvEvent& e = pending_events_.emplace_back();
  e.set_sequence(next_sequence_++);
  e.set_worker_id(worker_id_);
  return &e;
}

void SimWorker::OnBlocksStored(absl::Span<const BlockHash> hashes,
                               std::optional<BlockHash> parent) {
  iv1::BlockStored* stored = NewEvent()->mutable_stored();
  stored->set_block_hashes(ConcatBlockHashes(hashes));
  if (parent.has_value()) {
    stored->set_parent_hash(parent->ToBytes());
  }
  stored->set_tier(iv1::TIER_HBM);
  stored->set_num_tokens(static_cast<uint32_t>(static_cast<int64_t>(hashes.size()) * block_size_));
  stats_.stored_blocks += static_cast<int64_t>(hashes.size());
}

void SimWorker::OnBlocksRemoved(absl::Span<const BlockHash> hashes) {
  iv1::BlockRemoved* removed = NewEvent()->mutable_removed();
  removed->set_block_hashes(ConcatBlockHashes(hashes));
  removed->set_tier(iv1::TIER_HBM);
  stats_.removed_blocks += static_cast<int64_t>(hashes.size());
}

void SimWorker::OnAllCleared() { NewEvent()->mutable_cleared(); }

std::optional<iv1::KvEventBatch> SimWorker::TakeEventBatch() {
  if (pending_events_.empty()) {
    return std::nullopt;
  }
  iv1::KvEventBatch batch;
  batch.set_worker_id(worker_id_);
  batch.set_epoch(epoch_);
  for (iv1::KvEvent& e : pending_events_) {
    *batch.add_events() = std::move(e);
  }
  pending_events_.clear();
  return batch;
}

}  // namespace pd::loadtest::sim
