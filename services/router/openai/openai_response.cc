#include "services/router/openai/openai_response.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;

// Text relayed by the router is valid UTF-8 (workers send whole characters); `replace` keeps a
// stray invalid byte from ever making dump() fail.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Event(const std::string& data) { return absl::StrCat("data: ", data, "\n\n"); }

}  // namespace

ApiError ErrorFromStatus(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  e.param = ParamOf(status);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "invalid_request_error";
      if (e.param.empty() && absl::StrContains(e.message, "model")) {
        e.param = "model";
        e.code = "model_not_found";
      }
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout_error";
      break;
    case absl::StatusCode::kUnimplemented:
      e.http_status = 501;
      e.type = "not_implemented_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

std::string ErrorBody(const ApiError& error) {
  json j;
  json& e = j["error"];
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? json(nullptr) : json(error.param);
  e["code"] = error.code.empty() ? json(nullptr) : json(error.code);
  return Dump(j);
}

absl::string_view FinishReasonName(pdserve::v1::FinishReason reason) {
  switch (reason) {
    case pdserve::v1::FINISH_REASON_LENGTH:
      return "length";
    case pdserve::v1::FINISH_REASON_STOP:
    case pdserve::v1::FINISH_REASON_STOP_STRING:
      return "stop";
    default:
      return "stop";  // abort and error end the stream with a status instead
  }
}

ResponseBuilder::ResponseBuilder(const OpenAiRequest& request, std::string id, int64_t created,
                                 std::string model, std::string echo_text)
    : endpoint_(request.endpoint),
      include_usage_(request.include_usage),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      echo_text_(std::move(echo_text)) {}

std::string ResponseBuilder::UsageJson() const {
  json u;
  u["prompt_tokens"] = usage_.prompt_tokens();
  u["completion_tokens"] = usage_.completion_tokens();
  u["total_tokens"] = usage_.prompt_tokens() + usage_.completion_tokens();
  u["prompt_tokens_details"] = {{"cached_tokens", usage_.cached_tokens()}};
  return Dump(u);
}

std::string ResponseBuilder::Chunk(const std::string& choice_json, bool with_usage_null) const {
  // Built as text so the choice (already serialized) is not parsed again.
  std::string out = absl::StrCat(
      "{\"id\":", Dump(id_), ",\"object\":\"",
      endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion",
      "\",\"created\":", created_, ",\"model\":", Dump(model_), ",\"choices\":[", choice_json, "]");
  if (with_usage_null && include_usage_) out += ",\"usage\":null";
  out += "}";
  return out;
}

std::string ResponseBuilder::StreamEvents(const pdserve::v1::GenerateResponse& msg) {
  std::string out;
  const bool chat = endpoint_ == Endpoint::kChat;
  auto text_choice = [&](const std::string& text) {
    json c;
    c["index"] = 0;
    if (chat) {
      c["delta"] = {{"content", text}};
    } else {
      c["text"] = text;
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = nullptr;
    return Dump(c);
  };
  if (!started_) {
    started_ = true;
    if (chat) {
      json c;
      c["index"] = 0;
      c["delta"] = {{"role", "assistant"}, {"content", ""}};
      c["logprobs"] = nullptr;
      c["finish_reason"] = nullptr;
      out += Event(Chunk(Dump(c), true));
    } else if (!echo_text_.empty()) {
      out += Event(Chunk(text_choice(echo_text_), true));
    }
  }
  if (!msg.text().empty()) {
    out += Event(Chunk(text_choice(msg.text()), true));
  }
  if (msg.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = msg.finish_reason();
    usage_ = msg.usage();
    json c;
    c["index"] = 0;
    if (chat) {
      c["delta"] = json::object();
    } else {
      c["text"] = "";
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = FinishReasonName(finish_reason_);
    out += Event(Chunk(Dump(c), true));
    if (include_usage_) {
      out += Event(absl::StrCat("{\"id\":", Dump(id_), ",\"object\":\"",
                                chat ? "chat.completion.chunk" : "text_completion",
                                "\",\"created\":", created_, ",\"model\":", Dump(model_),
                                ",\"choices\":[],\"usage\":", UsageJson(), "}"));
    }
  }
  return out;
}

std::string ResponseBuilder::DoneEvent() { return "data: [DONE]\n\n"; }

std::string ResponseBuilder::ErrorEvent(const ApiError& error) { return Event(ErrorBody(error)); }

void ResponseBuilder::Add(const pdserve::v1::GenerateResponse& msg) {
  text_ += msg.text();
  if (msg.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = msg.finish_reason();
    usage_ = msg.usage();
  }
}

std::string ResponseBuilder::Body() const {
  const bool chat = endpoint_ == Endpoint::kChat;
  json c;
  c["index"] = 0;
  if (chat) {
    c["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    c["text"] = echo_text_ + text_;
  }
  c["logprobs"] = nullptr;
  c["finish_reason"] = FinishReasonName(finish_reason_);
  return absl::StrCat("{\"id\":", Dump(id_), ",\"object\":\"",
                      chat ? "chat.completion" : "text_completion", "\",\"created\":", created_,
                      ",\"model\":", Dump(model_), ",\"choices\":[", Dump(c),
                      "],\"usage\":", UsageJson(), "}");
}

}  // namespace pd::router::openai
