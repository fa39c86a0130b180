#include "services/router/openai/http_front.h"

#include <httplib.h>
#include <sys/stat.h>

#include <fstream>
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
#include "services/router/openai/http_connections.h"
#include "services/router/openai/openai_response.h"
#include "services/router/router_stream.h"

namespace pd::router::openai {

namespace v1 = pdserve::v1;

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
  if (max_open_connections < max_connections) {
    return absl::InvalidArgumentError(
        "--http_max_open_connections must be at least --http_max_connections");
  }
  if (max_connections_per_client < 0) {
    return absl::InvalidArgumentError(
        "--http_max_connections_per_client must be 0 (no cap) or more");
  }
  if (idle_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_idle_timeout must be at least 1s");
  }
  if (header_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_header_timeout must be at least 1s");
  }
  if (body_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_body_timeout must be at least 1s");
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
  HttpConnectionsConfig c;
  c.address = config.address;
  c.tls = config.tls;
  c.max_body_bytes = config.max_body_bytes;
  c.max_connections = config.max_connections;
  c.max_open_connections = config.max_open_connections;
  c.max_connections_per_client = config.max_connections_per_client;
  c.idle_timeout = config.idle_timeout;
  c.header_timeout = config.header_timeout;
  c.body_timeout = config.body_timeout;
  PD_ASSIGN_OR_RETURN(f->connections_, HttpConnections::Create(c, registry));
  f->Route();
  f->connections_->Start();
  LOG(INFO) << "http: OpenAI API on " << config.address.host << ":" << f->connections_->port()
            << (config.tls.enabled() ? " (tls)" : " (plaintext)");
  return f;
}

HttpFront::~HttpFront() { Stop(); }

int HttpFront::port() const { return connections_->port(); }

void HttpFront::Drain(absl::Time deadline) {
  draining_ = true;
  live_->WaitIdle(deadline);
  Stop();
}

void HttpFront::Stop() {
  if (stopped_.exchange(true) || connections_ == nullptr) return;
  draining_ = true;
  connections_->Shutdown();  // no new connections; idle ones close now
  live_->CancelAll();        // the worker threads wait on their streams' ends
  connections_->Stop();
}

absl::Status HttpFront::Admit() const {
  if (draining_) {
    return absl::UnavailableError("router is draining; retry on another router");
  }
  return absl::OkStatus();
}

void HttpFront::Reply(httplib::Response& res, const absl::Status& status) {
  SetError(res, ErrorFromStatus(status));
}

void HttpFront::Route() {
  httplib::Server& s = connections_->server();
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
