#include "services/router/openai/request_framing.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pd::router::openai {
namespace {

// A chunk-size line (with its extensions) or a trailer line longer than this is refused.
constexpr size_t kMaxChunkLineBytes = 4096;
// Digits of a Content-Length that always fits an int64_t.
constexpr size_t kMaxLengthDigits = 18;

// RFC 9110 tchar: what a method and a field name are made of.
bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c))) continue;
    if (absl::string_view("!#$%&'*+-.^_`|~").find(c) == absl::string_view::npos) return false;
  }
  return true;
}

absl::string_view TrimOws(absl::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void RequestFramer::Reset() { *this = RequestFramer(limits_); }

RequestFramer::State RequestFramer::Fail(int http_status, std::string message) {
  http_status_ = http_status;
  message_ = std::move(message);
  return state_ = State::kError;
}

RequestFramer::State RequestFramer::Scan(absl::string_view data) {
  if (state_ == State::kComplete || state_ == State::kError) return state_;
  if (state_ == State::kNeedHead) {
    // Looks at each new byte once: a head ends at "\n\r\n"; a CR must be followed by LF and an
    // LF preceded by CR (bare ones are what request smuggling hides behind), and no NUL.
    for (size_t i = scanned_; i < data.size(); ++i) {
      const char c = data[i];
      if (i > 0 && data[i - 1] == '\r' && c != '\n') {
        return Fail(400, "request head has a CR not followed by LF");
      }
      if (c == '\0') return Fail(400, "request head has a NUL byte");
      if (c != '\n') continue;
      if (i == 0 || data[i - 1] != '\r') {
        return Fail(400, "request head has a line ending in a bare LF (CRLF required)");
      }
      if (i >= 2 && data[i - 2] == '\n') {
        head_bytes_ = i + 1;
        break;
      }
    }
    if (head_bytes_ == 0) {
      // The last byte may be a CR whose LF has not come yet: look at it again next time.
      scanned_ = data.size();
      if (data.size() > limits_.max_head_bytes) {
        return Fail(431, absl::StrCat("request head is larger than ", limits_.max_head_bytes,
                                      " bytes"));
      }
      return state_;
    }
    if (head_bytes_ > limits_.max_head_bytes) {
      return Fail(431,
                  absl::StrCat("request head is larger than ", limits_.max_head_bytes, " bytes"));
    }
    if (ParseHead(data.substr(0, head_bytes_)) == State::kError) return state_;
  }
  if (chunked_) return ScanChunked(data);
  if (data.size() >= frame_bytes_) return state_ = State::kComplete;
  return state_;
}

RequestFramer::State RequestFramer::ParseHead(absl::string_view head) {
  head.remove_suffix(4);  // the last line's CRLF and the empty line
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  const absl::string_view request_line = lines[0];
  const absl::string_view method = request_line.substr(0, request_line.find(' '));
  if (!IsToken(method) || method.size() == request_line.size()) {
    return Fail(400, "malformed request line");
  }
  std::string length;  // the Content-Length's digits without leading zeros; "" = none
  int transfer_encodings = 0;
  bool te_chunked = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Fail(400, "malformed header line (a field name, a colon, a value)");
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = TrimOws(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      if (!AllDigits(value)) {
        return Fail(400, "Content-Length must be a decimal number (digits only)");
      }
      std::string digits(value.substr(std::min(value.find_first_not_of('0'), value.size() - 1)));
      if (!length.empty() && length != digits) {
        return Fail(400, "conflicting Content-Length headers");
      }
      length = std::move(digits);
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      ++transfer_encodings;
      te_chunked = absl::EqualsIgnoreCase(value, "chunked");
    } else if (absl::EqualsIgnoreCase(name, "Expect")) {
      expects_continue_ = absl::EqualsIgnoreCase(value, "100-continue");
    }
  }
  if (transfer_encodings > 0 && !length.empty()) {
    return Fail(400, "a request may not have both Content-Length and Transfer-Encoding");
  }
  if (transfer_encodings > 1) return Fail(400, "more than one Transfer-Encoding header");
  if (transfer_encodings == 1 && !te_chunked) {
    return Fail(501, "unsupported Transfer-Encoding (only chunked is)");
  }
  const std::string too_large = absl::StrCat("request body is larger than ",
                                             limits_.max_body_bytes, " bytes (--http_max_body_bytes)");
  if (te_chunked) {
    chunked_ = true;
    chunk_at_ = head_bytes_;
    state_ = State::kNeedBody;
    return state_;
  }
  if (length.empty()) {
    if (method == "POST" || method == "PUT" || method == "PATCH") {
      return Fail(411, absl::StrCat("a ", method,
                                    " request needs a Content-Length header (or a chunked body)"));
    }
    expects_continue_ = false;
    frame_bytes_ = head_bytes_;
    return state_ = State::kComplete;
  }
  if (length.size() > kMaxLengthDigits || !absl::SimpleAtoi(length, &body_bytes_) ||
      body_bytes_ > limits_.max_body_bytes) {
    return Fail(413, too_large);
  }
  if (body_bytes_ == 0) expects_continue_ = false;
  frame_bytes_ = head_bytes_ + static_cast<size_t>(body_bytes_);
  return state_ = State::kNeedBody;
}

RequestFramer::State RequestFramer::ScanChunked(absl::string_view data) {
  // Size lines, extensions and trailers around the data: bounded, so that tiny chunks with long
  // extensions cannot make a connection buffer far more than max_body_bytes.
  const size_t max_wire = 2 * static_cast<size_t>(limits_.max_body_bytes) + limits_.max_head_bytes;
  for (;;) {
    if (chunk_at_ - head_bytes_ > max_wire) {
      return Fail(413, "chunked body's framing is too large for its data");
    }
    const size_t eol = data.find("\r\n", chunk_at_);
    const size_t limit = chunk_at_ + kMaxChunkLineBytes;
    if (eol == absl::string_view::npos) {
      if (data.size() > limit) return Fail(400, "malformed chunked body (a line is too long)");
      return state_;
    }
    if (eol > limit) return Fail(400, "malformed chunked body (a line is too long)");
    const absl::string_view line = data.substr(chunk_at_, eol - chunk_at_);
    if (line.find('\n') != absl::string_view::npos || line.find('\r') != absl::string_view::npos ||
        line.find('\0') != absl::string_view::npos) {
      return Fail(400, "malformed chunked body (a bare CR or LF)");
    }
    if (in_trailers_) {
      chunk_at_ = eol + 2;
      if (line.empty()) {
        frame_bytes_ = chunk_at_;
        return state_ = State::kComplete;
      }
      if (chunk_at_ - trailers_at_ > limits_.max_head_bytes) {
        return Fail(431, "chunked body's trailers are too large");
      }
      continue;
    }
    // chunk-size [BWS ";" extensions]
    size_t digits = 0;
    int64_t size = 0;
    while (digits < line.size() && HexValue(line[digits]) >= 0) {
      if (digits == 15) {
        return Fail(413, absl::StrCat("request body is larger than ", limits_.max_body_bytes,
                                      " bytes (--http_max_body_bytes)"));
      }
      size = size * 16 + HexValue(line[digits]);
      ++digits;
    }
    const absl::string_view rest = TrimOws(line.substr(digits));
    if (digits == 0 || (!rest.empty() && rest.front() != ';')) {
      return Fail(400, "malformed chunked body (a chunk size must be hexadecimal)");
    }
    if (size == 0) {
      in_trailers_ = true;
      chunk_at_ = trailers_at_ = eol + 2;
      continue;
    }
    if (size > limits_.max_body_bytes - body_bytes_) {
      return Fail(413, absl::StrCat("request body is larger than ", limits_.max_body_bytes,
                                    " bytes (--http_max_body_bytes)"));
    }
    const size_t data_end = eol + 2 + static_cast<size_t>(size);
    if (data.size() < data_end + 2) return state_;
    if (data.substr(data_end, 2) != "\r\n") {
      return Fail(400, "malformed chunked body (no CRLF after a chunk's data)");
    }
    body_bytes_ += size;
    chunk_at_ = data_end + 2;
  }
}

}  // namespace pd::router::openai
