// UcxTransport, the object: creation (ucp context and worker), the progress thread that runs
// every UCX call and its command queue, shutdown, and the transfer API (PostTransfer, Cancel).
// Design and the map of the other sources: ucx_transport_impl.h.
#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/transport_core.h"
#include "transport/ucx/ucx_internal.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace pd::transport {
namespace ucx_internal {

using transport_internal::PreparedPost;
using transport_internal::TransportCore;

absl::StatusOr<std::unique_ptr<KvTransport>> UcxTransport::Create(const UcxTransportOptions& o) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(o));
  PD_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<KvTransport>(std::move(t));
}

absl::Status UcxTransport::Init() {
  ucp_config_t* raw_config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &raw_config);
  if (s != UCS_OK) {
    return UcsError("ucp_config_read", s);
  }
  UcpConfig config(raw_config);
  for (const auto& [name, value] : options_.ucp_options) {
    s = ucp_config_modify(config.get(), name.c_str(), value.c_str());
    if (s != UCS_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx option ", name, "=", value, ": ", ucs_status_string(s)));
    }
  }
  PD_RETURN_IF_ERROR(RestrictNetworkDevices(config.get()));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  // Context calls (ucp_mem_map/unmap of AllocateHost) may come from any thread.
  params.mt_workers_shared = 1;
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config.get(), &ctx);
  if (s != UCS_OK) {
    return UcsError("ucp_init", s);
  }
  context_ = UcpContext(ctx, ContextDeleter());
  allocations_ = std::make_shared<UcxAllocations>();
  allocations_->context = context_;
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_.get(), &attr) == UCS_OK) {
    cuda_memory_ = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches UCX
  ucp_worker_h w = nullptr;
  s = ucp_worker_create(context_.get(), &wp, &w);
  if (s != UCS_OK) {
    return UcsError("ucp_worker_create", s);
  }
  worker_.reset(w);
  if (options_.blocking_progress) {
    s = ucp_worker_get_efd(worker_.get(), &efd_);
    if (s != UCS_OK) {
      return UcsError("ucp_worker_get_efd", s);
    }
  }
  PD_RETURN_IF_ERROR(RegisterAmHandlers());
  ucp_address_t* wa = nullptr;
  size_t wa_len = 0;
  s = ucp_worker_get_address(worker_.get(), &wa, &wa_len);
  if (s != UCS_OK) {
    return UcsError("ucp_worker_get_address", s);
  }
  worker_address_.assign(reinterpret_cast<const char*>(wa), wa_len);
  ucp_worker_release_address(worker_.get(), wa);
  PD_RETURN_IF_ERROR(Listen());
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

// The ucp listener binds listen_host, but UCX's tcp transport listens on every device of
// UCX_NET_DEVICES (default all: the host's external addresses too) for the data endpoints, and
// the KV data plane is unauthenticated. So, unless NET_DEVICES was chosen explicitly (UCX_*
// environment or ucp_options: the operator's list, e.g. an RDMA device plus its interface),
// the devices are restricted to the interface owning listen_host. ucp_config_modify, not
// setenv: the process environment stays untouched.
absl::Status UcxTransport::RestrictNetworkDevices(ucp_config_t* config) {
  PD_ASSIGN_OR_RETURN(const std::string device, InterfaceOwning(options_.listen_host));
  const std::string current = PrintedConfigValue(PrintConfig(config), "NET_DEVICES");
  if (device.empty()) {
    LOG(INFO) << "ucx: listen address " << options_.listen_host
              << " is every interface; UCX_NET_DEVICES=" << current << " left as is";
    return absl::OkStatus();
  }
  if (!current.empty() && current != "all") {
    LOG(INFO) << "ucx: UCX_NET_DEVICES=" << current << " set explicitly (listen address "
              << options_.listen_host << " is on " << device
              << "): UCX also listens on those devices' addresses";
    return absl::OkStatus();
  }
  const ucs_status_t s = ucp_config_modify(config, "NET_DEVICES", device.c_str());
  if (s != UCS_OK) {
    return absl::InternalError(
        absl::StrCat("ucx: NET_DEVICES=", device, ": ", ucs_status_string(s)));
  }
  VLOG(1) << "ucx: network devices restricted to " << device << " (listen address "
          << options_.listen_host << ")";
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    ucp_worker_signal(worker_.get());
    thread_.join();
  }
  // Eps were closed by the loop. Destroying the worker may still complete requests it purges
  // (their callbacks touch this object's maps), so it goes before any other member; the
  // context is last.
  listener_.reset();
  worker_.reset();
  // (No callback can run now: what UCX never completed is freed here.)
  if (!in_flight_.empty()) {
    VLOG(1) << "ucx: " << in_flight_.size() << " requests never completed; freed";
  }
  for (const auto& [ctx, free_ctx] : in_flight_) {
    free_ctx(ctx);
  }
  in_flight_.clear();
  mems_.clear();
}

void UcxTransport::Run(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    commands_.push_back(std::move(fn));
  }
  ucp_worker_signal(worker_.get());
}

void UcxTransport::RunSync(std::function<void()> fn) {
  absl::Notification done;
  Run([&] {
    fn();
    done.Notify();
  });
  done.WaitForNotification();
}

void UcxTransport::Loop() {
  while (true) {
    std::deque<std::function<void()>> cmds;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      cmds.swap(commands_);
      stop = stopping_;
    }
    for (auto& c : cmds) {
      c();
    }
    if (stop) {
      break;
    }
    while (ucp_worker_progress(worker_.get()) != 0) {
    }
    {
      auto buried = std::move(graveyard_);  // closes failed endpoints outside their callbacks
      graveyard_.clear();
    }
    {
      absl::MutexLock lock(&mu_);
      if (!commands_.empty() || stopping_) {
        continue;
      }
    }
    if (efd_ < 0) {
      continue;  // busy-poll mode
    }
    const ucs_status_t s = ucp_worker_arm(worker_.get());
    if (s == UCS_ERR_BUSY) {
      continue;  // events arrived meanwhile
    }
    pollfd p{efd_, POLLIN, 0};
    ::poll(&p, 1, 100);  // bounded: deadlines are also checked by callers
  }
  CloseAll();
}

void UcxTransport::CloseAll() {
  // Fail what is pending, close endpoints while the worker still exists.
  const absl::Status down = absl::CancelledError("ucx transport shutting down");
  for (auto& [id, conn] : conns_) {
    for (const auto& [seq, unused] : conn->in_flight) {
      core_.Finish(TransferId(seq), down);
    }
    conn->dead = true;
  }
  while (!grants_.empty()) {
    ReleaseGrants(grants_.begin()->first.first, grants_.begin()->first.second, false, down);
  }
  {
    // Force-closes endpoints; their requests complete (cancelled) re-entrantly, and must find
    // conns_ already empty.
    auto doomed = std::move(conns_);
    conns_.clear();
    auto buried = std::move(graveyard_);
    graveyard_.clear();
  }
  graveyard_.clear();
  rma_posts_.clear();
}

absl::StatusOr<TransferId> UcxTransport::PostTransfer(PeerHandle peer, uint64_t tag,
                                                      RegionHandle src,
                                                      absl::Span<const BlockPair> pairs,
                                                      absl::string_view remote_descriptor,
                                                      const TransferOptions& options) {
  uint64_t conn_id = 0, instance = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = peer_conn_.find(peer.value());
    if (it == peer_conn_.end()) {
      return absl::NotFoundError(absl::StrCat("post: unknown peer ", peer.value()));
    }
    conn_id = it->second;
    instance = conn_instance_[conn_id];
    if (conn_dead_[conn_id]) {
      return absl::UnavailableError(
          absl::StrCat("post: connection to peer ", peer.value(), " failed; Connect again"));
    }
  }
  absl::StatusOr<PreparedPost> post =
      core_.PreparePost(instance, tag, src, pairs, remote_descriptor, options);
  if (!post.ok()) {
    return post.status();
  }
  const TransferId id = post->id;
  Run([this, conn_id, p = *std::move(post)]() mutable { StartPost(conn_id, std::move(p)); });
  return id;
}

void UcxTransport::StartPost(uint64_t conn_id, PreparedPost post) {
  UcxConn* conn = FindConn(conn_id);
  if (conn == nullptr) {
    core_.Finish(post.id, absl::UnavailableError("ucx connection failed before the post"));
    return;
  }
  const uint64_t seq = post.id.value();
  DataHeader h{seq, post.desc.tag, post.desc.region_nonce, conn->remote_conn, 0, 0};
  if (!core_.IsPending(post.id)) {
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0, /*on_data_ep=*/!conn->rma);
    return;
  }
  // RMA when the connection uses it; for device-memory destinations (UCX moves them with
  // cuda_ipc/cuda_copy/RDMA; the AM path would make the receiver's CPU copy into device memory);
  // and when the receiver's region is a UCX allocation that this connection's shm lanes reach
  // with a plain memcpy (see SetupDataPath).
  const bool rma = conn->rma || DescriptorTargetsDevice(post.desc.blob) ||
                   (conn->mapped_rma && DescriptorIsMapped(post.desc.blob));
  conn->in_flight[seq] = UcxConn::InFlight{h, rma};
  if (rma) {
    StartRmaPost(*conn, h, std::move(post));
  } else {
    StartAmPost(*conn, h, post);
  }
}

absl::Status UcxTransport::Cancel(TransferId id) {
  absl::StatusOr<TransportCore::CancelResult> r = core_.Cancel(id);
  if (!r.ok()) {
    return r.status();
  }
  if (r->was_pending && !r->expectation) {
    // Frames already handed to UCX still go out; CANCEL follows them on the same endpoint, so
    // the receiver fails its expectation unless every block had already arrived.
    Run([this, seq = id.value()] {
      for (auto& [cid, conn] : conns_) {
        auto it = conn->in_flight.find(seq);
        if (it != conn->in_flight.end() && !conn->dead) {
          if (rma_posts_.contains(seq)) {
            return;  // the RMA state machine tells the receiver once no put is in flight
          }
          DataHeader h = it->second.h;
          const bool rma = it->second.rma;
          conn->in_flight.erase(it);
          SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0, /*on_data_ep=*/!rma);
          return;
        }
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace ucx_internal

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(
    const UcxTransportOptions& options) {
  return ucx_internal::UcxTransport::Create(options);
}

}  // namespace pd::transport
