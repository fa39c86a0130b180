#include "loadtest/sim/route_sim.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <queue>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::loadtest::sim {
namespace {

namespace iv1 = ::pdserve::internal::v1;

// Seed of every simulated chain: the simulator's blocks never meet real ones.
constexpr BlockHash kChainSeed{0x7064'2d72'6f75'7465ULL, 0x7369'6d2f'7631'0000ULL};

// What the router knows of one worker (pd-router's WorkerSnapshot) and what is on its way to it.
struct RouterView {
  SimLoad load;
  bool has_report = false;
  int64_t inflight = 0;         // streams open on the worker
  int64_t assigned_blocks = 0;  // their new prompt blocks (Placement::new_blocks)
  int64_t inflight_at_report = 0;
  int64_t assigned_blocks_at_report = 0;
  struct PendingLoad {
    SimLoad load;
    int64_t inflight = 0;
    int64_t assigned_blocks = 0;
  };
  std::deque<PendingLoad> pending_loads;          // polled, not yet received
  std::deque<iv1::KvEventBatch> pending_batches;  // published, not yet applied
  uint64_t version = 0;                           // of the worker's latest scheduled wake-up
};

enum class EventType { kLoadPoll, kArrival, kWorker, kDeliverBatch, kDeliverLoad };

struct Event {
  int64_t time_ns = 0;
  uint64_t order = 0;  // FIFO among equal times
  EventType type = EventType::kArrival;
  int worker = -1;
  int64_t arg = 0;  // request index (kArrival) or version (kWorker)

  bool operator>(const Event& o) const {
    return time_ns != o.time_ns ? time_ns > o.time_ns : order > o.order;
  }
};

class Simulation {
 public:
  Simulation(const Trace& trace, const RouteSimConfig& config) : trace_(trace), config_(config) {}

  absl::Status Init();
  RouteSimResult Run();

 private:
  void Push(int64_t time_ns, EventType type, int worker = -1, int64_t arg = 0) {
    events_.push(Event{time_ns, next_order_++, type, worker, arg});
  }
  // Advances worker `w` to now, settles what it finished and published, schedules its wake-up.
  void Touch(int w, int64_t now_ns);
  void Settle(int w, int64_t now_ns, const std::vector<SimRequest*>& finished);
  void Reschedule(int w, int64_t now_ns);
  void ApplyBatch(int w, const iv1::KvEventBatch& batch);
  void OnArrival(int64_t index, int64_t now_ns);
  void OnLoadPoll(int64_t now_ns);
  int ChooseWorker(SimRequest& r, int64_t* new_blocks);
  std::vector<router::WorkerCandidate> Candidates() const;
  RouteSimResult Collect();

  const Trace& trace_;
  const RouteSimConfig config_;
  std::unique_ptr<router::KvIndex> index_;
  std::unique_ptr<router::WorkerScorer> scorer_;
  std::unique_ptr<kvcache::KvCacheManager> shared_pool_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::unique_ptr<RemoteFetcher> fetcher_;  // null: pooled, or remote fetch off
  std::vector<RouterView> views_;
  std::vector<SimRequest> requests_;
  std::vector<int64_t> new_blocks_;  // per request, for the router's bookkeeping
  std::vector<int> placed_on_;       // per request; -1 = rejected
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t next_order_ = 0;
  std::mt19937_64 placement_rng_;
  uint64_t pooled_cursor_ = 0;
  int64_t arrivals_left_ = 0;
  int64_t in_system_ = 0;
  int64_t rejected_ = 0;
  int64_t index_max_entries_ = 0;
  int64_t index_rejected_ = 0;
  std::map<std::string, int64_t> reasons_;
  int64_t affinity_missed_requests_ = 0;
  int64_t affinity_missed_blocks_ = 0;
  int64_t ticks_ = 0;         // load polls
  double active_blocks_ = 0;  // sums over the polls
  double active_spread_ = 0;
  double queued_spread_ = 0;
};

absl::Status Simulation::Init() {
  const bool pooled = config_.policy == SimPolicy::kPooled;
  if (pooled) {
    absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> pool = SimWorker::MakeSharedPool(
        config_.capacity_blocks * config_.num_workers, config_.block_size);
    if (!pool.ok()) {
      return pool.status();
    }
    shared_pool_ = *std::move(pool);
  } else {
    router::KvIndexConfig ic;
    ic.max_blocks = config_.index_max_blocks > 0
                        ? config_.index_max_blocks
                        : router::AutoIndexBound(config_.capacity_blocks * config_.num_workers);
    absl::StatusOr<std::unique_ptr<router::KvIndex>> index = router::KvIndex::Create(ic);
    if (!index.ok()) {
      return index.status();
    }
    index_ = *std::move(index);
  }
  if (config_.policy == SimPolicy::kCacheAware || config_.policy == SimPolicy::kRoundRobin) {
    router::ScorerConfig sc = config_.scorer;
    sc.policy = config_.policy == SimPolicy::kCacheAware ? router::ScorerPolicy::kCacheAware
                                                         : router::ScorerPolicy::kRoundRobin;
    absl::StatusOr<std::unique_ptr<router::WorkerScorer>> scorer = router::WorkerScorer::Create(sc);
    if (!scorer.ok()) {
      return scorer.status();
    }
    scorer_ = *std::move(scorer);
  }
  for (int w = 0; w < config_.num_workers; ++w) {
    absl::StatusOr<std::unique_ptr<SimWorker>> worker = SimWorker::Create(
        absl::StrCat("sim-worker-", w), 0x5eed0000ULL + static_cast<uint64_t>(w), config_.time,
        config_.block_size, config_.capacity_blocks, shared_pool_.get());
    if (!worker.ok()) {
      return worker.status();
    }
    workers_.push_back(*std::move(worker));
  }
  if (!pooled && config_.remote.enabled) {
    std::vector<const kvcache::KvCacheManager*> pools;
    for (const auto& w : workers_) {
      pools.push_back(&w->pool());
    }
    fetcher_ = std::make_unique<RemoteFetcher>(config_.remote, std::move(pools), config_.block_size,
                                               config_.time.prefill_tokens_per_s);
    for (int w = 0; w < config_.num_workers; ++w) {
      workers_[w]->AttachRemoteFetcher(fetcher_.get(), w);
    }
  }
  views_.resize(static_cast<size_t>(config_.num_workers));
  placement_rng_.seed(config_.seed);

  // Arrivals: the trace's offsets plus the jitter, drawn in trace order from their own stream
  // so that every policy sees the same arrival times.
  std::mt19937_64 jitter_rng(config_.seed ^ 0x6a17'7e55'0000'0001ULL);
  const int64_t jitter_ns = absl::ToInt64Nanoseconds(config_.arrival_jitter);
  const size_t n = trace_.records.size();
  requests_.resize(n);
  new_blocks_.assign(n, 0);
  placed_on_.assign(n, -1);
  Push(0, EventType::kLoadPoll);  // the first reports precede the first arrival
  for (size_t i = 0; i < n; ++i) {
    int64_t t = absl::ToInt64Nanoseconds(trace_.records[i].arrival_offset);
    if (jitter_ns > 0) {
      t += std::uniform_int_distribution<int64_t>(0, jitter_ns - 1)(jitter_rng);
    }
    requests_[i].id = static_cast<int64_t>(i);
    requests_[i].arrival_ns = t;
    Push(t, EventType::kArrival, -1, static_cast<int64_t>(i));
  }
  arrivals_left_ = static_cast<int64_t>(n);
  return absl::OkStatus();
}

void Simulation::ApplyBatch(int w, const iv1::KvEventBatch& batch) {
  const absl::Status s = index_->Apply(workers_[w]->worker_id(), batch);
  if (!s.ok()) {
    if (index_rejected_ == 0) {
      LOG(WARNING) << "kv index rejected a batch of " << workers_[w]->worker_id() << ": " << s;
    }
    ++index_rejected_;
  }
}

void Simulation::Settle(int w, int64_t now_ns, const std::vector<SimRequest*>& finished) {
  RouterView& v = views_[w];
  for (SimRequest* r : finished) {
    // The stream ended: pd-router's AddInflight(index, -1, -new_blocks).
    --v.inflight;
    v.assigned_blocks -= new_blocks_[r->id];
    --in_system_;
  }
  if (index_ != nullptr) {
    std::optional<iv1::KvEventBatch> batch = workers_[w]->TakeEventBatch();
    if (batch.has_value()) {
      if (config_.event_delay <= absl::ZeroDuration()) {
        ApplyBatch(w, *batch);
      } else {
        v.pending_batches.push_back(*std::move(batch));
        Push(now_ns + absl::ToInt64Nanoseconds(config_.event_delay), EventType::kDeliverBatch, w);
      }
    }
  }
  Reschedule(w, now_ns);
  // A shared pool: blocks freed here may unblock another worker's queue.
  if (shared_pool_ != nullptr && !finished.empty()) {
    for (int o = 0; o < config_.num_workers; ++o) {
      if (o != w && workers_[o]->Blocked()) {
        Touch(o, now_ns);
      }
    }
  }
}

void Simulation::Touch(int w, int64_t now_ns) {
  std::vector<SimRequest*> finished;
  workers_[w]->Advance(now_ns, &finished);
  Settle(w, now_ns, finished);
}

void Simulation::Reschedule(int w, int64_t now_ns) {
  RouterView& v = views_[w];
  ++v.version;
  std::optional<int64_t> next = workers_[w]->NextEventNs();
  if (next.has_value()) {
    Push(std::max(*next, now_ns), EventType::kWorker, w, static_cast<int64_t>(v.version));
  }
}

std::vector<router::WorkerCandidate> Simulation::Candidates() const {
  // As services/router/placement.cc: the stale report corrected by what this router placed or
  // saw finish since it was requested.
  std::vector<router::WorkerCandidate> candidates(views_.size());
  for (size_t i = 0; i < views_.size(); ++i) {
    const RouterView& v = views_[i];
    router::WorkerCandidate& c = candidates[i];
    c.worker_id = workers_[i]->worker_id();
    c.healthy = true;
    c.can_decode = true;
    c.can_prefill = false;  // colocated: the decode worker prefills
    const int64_t d_blocks = v.assigned_blocks - v.assigned_blocks_at_report;
    const int64_t d_streams = v.inflight - v.inflight_at_report;
    c.queued_prefill_tokens = v.load.queued_prefill_tokens;
    c.active_kv_blocks = std::max<int64_t>(0, v.load.active_kv_blocks + d_blocks);
    c.free_kv_blocks = std::max<int64_t>(0, v.load.free_kv_blocks - d_blocks);
    c.total_kv_blocks = v.has_report ? v.load.total_kv_blocks : 0;
    const int64_t running = v.load.running;
    const int64_t waiting = v.load.waiting;
    const int64_t ended = std::min<int64_t>(std::max<int64_t>(0, -d_streams), running + waiting);
    c.running = static_cast<int32_t>(std::max<int64_t>(0, running - ended));
    c.waiting = static_cast<int32_t>(waiting - std::max<int64_t>(0, ended - running));
    c.inflight_assigned = std::max<int64_t>(0, d_streams);
    c.inflight_new_blocks = std::max<int64_t>(0, d_blocks);
  }
  return candidates;
}

int Simulation::ChooseWorker(SimRequest& r, int64_t* new_blocks) {
  const int64_t bs = config_.block_size;
  const int64_t prompt_blocks = (r.prompt_tokens + bs - 1) / bs;
  const int n = config_.num_workers;
  if (config_.policy == SimPolicy::kPooled) {
    // Ideal: exact queued prefill work now, then fewer requests, then rotation.
    int best = -1;
    int64_t best_tokens = 0;
    int64_t best_requests = 0;
    for (int k = 0; k < n; ++k) {
      const int w = static_cast<int>((pooled_cursor_ + static_cast<uint64_t>(k)) % n);
      const int64_t tokens = workers_[w]->QueuedPrefillTokens(r.arrival_ns);
      const int64_t requests = workers_[w]->NumRequests();
      if (best < 0 || tokens < best_tokens || (tokens == best_tokens && requests < best_requests)) {
        best = w;
        best_tokens = tokens;
        best_requests = requests;
      }
    }
    ++pooled_cursor_;
    ++reasons_["pooled"];
    *new_blocks = prompt_blocks;
    return best;
  }
  // Every policy matches the chain (pd-router does): the overlap sets new_blocks.
  const std::vector<router::WorkerOverlap> overlaps = index_->Match(r.chain);
  int chosen = -1;
  if (config_.policy == SimPolicy::kRandom) {
    chosen = std::uniform_int_distribution<int>(0, n - 1)(placement_rng_);
    ++reasons_["random"];
  } else {
    const std::vector<router::WorkerCandidate> candidates = Candidates();
    absl::StatusOr<router::RoutingDecision> d =
        scorer_->Choose(candidates, overlaps, r.prompt_tokens, bs);
    CHECK(d.ok()) << d.status();  // every candidate is a healthy decode worker
    chosen = d->decode_index;
    ++reasons_[d->reason];
  }
  int64_t overlap = 0;
  int64_t best_overlap = 0;
  for (const router::WorkerOverlap& o : overlaps) {
    const int64_t blocks = std::min(o.total_blocks(), r.prompt_tokens / bs);
    best_overlap = std::max(best_overlap, blocks);
    if (o.worker_id == workers_[chosen]->worker_id()) {
      overlap = blocks;
    }
  }
  if (overlap < best_overlap) {
    ++affinity_missed_requests_;
    affinity_missed_blocks_ += best_overlap - overlap;
  }
  *new_blocks = std::max<int64_t>(0, prompt_blocks - overlap);
  return chosen;
}

void Simulation::OnArrival(int64_t index, int64_t now_ns) {
  --arrivals_left_;
  const TraceRecord& rec = trace_.records[static_cast<size_t>(index)];
  SimRequest& r = requests_[static_cast<size_t>(index)];
  r.prompt_tokens = rec.input_length;
  r.output_tokens = rec.output_length;
  const int64_t pool_blocks =
      config_.capacity_blocks * (shared_pool_ != nullptr ? config_.num_workers : 1);
  if (workers_[0]->BlocksNeeded(r) > pool_blocks) {
    ++rejected_;
    return;
  }
  r.chain =
      TraceChain(rec.hash_ids, rec.input_length, config_.trace_block_tokens, config_.block_size);
  if (shared_pool_ != nullptr) {
    for (int w = 0; w < config_.num_workers; ++w) {
      Touch(w, now_ns);  // exact queues for the ideal placement
    }
  }
  int64_t new_blocks = 0;
  const int w = ChooseWorker(r, &new_blocks);
  placed_on_[static_cast<size_t>(index)] = w;
  new_blocks_[static_cast<size_t>(index)] = new_blocks;
  RouterView& v = views_[w];
  ++v.inflight;
  v.assigned_blocks += new_blocks;
  ++in_system_;
  std::vector<SimRequest*> finished;
  workers_[w]->Enqueue(&r, now_ns, &finished);
  Settle(w, now_ns, finished);
}

void Simulation::OnLoadPoll(int64_t now_ns) {
  int64_t active_sum = 0;
  int64_t active_min = INT64_MAX;
  int64_t active_max = 0;
  int64_t queued_min = INT64_MAX;
  int64_t queued_max = 0;
  for (int w = 0; w < config_.num_workers; ++w) {
    Touch(w, now_ns);
    RouterView& v = views_[w];
    RouterView::PendingLoad report{workers_[w]->Load(now_ns), v.inflight, v.assigned_blocks};
    // A shared pool's active blocks are the pool's: the per-worker spread means nothing there.
    const int64_t active = shared_pool_ != nullptr ? 0 : report.load.active_kv_blocks;
    active_sum += active;
    active_min = std::min(active_min, active);
    active_max = std::max(active_max, active);
    queued_min = std::min(queued_min, report.load.queued_prefill_tokens);
    queued_max = std::max(queued_max, report.load.queued_prefill_tokens);
    if (config_.load_report_delay <= absl::ZeroDuration()) {
      v.load = report.load;
      v.inflight_at_report = report.inflight;
      v.assigned_blocks_at_report = report.assigned_blocks;
      v.has_report = true;
    } else {
      v.pending_loads.push_back(report);
      Push(now_ns + absl::ToInt64Nanoseconds(config_.load_report_delay), EventType::kDeliverLoad,
           w);
    }
  }
  ++ticks_;
  active_blocks_ += static_cast<double>(active_sum) / config_.num_workers;
  active_spread_ += static_cast<double>(active_max - active_min);
  queued_spread_ +=
      static_cast<double>(queued_max - queued_min) / static_cast<double>(config_.block_size);
  if (index_ != nullptr) {
    index_max_entries_ = std::max(index_max_entries_, index_->Stats().entries);
  }
  if (arrivals_left_ > 0 || in_system_ > 0) {
    Push(now_ns + absl::ToInt64Nanoseconds(config_.load_report_interval), EventType::kLoadPoll);
  }
}

RouteSimResult Simulation::Run() {
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    switch (e.type) {
      case EventType::kLoadPoll:
        OnLoadPoll(e.time_ns);
        break;
      case EventType::kArrival:
        OnArrival(e.arg, e.time_ns);
        break;
      case EventType::kWorker:
        if (static_cast<uint64_t>(e.arg) == views_[e.worker].version) {
          Touch(e.worker, e.time_ns);
        }
        break;
      case EventType::kDeliverBatch: {
        RouterView& v = views_[e.worker];
        ApplyBatch(e.worker, v.pending_batches.front());
        v.pending_batches.pop_front();
        break;
      }
      case EventType::kDeliverLoad: {
        RouterView& v = views_[e.worker];
        const RouterView::PendingLoad& report = v.pending_loads.front();
        v.load = report.load;
        v.inflight_at_report = report.inflight;
        v.assigned_blocks_at_report = report.assigned_blocks;
        v.has_report = true;
        v.pending_loads.pop_front();
        break;
      }
    }
  }
  return Collect();
}

double MaxOverMean(const std::vector<double>& values) {
  if (values.empty()) {
    return 0;
  }
  double sum = 0;
  double max = 0;
  for (double v : values) {
    sum += v;
    max = std::max(max, v);
  }
  return sum > 0 ? max / (sum / static_cast<double>(values.size())) : 0;
}

RouteSimResult Simulation::Collect() {
  RouteSimResult res;
  res.policy = config_.policy;
  res.num_workers = config_.num_workers;
  res.rejected = rejected_;
  res.reasons = reasons_;
  res.affinity_missed_requests = affinity_missed_requests_;
  res.affinity_missed_blocks = affinity_missed_blocks_;
  if (ticks_ > 0) {
    res.mean_active_blocks = active_blocks_ / static_cast<double>(ticks_);
    res.mean_active_blocks_spread = active_spread_ / static_cast<double>(ticks_);
    res.mean_queued_blocks_spread = queued_spread_ / static_cast<double>(ticks_);
  }
  std::vector<double> ttft_ms;
  std::vector<double> wait_ms;
  int64_t ttft_ns_sum = 0;
  int64_t first_arrival = INT64_MAX;
  int64_t last_end = 0;
  res.outcomes.resize(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    const SimRequest& r = requests_[i];
    SimRequestOutcome& o = res.outcomes[i];
    o.worker = placed_on_[i];
    o.prompt_tokens = trace_.records[i].input_length;
    if (o.worker < 0) {
      continue;
    }
    CHECK_GE(r.end_ns, 0) << "request " << i << " never finished";
    o.cached_tokens = r.cached_tokens;
    o.fetched_tokens = r.fetched_tokens;
    o.fetch_ns = r.fetch_ns;
    o.recompute_chosen = r.recompute_chosen;
    o.ttft_ns = r.first_token_ns - r.arrival_ns;
    o.end_ns = r.end_ns;
    ++res.requests;
    res.prompt_tokens += r.prompt_tokens;
    res.cached_tokens += r.cached_tokens;
    res.fetched_tokens += r.fetched_tokens;
    res.fetches += r.fetched_tokens > 0 ? 1 : 0;
    res.fetch_ns += r.fetch_ns;
    res.recompute_chosen += r.recompute_chosen ? 1 : 0;
    ttft_ns_sum += o.ttft_ns;
    ttft_ms.push_back(static_cast<double>(o.ttft_ns) / 1e6);
    wait_ms.push_back(static_cast<double>(r.prefill_start_ns - r.arrival_ns) / 1e6);
    first_arrival = std::min(first_arrival, r.arrival_ns);
    last_end = std::max(last_end, r.end_ns);
  }
  res.hit_ratio = res.prompt_tokens > 0 ? static_cast<double>(res.cached_tokens) /
                                              static_cast<double>(res.prompt_tokens)
                                        : 0;
  res.fetched_blocks = res.fetched_tokens / config_.block_size;
  res.hit_ratio_with_remote = res.prompt_tokens > 0
                                  ? static_cast<double>(res.cached_tokens + res.fetched_tokens) /
                                        static_cast<double>(res.prompt_tokens)
                                  : 0;
  res.mean_fetch_ms =
      res.fetches > 0 ? static_cast<double>(res.fetch_ns) / 1e6 / static_cast<double>(res.fetches)
                      : 0;
  res.fetch_share_of_ttft =
      ttft_ns_sum > 0 ? static_cast<double>(res.fetch_ns) / static_cast<double>(ttft_ns_sum) : 0;
  res.ttft = ComputeStats(std::move(ttft_ms));
  res.prefill_wait = ComputeStats(std::move(wait_ms));
  res.simulated_s = res.requests > 0 ? static_cast<double>(last_end - first_arrival) / 1e9 : 0;
  std::vector<double> prefill;
  std::vector<double> requests;
  for (const auto& w : workers_) {
    res.workers.push_back({w->worker_id(), w->stats()});
    prefill.push_back(static_cast<double>(w->stats().prefill_tokens));
    requests.push_back(static_cast<double>(w->stats().requests));
  }
  res.prefill_imbalance = MaxOverMean(prefill);
  res.request_imbalance = MaxOverMean(requests);
  if (index_ != nullptr) {
    res.index = index_->Stats();
    res.index_max_entries = std::max(index_max_entries_, res.index.entries);
  }
  res.index_rejected_batches = index_rejected_;
  return res;
}

}  // namespace

absl::StatusOr<SimPolicy> ParseSimPolicy(absl::string_view name) {
  if (name == "cache_aware") {
    return SimPolicy::kCacheAware;
  }
  if (name == "round_robin") {
    return SimPolicy::kRoundRobin;
  }
  if (name == "random") {
    return SimPolicy::kRandom;
  }
  if (name == "pooled") {
    return SimPolicy::kPooled;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown policy \"", name, "\"; valid: cache_aware, round_robin, random, pooled"));
}

absl::string_view SimPolicyName(SimPolicy policy) {
  switch (policy) {
    case SimPolicy::kCacheAware:
      return "cache_aware";
    case SimPolicy::kRoundRobin:
      return "round_robin";
    case SimPolicy::kRandom:
      return "random";
    case SimPolicy::kPooled:
      return "pooled";
  }
  return "unknown";
}

absl::Status RouteSimConfig::Validate() const {
  if (num_workers < 1 || num_workers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers: each count must be in [1, 1024], got ", num_workers));
  }
  if (block_size < 1 || trace_block_tokens < 1 || trace_block_tokens % block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--block_size (", block_size,
                                                   ") must divide --trace_block_tokens (",
                                                   trace_block_tokens, ")"));
  }
  if (capacity_blocks < 1 || capacity_blocks * num_workers > kvcache::BlockPool::kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("--capacity_blocks must be in [1, ",
                                                   kvcache::BlockPool::kMaxBlocks,
                                                   " / workers], got ", capacity_blocks));
  }
  if (load_report_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--load_report_interval must be > 0");
  }
  if (load_report_delay < absl::ZeroDuration() || event_delay < absl::ZeroDuration() ||
      arrival_jitter < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--load_report_delay, --event_delay and --arrival_jitter must be >= 0");
  }
  if (index_max_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--index_max_blocks must be >= 0 (0 = automatic), got ", index_max_blocks));
  }
  if (absl::Status s = scorer.Validate(); !s.ok()) {
    return s;
  }
  if (absl::Status s = remote.Validate(); !s.ok()) {
    return s;
  }
  return time.Validate();
}

double RemoteHitWeightFromModel(const RouteSimConfig& config) {
  if (!config.remote.enabled) {
    return 1.0;
  }
  const double fetch_s = config.remote.BlockSeconds(config.block_size);
  const double prefill_s =
      static_cast<double>(config.block_size) / config.time.prefill_tokens_per_s;
  return std::clamp(fetch_s / prefill_s, 0.0, 1.0);
}

std::vector<BlockHash> TraceChain(absl::Span<const uint64_t> hash_ids, int64_t prompt_tokens,
                                  int64_t trace_block_tokens, int64_t block_size) {
  const int64_t per_id = trace_block_tokens / block_size;
  const int64_t full = prompt_tokens / block_size;
  std::vector<BlockHash> chain;
  chain.reserve(static_cast<size_t>(std::max<int64_t>(full, 0)));
  BlockHash parent = kChainSeed;
  for (int64_t k = 0; k < full; ++k) {
    const size_t i = static_cast<size_t>(k / per_id);
    if (i >= hash_ids.size()) {
      break;
    }
    const uint32_t key[3] = {static_cast<uint32_t>(hash_ids[i]),
                             static_cast<uint32_t>(hash_ids[i] >> 32),
                             static_cast<uint32_t>(k % per_id)};
    parent = HashBlock(parent, key);
    chain.push_back(parent);
  }
  return chain;
}

absl::StatusOr<RouteSimResult> RunRouteSim(const Trace& trace, const RouteSimConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) {
    return s;
  }
  Simulation sim(trace, config);
  if (absl::Status s = sim.Init(); !s.ok()) {
    return s;
  }
  return sim.Run();
}

}  // namespace pd::loadtest::sim
