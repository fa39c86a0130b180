#include "services/router/openai/http_connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/router/openai/connection_caps.h"
#include "services/router/openai/connection_stream.h"
#include "services/router/openai/openai_response.h"
#include "services/router/openai/request_framing.h"

namespace pd::router::openai {
namespace {

using http_internal::CannedResponse;
using http_internal::Conn;
using http_internal::kContinue;
using http_internal::NumericHost;
using http_internal::ServeBuffered;

constexpr int kListenBacklog = 4096;
// How long an idle worker thread waits for the next request before it ends.
constexpr absl::Duration kWorkerLinger = absl::Seconds(5);
// After an error response: how long the socket is kept to read what the client still sends
// (closing with unread bytes resets the connection and can destroy the response in flight).
constexpr absl::Duration kLinger = absl::Seconds(2);
// Bytes one readiness event reads off a plaintext socket (fairness between connections).
constexpr size_t kReadBudget = 64 << 10;
// Open-file descriptors kept free above max_open_connections for everything else.
constexpr rlim_t kFdMargin = 1024;
constexpr absl::Duration kLogInterval = absl::Seconds(10);

// Refusal reasons: fixed label values of pd_router_http_connections_refused_total.
enum Reason { kOpenLimit, kClientLimit, kFdLimit, kHeaderTimeout, kBodyTimeout, kBusy, kFraming,
              kNumReasons };
constexpr std::array<const char*, kNumReasons> kReasonNames = {
    "open_limit", "client_limit", "fd_limit", "header_timeout", "body_timeout", "busy", "framing"};

void ResetAndClose(int fd) {
  const linger l = {1, 0};  // RST: no TIME_WAIT left behind for a refused connection
  (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

// httplib's request processing is protected: this exposes it on a plaintext or TLS server.
template <typename Base>
class Processor final : public Base {
 public:
  using Base::Base;
  // httplib's chunked writer (streams) runs only while the server's listening socket is set;
  // this server never runs httplib's accept loop, so it says so itself (-1: stopping).
  void SetRunning(int listen_fd) { this->svr_sock_ = listen_fd; }
  bool Process(httplib::Stream& strm, bool close_connection, bool& closed, SSL* ssl) {
    if (ssl == nullptr) return this->process_request(strm, close_connection, closed, {});
    return this->process_request(strm, close_connection, closed,
                                 [ssl](httplib::Request& req) { req.ssl = ssl; });
  }
};

}  // namespace

class HttpConnections::Impl {
 public:
  Impl(const HttpConnectionsConfig& config, metrics::Registry* registry)
      : config_(config),
        registry_(registry),
        caps_(config.max_open_connections, config.max_connections_per_client),
        work_(std::make_shared<WorkQueue>()) {
    limits_.max_head_bytes = static_cast<size_t>(config.max_head_bytes);
    limits_.max_body_bytes = config.max_body_bytes;
  }

  ~Impl() {
    for (int fd : {listen_fd_, epoll_fd_, wake_fd_, notify_fd_, spare_fd_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  absl::Status Init();
  void RaiseFileLimit();
  absl::Status Listen();
  absl::Status InitEpoll();
  absl::Status InitMetrics();
  httplib::Server& server() { return *server_; }
  int port() const { return port_; }
  void Start() {
    set_running_(listen_fd_);
    waiter_ = std::thread([this] { WaiterLoop(); });
  }
  void Shutdown() {
    if (shutdown_.exchange(true)) return;
    set_running_(-1);  // streams end at their next chunk, as under httplib's own stop()
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  void Stop();

 private:
  // Worker threads and the requests waiting for one. Shared with the detached workers, which
  // may still be leaving it after Stop has seen them gone.
  struct WorkQueue {
    absl::Mutex mu;
    std::deque<Conn*> ready ABSL_GUARDED_BY(mu);
    int64_t workers ABSL_GUARDED_BY(mu) = 0;
    int64_t idle ABSL_GUARDED_BY(mu) = 0;
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };

  void WaiterLoop();
  void Accept();
  void OnEvent(Conn* c, uint32_t events);
  void Handshake(Conn* c);
  // Reads what the socket has into c->buf. False on end of stream or error.
  bool ReadSome(Conn* c);
  void ReadRequest(Conn* c);
  // Frames the request in c->buf; dispatches it when complete, answers a framing error.
  void Advance(Conn* c);
  void Dispatch(Conn* c);
  // More than any valid request needs: the framer refuses before a buffer grows past it.
  size_t BufferCap() const {
    return limits_.max_head_bytes + 3 * static_cast<size_t>(limits_.max_body_bytes) + kReadBudget;
  }
  void TakeReturned();
  void BackToWaiting(Conn* c);
  void WorkerLoop(std::shared_ptr<WorkQueue> work);
  void Serve(Conn* c);

  void SetTimer(Conn* c, absl::Duration after);
  void ClearTimer(Conn* c);
  void ExpireTimers();
  void SetInterest(Conn* c, uint32_t events);
  // Best-effort write of a small response from the waiter (never blocks).
  void SendNow(Conn* c, const std::string& bytes);
  // Sends an error response, then lingers (kLinger) before closing.
  void Refuse(Conn* c, int status, const std::string& message, Reason reason, bool linger);
  void Close(Conn* c);
  void Count(Reason reason);
  void MaybeLog(bool force);
  void CloseAllWaiting();

  const HttpConnectionsConfig config_;
  metrics::Registry* const registry_;
  FramingLimits limits_;
  std::unique_ptr<httplib::Server> server_;
  std::function<bool(httplib::Stream&, bool, bool&, SSL*)> process_;
  std::function<void(int)> set_running_;  // Processor::SetRunning
  SSL_CTX* ssl_ctx_ = nullptr;  // owned by server_ (TLS only)
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;    // Shutdown: stays readable from then on
  int notify_fd_ = -1;  // workers hand connections back
  int spare_fd_ = -1;   // closed to accept (and reset) a connection when out of descriptors
  int port_ = 0;
  std::thread waiter_;
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> stopped_{false};

  // Waiter thread only.
  ConnectionCaps caps_;
  absl::flat_hash_map<Conn*, std::unique_ptr<Conn>> conns_;
  std::multimap<absl::Time, Conn*> timers_;
  int64_t serving_ = 0;
  bool stopping_ = false;
  std::array<int64_t, kNumReasons> unlogged_{};
  absl::Time last_log_ = absl::InfinitePast();

  // Read by the metrics collector.
  std::atomic<int64_t> open_gauge_{0};
  std::atomic<int64_t> waiting_gauge_{0};
  std::array<metrics::Counter*, kNumReasons> refused_{};
  std::optional<metrics::CollectorId> collector_;

  std::shared_ptr<WorkQueue> work_;
  absl::Mutex returned_mu_;
  std::vector<Conn*> returned_ ABSL_GUARDED_BY(returned_mu_);
};

absl::Status HttpConnections::Impl::Init() {
  if (config_.tls.enabled()) {
    auto tls = std::make_unique<Processor<httplib::SSLServer>>(
        config_.tls.cert_file.c_str(), config_.tls.key_file.c_str(),
        config_.tls.client_ca_file.empty() ? nullptr : config_.tls.client_ca_file.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          "http: cannot load the TLS certificate/key (--tls_cert, --tls_key, --tls_ca)");
    }
    ssl_ctx_ = tls->ssl_context();
    process_ = [s = tls.get()](httplib::Stream& strm, bool close, bool& closed, SSL* ssl) {
      return s->Process(strm, close, closed, ssl);
    };
    set_running_ = [s = tls.get()](int fd) { s->SetRunning(fd); };
    server_ = std::move(tls);
  } else {
    auto plain = std::make_unique<Processor<httplib::Server>>();
    process_ = [s = plain.get()](httplib::Stream& strm, bool close, bool& closed, SSL* ssl) {
      return s->Process(strm, close, closed, ssl);
    };
    set_running_ = [s = plain.get()](int fd) { s->SetRunning(fd); };
    server_ = std::move(plain);
  }
  server_->set_payload_max_length(static_cast<size_t>(config_.max_body_bytes));
  RaiseFileLimit();
  PD_RETURN_IF_ERROR(Listen());
  PD_RETURN_IF_ERROR(InitEpoll());
  return InitMetrics();
}

void HttpConnections::Impl::RaiseFileLimit() {
  // The open-file limit: connections past it would fail at accept.
  rlimit nofile{};
  const rlim_t want = static_cast<rlim_t>(config_.max_open_connections) + kFdMargin;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < want) {
    nofile.rlim_cur = std::min(want, nofile.rlim_max);
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
    if (nofile.rlim_cur < want) {
      LOG(WARNING) << "http: the open-file limit (" << nofile.rlim_cur << ", hard limit) is "
                   << "below --http_max_open_connections + " << kFdMargin
                   << ": connections past it are reset (reason fd_limit)";
    }
  }
}

absl::Status HttpConnections::Impl::Listen() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(config_.address.port);
  if (::getaddrinfo(config_.address.host.c_str(), port.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::UnavailableError(absl::StrCat("http: cannot resolve ", config_.address.host));
  }
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // Only SO_REUSEADDR: SO_REUSEPORT would let a second process share the port.
    int yes = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, kListenBacklog) == 0) {
      listen_fd_ = fd;
    } else {
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ",
                                               config_.address.ToString(), ": ",
                                               std::strerror(errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  (void)::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  NumericHost(bound, &port_);
  return absl::OkStatus();
}

absl::Status HttpConnections::Impl::InitEpoll() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  notify_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || notify_fd_ < 0) {
    return absl::InternalError(absl::StrCat("http: epoll/eventfd: ", std::strerror(errno)));
  }
  // The fixed descriptors are told apart by their data.fd; connections carry a Conn* (never
  // one of these small integers).
  for (int fd : {listen_fd_, wake_fd_, notify_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = static_cast<uint64_t>(fd);
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat("http: epoll_ctl: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status HttpConnections::Impl::InitMetrics() {
  metrics::Family<metrics::Counter>* refused;
  absl::StatusOr<metrics::Family<metrics::Counter>*> family = registry_->AddCounter(
      "pd_router_http_connections_refused_total",
      "HTTP API connections refused or closed by a limit, by reason (open_limit, client_limit, "
      "fd_limit, header_timeout, body_timeout, busy, framing)",
      {"reason"});
  if (!family.ok()) return family.status();
  refused = *family;
  for (int r = 0; r < kNumReasons; ++r) refused_[r] = &refused->WithLabels({kReasonNames[r]});
  collector_ = registry_->AddCollector([this](metrics::CollectorSink& sink) {
    sink.AddGauge("pd_router_http_connections",
                  "OpenAI HTTP API connections open (waiting or with a request being served)",
                  static_cast<double>(open_gauge_.load(std::memory_order_relaxed)));
    sink.AddGauge("pd_router_http_connections_waiting",
                  "OpenAI HTTP API connections without a complete request (idle keep-alive, "
                  "TLS handshake, head or body under way)",
                  static_cast<double>(waiting_gauge_.load(std::memory_order_relaxed)));
  });
  return absl::OkStatus();
}

void HttpConnections::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  Shutdown();
  if (waiter_.joinable()) waiter_.join();
  {
    absl::MutexLock lock(&work_->mu);
    work_->stopping = true;
    work_->mu.Await(absl::Condition(
        +[](int64_t* workers) { return *workers == 0; }, &work_->workers));
  }
  if (collector_.has_value()) registry_->RemoveCollector(*collector_);
  collector_.reset();
}

void HttpConnections::Impl::WaiterLoop() {
  std::array<epoll_event, 256> events;
  for (;;) {
    int timeout_ms = -1;
    if (!timers_.empty()) {
      const absl::Duration left = timers_.begin()->first - absl::Now();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 0, 60000));
    }
    if (std::any_of(unlogged_.begin(), unlogged_.end(), [](int64_t n) { return n > 0; })) {
      timeout_ms = timeout_ms < 0 ? 10000 : std::min(timeout_ms, 10000);
    }
    const int n = ::epoll_wait(epoll_fd_, events.data(), events.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      PLOG(ERROR) << "http: epoll_wait";
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t data = events[i].data.u64;
      if (data == static_cast<uint64_t>(listen_fd_)) {
        if (!stopping_) Accept();
      } else if (data == static_cast<uint64_t>(notify_fd_)) {
        uint64_t count;
        (void)!::read(notify_fd_, &count, sizeof(count));
        TakeReturned();
      } else if (data == static_cast<uint64_t>(wake_fd_)) {
        if (!stopping_) {
          stopping_ = true;
          (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, wake_fd_, nullptr);
          (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
          ::close(listen_fd_);
          listen_fd_ = -1;
          CloseAllWaiting();
        }
      } else {
        Conn* c = reinterpret_cast<Conn*>(static_cast<uintptr_t>(data));
        // A connection closed earlier in this batch is gone from conns_.
        if (conns_.contains(c) && c->phase != Conn::Phase::kServing) OnEvent(c, events[i].events);
      }
    }
    ExpireTimers();
    MaybeLog(false);
    if (stopping_ && serving_ == 0) break;
  }
  MaybeLog(true);
}

void HttpConnections::Impl::Accept() {
  for (int i = 0; i < 256; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // Out of descriptors: take the connection off the queue with the spare one and reset
        // it, so that the listening socket does not stay readable forever.
        ::close(spare_fd_);
        const int victim = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        Count(kFdLimit);
        if (victim >= 0) ResetAndClose(victim);
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) PLOG(WARNING) << "http: accept";
      return;
    }
    int peer_port = 0;
    std::string peer = NumericHost(addr, &peer_port);
    const ConnectionCaps::Verdict verdict = caps_.TryOpen(peer);
    if (verdict != ConnectionCaps::Verdict::kAdmit) {
      Count(verdict == ConnectionCaps::Verdict::kOpenLimit ? kOpenLimit : kClientLimit);
      ResetAndClose(fd);
      continue;
    }
    auto owned = std::make_unique<Conn>(fd, std::move(peer), peer_port, limits_);
    Conn* c = owned.get();
    conns_.emplace(c, std::move(owned));
    open_gauge_.fetch_add(1, std::memory_order_relaxed);
    waiting_gauge_.fetch_add(1, std::memory_order_relaxed);
    if (ssl_ctx_ != nullptr) {
      c->ssl = SSL_new(ssl_ctx_);
      if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
        Close(c);
        continue;
      }
      SSL_set_accept_state(c->ssl);
      // Idle sessions give their read and write buffers back.
      SSL_set_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
      c->phase = Conn::Phase::kHandshake;
      SetTimer(c, config_.header_timeout);
      Handshake(c);
    } else {
      c->phase = Conn::Phase::kIdle;
      SetTimer(c, config_.idle_timeout);
      SetInterest(c, EPOLLIN);
    }
  }
}

void HttpConnections::Impl::OnEvent(Conn* c, uint32_t events) {
  (void)events;  // the next read or handshake step tells what happened
  switch (c->phase) {
    case Conn::Phase::kHandshake:
      Handshake(c);
      return;
    case Conn::Phase::kLinger: {  // discard what comes until the client's end or the timer
      char scratch[16 << 10];
      for (size_t budget = kReadBudget; budget > 0;) {
        const ssize_t n = ::recv(c->fd, scratch, sizeof(scratch), MSG_DONTWAIT);
        if (n > 0) {
          budget -= std::min(budget, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) Close(c);
        return;
      }
      return;
    }
    default:
      ReadRequest(c);
  }
}

void HttpConnections::Impl::Handshake(Conn* c) {
  ERR_clear_error();
  const int r = SSL_do_handshake(c->ssl);
  if (r == 1) {
    c->phase = Conn::Phase::kIdle;
    SetTimer(c, config_.idle_timeout);
    ReadRequest(c);  // the client may have sent its request with the handshake's end
    return;
  }
  const int err = SSL_get_error(c->ssl, r);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    SetInterest(c, err == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
    return;
  }
  const char* reason = ERR_reason_error_string(ERR_peek_error());
  VLOG(1) << "http: TLS handshake with " << c->peer << " failed: "
          << (reason != nullptr ? reason : "peer closed");
  Close(c);
}

bool HttpConnections::Impl::ReadSome(Conn* c) {
  const size_t cap = BufferCap();
  char scratch[16 << 10];
  size_t budget = kReadBudget;
  c->tls_want_write = false;
  // TLS: plaintext OpenSSL holds already (epoll cannot see it) is read past the budget.
  while (c->buf.size() < cap &&
         (budget > 0 || (c->ssl != nullptr && SSL_pending(c->ssl) > 0))) {
    if (c->ssl != nullptr) {
      ERR_clear_error();
      const int n = SSL_read(c->ssl, scratch, sizeof(scratch));
      if (n > 0) {
        c->buf.append(scratch, static_cast<size_t>(n));
        budget -= std::min(budget, static_cast<size_t>(n));
        continue;
      }
      const int err = SSL_get_error(c->ssl, n);
      if (err == SSL_ERROR_WANT_READ) return true;
      if (err == SSL_ERROR_WANT_WRITE) {
        c->tls_want_write = true;
        return true;
      }
      return false;  // close_notify, a protocol error, or the socket's end
    }
    const ssize_t n = ::recv(c->fd, scratch, std::min(sizeof(scratch), budget), MSG_DONTWAIT);
    if (n > 0) {
      c->buf.append(scratch, static_cast<size_t>(n));
      budget -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

void HttpConnections::Impl::ReadRequest(Conn* c) {
  const bool open = ReadSome(c);
  if (c->phase == Conn::Phase::kIdle) {
    // Empty lines before a request are ignored (RFC 9112 2.2), e.g. a client's CRLF after a
    // POST body.
    size_t skip = 0;
    while (c->buf.size() >= skip + 2 && c->buf.compare(skip, 2, "\r\n") == 0) skip += 2;
    c->buf.erase(0, skip);
    if (!c->buf.empty() && c->buf != "\r") {
      c->phase = Conn::Phase::kHead;
      SetTimer(c, config_.header_timeout);
    }
  }
  if (c->phase == Conn::Phase::kHead || c->phase == Conn::Phase::kBody) {
    Advance(c);
    if (!conns_.contains(c) || c->phase == Conn::Phase::kServing ||
        c->phase == Conn::Phase::kLinger) {
      return;
    }
    if (c->buf.size() >= BufferCap()) {  // not reached: the framer refuses first
      Refuse(c, 413, "request is too large", kFraming, /*linger=*/true);
      return;
    }
  }
  if (!open) {
    Close(c);
    return;
  }
  SetInterest(c, c->tls_want_write ? EPOLLOUT : EPOLLIN);
}

void HttpConnections::Impl::Advance(Conn* c) {
  const RequestFramer::State state = c->framer.Scan(c->buf);
  switch (state) {
    case RequestFramer::State::kNeedHead:
      return;
    case RequestFramer::State::kNeedBody:
      if (c->phase == Conn::Phase::kHead) {
        c->phase = Conn::Phase::kBody;
        SetTimer(c, config_.body_timeout);
        if (c->framer.expects_continue() && !c->continue_sent) {
          c->continue_sent = true;
          SendNow(c, kContinue);
        }
      }
      return;
    case RequestFramer::State::kComplete:
      Dispatch(c);
      return;
    case RequestFramer::State::kError:
      Refuse(c, c->framer.http_status(), c->framer.message(), kFraming, /*linger=*/true);
      return;
  }
}

void HttpConnections::Impl::Dispatch(Conn* c) {
  if (stopping_) {
    Close(c);
    return;
  }
  if (serving_ >= config_.max_connections) {
    Refuse(c, 503,
           absl::StrCat("router is serving ", config_.max_connections,
                        " HTTP requests at once (--http_max_connections); retry later"),
           kBusy, /*linger=*/true);
    return;
  }
  ClearTimer(c);
  SetInterest(c, 0);
  c->phase = Conn::Phase::kServing;
  ++serving_;
  waiting_gauge_.fetch_sub(1, std::memory_order_relaxed);
  absl::MutexLock lock(&work_->mu);
  work_->ready.push_back(c);
  // Every queued request has a worker: an idle one, or a new one (counted idle from now on,
  // so that the next request does not count on it too).
  if (work_->ready.size() > static_cast<size_t>(work_->idle)) {
    ++work_->workers;
    ++work_->idle;
    std::thread([this, work = work_] { WorkerLoop(work); }).detach();
  }
}

void HttpConnections::Impl::WorkerLoop(std::shared_ptr<WorkQueue> work) {
  absl::MutexLock lock(&work->mu);  // `idle` counts this thread already (Dispatch)
  for (;;) {
    auto has_work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(work->mu) {
      return !work->ready.empty() || work->stopping;
    };
    work->mu.AwaitWithTimeout(absl::Condition(&has_work), kWorkerLinger);
    --work->idle;
    if (work->ready.empty()) break;  // lingered long enough, or stopping
    Conn* c = work->ready.front();
    work->ready.pop_front();
    work->mu.Unlock();
    Serve(c);
    work->mu.Lock();
    ++work->idle;
  }
  --work->workers;
}

void HttpConnections::Impl::Serve(Conn* c) {
  {
    bool closed = false;
    const bool ok = ServeBuffered(*c, config_.write_timeout, [&](httplib::Stream& strm) {
      return process_(strm, /*close_connection=*/c->requests_left == 1, closed, c->ssl);
    });
    --c->requests_left;
    c->keep = ok && !closed && c->requests_left > 0;
    if (!c->keep && ok && c->ssl != nullptr) {
      ERR_clear_error();
      (void)SSL_shutdown(c->ssl);  // close_notify; the peer's is not awaited
    }
  }
  c->buf.erase(0, c->framer.frame_bytes());
  {
    absl::MutexLock lock(&returned_mu_);
    returned_.push_back(c);
  }
  const uint64_t one = 1;
  (void)!::write(notify_fd_, &one, sizeof(one));
}

void HttpConnections::Impl::TakeReturned() {
  std::vector<Conn*> back;
  {
    absl::MutexLock lock(&returned_mu_);
    back.swap(returned_);
  }
  for (Conn* c : back) {
    --serving_;
    waiting_gauge_.fetch_add(1, std::memory_order_relaxed);
    if (stopping_ || !c->keep) {
      Close(c);
    } else {
      BackToWaiting(c);
    }
  }
}

void HttpConnections::Impl::BackToWaiting(Conn* c) {
  c->phase = Conn::Phase::kIdle;
  c->framer.Reset();
  c->continue_sent = false;
  SetTimer(c, config_.idle_timeout);
  // A pipelined request may be buffered already (here or, for TLS, inside OpenSSL).
  ReadRequest(c);
}

void HttpConnections::Impl::SetTimer(Conn* c, absl::Duration after) {
  ClearTimer(c);
  c->timer = timers_.emplace(absl::Now() + after, c);
  c->has_timer = true;
}

void HttpConnections::Impl::ClearTimer(Conn* c) {
  if (!c->has_timer) return;
  timers_.erase(c->timer);
  c->has_timer = false;
}

void HttpConnections::Impl::ExpireTimers() {
  const absl::Time now = absl::Now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    Conn* c = timers_.begin()->second;
    ClearTimer(c);
    switch (c->phase) {
      case Conn::Phase::kHandshake:
        Count(kHeaderTimeout);
        Close(c);
        break;
      case Conn::Phase::kHead:
        Refuse(c, 408, "request head not received in time (--http_header_timeout)",
               kHeaderTimeout, /*linger=*/false);
        break;
      case Conn::Phase::kBody:
        Refuse(c, 408, "request body not received in time (--http_body_timeout)", kBodyTimeout,
               /*linger=*/false);
        break;
      default:  // idle keep-alive, or the end of a linger
        Close(c);
    }
  }
}

void HttpConnections::Impl::SetInterest(Conn* c, uint32_t events) {
  if (events == c->interest) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(c));
  const int op = events == 0 ? EPOLL_CTL_DEL : c->interest == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  if (::epoll_ctl(epoll_fd_, op, c->fd, &ev) != 0) {
    PLOG(WARNING) << "http: epoll_ctl";
  }
  c->interest = events;
}

void HttpConnections::Impl::SendNow(Conn* c, const std::string& bytes) {
  if (c->ssl != nullptr) {
    ERR_clear_error();
    (void)SSL_write(c->ssl, bytes.data(), static_cast<int>(bytes.size()));
  } else {
    (void)::send(c->fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void HttpConnections::Impl::Refuse(Conn* c, int status, const std::string& message,
                                   Reason reason, bool linger) {
  Count(reason);
  VLOG(1) << "http: " << status << " to " << c->peer << ": " << message;
  SendNow(c, CannedResponse(status, message));
  if (!linger) {
    Close(c);
    return;
  }
  if (c->ssl != nullptr) {
    ERR_clear_error();
    (void)SSL_shutdown(c->ssl);
  }
  ::shutdown(c->fd, SHUT_WR);
  c->buf.clear();
  c->buf.shrink_to_fit();
  c->phase = Conn::Phase::kLinger;
  SetTimer(c, kLinger);
  SetInterest(c, EPOLLIN);
}

void HttpConnections::Impl::Close(Conn* c) {
  ClearTimer(c);
  SetInterest(c, 0);
  if (c->ssl != nullptr) SSL_free(c->ssl);
  ::close(c->fd);
  caps_.Close(c->peer);
  open_gauge_.fetch_sub(1, std::memory_order_relaxed);
  waiting_gauge_.fetch_sub(1, std::memory_order_relaxed);
  conns_.erase(c);
}

void HttpConnections::Impl::CloseAllWaiting() {
  std::vector<Conn*> waiting;
  for (const auto& [c, owned] : conns_) {
    if (c->phase != Conn::Phase::kServing) waiting.push_back(c);
  }
  for (Conn* c : waiting) Close(c);
}

void HttpConnections::Impl::Count(Reason reason) {
  refused_[reason]->Increment();
  ++unlogged_[reason];
  MaybeLog(false);
}

void HttpConnections::Impl::MaybeLog(bool force) {
  const absl::Time now = absl::Now();
  if (!force && now - last_log_ < kLogInterval) return;
  std::string counts;
  for (int r = 0; r < kNumReasons; ++r) {
    if (unlogged_[r] == 0) continue;
    absl::StrAppend(&counts, " ", kReasonNames[r], "=", unlogged_[r]);
    unlogged_[r] = 0;
  }
  if (counts.empty()) return;
  last_log_ = now;
  LOG(WARNING) << "http: connections refused or closed by a limit since the last report:"
               << counts << " (pd_router_http_connections_refused_total)";
}

HttpConnections::HttpConnections(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpConnections::~HttpConnections() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpConnections>> HttpConnections::Create(
    const HttpConnectionsConfig& config, metrics::Registry* registry) {
  auto impl = std::make_unique<Impl>(config, registry);
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<HttpConnections>(new HttpConnections(std::move(impl)));
}

httplib::Server& HttpConnections::server() { return impl_->server(); }
int HttpConnections::port() const { return impl_->port(); }
void HttpConnections::Start() { impl_->Start(); }
void HttpConnections::Shutdown() { impl_->Shutdown(); }
void HttpConnections::Stop() { impl_->Stop(); }

}  // namespace pd::router::openai
