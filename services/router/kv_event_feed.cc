#include "services/router/kv_event_feed.h"

#include <utility>

#include "common/log/log.h"

namespace pd::router {

KvEventFeed::KvEventFeed(KvIndex* index, KvEventFeedOptions options)
    : index_(index), options_(std::move(options)) {}

KvEventFeed::~KvEventFeed() { Stop(); }

void KvEventFeed::Start(std::function<std::vector<WorkerSnapshot>()> snapshot) {
  snapshot_ = std::move(snapshot);
  thread_ = std::thread([this] { Run(); });
}

void KvEventFeed::Poke() {
  absl::MutexLock lock(&mu_);
  poked_ = true;
}

void KvEventFeed::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || poked_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), options_.reconcile_interval);
      if (stopping_) {
        return;
      }
      poked_ = false;
    }
    Reconcile();
  }
}

void KvEventFeed::Reconcile() {
  // address -> worker id, for the healthy, verified workers.
  absl::flat_hash_map<std::string, std::string> want;
  for (const WorkerSnapshot& w : snapshot_()) {
    if (w.healthy && !w.worker_id.empty()) {
      want[w.address] = w.worker_id;
    }
  }
  // Drop followers of workers that left (or came back under another id): stop the subscriber
  // first so that no batch of it lands after the worker's entries are removed.
  std::vector<std::pair<std::string, Follow>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = follows_.begin(); it != follows_.end();) {
      auto w = want.find(it->first);
      if (w == want.end() || w->second != it->second.worker_id) {
        dropped.emplace_back(it->first, std::move(it->second));
        follows_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& [address, follow] : dropped) {
    follow.subscriber->Stop();
    index_->RemoveWorker(follow.worker_id);
    LOG(INFO) << "KV events: stopped following " << follow.worker_id << " at " << address;
  }
  for (const auto& [address, worker_id] : want) {
    {
      absl::MutexLock lock(&mu_);
      if (follows_.contains(address)) {
        continue;
      }
    }
    kv_events::KvEventSubscriberConfig c;
    c.address = address;
    c.subscriber_id = options_.subscriber_id;
    c.idle_timeout = options_.idle_timeout;
    c.security = options_.security;
    KvIndex* index = index_;
    std::shared_ptr<std::atomic<int64_t>> errors = apply_errors_;
    c.on_batch = [index, errors, id = worker_id](
                     const pdserve::internal::v1::KvEventBatch& batch) -> absl::Status {
      absl::Status s = index->Apply(id, batch);
      if (!s.ok()) {
        errors->fetch_add(1);
        LOG(WARNING) << "KV events of " << id << " refused (resubscribing): " << s;
      }
      return s;
    };
    absl::StatusOr<std::unique_ptr<kv_events::KvEventSubscriber>> sub =
        kv_events::KvEventSubscriber::Start(std::move(c));
    if (!sub.ok()) {
      LOG(ERROR) << "KV events: cannot follow " << worker_id << " at " << address << ": "
                 << sub.status();
      continue;
    }
    LOG(INFO) << "KV events: following " << worker_id << " at " << address;
    absl::MutexLock lock(&mu_);
    follows_[address] = Follow{worker_id, *std::move(sub)};
  }
}

void KvEventFeed::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) {
    thread_.join();
  }
  absl::flat_hash_map<std::string, Follow> follows;
  {
    absl::MutexLock lock(&mu_);
    follows.swap(follows_);
  }
  for (auto& [address, follow] : follows) {
    follow.subscriber->Stop();
  }
}

KvEventFeedStats KvEventFeed::Stats() const {
  KvEventFeedStats out;
  absl::MutexLock lock(&mu_);
  for (const auto& [address, follow] : follows_) {
    const kv_events::KvEventSubscriberStats s = follow.subscriber->Stats();
    ++out.subscribers;
    out.connected += s.connected ? 1 : 0;
    out.reconnects += s.reconnects;
    out.resyncs += s.resyncs;
  }
  out.apply_errors = apply_errors_->load();
  return out;
}

}  // namespace pd::router
