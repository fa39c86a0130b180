// RedisClient: a synchronous Redis (RESP2) client over hiredis, with reconnect and timeouts.
//
// pdserve keeps its cluster-wide KV index in Redis (block hash -> {node, tier}); this is the one
// place that talks to it. hiredis types never appear here: replies are converted to RedisReply.
//
//   PD_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client, RedisClient::Connect(config));
//   PD_ASSIGN_OR_RETURN(RedisReply reply, client->Command({"GET", client->Key("blk:42")}));
//
// Error codes, used the same way by every call:
//   InvalidArgument     bad config or empty command (nothing was sent)
//   Unavailable         could not connect / connection lost and every reconnect attempt failed;
//                       the message names host:port and the last cause
//   DeadlineExceeded    a socket read or write waited longer than command_timeout
//   Unauthenticated     AUTH failed (wrong password / username) or the server requires AUTH
//   PermissionDenied    the server's ACL refused a command (NOPERM)
//   others              a Redis error reply to Command(), mapped by RedisErrorToStatus()
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pd::redis {

// Connection settings, passed by value to RedisClient::Connect. Defaults suit a local server.
struct RedisConfig {
  std::string host = "127.0.0.1";  // name or address; resolved at every (re)connect
  int port = 6379;                 // 1..65535
  // AUTH is sent after connecting when password is non-empty: `AUTH password`, or
  // `AUTH username password` (Redis 6 ACL user) when username is non-empty too.
  std::string username;
  std::string password;
  int db = 0;  // SELECTed after AUTH when non-zero; >= 0
  // Namespace of this cluster's keys; callers build keys with Key(). Any bytes; a ':' is put
  // between it and the key's name unless it is empty or ends with one.
  std::string key_prefix;

  absl::Duration connect_timeout = absl::Milliseconds(500);  // TCP connect, per attempt
  // Bounds each blocking socket read or write (SO_RCVTIMEO/SO_SNDTIMEO), so a call that waits
  // for many replies may take longer in total. Exceeding it gives DeadlineExceeded.
  absl::Duration command_timeout = absl::Seconds(1);
  // Sleep before the k-th reconnect attempt of one call: initial * 2^(k-1), capped at max.
  absl::Duration reconnect_backoff_initial = absl::Milliseconds(50);
  absl::Duration reconnect_backoff_max = absl::Seconds(2);
  // Reconnect attempts one Command/Pipeline call may make after the connection failed (or was
  // already down) before it returns Unavailable. 0 = never reconnect within a call.
  int max_reconnect_attempts = 3;

  // OK, or InvalidArgument naming the first bad field and its value.
  absl::Status Validate() const;

  // key_prefix + [":"] + name: the full Redis key for `name` in this cluster's namespace
  // ("pdserve" or "pdserve:" + "nodes" = "pdserve:nodes").
  std::string Key(absl::string_view name) const;
};

// One RESP2 reply. A plain value type: copyable, comparable, no hiredis types.
struct RedisReply {
  enum class Type {
    kNil,      // nil bulk string or nil array (e.g. GET of a missing key)
    kInteger,  // `integer`
    kString,   // bulk string in `str` (binary-safe)
    kStatus,   // simple string in `str`, e.g. "OK", "PONG"
    kError,    // error reply in `str`, e.g. "WRONGTYPE Operation against a key ..."
    kArray,    // `elements` (may be nested)
  };

  Type type = Type::kNil;
  int64_t integer = 0;
  std::string str;
  std::vector<RedisReply> elements;

  static RedisReply Nil() { return RedisReply(); }
  static RedisReply Integer(int64_t value);
  static RedisReply String(std::string value);
  static RedisReply Status(std::string value);
  static RedisReply Error(std::string message);
  static RedisReply Array(std::vector<RedisReply> elements);

  bool is_nil() const { return type == Type::kNil; }
  bool is_error() const { return type == Type::kError; }

  // OK unless this is an error reply; then RedisErrorToStatus(str).
  absl::Status ToStatus() const;
  // Short human-readable form for logs and test failures; binary bytes are C-escaped.
  std::string DebugString() const;

  friend bool operator==(const RedisReply& a, const RedisReply& b);
  friend bool operator!=(const RedisReply& a, const RedisReply& b) { return !(a == b); }
};

// Maps a Redis error reply ("PREFIX message") to a canonical code, the message kept verbatim:
// NOAUTH/WRONGPASS -> Unauthenticated, NOPERM -> PermissionDenied, WRONGTYPE/EXECABORT/
// NOSCRIPT -> FailedPrecondition, OOM -> ResourceExhausted, LOADING/BUSY/TRYAGAIN/MASTERDOWN/
// CLUSTERDOWN -> Unavailable, MOVED/ASK -> Unimplemented (no cluster mode), anything else
// (ERR ...) -> InvalidArgument.
absl::Status RedisErrorToStatus(absl::string_view error_message);

// Counters since the client was created. Fields only grow.
struct RedisClientStats {
  uint64_t num_calls = 0;             // Command() + Pipeline() calls
  uint64_t num_commands = 0;          // Redis commands requested (a Pipeline of n counts n)
  uint64_t num_failed_calls = 0;      // calls that returned a non-OK status (any cause)
  uint64_t num_error_replies = 0;     // Redis error replies received (in Command or Pipeline)
  uint64_t num_reconnects = 0;        // connections re-established after a drop (not the first one)
  uint64_t num_connect_failures = 0;  // failed reconnect attempts
  absl::Duration total_call_latency;  // wall time summed over calls, retries and backoff included
};

namespace redis_internal {
class Connection;  // owns the hiredis context; defined in redis_client.cc
}  // namespace redis_internal

// A synchronous client holding one connection to one Redis server.
//
// Thread-safe: calls from several threads are serialized on the single connection (an
// absl::Mutex held for the whole call, including reconnect backoff sleeps), so a call that is
// reconnecting delays the others by up to the backoff bound. Use one client per thread when
// calls must not wait for each other.
//
// Reconnect: an I/O error, EOF, protocol error or timeout drops the connection. The failing
// call then reconnects (exponential backoff, up to max_reconnect_attempts) and re-sends its
// command, or for Pipeline all of its commands, from the start: a command may thus run twice
// on the server, so only idempotent commands (GET, SET, DEL, HSET, EXPIRE, ...) may be sent
// through a client whose retry count is non-zero; use max_reconnect_attempts = 0 for INCR,
// LPUSH and the like. A timeout is not retried within the call (the caller's deadline is
// spent): it returns DeadlineExceeded and the next call reconnects. A Redis error reply is
// never retried.
class RedisClient {
 public:
  // Validates `config`, connects (one attempt, bounded by connect_timeout), sends AUTH, SELECT
  // and PING. No retry: startup decides what to do with a failure.
  // Errors: InvalidArgument (config), Unavailable ("redis 127.0.0.1:1234: connect: connection
  // refused"), DeadlineExceeded (the handshake timed out), Unauthenticated (wrong password or
  // AUTH required), PermissionDenied, InvalidArgument (SELECT of a db the server lacks).
  static absl::StatusOr<std::unique_ptr<RedisClient>> Connect(RedisConfig config);

  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;
  ~RedisClient();

  // Sends one command (binary-safe arguments, e.g. {"SET", key, value}) and returns its reply.
  // A Redis error reply is returned as a non-OK status (RedisErrorToStatus, message prefixed
  // with host:port and the command name); nil, integer, string and array replies are values.
  // Errors: InvalidArgument (empty args), Unavailable, DeadlineExceeded, or the mapped reply.
  absl::StatusOr<RedisReply> Command(std::vector<std::string> args);

  // Sends all commands in one write and reads their replies, in order (one round trip).
  // A Redis error reply to one command is that element's RedisReply (Type::kError): the call
  // still succeeds. The call fails only as a whole: InvalidArgument (an empty command),
  // Unavailable, DeadlineExceeded; on a retried I/O failure every command is re-sent.
  // An empty `commands` returns an empty vector without touching the connection.
  absl::StatusOr<std::vector<RedisReply>> Pipeline(
      const std::vector<std::vector<std::string>>& commands);

  // config().Key(name).
  std::string Key(absl::string_view name) const { return config_.Key(name); }
  const RedisConfig& config() const { return config_; }
  // "host:port", as used in error messages.
  const std::string& address() const { return address_; }

  RedisClientStats Stats() const;

 private:
  RedisClient(RedisConfig config, std::unique_ptr<redis_internal::Connection> connection);

  struct CallTally;  // per-call counters, folded into stats_ when the call ends

  // Runs `attempt` on a live connection, reconnecting as described in the class comment.
  // `command_name` is used in messages only.
  template <typename T, typename Fn>
  absl::StatusOr<T> RunWithRetry(absl::string_view command_name, CallTally& tally, Fn attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordCall(const CallTally& tally) ABSL_LOCKS_EXCLUDED(stats_mu_);

  const RedisConfig config_;
  const std::string address_;

  mutable absl::Mutex mu_;  // serializes calls on the connection
  // Null while disconnected (after an I/O failure, until the next successful reconnect).
  std::unique_ptr<redis_internal::Connection> connection_ ABSL_GUARDED_BY(mu_);

  // Separate from mu_ so Stats() never waits for a call in flight.
  mutable absl::Mutex stats_mu_;
  RedisClientStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace pd::redis
