#include "loadtest/testing/fake_openai_server.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace pd::loadtest::testing {
namespace {

using json = nlohmann::json;

// Worker threads of the server: one per stream in flight, so tests may hold many open.
constexpr size_t kServerThreads = 64;

void SetError(httplib::Response& res, int status, const std::string& message,
              const std::string& type) {
  res.status = status;
  json j = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
  res.set_content(j.dump(), "application/json");
}

}  // namespace

class FakeOpenAiServer::Impl {
 public:
  explicit Impl(FakeOpenAiServerOptions options) : options_(std::move(options)) {}

  absl::Status Start() {
    server_.new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
    server_.set_keep_alive_timeout(1);  // bounds Shutdown's wait on idle connections
    server_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!Authorized(req, res)) {
        return;
      }
      json m = {{"id", options_.model_id}, {"object", "model"}, {"owned_by", "pdserve-test"}};
      if (options_.max_model_len > 0) {
        m["max_model_len"] = options_.max_model_len;
      }
      res.set_content(json({{"object", "list"}, {"data", json::array({m})}}).dump(),
                      "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(req, res, /*chat=*/false);
    });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   Generate(req, res, /*chat=*/true);
                 });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) {
      return absl::UnavailableError("fake openai server: cannot bind 127.0.0.1:0");
    }
    // The socket listens already (connections wait in its backlog until accepted).
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return absl::OkStatus();
  }

  void Shutdown() {
    if (shutdown_.HasBeenNotified()) {
      return;
    }
    shutdown_.Notify();
    server_.stop();
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  int port() const { return port_; }

  FakeOpenAiServerStats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  bool WaitForActiveStreams(int64_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stats_.active_streams >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  bool Authorized(const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() ||
        req.get_header_value("Authorization") == absl::StrCat("Bearer ", options_.api_key)) {
      return true;
    }
    SetError(res, 401, "invalid api key", "authentication_error");
    return false;
  }

  // One streamed event ("data: ...") plus, optionally, a comment line before it.
  std::string Event(const std::string& data) const {
    const char* eol = options_.crlf ? "\r\n" : "\n";
    std::string out = options_.comments ? absl::StrCat(": ping", eol) : "";
    absl::StrAppend(&out, "data: ", data, eol, eol);
    return out;
  }

  void Generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    int64_t n = 0;
    {
      absl::MutexLock lock(&mu_);
      n = ++stats_.requests;
      stats_.last_body = req.body;
    }
    if (!Authorized(req, res)) {
      return;
    }
    const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      return SetError(res, 400, "body is not a JSON object", "invalid_request_error");
    }
    if (body.value("model", "") != options_.model_id) {
      return SetError(res, 404, absl::StrCat("model '", body.value("model", ""), "' not found"),
                      "invalid_request_error");
    }
    if (body.value("stream", false) != true || !body.contains("stream_options") ||
        body["stream_options"].value("include_usage", false) != true) {
      return SetError(res, 400, "stream and stream_options.include_usage must be true",
                      "invalid_request_error");
    }
    int64_t prompt_tokens = 0;
    if (chat) {
      const json& m = body.value("messages", json::array());
      if (!m.is_array() || m.size() != 1 || !m[0].is_object() || !m[0].contains("content") ||
          !m[0]["content"].is_string()) {
        return SetError(res, 400, "messages must hold one user message", "invalid_request_error");
      }
      prompt_tokens = static_cast<int64_t>(m[0]["content"].get<std::string>().size());
    } else {
      const json& p = body.value("prompt", json());
      if (!p.is_array() || p.empty()) {
        return SetError(res, 400, "prompt must be a token-id array", "invalid_request_error");
      }
      prompt_tokens = static_cast<int64_t>(p.size());
    }
    const int64_t max_tokens = body.value("max_tokens", int64_t{16});
    const bool fail = options_.fail_every_n > 0 && n % options_.fail_every_n == 0;
    if (fail && options_.fail_mode == "http") {
      return SetError(res, options_.fail_http_status, "injected failure",
                      options_.fail_http_status == 429 ? "rate_limit_error" : "server_error");
    }
    const std::string fail_mode = fail ? options_.fail_mode : "";
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, chat, max_tokens, prompt_tokens, fail_mode](size_t, httplib::DataSink& sink) {
          const bool ok = Stream(sink, chat, max_tokens, prompt_tokens, fail_mode);
          if (ok) {
            sink.done();
          }
          return ok;
        });
  }

  // Writes the whole stream; false when the client went away (or the server shuts down).
  bool Stream(httplib::DataSink& sink, bool chat, int64_t max_tokens, int64_t prompt_tokens,
              const std::string& fail_mode) {
    {
      absl::MutexLock lock(&mu_);
      ++stats_.active_streams;
      stats_.max_active_streams = std::max(stats_.max_active_streams, stats_.active_streams);
    }
    const bool ok = WriteEvents(sink, chat, max_tokens, prompt_tokens, fail_mode);
    absl::MutexLock lock(&mu_);
    --stats_.active_streams;
    ++(ok ? stats_.completed : stats_.aborted);
    return ok;
  }

  bool WriteEvents(httplib::DataSink& sink, bool chat, int64_t max_tokens, int64_t prompt_tokens,
                   const std::string& fail_mode) {
    auto write = [&](const std::string& data) {
      const std::string e = Event(data);
      return !shutdown_.HasBeenNotified() && sink.write(e.data(), e.size());
    };
    auto wait = [&](absl::Duration d) {
      return d <= absl::ZeroDuration() || !shutdown_.WaitForNotificationWithTimeout(d);
    };
    const char* object = chat ? "chat.completion.chunk" : "text_completion";
    auto chunk = [&](const json& choice) {
      return json({{"id", "cmpl-fake"},
                   {"object", object},
                   {"model", options_.model_id},
                   {"choices", json::array({choice})}})
          .dump();
    };
    if (chat && !write(chunk({{"index", 0},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"finish_reason", nullptr}}))) {
      return false;
    }
    int64_t sent = 0;
    for (int chunk_index = 0; sent < max_tokens; ++chunk_index) {
      if (!wait(chunk_index == 0 ? options_.first_token_delay : options_.token_delay)) {
        return false;
      }
      if (chunk_index == 1 && fail_mode == "malformed") {
        return write("{\"choices\": [");  // then the stream ends
      }
      if (chunk_index == 1 && fail_mode == "stream_error") {
        json e = {
            {"error",
             {{"message", "injected stream error"}, {"type", "server_error"}, {"code", 500}}}};
        return write(e.dump());
      }
      const int64_t k = std::min<int64_t>(options_.tokens_per_chunk, max_tokens - sent);
      sent += k;
      std::string text;
      for (int64_t i = 0; i < k; ++i) {
        text += "t ";
      }
      const json finish = sent == max_tokens ? json("length") : json(nullptr);
      const json choice =
          chat ? json({{"index", 0}, {"delta", {{"content", text}}}, {"finish_reason", finish}})
               : json({{"index", 0}, {"text", text}, {"finish_reason", finish}});
      if (!write(chunk(choice))) {
        return false;
      }
    }
    json usage = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", max_tokens},
                  {"total_tokens", prompt_tokens + max_tokens},
                  {"prompt_tokens_details",
                   {{"cached_tokens", std::min(options_.cached_tokens, prompt_tokens)}}}};
    json last = {{"id", "cmpl-fake"},
                 {"object", object},
                 {"model", options_.model_id},
                 {"choices", json::array()},
                 {"usage", usage}};
    return write(last.dump()) && write("[DONE]");
  }

  const FakeOpenAiServerOptions options_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  absl::Notification shutdown_;
  mutable absl::Mutex mu_;
  FakeOpenAiServerStats stats_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<FakeOpenAiServer>> FakeOpenAiServer::Start(
    FakeOpenAiServerOptions options) {
  if (options.tokens_per_chunk < 1) {
    return absl::InvalidArgumentError("tokens_per_chunk must be >= 1");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Start(); !s.ok()) {
    return s;
  }
  return std::unique_ptr<FakeOpenAiServer>(new FakeOpenAiServer(std::move(impl)));
}

FakeOpenAiServer::FakeOpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FakeOpenAiServer::~FakeOpenAiServer() { Shutdown(); }

int FakeOpenAiServer::port() const { return impl_->port(); }

std::string FakeOpenAiServer::url() const { return absl::StrCat("http://127.0.0.1:", port()); }

FakeOpenAiServerStats FakeOpenAiServer::stats() const { return impl_->stats(); }

bool FakeOpenAiServer::WaitForActiveStreams(int64_t n, absl::Duration timeout) const {
  return impl_->WaitForActiveStreams(n, timeout);
}

void FakeOpenAiServer::Shutdown() { impl_->Shutdown(); }

}  // namespace pd::loadtest::testing
