// RequestFramer: where an HTTP/1.1 request ends in the bytes a connection has sent so far, and
// the framing errors that get an answer before any body is read (RFC 9112 sections 6 and 7).
//
// pd-router's connection waiter (http_connections.h) buffers each request until it is complete
// and only then hands it to httplib's parser on a worker thread; this class tells it when a
// request is complete, using the same rules as that parser (a head ends at the first empty
// CRLF line; the body is Content-Length bytes or a chunked body), and refuses at once what the
// parser would wait on or accept leniently:
//   - a head line ending in a bare LF, a header line without a field name and colon: 400
//   - a head over max_head_bytes: 431
//   - Content-Length that is not all digits ("+74", "7 4", "0x10", "5, 5"), two that differ,
//     or Content-Length with Transfer-Encoding (request smuggling): 400
//   - Content-Length or a chunked body over max_body_bytes (10^23 included): 413
//   - a Transfer-Encoding other than "chunked": 501
//   - POST/PUT/PATCH with neither Content-Length nor chunked: 411
//   - a malformed chunked body (size line, missing CRLF after the data): 400
// Identical duplicate Content-Length headers are accepted (RFC 9112 6.3 allows it).
//
// Thread-safety: none; one framer per connection, used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace pd::router::openai {

struct FramingLimits {
  // The request line plus headers, the terminating empty line included.
  size_t max_head_bytes = 64 << 10;
  // Content-Length, or the sum of a chunked body's chunk sizes.
  int64_t max_body_bytes = 4 << 20;
};

class RequestFramer {
 public:
  enum class State {
    kNeedHead,  // the head has not ended yet
    kNeedBody,  // the head is complete and valid; the body is not
    kComplete,  // the request is the first frame_bytes() bytes
    kError,     // answer http_status() with message(), then close the connection
  };

  explicit RequestFramer(FramingLimits limits) : limits_(limits) {}

  // Scans `data`: the connection's bytes from the request's first byte on. Between two calls
  // `data` may only grow at its end (the same prefix), until Reset. Work is incremental: bytes
  // already scanned are not scanned again. Once kComplete or kError the answer stays.
  State Scan(absl::string_view data);

  // Forgets the request, for the next one on the connection.
  void Reset();

  State state() const { return state_; }
  // The head's length (kNeedBody and kComplete).
  size_t head_bytes() const { return head_bytes_; }
  // The whole request's length, head and body (kComplete).
  size_t frame_bytes() const { return frame_bytes_; }
  // The head asked "Expect: 100-continue" and a body follows (kNeedBody and kComplete).
  bool expects_continue() const { return expects_continue_; }
  // kError: 400, 411, 413, 431 or 501, and a lower-case message naming the problem (no bytes of
  // the request in it).
  int http_status() const { return http_status_; }
  const std::string& message() const { return message_; }

 private:
  State Fail(int http_status, std::string message);
  // Parses the complete head data[0, head_bytes_).
  State ParseHead(absl::string_view head);
  // Advances over the chunked body from chunk_at_.
  State ScanChunked(absl::string_view data);

  FramingLimits limits_;
  State state_ = State::kNeedHead;
  size_t scanned_ = 0;  // bytes of the head searched for its end without finding it
  size_t head_bytes_ = 0;
  size_t frame_bytes_ = 0;
  bool expects_continue_ = false;
  // Chunked bodies: where the next chunk-size line (or trailer line) starts, and the sum of
  // the chunk sizes so far (with Content-Length: its value).
  bool chunked_ = false;
  bool in_trailers_ = false;
  size_t chunk_at_ = 0;
  size_t trailers_at_ = 0;
  int64_t body_bytes_ = 0;
  int http_status_ = 0;
  std::string message_;
};

}  // namespace pd::router::openai
