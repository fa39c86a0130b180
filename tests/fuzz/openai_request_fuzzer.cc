// Fuzzes the OpenAI request parser pd-router's HTTP front runs on every body
// (services/router/openai/openai_request.h), in two modes chosen by the first byte:
//   < 0x80  raw: the rest of the input is the body;
//   >= 0x80 structure-aware: the input describes a body that nests arrays and objects inside one
//           of the fields a walk visits (prompt, messages and content parts, stop, metadata,
//           logit_bias, tools, ...) from one level to 200,000, in both endpoints' shapes, so
//           the deep cases that crashed the router (a prompt nested 100,000 arrays deep) are
//           reached at once rather than grown byte by byte.
//
// Oracle: no crash and no sanitizer report; every refusal is InvalidArgument; a body nesting
// deeper than ParseLimits::max_json_depth is refused; an accepted completion has exactly one of
// text and token ids, an accepted chat at least one message.
#include <cstdint>
#include <string>

#include "common/log/log.h"
#include "services/router/openai/openai_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using pd::router::openai::Endpoint;
using pd::router::openai::JsonNestingDepth;
using pd::router::openai::OpenAiRequest;
using pd::router::openai::ParseLimits;
using pd::router::openai::ParseRequest;

// Reads the structure-aware input.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U16() { return static_cast<uint32_t>(Byte()) << 8 | Byte(); }
  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_) + pos_, size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A body with `field` holding a value nested `levels` deep, built from the input.
std::string StructuredBody(Reader& in, bool* chat) {
  static const char* const kFields[] = {
      "prompt",     "messages", "metadata",        "stop", "stop_token_ids",
      "logit_bias", "tools",    "response_format", "seed", "stream_options",
      "user",       "content",  "temperature",     "n",    "max_tokens"};
  static const char* const kLeaves[] = {"5",     "\"x\"", "null",
                                        "true",  "{}",    "[]",
                                        "1e400", "-1",    "{\"type\":\"text\",\"text\":\"x\"}"};
  const uint8_t shape = in.Byte();
  *chat = (shape & 1) != 0;
  const char* field = kFields[in.Byte() % (sizeof(kFields) / sizeof(kFields[0]))];
  const uint32_t levels = 1 + in.U16() * 4 % 200000;  // up to 200,000 levels
  const char* leaf = kLeaves[in.Byte() % (sizeof(kLeaves) / sizeof(kLeaves[0]))];
  const bool objects = (shape & 2) != 0;
  const bool closed = (shape & 4) == 0;  // else truncated: the brackets never close
  std::string open, close;
  open.reserve(levels * (objects ? 5 : 1));
  for (uint32_t i = 0; i < levels; ++i) open += objects ? "{\"a\":" : "[";
  if (closed) close.assign(levels, objects ? '}' : ']');
  std::string value = open + leaf + close;
  std::string body = "{\"model\":\"m\",";
  if (std::string(field) == "content") {
    *chat = true;
    body += "\"messages\":[{\"role\":\"user\",\"content\":" + value + "}]";
  } else {
    if (std::string(field) != "prompt" && std::string(field) != "messages") {
      body += *chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," : "\"prompt\":\"x\",";
    }
    body += "\"" + std::string(field) + "\":" + value;
  }
  return body + in.Rest() + (closed ? "}" : "");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Reader in(data + 1, size - 1);
  bool chat = (data[0] & 1) != 0;
  const std::string body = data[0] < 0x80 ? in.Rest() : StructuredBody(in, &chat);
  ParseLimits limits;
  if ((data[0] & 0x40) != 0) {
    limits.max_json_depth = 4;  // tiny limits too
    limits.max_prompt_tokens = 3;
    limits.max_messages = 2;
    limits.max_stop_strings = 1;
  }
  const absl::StatusOr<OpenAiRequest> r =
      ParseRequest(chat ? Endpoint::kChat : Endpoint::kCompletions, body, limits);
  if (!r.ok()) {
    CHECK(absl::IsInvalidArgument(r.status())) << r.status();
    return 0;
  }
  CHECK(JsonNestingDepth(body, limits.max_json_depth).depth <= limits.max_json_depth);
  if (chat) {
    CHECK(!r->messages.empty() && r->messages.size() <= limits.max_messages);
  } else {
    CHECK(r->prompt_text.has_value() != r->prompt_ids.has_value());
    if (r->prompt_ids.has_value()) {
      CHECK(!r->prompt_ids->empty() && r->prompt_ids->size() <= limits.max_prompt_tokens);
    }
  }
  return 0;
}
