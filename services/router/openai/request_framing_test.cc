#include "services/router/openai/request_framing.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::router::openai {
namespace {

using State = RequestFramer::State;
using ::testing::HasSubstr;

FramingLimits Limits() {
  FramingLimits l;
  l.max_head_bytes = 1024;
  l.max_body_bytes = 100;
  return l;
}

// The framer's answer for `data` given whole.
RequestFramer Framed(const std::string& data) {
  RequestFramer f(Limits());
  f.Scan(data);
  return f;
}

// The error status for a head (with CRLF line ends added) given whole.
int ErrorStatus(const std::string& head) {
  RequestFramer f = Framed(head);
  EXPECT_EQ(f.state(), State::kError) << head;
  return f.http_status();
}

TEST(RequestFramerTest, GetWithoutBodyEndsAtTheEmptyLine) {
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  RequestFramer f = Framed(get + "GET /next");
  ASSERT_EQ(f.state(), State::kComplete);
  EXPECT_EQ(f.frame_bytes(), get.size());
}

TEST(RequestFramerTest, ByteByByteNeedsTheWholeHeadThenTheBody) {
  const std::string req = "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
  RequestFramer f(Limits());
  for (size_t n = 1; n < req.size(); ++n) {
    const State s = f.Scan(absl::string_view(req).substr(0, n));
    ASSERT_EQ(s, n < req.size() - 5 ? State::kNeedHead : State::kNeedBody) << n;
  }
  ASSERT_EQ(f.Scan(req), State::kComplete);
  EXPECT_EQ(f.frame_bytes(), req.size());
  EXPECT_EQ(f.head_bytes(), req.size() - 5);
  f.Reset();
  EXPECT_EQ(f.Scan("GET / HTTP/1.1\r\n\r\n"), State::kComplete);
}

TEST(RequestFramerTest, ContentLengthMustBeDigitsOnly) {
  for (const char* value : {"+74", "-1", " 7 4", "0x10", "5, 5", "", "1e3", "５"}) {
    SCOPED_TRACE(value);
    const std::string head =
        std::string("POST / HTTP/1.1\r\nContent-Length: ") + value + "\r\n\r\n";
    EXPECT_EQ(ErrorStatus(head), 400);
    EXPECT_THAT(Framed(head).message(), HasSubstr("Content-Length"));
  }
  // Optional whitespace around the value is not part of it; leading zeros are digits.
  RequestFramer f = Framed("POST / HTTP/1.1\r\nContent-Length: \t007 \r\n\r\n1234567");
  ASSERT_EQ(f.state(), State::kComplete);
  EXPECT_EQ(f.frame_bytes(), f.head_bytes() + 7);
}

TEST(RequestFramerTest, DifferentContentLengthsAre400AndEqualOnesPass) {
  EXPECT_EQ(ErrorStatus("POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\n"),
            400);
  RequestFramer f = Framed("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\n");
  EXPECT_EQ(f.state(), State::kNeedBody);
}

TEST(RequestFramerTest, LengthOverTheLimitIs413FromTheHeadAlone) {
  for (const char* value : {"101", "100000000000000000000000", "99999999999999999999"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(ErrorStatus(std::string("POST / HTTP/1.1\r\nContent-Length: ") + value + "\r\n\r\n"),
              413);
  }
  EXPECT_EQ(Framed("POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n").state(), State::kNeedBody);
}

TEST(RequestFramerTest, PostWithoutLengthIs411AndGetIsComplete) {
  EXPECT_EQ(ErrorStatus("POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"), 411);
  EXPECT_EQ(ErrorStatus("PUT / HTTP/1.1\r\n\r\n"), 411);
  EXPECT_EQ(Framed("DELETE / HTTP/1.1\r\n\r\n").state(), State::kComplete);
}

TEST(RequestFramerTest, BadHeadsAreRefused) {
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\nHost: x\n\n"), 400);           // bare LF
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\r\nHost: x\ry\r\n\r\n"), 400);  // bare CR
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\r\nHost x\r\n\r\n"), 400);      // no colon
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\r\nContent-Length : 5\r\n\r\n"), 400);
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\r\n folded\r\n\r\n"), 400);     // obs-fold
  EXPECT_EQ(ErrorStatus("\r\n\r\n"), 400);                               // no request line
  EXPECT_EQ(ErrorStatus(std::string("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", 26)), 400);
  // Too large, with or without its end.
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\r\nX: " + std::string(1100, 'a')), 431);
  EXPECT_EQ(ErrorStatus("GET / HTTP/1.1\r\nX: " + std::string(1100, 'a') + "\r\n\r\n"), 431);
}

TEST(RequestFramerTest, TransferEncodingRules) {
  EXPECT_EQ(ErrorStatus("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(ErrorStatus("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
                        "\r\n\r\n"),
            400);
  EXPECT_EQ(ErrorStatus("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n"),
            400);
}

TEST(RequestFramerTest, ChunkedBodyEndsAfterTheLastChunkAndTrailers) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n";
  const std::string body = "5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n";
  RequestFramer f(Limits());
  const std::string all = head + body + "GET / HTTP/1.1\r\n\r\n";
  for (size_t n = head.size(); n < head.size() + body.size(); ++n) {
    ASSERT_EQ(f.Scan(absl::string_view(all).substr(0, n)), State::kNeedBody) << n;
  }
  ASSERT_EQ(f.Scan(all), State::kComplete);
  EXPECT_EQ(f.frame_bytes(), head.size() + body.size());
}

TEST(RequestFramerTest, BadChunkedBodiesAreRefused) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(ErrorStatus(head + "+5\r\nhello\r\n0\r\n\r\n"), 400);
  EXPECT_EQ(ErrorStatus(head + "0x5\r\nhello\r\n0\r\n\r\n"), 400);
  EXPECT_EQ(ErrorStatus(head + "5\r\nhelloXY0\r\n\r\n"), 400);  // no CRLF after the data
  EXPECT_EQ(ErrorStatus(head + "65\r\n"), 413);                  // 101 bytes
  EXPECT_EQ(ErrorStatus(head + "32\r\n" + std::string(50, 'a') + "\r\n33\r\n"), 413);
  EXPECT_EQ(ErrorStatus(head + "1000000000000000000\r\n"), 413);
  EXPECT_EQ(ErrorStatus(head + "5" + std::string(5000, ' ')), 400);  // endless size line
}

TEST(RequestFramerTest, ExpectContinueOnlyWithABodyToCome) {
  RequestFramer f = Framed("POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n");
  EXPECT_EQ(f.state(), State::kNeedBody);
  EXPECT_TRUE(f.expects_continue());
  EXPECT_FALSE(Framed("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n")
                   .expects_continue());
}

}  // namespace
}  // namespace pd::router::openai
