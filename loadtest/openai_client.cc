#include "loadtest/openai_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log/log.h"

namespace pd::loadtest {
namespace {

// How often the reaper looks for cancelled and overdue requests while any is running.
constexpr absl::Duration kReaperPeriod = absl::Milliseconds(10);
// Largest error body kept for the message.
constexpr size_t kMaxErrorBody = 4096;

std::chrono::microseconds ToChronoOr(absl::Duration d, absl::Duration fallback) {
  return std::chrono::microseconds(
      absl::ToInt64Microseconds(d > absl::ZeroDuration() ? d : fallback));
}

std::unique_ptr<httplib::Client> MakeHttpClient(const OpenAiClientOptions& o,
                                                const OpenAiUrl& url) {
  auto c = std::make_unique<httplib::Client>(url.origin);
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);
  c->set_connection_timeout(ToChronoOr(o.connect_timeout, absl::Seconds(5)));
  // The reaper enforces request_timeout; httplib's per-read timeout (5 s by default) must not
  // end a stream that waits long for its first token. It gets a margin past the reaper's
  // deadline: at equal times the two raced, and a read error (UNAVAILABLE) could win over the
  // reaper's DEADLINE_EXCEEDED.
  const absl::Duration transport_timeout = o.request_timeout > absl::ZeroDuration()
                                               ? o.request_timeout + absl::Seconds(1)
                                               : absl::ZeroDuration();
  c->set_read_timeout(ToChronoOr(transport_timeout, absl::Hours(24)));
  c->set_write_timeout(ToChronoOr(transport_timeout, absl::Hours(24)));
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  if (!o.tls_ca.empty()) {
    c->set_ca_cert_path(o.tls_ca);
  }
  c->enable_server_certificate_verification(true);
#endif
  return c;
}

httplib::Headers RequestHeaders(const OpenAiClientOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) {
    h.emplace("Authorization", absl::StrCat("Bearer ", o.api_key));
  }
  return h;
}

absl::Status TransportError(httplib::Error e, absl::string_view origin) {
  const absl::StatusCode code = e == httplib::Error::ConnectionTimeout
                                    ? absl::StatusCode::kDeadlineExceeded
                                    : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(origin, ": ", httplib::to_string(e)));
}

}  // namespace

absl::Status OpenAiClientOptions::Validate() const {
  if (absl::StatusOr<OpenAiUrl> u = ParseOpenAiUrl("target", url); !u.ok()) {
    return u.status();
  }
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
  if (absl::StartsWith(url, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target ", url, " is https but this cpp-httplib was built without OpenSSL: use http"));
  }
#endif
  if (endpoint == OpenAiEndpoint::kChat && tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "--endpoint=chat sends text prompts: pass --tokenizer (the model's tokenizer.json or "
        "its directory) so that the workload's token ids can be decoded to text");
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenAiModel> ProbeOpenAiTarget(const OpenAiClientOptions& options,
                                              absl::string_view model) {
  absl::StatusOr<OpenAiUrl> url = ParseOpenAiUrl("target", options.url);
  if (!url.ok()) {
    return url.status();
  }
  std::unique_ptr<httplib::Client> client = MakeHttpClient(options, *url);
  client->set_read_timeout(ToChronoOr(options.connect_timeout, absl::Seconds(5)));
  const std::string path = absl::StrCat(url->api_root, "/models");
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  httplib::Result res = client->Get(path, RequestHeaders(options));
  // A server still starting refuses connections: retry those until the deadline.
  while (!res && res.error() == httplib::Error::Connection && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    res = client->Get(path, RequestHeaders(options));
  }
  if (!res) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to target ", options.url, " within ",
        absl::FormatDuration(options.connect_timeout),
        " (--connect_timeout): ", httplib::to_string(res.error()), ": is the server running?"));
  }
  if (res->status != 200) {
    const absl::Status s = HttpErrorStatus(res->status, res->body);
    return absl::Status(s.code(),
                        absl::StrCat("target ", options.url, ": GET ", path, ": ", s.message()));
  }
  absl::StatusOr<std::vector<OpenAiModel>> models = ParseModelList(res->body);
  if (!models.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target ", options.url, ": GET ", path, ": ", models.status().message()));
  }
  if (models->empty()) {
    return absl::UnavailableError(
        absl::StrCat("target ", options.url, " serves no model yet (GET ", path, " is empty)"));
  }
  if (model.empty()) {
    return models->front();
  }
  std::vector<std::string> ids;
  for (const OpenAiModel& m : *models) {
    if (m.id == model) {
      return m;
    }
    ids.push_back(m.id);
  }
  return absl::NotFoundError(absl::StrCat("target ", options.url, " does not serve model '", model,
                                          "' (it serves: ", absl::StrJoin(ids, ", "), ")"));
}

// One request: built by Prepare on the issuer thread, run by a worker thread.
class HttpRequest : public InFlight {
 public:
  HttpRequest(absl::Mutex* mu, RequestRecord record) : mu_(mu), record(std::move(record)) {}

  // Never blocks: the reaper shuts the connection down (within kReaperPeriod).
  void Cancel() override { cancelled.store(true, std::memory_order_relaxed); }

  absl::Mutex* const mu_;  // OpenAiClient::Impl::mu_
  RequestRecord record;
  std::vector<uint32_t> prompt;
  RequestParams params;
  int64_t deadline_ns = 0;  // on the sink's clock; 0 = none
  // Relaxed: read by the worker and the reaper, which only need to see it eventually.
  std::atomic<bool> cancelled{false};
  httplib::Client* client ABSL_GUARDED_BY(mu_) = nullptr;  // while running
  bool timed_out ABSL_GUARDED_BY(mu_) = false;
};

class OpenAiClient::Impl {
 public:
  Impl(RequestSink* sink, OpenAiClientOptions options, OpenAiUrl url)
      : sink_(sink),
        options_(std::move(options)),
        url_(std::move(url)),
        headers_(RequestHeaders(options_)),
        reaper_([this] { ReaperLoop(); }) {}

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      shutdown_ = true;
    }
    reaper_.join();  // first: it may hold pointers to the workers' clients
    for (std::thread& t : workers_) {
      t.join();
    }
  }

  absl::Mutex* mu() { return &mu_; }
  RequestSink* sink() const { return sink_; }
  const OpenAiClientOptions& options() const { return options_; }

  // Issuer thread.
  void Enqueue(HttpRequest* r) {
    bool spawn = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(r);
      spawn = static_cast<int64_t>(queue_.size()) > waiting_;
    }
    if (spawn) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  }

 private:
  void WorkerLoop() {
    std::unique_ptr<httplib::Client> client = MakeHttpClient(options_, url_);
    absl::MutexLock lock(&mu_);
    while (true) {
      ++waiting_;
      mu_.Await(absl::Condition(
          +[](Impl* self)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->shutdown_ || !self->queue_.empty(); },
          this));
      --waiting_;
      if (queue_.empty()) {
        return;  // shut down
      }
      HttpRequest* r = queue_.front();
      queue_.pop_front();
      mu_.Unlock();
      Run(r, client.get());
      mu_.Lock();
    }
  }

  void ReaperLoop() {
    absl::MutexLock lock(&mu_);
    while (!shutdown_) {
      if (running_.empty()) {
        mu_.Await(absl::Condition(
            +[](Impl* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return self->shutdown_ || !self->running_.empty();
            },
            this));
        continue;
      }
      mu_.AwaitWithTimeout(absl::Condition(&shutdown_), kReaperPeriod);
      const int64_t now = sink_->NowNs();
      std::vector<httplib::Client*> stop;
      for (HttpRequest* r : running_) {
        const bool overdue = r->deadline_ns > 0 && now >= r->deadline_ns;
        if (r->cancelled.load(std::memory_order_relaxed) || overdue) {
          r->timed_out = r->timed_out || overdue;
          stop.push_back(r->client);
        }
      }
      // stop() may wait for a connect in progress: never under mu_. Clients outlive this loop
      // (their workers are joined after the reaper); again every period until the request
      // ends, as a stop() before the request opened its socket is lost.
      mu_.Unlock();
      for (httplib::Client* c : stop) {
        c->stop();
      }
      mu_.Lock();
    }
  }

  void Run(HttpRequest* r, httplib::Client* client);

  RequestSink* const sink_;
  const OpenAiClientOptions options_;
  const OpenAiUrl url_;
  const httplib::Headers headers_;

  absl::Mutex mu_;
  std::deque<HttpRequest*> queue_ ABSL_GUARDED_BY(mu_);
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;  // idle workers
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<HttpRequest*> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;  // issuer thread and destructor only
  std::thread reaper_;                // last member: started after the others are ready
};

void OpenAiClient::Impl::Run(HttpRequest* r, httplib::Client* client) {
  RequestRecord& record = r->record;
  OpenAiStreamRecorder recorder(options_.endpoint, &record);
  OpenAiRequestFields fields;
  fields.endpoint = options_.endpoint;
  fields.model = options_.model;
  fields.max_tokens = record.max_tokens;
  fields.temperature = options_.temperature;
  fields.penalties = options_.penalties;
  fields.ignore_eos = options_.ignore_eos;
  fields.cache_salt = r->params.cache_salt;
  fields.json_schema = options_.json_schema;
  std::string text;
  absl::Status setup;
  if (options_.endpoint == OpenAiEndpoint::kChat) {
    absl::StatusOr<std::string> decoded = options_.tokenizer->Decode(r->prompt);
    if (decoded.ok()) {
      text = *std::move(decoded);
    } else {
      setup = decoded.status();
    }
    fields.prompt_text = text;
  } else {
    fields.prompt_ids = r->prompt;
  }
  if (r->cancelled.load(std::memory_order_relaxed)) {
    setup = absl::CancelledError("cancelled by the load test before it was sent");
  }
  if (!setup.ok()) {
    record.start_ns = sink_->NowNs();
    recorder.Finish(record.start_ns, setup);
    sink_->Finished(r, std::move(record));
    delete r;
    return;
  }
  httplib::Request req;
  req.method = "POST";
  req.path = absl::StrCat(url_.api_root, OpenAiEndpointPath(options_.endpoint));
  req.headers = headers_;
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  req.body = OpenAiRequestBody(fields);
  int status = 0;
  bool event_stream = false;
  std::string error_body;  // of a response that is not a 200 event stream
  bool stopped = false;    // the recorder stopped reading (error payload, malformed JSON)
  SseDecoder sse;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    event_stream = absl::StrContains(res.get_header_value("Content-Type"), "text/event-stream");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (r->cancelled.load(std::memory_order_relaxed)) {
      return false;
    }
    if (status != 200 || !event_stream) {
      error_body.append(data,
                        std::min(size, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
      return true;
    }
    if (recorder.done()) {
      return true;  // read to the end so that the connection can be reused
    }
    const int64_t now = sink_->NowNs();
    const int64_t before = recorder.content_chunks();
    sse.Feed(absl::string_view(data, size), [&](absl::string_view event) {
      stopped = !recorder.OnData(event, now) && !recorder.done();
      return !stopped && !recorder.done();
    });
    sink_->AddOutputTokens(recorder.content_chunks() - before);
    return !stopped;
  };
  if (options_.request_timeout > absl::ZeroDuration()) {
    r->deadline_ns = sink_->NowNs() + absl::ToInt64Nanoseconds(options_.request_timeout);
  }
  {
    absl::MutexLock lock(&mu_);
    r->client = client;
    running_.insert(r);
  }
  record.start_ns = sink_->NowNs();
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  client->send(req, res, error);
  const int64_t end_ns = sink_->NowNs();
  bool timed_out = false;
  {
    absl::MutexLock lock(&mu_);
    running_.erase(r);
    r->client = nullptr;
    timed_out = r->timed_out;
  }
  absl::Status transport;
  if (r->cancelled.load(std::memory_order_relaxed)) {
    transport = absl::CancelledError("cancelled by the load test");
  } else if (timed_out) {
    transport =
        absl::DeadlineExceededError(absl::StrCat("no complete response within --request_timeout ",
                                                 absl::FormatDuration(options_.request_timeout)));
  } else if (stopped) {
    transport = absl::OkStatus();  // the recorder holds the stream's error
  } else if (error != httplib::Error::Success) {
    transport = TransportError(error, url_.origin);
  } else if (status != 200) {
    transport = HttpErrorStatus(status, error_body);
  } else if (!event_stream) {
    transport = absl::InternalError(absl::StrCat("expected a text/event-stream response, got '",
                                                 res.get_header_value("Content-Type"),
                                                 "': ", error_body.substr(0, 200)));
  }
  recorder.Finish(end_ns, transport);
  sink_->Finished(r, std::move(record));
  delete r;
}

OpenAiClient::OpenAiClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiClient::~OpenAiClient() = default;

absl::StatusOr<std::unique_ptr<OpenAiClient>> OpenAiClient::Create(RequestSink* sink,
                                                                   OpenAiClientOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) {
    return s;
  }
  absl::StatusOr<OpenAiUrl> url = ParseOpenAiUrl("target", options.url);
  if (!url.ok()) {
    return url.status();
  }
  return std::unique_ptr<OpenAiClient>(
      new OpenAiClient(std::make_unique<Impl>(sink, std::move(options), *std::move(url))));
}

std::unique_ptr<InFlight> OpenAiClient::Prepare(RequestSpec& spec, bool move_prompt,
                                                const RequestParams& params, RequestRecord record) {
  record.itl_ns.reserve(static_cast<size_t>(std::max<int64_t>(record.max_tokens - 1, 0)));
  auto r = std::make_unique<HttpRequest>(impl_->mu(), std::move(record));
  if (move_prompt) {
    r->prompt = std::move(spec.prompt);
    spec.prompt.clear();
  } else {
    r->prompt = spec.prompt;
  }
  r->params = params;
  return r;
}

void OpenAiClient::Start(std::unique_ptr<InFlight> request) {
  impl_->Enqueue(static_cast<HttpRequest*>(request.release()));  // deleted by its worker
}

}  // namespace pd::loadtest
