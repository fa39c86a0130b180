// UcxTransport's connections: the listener and the control endpoints of accepted connections,
// Connect (the client's control endpoint and the HELLO / HELLO_REPLY handshake that checks the
// peer's instance and protocol and fetches its worker address), the data endpoint opened to
// that address and the data-path choice it drives, and peer failure (the control endpoint's
// error handler fails everything on the connection). See ucx_transport_impl.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/transport_core.h"
#include "transport/ucx/ucx_internal.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace pd::transport::ucx_internal {
namespace {

void ConnHandler(ucp_conn_request_h req, void* arg) {
  static_cast<UcxTransport*>(arg)->OnConnRequest(req);
}

void EpErrorHandler(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* conn = static_cast<UcxConn*>(arg);
  conn->owner->OnEpError(conn, status);
}

}  // namespace

absl::Status UcxTransport::Listen() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options_.listen_port));
  if (::inet_pton(AF_INET, options_.listen_host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx: not a numeric IPv4 address: ", options_.listen_host));
  }
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  lp.sockaddr.addrlen = sizeof(addr);
  lp.conn_handler.cb = &ConnHandler;
  lp.conn_handler.arg = this;
  ucp_listener_h l = nullptr;
  ucs_status_t s = ucp_listener_create(worker_.get(), &lp, &l);
  if (s != UCS_OK) {
    return UcsError(absl::StrCat("ucp_listener_create ", options_.listen_host, ":",
                                 options_.listen_port, " (UCX_TLS must include tcp)"),
                    s);
  }
  listener_.reset(l);
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_.get(), &la);
  if (s != UCS_OK) {
    return UcsError("ucp_listener_query", s);
  }
  const auto* bound = reinterpret_cast<const sockaddr_in*>(&la.sockaddr);
  address_ = absl::StrCat(options_.listen_host, ":", ntohs(bound->sin_port));
  return absl::OkStatus();
}

UcxConn* UcxTransport::FindConn(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() || it->second->dead ? nullptr : it->second.get();
}

void UcxTransport::OnConnRequest(ucp_conn_request_h req) {
  auto conn = std::make_unique<UcxConn>();
  conn->id = next_conn_++ | (uint64_t{1} << 63);
  conn->owner = this;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &EpErrorHandler;
  ep.err_handler.arg = conn.get();
  ucp_ep_h h = nullptr;
  if (ucp_ep_create(worker_.get(), &ep, &h) != UCS_OK) {
    ucp_listener_reject(listener_.get(), req);
    return;
  }
  conn->ep = std::make_unique<UcpEndpoint>(worker_.get(), h);
  conns_[conn->id] = std::move(conn);
}

void UcxTransport::OnEpError(UcxConn* conn, ucs_status_t status) {
  if (conn->dead) {
    return;
  }
  conn->dead = true;
  const absl::Status why =
      absl::UnavailableError(absl::StrCat("ucx connection to instance ", conn->peer_instance,
                                          " failed: ", ucs_status_string(status), " (peer died?)"));
  for (const auto& [seq, unused] : conn->in_flight) {
    core_.Finish(TransferId(seq), why);
  }
  conn->in_flight.clear();
  std::vector<uint64_t> held;
  for (const auto& [key, grants] : grants_) {
    if (key.first == conn->id) {
      held.push_back(key.second);
    }
  }
  for (uint64_t seq : held) {
    ReleaseGrants(conn->id, seq, false, why);
  }
  for (auto it = rma_posts_.begin(); it != rma_posts_.end();) {
    if (it->second.conn == conn->id && !it->second.started) {
      rma_posts_.erase(it++);  // never granted: nothing outstanding
    } else {
      ++it;
    }
  }
  core_.FailExpectationsFromSource(conn->id, why);
  {
    absl::MutexLock lock(&mu_);
    conn_dead_[conn->id] = true;
  }
  auto it = conns_.find(conn->id);
  if (it != conns_.end()) {
    graveyard_.push_back(std::move(it->second));
    conns_.erase(it);
  }
}

void UcxTransport::OnHello(uint64_t conn_id, const void* header, size_t header_length) {
  if (header_length != sizeof(Hello) || conn_id == 0) {
    return;
  }
  Hello h;
  std::memcpy(&h, header, sizeof(h));
  conns_[conn_id]->peer_instance = h.instance;
  Hello reply{core_.instance_id(), kTransportProtocolVersion, h.cookie, conn_id};
  SendAm(*conns_[conn_id], kAmHelloReply, &reply, sizeof(reply), nullptr, 0, 0,
         /*on_data_ep=*/false, worker_address_);
}

void UcxTransport::OnHelloReply(const void* header, size_t header_length, const void* data,
                                size_t length, bool rndv) {
  if (header_length != sizeof(Hello)) {
    return;
  }
  HelloReply r;
  std::memcpy(&r.hello, header, sizeof(r.hello));
  if (!rndv) {
    r.worker_address.assign(static_cast<const char*>(data), length);
  }
  absl::MutexLock lock(&mu_);
  hello_replies_[r.hello.cookie] = std::move(r);
}

void UcxTransport::SetupDataPath(UcxConn& conn, const std::string& worker_address) {
  const UcxDataPath want = options_.data_path;
  if (!worker_address.empty()) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h h = nullptr;
    if (ucp_ep_create(worker_.get(), &ep, &h) == UCS_OK) {
      auto data_ep = std::make_unique<UcpEndpoint>(worker_.get(), h);
      const std::string info = EpInfo(h);
      const std::string am = LaneTransport(info, "am_bw#0");
      const std::string rma = LaneTransport(info, "rma_bw#0");
      if (IsFastTransport(am) || IsFastTransport(rma)) {
        conn.data_ep = std::move(data_ep);
      }
      conn.data_lanes =
          absl::StrCat("am=", am.empty() ? "-" : am, " rma=", rma.empty() ? "-" : rma);
      conn.rma = want == UcxDataPath::kAuto && conn.data_ep != nullptr && IsGoodPutTransport(rma);
      conn.mapped_rma =
          want == UcxDataPath::kAuto && conn.data_ep != nullptr && IsSharedMemoryTransport(am);
    }
  }
  if (want == UcxDataPath::kRma) {
    conn.rma = true;  // explicitly asked for, even over tcp
  }
  LOG(INFO) << "ucx connection " << conn.id << ": data endpoint "
            << (conn.data_ep != nullptr ? "yes" : "no") << " (" << conn.data_lanes
            << "), data path "
            << (conn.rma          ? "rma"
                : conn.mapped_rma ? "am, rma into ucx-allocated pools"
                                  : "am");
}

absl::StatusOr<UcxTransport::HelloReply> UcxTransport::AwaitHelloReply(uint64_t cookie,
                                                                       uint64_t conn_id,
                                                                       absl::string_view address) {
  absl::MutexLock lock(&mu_);
  auto has_reply = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return hello_replies_.contains(cookie) || conn_dead_[conn_id];
  };
  mu_.AwaitWithTimeout(absl::Condition(&has_reply), options_.connect_timeout);
  auto it = hello_replies_.find(cookie);
  if (it == hello_replies_.end()) {
    conn_dead_[conn_id] = true;
    return absl::UnavailableError(
        absl::StrCat("ucx handshake with ", address, " failed or timed out"));
  }
  HelloReply reply = std::move(it->second);
  hello_replies_.erase(it);
  return reply;
}

absl::StatusOr<PeerHandle> UcxTransport::Connect(absl::string_view endpoint) {
  PD_ASSIGN_OR_RETURN(const EndpointInfo e,
                      transport_internal::DecodePeerEndpoint("ucx", endpoint));
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [handle, conn] : peer_conn_) {
      if (conn_instance_[conn] == e.instance_id && !conn_dead_[conn]) {
        return PeerHandle(handle);
      }
    }
  }
  std::pair<std::string, std::string> hp = absl::StrSplit(e.address, absl::MaxSplits(':', 1));
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (!absl::SimpleAtoi(hp.second, &port) ||
      ::inet_pton(AF_INET, hp.first.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("bad ucx address: ", e.address));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const uint64_t cookie = transport_internal::RandomId();
  uint64_t conn_id = 0;
  ucs_status_t status = UCS_OK;
  RunSync([&] {
    auto conn = std::make_unique<UcxConn>();
    conn->id = next_conn_++;
    conn->owner = this;
    conn->client = true;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &EpErrorHandler;
    ep.err_handler.arg = conn.get();
    ucp_ep_h h = nullptr;
    status = ucp_ep_create(worker_.get(), &ep, &h);
    if (status != UCS_OK) {
      return;
    }
    conn->ep = std::make_unique<UcpEndpoint>(worker_.get(), h);
    Hello hello{core_.instance_id(), kTransportProtocolVersion, cookie};
    SendAm(*conn, kAmHello, &hello, sizeof(hello), nullptr, 0, 0);
    conn_id = conn->id;
    conns_[conn->id] = std::move(conn);
  });
  if (status != UCS_OK) {
    return UcsError(absl::StrCat("ucx connect ", e.address), status);
  }
  PD_ASSIGN_OR_RETURN(const HelloReply reply, AwaitHelloReply(cookie, conn_id, e.address));
  if (reply.hello.version != kTransportProtocolVersion || reply.hello.instance != e.instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("ucx handshake: endpoint names instance ", e.instance_id, " protocol ",
                     kTransportProtocolVersion, " but ", e.address, " is instance ",
                     reply.hello.instance, " protocol ", reply.hello.version));
  }
  RunSync([&] {
    if (UcxConn* c = FindConn(conn_id)) {
      c->peer_instance = reply.hello.instance;
      c->remote_conn = reply.hello.conn;
      SetupDataPath(*c, reply.worker_address);
      VLOG(2) << "ucx control endpoint:\n" << EpInfo(c->ep->get());
    }
  });
  absl::MutexLock lock(&mu_);
  const uint32_t handle = next_peer_++;
  peer_conn_[handle] = conn_id;
  conn_instance_[conn_id] = reply.hello.instance;
  VLOG(1) << "ucx transport connected to " << e.address;
  return PeerHandle(handle);
}

}  // namespace pd::transport::ucx_internal
