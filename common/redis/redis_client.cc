#include "common/redis/redis_client.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::redis {

// ---- RedisConfig --------------------------------------------------------------------------------

namespace {

absl::Status CheckTimeout(absl::string_view field, absl::Duration value) {
  if (value < absl::Milliseconds(1) || value == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RedisConfig.", field, " must be finite and >= 1ms, got ", absl::FormatDuration(value)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RedisConfig::Validate() const {
  if (host.empty()) {
    return absl::InvalidArgumentError("RedisConfig.host must not be empty, got \"\"");
  }
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisConfig.port must be in [1, 65535], got ", port));
  }
  if (!username.empty() && password.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("RedisConfig.username \"", username,
                                                   "\" is set but RedisConfig.password is empty"));
  }
  if (db < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RedisConfig.db must be >= 0, got ", db));
  }
  PD_RETURN_IF_ERROR(CheckTimeout("connect_timeout", connect_timeout));
  PD_RETURN_IF_ERROR(CheckTimeout("command_timeout", command_timeout));
  if (reconnect_backoff_initial < absl::ZeroDuration() ||
      reconnect_backoff_initial == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RedisConfig.reconnect_backoff_initial must be finite and >= 0, got ",
                     absl::FormatDuration(reconnect_backoff_initial)));
  }
  if (reconnect_backoff_max < reconnect_backoff_initial ||
      reconnect_backoff_max == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RedisConfig.reconnect_backoff_max must be finite and >= reconnect_backoff_initial (",
        absl::FormatDuration(reconnect_backoff_initial), "), got ",
        absl::FormatDuration(reconnect_backoff_max)));
  }
  if (max_reconnect_attempts < 0 || max_reconnect_attempts > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RedisConfig.max_reconnect_attempts must be in [0, 100], got ", max_reconnect_attempts));
  }
  return absl::OkStatus();
}

std::string RedisConfig::Key(absl::string_view name) const {
  // "pdserve" and "pdserve:" both give "pdserve:blk:...", so the ACL key pattern the docs
  // recommend (~<prefix>:*) matches every key whatever the operator wrote.
  if (key_prefix.empty() || key_prefix.back() == ':') {
    return absl::StrCat(key_prefix, name);
  }
  return absl::StrCat(key_prefix, ":", name);
}

// ---- RedisReply ---------------------------------------------------------------------------------

RedisReply RedisReply::Integer(int64_t value) {
  RedisReply r;
  r.type = Type::kInteger;
  r.integer = value;
  return r;
}

RedisReply RedisReply::String(std::string value) {
  RedisReply r;
  r.type = Type::kString;
  r.str = std::move(value);
  return r;
}

RedisReply RedisReply::Status(std::string value) {
  RedisReply r;
  r.type = Type::kStatus;
  r.str = std::move(value);
  return r;
}

RedisReply RedisReply::Error(std::string message) {
  RedisReply r;
  r.type = Type::kError;
  r.str = std::move(message);
  return r;
}

RedisReply RedisReply::Array(std::vector<RedisReply> elements) {
  RedisReply r;
  r.type = Type::kArray;
  r.elements = std::move(elements);
  return r;
}

absl::Status RedisReply::ToStatus() const {
  return is_error() ? RedisErrorToStatus(str) : absl::OkStatus();
}

std::string RedisReply::DebugString() const {
  switch (type) {
    case Type::kNil:
      return "(nil)";
    case Type::kInteger:
      return absl::StrCat("(integer) ", integer);
    case Type::kString:
      return absl::StrCat("\"", absl::CHexEscape(str), "\"");
    case Type::kStatus:
      return absl::StrCat("(status) ", absl::CHexEscape(str));
    case Type::kError:
      return absl::StrCat("(error) ", absl::CHexEscape(str));
    case Type::kArray:
      return absl::StrCat("[",
                          absl::StrJoin(elements, ", ",
                                        [](std::string* out, const RedisReply& e) {
                                          absl::StrAppend(out, e.DebugString());
                                        }),
                          "]");
  }
  return "(unknown)";
}

bool operator==(const RedisReply& a, const RedisReply& b) {
  if (a.type != b.type) {
    return false;
  }
  switch (a.type) {
    case RedisReply::Type::kNil:
      return true;
    case RedisReply::Type::kInteger:
      return a.integer == b.integer;
    case RedisReply::Type::kString:
    case RedisReply::Type::kStatus:
    case RedisReply::Type::kError:
      return a.str == b.str;
    case RedisReply::Type::kArray:
      return a.elements == b.elements;
  }
  return false;
}

absl::Status RedisErrorToStatus(absl::string_view error_message) {
  // Redis error replies start with an upper-case code word ("WRONGTYPE Operation ...").
  absl::string_view prefix = error_message.substr(0, error_message.find(' '));
  std::string message(error_message);
  if (prefix == "NOAUTH" || prefix == "WRONGPASS") {
    return absl::UnauthenticatedError(message);
  }
  if (prefix == "NOPERM") {
    return absl::PermissionDeniedError(message);
  }
  if (prefix == "WRONGTYPE" || prefix == "EXECABORT" || prefix == "NOSCRIPT") {
    return absl::FailedPreconditionError(message);
  }
  if (prefix == "OOM") {
    return absl::ResourceExhaustedError(message);
  }
  if (prefix == "LOADING" || prefix == "BUSY" || prefix == "TRYAGAIN" || prefix == "MASTERDOWN" ||
      prefix == "CLUSTERDOWN") {
    return absl::UnavailableError(message);
  }
  if (prefix == "MOVED" || prefix == "ASK") {
    return absl::UnimplementedError(message);
  }
  return absl::InvalidArgumentError(message);
}

// ---- Connection ---------------------------------------------------------------------------------

namespace {

// hiredis writes with write(2), which raises SIGPIPE when the server has reset the connection;
// the default action would kill the process. This blocks SIGPIPE in the calling thread for the
// scope (write-generated SIGPIPE is thread-directed) and discards one raised meanwhile, without
// touching process-wide signal dispositions.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const int saved_errno = errno;
        const timespec zero{0, 0};
        sigtimedwait(&sigpipe_, nullptr, &zero);
        errno = saved_errno;
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t sigpipe_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

RedisReply ConvertReply(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_STRING:
      return RedisReply::String(std::string(r.str, r.len));
    case REDIS_REPLY_STATUS:
      return RedisReply::Status(std::string(r.str, r.len));
    case REDIS_REPLY_ERROR:
      return RedisReply::Error(std::string(r.str, r.len));
    case REDIS_REPLY_INTEGER:
      return RedisReply::Integer(r.integer);
    case REDIS_REPLY_ARRAY: {
      std::vector<RedisReply> elements;
      elements.reserve(r.elements);
      for (size_t i = 0; i < r.elements; ++i) {
        elements.push_back(ConvertReply(*r.element[i]));
      }
      return RedisReply::Array(std::move(elements));
    }
    case REDIS_REPLY_NIL:
    default:  // hiredis 0.14 speaks RESP2 only: the six types above are all it produces
      return RedisReply::Nil();
  }
}

// "Connection refused" -> "connection refused" (our messages are lower-case).
std::string LowerFirst(const char* text) {
  std::string s(text);
  if (!s.empty()) {
    s[0] = absl::ascii_tolower(static_cast<unsigned char>(s[0]));
  }
  return s;
}

// The command word for messages: never the arguments (keys and values may be large or binary).
std::string CommandName(const std::vector<std::string>& args) {
  if (args.empty()) {
    return "(empty)";
  }
  return absl::CHexEscape(absl::string_view(args[0]).substr(0, 32));
}

void Prepare(const std::vector<std::string>& args, std::vector<const char*>& argv,
             std::vector<size_t>& argv_len) {
  argv.clear();
  argv_len.clear();
  for (const std::string& a : args) {
    argv.push_back(a.data());
    argv_len.push_back(a.size());
  }
}

}  // namespace

namespace redis_internal {

// One hiredis connection (blocking mode, socket timeouts set). Errors carry no address prefix:
// RedisClient adds it. Thread-compatible; RedisClient serializes access.
class Connection {
 public:
  // Connects and runs the handshake (AUTH, SELECT, PING). Errors: see RedisClient::Connect.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const RedisConfig& config) {
    ContextPtr ctx(redisConnectWithTimeout(config.host.c_str(), config.port,
                                           absl::ToTimeval(config.connect_timeout)));
    if (ctx == nullptr) {
      return absl::ResourceExhaustedError("connect: cannot allocate a hiredis context");
    }
    if (ctx->err != 0) {
      return absl::UnavailableError(absl::StrCat("connect: ", LowerFirst(ctx->errstr)));
    }
    if (redisSetTimeout(ctx.get(), absl::ToTimeval(config.command_timeout)) != REDIS_OK) {
      return absl::InternalError(absl::StrCat("setting socket timeout: ", LowerFirst(ctx->errstr)));
    }
    // Detects a silently vanished server on an idle connection; failure only loses that.
    (void)redisEnableKeepAlive(ctx.get());

    auto conn = std::unique_ptr<Connection>(new Connection(std::move(ctx), config));
    PD_RETURN_IF_ERROR(conn->Handshake(config));
    return conn;
  }

  // The reply to `args`, which may be an error reply. Non-OK only for I/O-level failures, after
  // which broken() is true.
  absl::StatusOr<RedisReply> Execute(const std::vector<std::string>& args) {
    Prepare(args, argv_, argv_len_);
    void* raw = redisCommandArgv(ctx_.get(), static_cast<int>(argv_.size()), argv_.data(),
                                 argv_len_.data());
    if (raw == nullptr) {
      return IoError(CommandName(args));
    }
    ReplyPtr reply(static_cast<redisReply*>(raw));
    return ConvertReply(*reply);
  }

  // Replies to `commands`, in order; error replies are elements. Non-OK as Execute.
  absl::StatusOr<std::vector<RedisReply>> ExecutePipeline(
      const std::vector<std::vector<std::string>>& commands) {
    for (const std::vector<std::string>& args : commands) {
      Prepare(args, argv_, argv_len_);
      if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv_.size()), argv_.data(),
                                 argv_len_.data()) != REDIS_OK) {
        return IoError("pipeline");
      }
    }
    std::vector<RedisReply> replies;
    replies.reserve(commands.size());
    for (size_t i = 0; i < commands.size(); ++i) {
      void* raw = nullptr;
      // The first call flushes every appended command, then each call reads one reply.
      if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) {
        return IoError(absl::StrCat("pipeline (reply ", i, " of ", commands.size(), ", ",
                                    CommandName(commands[i]), ")"));
      }
      ReplyPtr reply(static_cast<redisReply*>(raw));
      replies.push_back(ConvertReply(*reply));
    }
    return replies;
  }

  // True after an I/O failure: the stream position is unknown, the connection must be dropped.
  bool broken() const { return broken_; }

 private:
  Connection(ContextPtr ctx, const RedisConfig& config)
      : ctx_(std::move(ctx)), command_timeout_(config.command_timeout) {}

  absl::Status Handshake(const RedisConfig& config) {
    if (!config.password.empty()) {
      std::vector<std::string> auth = {"AUTH"};
      if (!config.username.empty()) {
        auth.push_back(config.username);
      }
      auth.push_back(config.password);
      PD_ASSIGN_OR_RETURN(RedisReply reply, Execute(auth));
      if (reply.is_error()) {
        return absl::UnauthenticatedError(
            absl::StrCat("AUTH as user \"", config.username.empty() ? "default" : config.username,
                         "\" rejected: ", reply.str));
      }
    }
    if (config.db != 0) {
      PD_ASSIGN_OR_RETURN(RedisReply reply, Execute({"SELECT", absl::StrCat(config.db)}));
      if (reply.is_error()) {
        absl::Status s = RedisErrorToStatus(reply.str);
        return absl::Status(s.code(), absl::StrCat("SELECT ", config.db, ": ", reply.str));
      }
    }
    PD_ASSIGN_OR_RETURN(RedisReply reply, Execute({"PING"}));
    if (reply.is_error()) {
      absl::Status s = RedisErrorToStatus(reply.str);
      if (absl::IsUnauthenticated(s) && config.password.empty()) {
        return absl::UnauthenticatedError(
            absl::StrCat("server requires AUTH but RedisConfig.password is empty: ", reply.str));
      }
      return absl::Status(s.code(), absl::StrCat("PING: ", reply.str));
    }
    return absl::OkStatus();
  }

  // Status for the context's current error; marks the connection broken.
  absl::Status IoError(absl::string_view what) {
    const int saved_errno = errno;  // before anything else can clobber it
    broken_ = true;
    switch (ctx_->err) {
      case REDIS_ERR_IO:
        // A blocking socket with SO_RCVTIMEO/SO_SNDTIMEO reports an expired timeout as EAGAIN.
        if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
            std::strcmp(ctx_->errstr, std::strerror(EAGAIN)) == 0) {
          return absl::DeadlineExceededError(absl::StrCat(what,
                                                          ": no progress within command_timeout ",
                                                          absl::FormatDuration(command_timeout_)));
        }
        return absl::UnavailableError(absl::StrCat(what, ": ", LowerFirst(ctx_->errstr)));
      case REDIS_ERR_EOF:
        return absl::UnavailableError(absl::StrCat(what, ": ", LowerFirst(ctx_->errstr)));
      case REDIS_ERR_PROTOCOL:
        return absl::InternalError(
            absl::StrCat(what, ": protocol error: ", LowerFirst(ctx_->errstr)));
      case REDIS_ERR_OOM:
        return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
      default:
        return absl::UnavailableError(absl::StrCat(what, ": ", LowerFirst(ctx_->errstr)));
    }
  }

  ContextPtr ctx_;
  const absl::Duration command_timeout_;
  bool broken_ = false;
  // Scratch for argv conversion, reused across calls.
  std::vector<const char*> argv_;
  std::vector<size_t> argv_len_;
};

}  // namespace redis_internal

// ---- RedisClient --------------------------------------------------------------------------------

namespace {

// Connect failures worth another attempt: the server may be restarting or briefly overloaded.
// Auth and config failures (Unauthenticated, PermissionDenied, InvalidArgument) are not.
bool IsTransientConnectFailure(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsInternal(s) ||
         absl::IsResourceExhausted(s);
}

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

struct RedisClient::CallTally {
  uint64_t num_commands = 0;
  uint64_t num_error_replies = 0;
  uint64_t num_reconnects = 0;
  uint64_t num_connect_failures = 0;
  bool failed = false;
  absl::Time start = absl::Now();
};

RedisClient::RedisClient(RedisConfig config, std::unique_ptr<redis_internal::Connection> connection)
    : config_(std::move(config)),
      address_(absl::StrCat(config_.host, ":", config_.port)),
      connection_(std::move(connection)) {}

RedisClient::~RedisClient() = default;

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(RedisConfig config) {
  PD_RETURN_IF_ERROR(config.Validate());
  const std::string address = absl::StrCat(config.host, ":", config.port);
  absl::StatusOr<std::unique_ptr<redis_internal::Connection>> conn;
  {
    ScopedSigpipeBlock no_sigpipe;
    conn = redis_internal::Connection::Open(config);
  }
  if (!conn.ok()) {
    return WithPrefix(absl::StrCat("redis ", address, ": "), conn.status());
  }
  LOG(INFO) << "redis: connected to " << address << " db=" << config.db
            << (config.password.empty() ? "" : " (authenticated)");
  return std::unique_ptr<RedisClient>(new RedisClient(std::move(config), *std::move(conn)));
}

template <typename T, typename Fn>
absl::StatusOr<T> RedisClient::RunWithRetry(absl::string_view command_name, CallTally& tally,
                                            Fn attempt) {
  ScopedSigpipeBlock no_sigpipe;
  const std::string prefix = absl::StrCat("redis ", address_, ": ");
  absl::Duration backoff = config_.reconnect_backoff_initial;
  absl::Status last_error;
  int num_tries = 0;
  int num_retries = 0;
  while (true) {
    ++num_tries;
    if (connection_ == nullptr) {
      // Dropped by an earlier failure: reconnect before (re)sending.
      absl::StatusOr<std::unique_ptr<redis_internal::Connection>> conn =
          redis_internal::Connection::Open(config_);
      if (conn.ok()) {
        connection_ = *std::move(conn);
        ++tally.num_reconnects;
        LOG(INFO) << "redis: reconnected to " << address_;
      } else {
        ++tally.num_connect_failures;
        VLOG(1) << "redis: reconnect to " << address_ << " failed: " << conn.status();
        if (!IsTransientConnectFailure(conn.status())) {
          return WithPrefix(prefix, conn.status());
        }
        last_error = conn.status();
      }
    }
    if (connection_ != nullptr) {
      absl::StatusOr<T> result = attempt(*connection_);
      if (result.ok() || !connection_->broken()) {
        return result;
      }
      last_error = result.status();
      connection_.reset();
      LOG(WARNING) << "redis: connection to " << address_ << " dropped: " << last_error;
      if (absl::IsDeadlineExceeded(last_error)) {
        // The caller's time budget is spent; the next call reconnects.
        return WithPrefix(prefix, last_error);
      }
    }
    if (num_retries >= config_.max_reconnect_attempts) {
      break;
    }
    ++num_retries;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, config_.reconnect_backoff_max);
  }
  return absl::UnavailableError(absl::StrCat(prefix, command_name, ": server unavailable after ",
                                             num_tries, num_tries == 1 ? " try" : " tries",
                                             "; last error: ", last_error.message()));
}

absl::StatusOr<RedisReply> RedisClient::Command(std::vector<std::string> args) {
  CallTally tally;
  tally.num_commands = 1;
  absl::StatusOr<RedisReply> result;
  const std::string name = CommandName(args);
  if (args.empty()) {
    result = absl::InvalidArgumentError(
        absl::StrCat("redis ", address_, ": Command called with no arguments"));
  } else {
    absl::MutexLock lock(&mu_);
    result = RunWithRetry<RedisReply>(
        name, tally, [&args](redis_internal::Connection& c) { return c.Execute(args); });
  }
  if (result.ok() && result->is_error()) {
    ++tally.num_error_replies;
    result = WithPrefix(absl::StrCat("redis ", address_, ": ", name, ": "), result->ToStatus());
  }
  tally.failed = !result.ok();
  RecordCall(tally);
  return result;
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  CallTally tally;
  tally.num_commands = commands.size();
  absl::StatusOr<std::vector<RedisReply>> result;
  auto empty = std::find_if(commands.begin(), commands.end(),
                            [](const std::vector<std::string>& c) { return c.empty(); });
  if (empty != commands.end()) {
    result = absl::InvalidArgumentError(absl::StrCat("redis ", address_, ": pipeline command ",
                                                     empty - commands.begin(), " of ",
                                                     commands.size(), " is empty"));
  } else if (commands.empty()) {
    result = std::vector<RedisReply>();
  } else {
    absl::MutexLock lock(&mu_);
    result = RunWithRetry<std::vector<RedisReply>>(
        absl::StrCat("pipeline of ", commands.size()), tally,
        [&commands](redis_internal::Connection& c) { return c.ExecutePipeline(commands); });
  }
  if (result.ok()) {
    tally.num_error_replies = std::count_if(result->begin(), result->end(),
                                            [](const RedisReply& r) { return r.is_error(); });
  }
  tally.failed = !result.ok();
  RecordCall(tally);
  return result;
}

void RedisClient::RecordCall(const CallTally& tally) {
  const absl::Duration latency = absl::Now() - tally.start;
  absl::MutexLock lock(&stats_mu_);
  ++stats_.num_calls;
  stats_.num_commands += tally.num_commands;
  stats_.num_error_replies += tally.num_error_replies;
  stats_.num_reconnects += tally.num_reconnects;
  stats_.num_connect_failures += tally.num_connect_failures;
  stats_.num_failed_calls += tally.failed ? 1 : 0;
  stats_.total_call_latency += latency;
}

RedisClientStats RedisClient::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

}  // namespace pd::redis
