#include "services/router/openai/http_front.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "nlohmann/json.hpp"
#include "services/router/generation_service.h"
#include "services/router/openai/openai_response.h"
#include "services/router/router_stream.h"

namespace pd::router::openai {

namespace v1 = pdserve::v1;

// How many connection threads run; shared by the front and the task queues httplib owns.
struct HttpFront::ConnectionCount {
  mutable absl::Mutex mu;
  int64_t active ABSL_GUARDED_BY(mu) = 0;

  int64_t Get() const {
    absl::MutexLock lock(&mu);
    return active;
  }
};

namespace {

// Runs each connection on a thread of its own: a stream blocks its thread for as long as the
// generation runs, so a fixed pool would cap the streams open at once at its size. The detached
// threads keep the count alive until they have left it.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(std::shared_ptr<HttpFront::ConnectionCount> count)
      : count_(std::move(count)) {}

  void enqueue(std::function<void()> fn) override {
    {
      absl::MutexLock lock(&count_->mu);
      ++count_->active;
    }
    std::thread([count = count_, fn = std::move(fn)] {
      fn();
      absl::MutexLock lock(&count->mu);
      --count->active;
    }).detach();
  }

  // httplib calls this when its accept loop ends: wait for the connections.
  void shutdown() override {
    absl::MutexLock lock(&count_->mu);
    count_->mu.Await(absl::Condition(
        +[](int64_t* active) { return *active == 0; }, &count_->active));
  }

 private:
  std::shared_ptr<HttpFront::ConnectionCount> count_;
};

// Waits for `events` on `sock` up to `timeout`, in one poll(2) that also watches `wake_fd`
// (readable once Stop signalled it; -1 = none). True when `sock` is ready (or has hung up or
// failed: the next read or write tells which); false on timeout or wake-up.
bool WaitFor(int sock, int16_t events, int wake_fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd fds[2] = {{sock, events, 0}, {wake_fd, POLLIN, 0}};
    const int64_t left_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int n =
        ::poll(fds, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(left_ms, INT32_MAX)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (wake_fd >= 0 && fds[1].revents != 0) return false;
    return fds[0].revents != 0;
  }
}

std::string NumericHost(const sockaddr_storage& addr, socklen_t len, int* port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv,
                    sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "";
  }
  *port = std::atoi(serv);
  return host;
}

// One connection, plaintext or TLS, as httplib's request parser reads and writes it. Every wait
// is a single poll(2), where httplib 0.11's own streams and keep-alive wait poll 10 ms, sleep
// 1 ms and go round again: with a thousand open connections those wake-ups took both cores of
// a 2-core machine and starved the clients (tests/e2e/openai_streams_e2e_test.cc). Plaintext
// reads are buffered (the parser reads a request's head a byte at a time; OpenSSL buffers a
// TLS record itself) and the buffer lives as long as the connection, so a pipelined next
// request is kept. A TLS socket is non-blocking; a plaintext one blocks, written after poll.
class ConnectionStream final : public httplib::Stream {
 public:
  // `ssl`: the connection's TLS session after its handshake (not owned), or null.
  ConnectionStream(int sock, SSL* ssl, int wake_fd, absl::Duration read_timeout,
                   absl::Duration write_timeout)
      : sock_(sock),
        ssl_(ssl),
        wake_fd_(wake_fd),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout) {}

  // Waits up to `idle` for the next request's first byte. False on timeout, on Stop's wake-up,
  // or when the peer has closed without sending one.
  bool WaitForRequest(absl::Duration idle) {
    return Pending() || WaitFor(sock_, POLLIN, wake_fd_, idle);
  }

  bool is_readable() const override {
    return Pending() || WaitFor(sock_, POLLIN, wake_fd_, read_timeout_);
  }

  // httplib's meaning: writable within the write timeout, and the peer has not closed (a
  // streaming client that went away is noticed before the next chunk is generated). Stop's
  // wake-up ends the wait too: a client that stops reading does not hold up shutdown.
  bool is_writable() const override {
    return WaitFor(sock_, POLLOUT, wake_fd_, write_timeout_) && !PeerClosed();
  }

  // True when the peer has closed the connection (or it failed): nothing more will be read
  // from it. Does not wait. Bytes the peer sent (a pipelined request) mean it is still there.
  bool PeerClosed() const {
    if (Pending()) return false;
    pollfd fd = {sock_, POLLIN, 0};
    if (::poll(&fd, 1, 0) <= 0) return false;
    if ((fd.revents & (POLLERR | POLLNVAL)) != 0) return true;
    if (ssl_ != nullptr) {
      // A TLS peer's close_notify is a record: only OpenSSL can tell it from data.
      char byte;
      ERR_clear_error();
      const int n = SSL_peek(ssl_, &byte, 1);
      if (n > 0) return false;
      const int err = SSL_get_error(ssl_, n);
      return err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE;
    }
    char byte;
    const ssize_t n = ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (ssl_ != nullptr) return ReadTls(ptr, size);
    if (buffered_ < filled_) {
      const size_t n = std::min(size, filled_ - buffered_);
      std::memcpy(ptr, buffer_ + buffered_, n);
      buffered_ += n;
      return static_cast<ssize_t>(n);
    }
    if (!is_readable()) return -1;
    buffered_ = filled_ = 0;
    const bool into_buffer = size < sizeof(buffer_);
    ssize_t n;
    do {
      n = ::recv(sock_, into_buffer ? buffer_ : ptr, into_buffer ? sizeof(buffer_) : size, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0 || !into_buffer) return n;
    const size_t give = std::min(size, static_cast<size_t>(n));
    std::memcpy(ptr, buffer_, give);
    buffered_ = give;
    filled_ = static_cast<size_t>(n);
    return static_cast<ssize_t>(give);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    if (ssl_ != nullptr) return WriteTls(ptr, size);
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      ip = NumericHost(addr, len, &port);
    }
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      ip = NumericHost(addr, len, &port);
    }
  }

  socket_t socket() const override { return sock_; }

 private:
  bool Pending() const { return buffered_ < filled_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }

  // Waits for what OpenSSL asked for after a call that returned `ret` <= 0. False when the
  // session failed or ended, or the wait timed out.
  bool WaitForTls(int ret) const {
    switch (SSL_get_error(ssl_, ret)) {
      case SSL_ERROR_WANT_READ:
        return WaitFor(sock_, POLLIN, wake_fd_, read_timeout_);
      case SSL_ERROR_WANT_WRITE:
        return WaitFor(sock_, POLLOUT, wake_fd_, write_timeout_);
      default:  // SSL_ERROR_ZERO_RETURN (close_notify), a syscall or protocol error
        return false;
    }
  }

  ssize_t ReadTls(char* ptr, size_t size) {
    const int want = static_cast<int>(std::min<size_t>(size, INT32_MAX));
    for (;;) {
      ERR_clear_error();
      const int n = SSL_read(ssl_, ptr, want);
      if (n > 0) return n;
      if (SSL_get_error(ssl_, n) == SSL_ERROR_ZERO_RETURN) return 0;
      if (!WaitForTls(n)) return -1;
    }
  }

  ssize_t WriteTls(const char* ptr, size_t size) {
    const int want = static_cast<int>(std::min<size_t>(size, INT32_MAX));
    for (;;) {
      ERR_clear_error();
      const int n = SSL_write(ssl_, ptr, want);
      if (n > 0) return n;
      if (!WaitForTls(n)) return -1;
    }
  }

  const int sock_;
  SSL* const ssl_;
  const int wake_fd_;
  const absl::Duration read_timeout_;
  const absl::Duration write_timeout_;
  char buffer_[4096];
  size_t buffered_ = 0;  // bytes of buffer_ already handed out
  size_t filled_ = 0;    // bytes of buffer_ read from the socket
};

// The connection whose request this thread's handler serves (see CurrentClientGone).
thread_local const ConnectionStream* current_connection = nullptr;
// Set by a handler that answered without reading the request's body: the connection closes
// after the response (the unread body must not be parsed as the next request).
thread_local bool close_after_response = false;

// Serves one accepted connection: waits up to `idle` for each request (the first included) and
// hands it to httplib's parser, routing and writers; closes after keep_alive_max_count requests,
// the idle timeout, an error, Stop (`stop` returns true) or a "Connection: close".
template <typename ProcessRequest>
bool ServeConnection(ConnectionStream& strm, absl::Duration idle, size_t max_requests,
                     const std::function<bool()>& stop, ProcessRequest process_request) {
  bool ok = false;
  current_connection = &strm;
  for (size_t left = max_requests; left > 0 && !stop() && strm.WaitForRequest(idle); --left) {
    bool closed = false;
    close_after_response = false;
    ok = process_request(/*close_connection=*/left == 1, closed);
    if (!ok || closed || close_after_response) break;
  }
  current_connection = nullptr;
  return ok;
}

// The plaintext server: httplib's parser, routing and writers on a ConnectionStream.
class PlainServer final : public httplib::Server {
 public:
  explicit PlainServer(int wake_fd) : wake_fd_(wake_fd) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    ConnectionStream strm(sock, nullptr, wake_fd_, absl::Seconds(read_timeout_sec_),
                          absl::Seconds(write_timeout_sec_));
    const bool ok = ServeConnection(
        strm, absl::Seconds(keep_alive_timeout_sec_), keep_alive_max_count_,
        [this] { return svr_sock_ == INVALID_SOCKET; },
        [&](bool close_connection, bool& closed) {
          return process_request(strm, close_connection, closed, {});
        });
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  const int wake_fd_;
};

// The TLS server: httplib's SSL_CTX (certificate, key, and the client CA whose certificates it
// requires when set), and a non-blocking OpenSSL session of its own per connection with the
// same waits as the plaintext server.
class TlsServer final : public httplib::SSLServer {
 public:
  TlsServer(const char* cert, const char* key, const char* client_ca, int wake_fd)
      : httplib::SSLServer(cert, key, client_ca), wake_fd_(wake_fd) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    const absl::Duration idle = absl::Seconds(keep_alive_timeout_sec_);
    const absl::Duration read_timeout = absl::Seconds(read_timeout_sec_);
    bool ok = false;
    SSL* ssl = SSL_new(ssl_context());
    const int flags = ::fcntl(sock, F_GETFL);
    // The client speaks first (ClientHello): it has the idle timeout to start, the read
    // timeout to finish the handshake.
    if (ssl != nullptr && flags >= 0 && ::fcntl(sock, F_SETFL, flags | O_NONBLOCK) == 0 &&
        SSL_set_fd(ssl, sock) == 1 && WaitFor(sock, POLLIN, wake_fd_, idle) &&
        Handshake(ssl, sock, absl::Now() + read_timeout)) {
      ConnectionStream strm(sock, ssl, wake_fd_, read_timeout, absl::Seconds(write_timeout_sec_));
      ok = ServeConnection(
          strm, idle, keep_alive_max_count_, [this] { return svr_sock_ == INVALID_SOCKET; },
          [&](bool close_connection, bool& closed) {
            return process_request(strm, close_connection, closed,
                                   [ssl](httplib::Request& req) { req.ssl = ssl; });
          });
      if (ok) {
        ERR_clear_error();
        (void)SSL_shutdown(ssl);  // close_notify; the peer's is not awaited
      }
    }
    ERR_clear_error();
    SSL_free(ssl);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  bool Handshake(SSL* ssl, int sock, absl::Time deadline) const {
    for (;;) {
      ERR_clear_error();
      const int r = SSL_accept(ssl);
      if (r == 1) return true;
      const int err = SSL_get_error(ssl, r);
      const int16_t events = err == SSL_ERROR_WANT_READ    ? POLLIN
                             : err == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                           : 0;
      if (events == 0) {
        const char* reason = ERR_reason_error_string(ERR_peek_error());
        VLOG(1) << "http: TLS handshake failed: " << (reason != nullptr ? reason : "peer closed");
        return false;
      }
      if (!WaitFor(sock, events, wake_fd_, deadline - absl::Now())) return false;
    }
  }

  const int wake_fd_;
};

// True when the client of the request this thread's handler serves has closed its connection.
bool CurrentClientGone() {
  return current_connection != nullptr && current_connection->PeerClosed();
}

// The response being written ends the connection (its request's body was not read).
void CloseConnectionAfterResponse(httplib::Response& res) {
  close_after_response = true;
  res.set_header("Connection", "close");
}

}  // namespace

using json = nlohmann::json;

// The client side of one RouterStream for a connection thread that waits on it: RouterStream
// hands a message over (Send) and the thread takes it, writes it, and acknowledges (OnSent).
class BlockingSink final : public StreamSink {
 public:
  void Send(const v1::GenerateResponse& response) override {
    absl::MutexLock lock(&mu_);
    pending_ = &response;
  }
  void End(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    end_ = status;
  }

  enum class Next { kMessage, kEnd, kTimeout };
  // Waits up to `timeout` for a message (copied to `msg`; acknowledge it with OnSent) or the
  // stream's end (its status in `end`).
  Next Wait(absl::Duration timeout, v1::GenerateResponse* msg, absl::Status* end) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &BlockingSink::ReadyLocked), timeout);
    if (pending_ != nullptr) {
      *msg = *pending_;
      pending_ = nullptr;
      return Next::kMessage;
    }
    if (end_.has_value()) {
      *end = *end_;
      return Next::kEnd;
    }
    return Next::kTimeout;
  }

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ != nullptr || end_.has_value();
  }

  absl::Mutex mu_;
  const v1::GenerateResponse* pending_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
};

struct HttpStream;

// The streams running, so that Stop can cancel them.
class LiveStreams {
 public:
  void Add(HttpStream* s) {
    absl::MutexLock lock(&mu_);
    streams_.insert(s);
  }
  void Remove(HttpStream* s) {
    absl::MutexLock lock(&mu_);
    streams_.erase(s);
  }
  void CancelAll();
  // Waits until no stream runs or `deadline` passes.
  void WaitIdle(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(
        absl::Condition(
            +[](absl::flat_hash_set<HttpStream*>* s) { return s->empty(); }, &streams_),
        deadline);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<HttpStream*> streams_ ABSL_GUARDED_BY(mu_);
};

// One generation request of the HTTP front: the sink, the router stream and the response being
// built. Every message taken from the sink is acknowledged (Ack) exactly once, whatever it
// renders to: RouterStream relays in lockstep, and a message left unacknowledged would keep the
// stream, its slot and the connection thread forever. Destroyed on the connection thread; a
// stream that has not ended is cancelled and waited for first (RouterStream may be destroyed
// only after its end).
struct HttpStream {
  explicit HttpStream(LiveStreams* live) : live(live) {}
  ~HttpStream() {
    if (stream == nullptr) return;
    live->Remove(this);
    Ack(false);  // a message taken but never written (the client went away first)
    if (!ended) {
      stream->Cancel();
      v1::GenerateResponse msg;
      while (Next(absl::InfiniteDuration(), &msg) != BlockingSink::Next::kEnd) {
        Ack(false);
      }
    }
    stream.reset();
  }

  // The next message (to be acknowledged with Ack), or the end (ended/end_status set). Waits at
  // most `timeout`. Call only with no message unacknowledged.
  BlockingSink::Next Next(absl::Duration timeout, v1::GenerateResponse* msg) {
    absl::Status end;
    const BlockingSink::Next n = sink.Wait(timeout, msg, &end);
    if (n == BlockingSink::Next::kEnd) {
      ended = true;
      end_status = end;
    } else if (n == BlockingSink::Next::kMessage) {
      unacked = true;
    }
    return n;
  }

  // The message Next returned was written (`ok`) or not (false: the client is gone, the
  // generation is cancelled). No-op when none is outstanding.
  void Ack(bool ok) {
    if (!unacked) return;
    unacked = false;
    stream->OnSent(ok);
  }

  // Next, waiting as long as it takes, but cancelling the generation once the client has hung up
  // (checked every kClientCheck): a client that leaves before the first token, or during a
  // non-streamed generation, frees its worker and slot within that bound.
  BlockingSink::Next NextWhileClientThere(v1::GenerateResponse* msg);

  LiveStreams* const live;
  BlockingSink sink;
  std::unique_ptr<RouterStream> stream;
  std::optional<ResponseBuilder> builder;   // once the first message came
  std::optional<std::string> first_events;  // streams: the first message's SSE, until written
  bool unacked = false;
  bool cancelled = false;  // the client hung up
  bool ended = false;
  absl::Status end_status;
};

void LiveStreams::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (HttpStream* s : streams_) s->stream->Cancel();
}

namespace {

// How often an idle stream writes an SSE comment: a client that stops reading is noticed (the
// write fails) and its generation cancelled.
constexpr absl::Duration kStreamPing = absl::Seconds(5);
// How often a request waiting for its first message (or a non-streamed one for its end) checks
// whether its client has hung up.
constexpr absl::Duration kClientCheck = absl::Seconds(1);
constexpr int kListenBacklog = 4096;

void SetError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) {
    res.set_header("Retry-After", "1");
  }
  res.set_content(ErrorBody(e), "application/json");
}

std::string Header(const httplib::Request& req, const char* name) {
  return req.has_header(name) ? req.get_header_value(name) : std::string();
}

// The `path` label of pd_router_http_requests_total: the route's pattern, or "other".
absl::string_view RouteLabel(const httplib::Request& req) {
  if (absl::StartsWith(req.path, "/v1/models/")) return "/v1/models/{id}";
  for (absl::string_view route :
       {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions"}) {
    if (req.path == route) return route;
  }
  return "other";
}

CallerAuth Caller(const httplib::Request& req) {
  CallerAuth caller;
  if (req.has_header("Authorization")) {
    caller.authorization = req.get_header_value("Authorization");
  }
  return caller;
}

}  // namespace

BlockingSink::Next HttpStream::NextWhileClientThere(v1::GenerateResponse* msg) {
  for (;;) {
    const BlockingSink::Next n = Next(kClientCheck, msg);
    if (n != BlockingSink::Next::kTimeout) return n;
    if (!cancelled && CurrentClientGone()) {
      cancelled = true;
      VLOG(1) << "http: client hung up; cancelling its generation";
      stream->Cancel();
    }
  }
}

namespace {

// `bos_token` / `eos_token` of a tokenizer_config.json: a string or {"content": ...}.
std::string SpecialToken(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::StatusOr<std::unique_ptr<chat::ChatTemplate>> LoadChatTemplate(
    const std::string& model, const std::string& file, const chat::ChatTemplateLimits& limits) {
  const bool hf_dir = IsDirectory(model);
  if (file.empty()) {
    if (!hf_dir) return nullptr;  // llama2.c: no template
    absl::StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::FromModelDir(model, limits);
    if (absl::IsNotFound(t.status())) {
      LOG(WARNING) << "http: " << model << " has no chat template: /v1/chat/completions "
                   << "answers 400 (give one with --chat_template)";
      return nullptr;
    }
    if (!t.ok()) return t.status();
    return std::make_unique<chat::ChatTemplate>(*std::move(t));
  }
  PD_ASSIGN_OR_RETURN(std::string source, ReadWholeFile(file));
  std::string bos, eos;
  if (hf_dir) {
    absl::StatusOr<std::string> config = ReadWholeFile(model + "/tokenizer_config.json");
    if (config.ok()) {
      const json j = json::parse(*config, nullptr, false);
      if (j.is_object()) {
        bos = SpecialToken(j, "bos_token");
        eos = SpecialToken(j, "eos_token");
      }
    }
  }
  absl::StatusOr<chat::ChatTemplate> t =
      chat::ChatTemplate::Create(std::move(source), std::move(bos), std::move(eos), limits);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template ", file, ": ", t.status().message()));
  }
  return std::make_unique<chat::ChatTemplate>(*std::move(t));
}

absl::Status HttpFrontConfig::Validate() const {
  if (address.port < 0 || address.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_address: bad port ", address.port));
  }
  if (max_body_bytes < 1024) {
    return absl::InvalidArgumentError("--http_max_body_bytes must be at least 1024");
  }
  if (max_connections < 1) {
    return absl::InvalidArgumentError("--http_max_connections must be at least 1");
  }
  if (idle_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_idle_timeout must be at least 1s");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(
    const HttpFrontConfig& config, GenerationService* service, const engine::ModelFront* model,
    std::unique_ptr<chat::ChatTemplate> chat_template, metrics::Registry* registry) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->config_ = config;
  f->service_ = service;
  f->model_ = model;
  f->chat_template_ = std::move(chat_template);
  f->live_ = std::make_unique<LiveStreams>();
  PD_ASSIGN_OR_RETURN(
      f->metrics_.requests,
      registry->AddCounter("pd_router_http_requests_total",
                           "OpenAI HTTP API requests by path and HTTP status", {"path", "status"}));
  f->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (f->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("http: eventfd: ", std::strerror(errno)));
  }
  if (config.tls.enabled()) {
    f->server_ = std::make_unique<TlsServer>(
        config.tls.cert_file.c_str(), config.tls.key_file.c_str(),
        config.tls.client_ca_file.empty() ? nullptr : config.tls.client_ca_file.c_str(),
        f->wake_fd_);
    if (!f->server_->is_valid()) {
      return absl::InvalidArgumentError(
          "http: cannot load the TLS certificate/key (--tls_cert, --tls_key, --tls_ca)");
    }
  } else {
    f->server_ = std::make_unique<PlainServer>(f->wake_fd_);
  }
  httplib::Server& s = *f->server_;
  HttpFront* front = f.get();
  // httplib owns the queue it gets from this factory (its API hands out a raw pointer).
  f->connections_ = std::make_shared<ConnectionCount>();
  s.new_task_queue = [count = f->connections_] { return new ConnectionThreads(count); };
  s.set_payload_max_length(static_cast<size_t>(config.max_body_bytes));
  // Only SO_REUSEADDR: httplib's default SO_REUSEPORT would let a second process share the port.
  // The listening socket is remembered so its backlog can be raised after bind (below).
  auto listen_fd = std::make_shared<int>(-1);
  s.set_socket_options([listen_fd](int sock) {
    int yes = 1;
    (void)::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    *listen_fd = sock;
  });
  s.set_keep_alive_max_count(100000);
  // Also bounds how long Stop waits on an idle keep-alive connection.
  s.set_keep_alive_timeout(absl::ToInt64Seconds(config.idle_timeout));
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);
  f->Route();
  const int port =
      config.address.port == 0
          ? s.bind_to_any_port(config.address.host)
          : (s.bind_to_port(config.address.host, config.address.port) ? config.address.port : -1);
  if (port < 0) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot listen on ", config.address.host, ":", config.address.port));
  }
  // httplib listens with a backlog of 5: a burst of clients connecting at once (a load test
  // opening a thousand streams) would see dropped SYNs and connect timeouts. Linux lets a second
  // listen() on the same socket raise the backlog (capped by net.core.somaxconn).
  if (*listen_fd >= 0 && ::listen(*listen_fd, kListenBacklog) != 0) {
    PLOG(WARNING) << "http: listen backlog stays at httplib's default";
  }
  f->port_ = port;
  f->registry_ = registry;
  f->collector_ = registry->AddCollector([front](metrics::CollectorSink& sink) {
    sink.AddGauge("pd_router_http_connections", "OpenAI HTTP API connections open",
                  static_cast<double>(front->connections_->Get()));
  });
  f->listener_ = std::thread([front] {
    if (!front->server_->listen_after_bind()) {
      LOG(ERROR) << "http: accept loop ended with an error";
    }
    front->accept_loop_exited_ = true;
  });
  // httplib's stop() does nothing until the accept loop runs: wait for it (microseconds).
  while (!s.is_running() && !f->accept_loop_exited_) {
    absl::SleepFor(absl::Microseconds(50));
  }
  LOG(INFO) << "http: OpenAI API on " << config.address.host << ":" << port
            << (config.tls.enabled() ? " (tls)" : " (plaintext)");
  return f;
}

HttpFront::~HttpFront() {
  Stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);  // the connection threads have ended (Stop)
}

void HttpFront::Drain(absl::Time deadline) {
  draining_ = true;
  live_->WaitIdle(deadline);
  Stop();
}

void HttpFront::Stop() {
  if (stopped_.exchange(true) || server_ == nullptr) return;
  if (collector_.has_value()) registry_->RemoveCollector(*collector_);
  draining_ = true;
  server_->stop();
  if (wake_fd_ >= 0) {  // idle keep-alive connections close now, not at their idle timeout
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  live_->CancelAll();  // the connection threads wait on their streams' ends
  if (listener_.joinable()) listener_.join();
}

absl::Status HttpFront::Admit() const {
  if (draining_) {
    return absl::UnavailableError("router is draining; retry on another router");
  }
  if (connections_->Get() > config_.max_connections) {
    return absl::UnavailableError(absl::StrCat("router has ", config_.max_connections,
                                               " HTTP connections open (--http_max_connections); "
                                               "retry later"));
  }
  return absl::OkStatus();
}

void HttpFront::Reply(httplib::Response& res, const absl::Status& status) {
  SetError(res, ErrorFromStatus(status));
}

void HttpFront::Route() {
  httplib::Server& s = *server_;
  // With API keys, a request without a valid one is refused before its body is read or parsed:
  // an unauthenticated client costs the router its headers only.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method != "POST") return httplib::Server::HandlerResponse::Unhandled;
    absl::StatusOr<std::string> tenant = service_->Authenticate(Caller(req), nullptr);
    if (tenant.ok()) return httplib::Server::HandlerResponse::Unhandled;
    Reply(res, tenant.status());
    CloseConnectionAfterResponse(res);
    return httplib::Server::HandlerResponse::Handled;
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    absl::Status ok = Admit();
    if (ok.ok() && !service_->ServesModel()) {
      ok = absl::UnavailableError("no healthy decode worker");
    }
    if (ok.ok()) {
      res.set_content("", "text/plain");
    } else {
      Reply(res, ok);
    }
  });
  s.Get("/v1/models",
        [this](const httplib::Request& req, httplib::Response& res) { HandleModels(req, res); });
  s.Get(R"(/v1/models/(.+))",
        [this](const httplib::Request& req, httplib::Response& res) { HandleModels(req, res); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kChat, req, res);
  });
  // 404 (no route), 413 (body too large) and the like from httplib itself get an error object.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.http_status = res.status;
        e.type = "invalid_request_error";
        if (res.status == 404) {
          e.message = absl::StrCat("no such endpoint: ", req.method, " ", req.path);
          e.code = "not_found";
        } else if (res.status == 413) {
          e.message = "request body is too large (--http_max_body_bytes)";
          e.code = "request_too_large";
        } else {
          e.message = absl::StrCat("http error ", res.status);
          if (res.status >= 500) e.type = "server_error";
        }
        res.set_content(ErrorBody(e), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  // Labelled by route pattern, never by the raw path: a client choosing paths (or model ids)
  // must not grow the label set. The status is one httplib or a handler set.
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.requests->WithLabels({std::string(RouteLabel(req)), absl::StrCat(res.status)})
        .Increment();
  });
}

void HttpFront::HandleModels(const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<std::string> tenant = service_->Authenticate(Caller(req), nullptr);
  if (!tenant.ok()) {
    Reply(res, tenant.status());
    return;
  }
  json model = {{"id", service_->model_id()},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "pdserve"},
                {"max_model_len", model_->config().seq_len}};
  if (req.matches.size() > 1) {
    if (req.matches[1] != service_->model_id()) {
      Reply(res, WithParam(absl::NotFoundError(absl::StrCat("model '", std::string(req.matches[1]),
                                                            "' does not exist")),
                           "model"));
      return;
    }
    res.set_content(model.dump(), "application/json");
    return;
  }
  json list = {{"object", "list"}, {"data", json::array()}};
  if (service_->ServesModel()) list["data"].push_back(model);
  res.set_content(list.dump(), "application/json");
}

absl::StatusOr<v1::GenerateRequest> HttpFront::ToGenerateRequest(const OpenAiRequest& r,
                                                                 std::string* echo) const {
  v1::GenerateRequest g;
  g.set_model(r.model);
  *g.mutable_sampling() = r.sampling;
  if (r.logprobs >= 0) g.mutable_sampling()->set_logprobs(static_cast<uint32_t>(r.logprobs));
  if (r.cache_salt.has_value()) g.set_cache_salt(*r.cache_salt);
  if (r.endpoint == Endpoint::kCompletions) {
    if (r.prompt_text.has_value()) {
      g.set_text(*r.prompt_text);
      if (r.echo) *echo = *r.prompt_text;
    } else {
      g.mutable_token_ids()->mutable_ids()->Add(r.prompt_ids->begin(), r.prompt_ids->end());
      if (r.echo) {
        absl::StatusOr<std::string> text = model_->tokenizer().Decode(*r.prompt_ids);
        if (!text.ok()) return WithParam(text.status(), "prompt");
        *echo = *std::move(text);
      }
    }
    return g;
  }
  if (chat_template_ == nullptr) {
    return WithParam(absl::InvalidArgumentError(
                         "this model has no chat template (no chat_template in its "
                         "tokenizer_config.json): use /v1/completions, or start pd-router with "
                         "--chat_template FILE"),
                     "messages");
  }
  std::vector<chat::ChatMessage> messages;
  messages.reserve(r.messages.size());
  for (const ChatMessage& m : r.messages) messages.push_back({m.role, m.content});
  absl::StatusOr<std::string> text = chat_template_->Render(messages, r.add_generation_prompt);
  if (!text.ok()) {
    // Too many renders at once: 503, retry; any other failure is the request's (400).
    if (absl::IsUnavailable(text.status())) return text.status();
    return WithParam(
        absl::InvalidArgumentError(absl::StrCat("chat template: ", text.status().message())),
        "messages");
  }
  // A template that writes the BOS token itself gets no second one from the tokenizer.
  const bool add_bos = model_->add_bos() && chat_template_->bos_token().empty();
  absl::StatusOr<std::vector<uint32_t>> ids = model_->tokenizer().Encode(*text, add_bos, false);
  if (!ids.ok()) return WithParam(ids.status(), "messages");
  g.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  return g;
}

void HttpFront::HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                               httplib::Response& res) {
  if (absl::Status ok = Admit(); !ok.ok()) {
    Reply(res, ok);
    return;
  }
  // Authentication first, as OpenAI does: a client without a key learns nothing else.
  absl::StatusOr<std::string> tenant = service_->Authenticate(Caller(req), nullptr);
  if (!tenant.ok()) {
    Reply(res, tenant.status());
    return;
  }
  absl::StatusOr<OpenAiRequest> parsed = ParseRequest(endpoint, req.body, config_.limits);
  if (!parsed.ok()) {
    Reply(res, parsed.status());
    return;
  }
  const OpenAiRequest& r = *parsed;
  std::string echo;
  absl::StatusOr<v1::GenerateRequest> g = ToGenerateRequest(r, &echo);
  if (!g.ok()) {
    Reply(res, g.status());
    return;
  }
  g->set_client_request_id(Header(req, "X-Request-Id"));
  auto st = std::make_shared<HttpStream>(live_.get());
  absl::StatusOr<std::unique_ptr<RouterStream>> stream =
      service_->NewStream(*g, Caller(req), absl::InfiniteFuture(), &st->sink);
  if (!stream.ok()) {
    Reply(res, stream.status());
    return;
  }
  st->stream = *std::move(stream);
  live_->Add(st.get());
  st->stream->Start();
  // The first message (or an early end) decides the HTTP status.
  v1::GenerateResponse first;
  st->NextWhileClientThere(&first);
  if (st->ended || st->cancelled) {
    // Ended before any output, or the client is gone (nobody reads this answer; the
    // destructor acknowledges the message and waits for the cancelled stream's end).
    Reply(res, !st->end_status.ok() ? st->end_status
               : st->ended          ? absl::InternalError("the stream ended before any output")
                                    : absl::CancelledError("the client closed the connection"));
    return;
  }
  const std::string id =
      absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", first.request_id());
  TokenBytesFn token_bytes;
  if (r.logprobs >= 0) {
    token_bytes = [tokenizer = &model_->tokenizer()](uint32_t prev, uint32_t token) {
      absl::StatusOr<std::string> bytes = tokenizer->DecodeToken(prev, token);
      return bytes.ok() ? *std::move(bytes) : std::string();
    };
  }
  st->builder.emplace(r, id, absl::ToUnixSeconds(absl::Now()), service_->model_id(),
                      std::move(echo), std::move(token_bytes));
  if (!r.stream) {
    st->builder->Add(first);
    st->Ack(true);
    v1::GenerateResponse msg;
    while (!st->ended) {
      if (st->NextWhileClientThere(&msg) == BlockingSink::Next::kMessage) {
        st->builder->Add(msg);
        st->Ack(!st->cancelled);
      }
    }
    if (!st->end_status.ok()) {
      Reply(res, st->end_status);
      return;
    }
    res.set_content(st->builder->Body(), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The first message stays unacknowledged until its events are written (they may be empty:
  // its token's text can be held back, e.g. the first byte of a multi-byte character).
  st->first_events = st->builder->StreamEvents(first);
  res.set_chunked_content_provider(
      "text/event-stream", [st](size_t /*offset*/, httplib::DataSink& sink) {
        if (st->first_events.has_value()) {
          const std::string events = *std::move(st->first_events);
          st->first_events.reset();
          const bool ok = events.empty() || sink.write(events.data(), events.size());
          st->Ack(ok);
          return ok;
        }
        if (st->ended) {
          sink.done();
          return true;
        }
        v1::GenerateResponse msg;
        switch (st->Next(kStreamPing, &msg)) {
          case BlockingSink::Next::kMessage: {
            const std::string events = st->builder->StreamEvents(msg);
            const bool ok = events.empty() || sink.write(events.data(), events.size());
            st->Ack(ok);
            return ok;
          }
          case BlockingSink::Next::kTimeout: {
            static constexpr char kPing[] = ": ping\n\n";
            return sink.write(kPing, sizeof(kPing) - 1);
          }
          case BlockingSink::Next::kEnd: {
            std::string tail;
            if (!st->end_status.ok()) {
              tail = ResponseBuilder::ErrorEvent(ErrorFromStatus(st->end_status));
            }
            tail += ResponseBuilder::DoneEvent();
            const bool ok = sink.write(tail.data(), tail.size());
            if (ok) sink.done();
            return ok;
          }
        }
        return false;
      });
}

}  // namespace pd::router::openai
