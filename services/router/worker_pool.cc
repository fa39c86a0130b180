#include "services/router/worker_pool.h"

#include <grpcpp/grpcpp.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::router {

namespace iv1 = pdserve::internal::v1;

struct WorkerPool::Worker {
  int index = 0;
  std::string address;
  bool configured_decode = false;
  bool configured_prefill = false;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<iv1::DecodeService::Stub> decode;
  std::unique_ptr<iv1::PrefillService::Stub> prefill;
  // Guarded by WorkerPool::mu_.
  bool verified = false;
  bool healthy = false;
  std::string worker_id;
  std::string node_name;
  iv1::WorkerLoad load;
  std::string last_error;
  int missed_checks = 0;  // consecutive GetLoad timeouts
  std::atomic<int64_t> last_activity_ns{0};  // clock_->Now() of the last message, Unix ns
  std::atomic<int64_t> inflight{0};
  std::atomic<int64_t> assigned_blocks{0};
  int64_t inflight_at_report = 0;         // guarded by WorkerPool::mu_
  int64_t assigned_blocks_at_report = 0;  // guarded by WorkerPool::mu_
};

WorkerPool::WorkerPool(Clock* clock) : clock_(clock) {}

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(
    const std::vector<std::string>& decode_addresses,
    const std::vector<std::string>& prefill_addresses, WorkerPoolOptions options,
    HealthCallback on_health_change) {
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      Build(decode_addresses, prefill_addresses, std::move(options), std::move(on_health_change),
            Clock::Real());
  if (!pool.ok()) {
    return pool;
  }
  // One checker per worker: a worker that blackholes its RPCs costs its own checker the RPC
  // timeout, not everyone else's health checks.
  WorkerPool* p = pool->get();
  for (auto& w : p->workers_) {
    p->threads_.emplace_back([p, w = w.get()] { p->Run(*w); });
  }
  return pool;
}

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::CreateForTest(
    const std::vector<std::string>& decode_addresses,
    const std::vector<std::string>& prefill_addresses, WorkerPoolOptions options,
    HealthCallback on_health_change, Clock* clock) {
  return Build(decode_addresses, prefill_addresses, std::move(options), std::move(on_health_change),
               clock);
}

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Build(
    const std::vector<std::string>& decode_addresses,
    const std::vector<std::string>& prefill_addresses, WorkerPoolOptions options,
    HealthCallback on_health_change, Clock* clock) {
  if (decode_addresses.empty()) {
    return absl::InvalidArgumentError("--decode_workers: at least one decode worker is needed");
  }
  if (options.max_missed_checks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_missed_checks must be >= 1, got ",
                                                   options.max_missed_checks));
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool(clock));
  pool->options_ = std::move(options);
  pool->on_health_change_ = std::move(on_health_change);
  std::map<std::string, Worker*> by_address;
  const std::shared_ptr<const services::ClientSecurity> security =
      pool->options_.security != nullptr ? pool->options_.security
                                         : services::ClientSecurity::Insecure();
  auto add = [&](const std::string& address, bool decode) -> absl::Status {
    if (address.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(decode ? "--decode_workers" : "--prefill_workers", ": empty address"));
    }
    Worker*& w = by_address[address];
    if (w == nullptr) {
      auto owned = std::make_unique<Worker>();
      owned->index = static_cast<int>(pool->workers_.size());
      owned->address = address;
      // Reconnect quickly to a worker that restarts (gRPC's default backoff starts at 1 s and
      // grows to 120 s, which would keep a restarted worker out of the pool for minutes).
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      args.SetMaxReceiveMessageSize(64 << 20);
      owned->channel = security->CreateChannel(address, args);
      owned->decode = iv1::DecodeService::NewStub(owned->channel);
      owned->prefill = iv1::PrefillService::NewStub(owned->channel);
      w = owned.get();
      pool->workers_.push_back(std::move(owned));
    }
    (decode ? w->configured_decode : w->configured_prefill) = true;
    return absl::OkStatus();
  };
  for (const std::string& a : decode_addresses) {
    if (absl::Status s = add(a, true); !s.ok()) return s;
  }
  for (const std::string& a : prefill_addresses) {
    if (absl::Status s = add(a, false); !s.ok()) return s;
  }
  return pool;
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    t.join();
  }
}

// Only Create's pools run checker threads, and they have the real clock: the interval is a
// real-time wait that the destructor can cut short.
void WorkerPool::Run(Worker& w) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    Check(w);
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.health_interval)) {
      return;
    }
  }
}

void WorkerPool::Check(Worker& w) {
  bool verified;
  {
    absl::MutexLock lock(&mu_);
    verified = w.verified;
  }
  // gRPC's deadline is on the real clock, whatever clock_ is.
  const auto deadline = absl::ToChronoTime(absl::Now() + options_.rpc_timeout);
  if (!verified) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    iv1::WorkerInfo info;
    grpc::Status s = w.configured_decode ? w.decode->GetInfo(&ctx, {}, &info)
                                         : w.prefill->GetInfo(&ctx, {}, &info);
    if (!s.ok()) {
      SetHealthy(w, false, absl::StrCat("GetInfo: ", s.error_message()));
      return;
    }
    std::string problem;
    if (info.model_fingerprint() != options_.model_fingerprint) {
      problem = absl::StrCat("model fingerprint ", info.model_fingerprint(), " != router's ",
                             options_.model_fingerprint, " (different model files?)");
    } else if (info.layout().block_size() != options_.block_size) {
      problem = absl::StrCat("block size ", info.layout().block_size(), " != router's ",
                             options_.block_size);
    } else if (info.layout().dtype() != options_.kv_dtype) {
      problem = absl::StrCat("KV dtype ", iv1::KvDtype_Name(info.layout().dtype()),
                             " != router's ", iv1::KvDtype_Name(options_.kv_dtype),
                             " (--kv_dtype)");
    } else if (w.configured_decode && info.role() == iv1::WORKER_ROLE_PREFILL) {
      problem = "listed in --decode_workers but runs --role prefill";
    } else if (w.configured_prefill && info.role() == iv1::WORKER_ROLE_DECODE) {
      problem = "listed in --prefill_workers but runs --role decode";
    }
    if (!problem.empty()) {
      SetHealthy(w, false, problem);
      return;
    }
    absl::MutexLock lock(&mu_);
    w.verified = true;
    w.worker_id = info.worker_id();
    w.node_name = info.node_name();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  iv1::WorkerLoad load;
  // What this router had placed there when asking: the report counts (at most) that much.
  const int64_t inflight_before = w.inflight.load();
  const int64_t blocks_before = w.assigned_blocks.load();
  grpc::Status s = w.configured_decode ? w.decode->GetLoad(&ctx, {}, &load)
                                       : w.prefill->GetLoad(&ctx, {}, &load);
  if (!s.ok()) {
    const std::string why = absl::StrCat("GetLoad: ", s.error_message());
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      const absl::Duration since_activity =
          clock_->Now() - absl::FromUnixNanos(w.last_activity_ns.load());
      const bool streaming = since_activity < options_.health_interval + options_.rpc_timeout;
      absl::MutexLock lock(&mu_);
      // Busy, perhaps saturated: give it a few more checks before routing around it, and any
      // number while its streams keep delivering.
      if (w.healthy && streaming) {
        w.last_error = why;
        LOG_EVERY_N(WARNING, 10) << "worker " << w.address << " missed a health check but its "
                                 << "streams are delivering: kept (" << why << ")";
        return;
      }
      if (w.healthy && ++w.missed_checks < options_.max_missed_checks) {
        w.last_error = why;
        LOG(WARNING) << "worker " << w.address << " missed health check " << w.missed_checks
                     << " of " << options_.max_missed_checks << ": " << why;
        return;
      }
    }
    SetHealthy(w, false, why);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    w.missed_checks = 0;
    w.load = load;
    w.inflight_at_report = inflight_before;
    w.assigned_blocks_at_report = blocks_before;
    if (load.worker_id() != w.worker_id) {
      // Another process answers at this address (restart with a new id): verify again.
      w.verified = false;
    }
  }
  SetHealthy(w, true, "");
}

void WorkerPool::SetHealthy(Worker& w, bool healthy, const std::string& error) {
  WorkerSnapshot snap;
  {
    absl::MutexLock lock(&mu_);
    if (!healthy) {
      w.verified = false;  // re-verify when it answers again (it may have restarted)
      w.last_error = error;
      w.missed_checks = 0;
    }
    if (w.healthy == healthy) {
      return;
    }
    w.healthy = healthy;
    snap.index = w.index;
    snap.address = w.address;
    snap.worker_id = w.worker_id;
    snap.node_name = w.node_name;
    snap.can_decode = w.configured_decode;
    snap.can_prefill = w.configured_prefill;
    snap.healthy = healthy;
    snap.load = w.load;
    snap.last_error = w.last_error;
  }
  if (healthy) {
    LOG(INFO) << "worker " << snap.worker_id << " at " << w.address << " joined";
  } else {
    LOG(WARNING) << "worker at " << w.address << " left the pool: " << error;
  }
  if (on_health_change_) {
    on_health_change_(snap);
  }
}

std::vector<WorkerSnapshot> WorkerPool::Snapshot() const {
  std::vector<WorkerSnapshot> out;
  absl::MutexLock lock(&mu_);
  out.reserve(workers_.size());
  for (const auto& w : workers_) {
    WorkerSnapshot s;
    s.index = w->index;
    s.address = w->address;
    s.worker_id = w->worker_id;
    s.node_name = w->node_name;
    s.can_decode = w->configured_decode;
    s.can_prefill = w->configured_prefill;
    s.healthy = w->healthy;
    s.load = w->load;
    s.inflight = w->inflight.load();
    s.assigned_blocks = w->assigned_blocks.load();
    s.inflight_at_report = w->inflight_at_report;
    s.assigned_blocks_at_report = w->assigned_blocks_at_report;
    s.last_error = w->last_error;
    out.push_back(std::move(s));
  }
  return out;
}

iv1::DecodeService::Stub* WorkerPool::decode_stub(int index) {
  return workers_[index]->decode.get();
}

void WorkerPool::MarkFailed(int index, const absl::Status& why) {
  SetHealthy(*workers_[index], false, std::string(why.message()));
}

void WorkerPool::AddInflight(int index, int64_t delta, int64_t blocks) {
  workers_[index]->inflight += delta;
  workers_[index]->assigned_blocks += delta * blocks;
}

void WorkerPool::NoteActivity(int index) {
  workers_[index]->last_activity_ns.store(absl::ToUnixNanos(clock_->Now()),
                                          std::memory_order_relaxed);
}

void WorkerPool::CheckNowForTest(int index) { Check(*workers_[index]); }

bool WorkerPool::WaitForDecodeWorker(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& w : workers_) {
      if (w->healthy && w->configured_decode) return true;
    }
    return false;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

}  // namespace pd::router
