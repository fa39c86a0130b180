#include "services/router/openai/openai_response.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;

// Text relayed by the router is valid UTF-8 (workers send whole characters); `replace` keeps a
// stray invalid byte from ever making dump() fail.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string Event(const std::string& data) { return absl::StrCat("data: ", data, "\n\n"); }

// Unicode code points in `bytes` (what a client's string length counts), counting each byte
// that is not a UTF-8 continuation byte.
int64_t CodePoints(absl::string_view bytes) {
  int64_t n = 0;
  for (const char c : bytes) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

json ByteArray(const std::string& bytes) {
  json a = json::array();
  for (const char c : bytes) a.push_back(static_cast<unsigned char>(c));
  return a;
}

// A JSON number, or null for NaN (nlohmann writes non-finite numbers as null anyway; explicit
// here so the shape is documented).
json LogprobValue(float logprob) {
  const double v = JsonLogprob(logprob);
  return std::isnan(v) ? json(nullptr) : json(v);
}

// The choice's logprobs object, in `endpoint`'s shape (ResponseBuilder's comment), for `tokens`
// and their entries, continuing after the tokens already rendered: `*prev_token` is the token
// before tokens[0], `*text_offset` its code-point offset (completions); both are advanced.
json RenderLogprobs(Endpoint endpoint, const TokenBytesFn& token_bytes,
                    const google::protobuf::RepeatedField<uint32_t>& tokens,
                    const google::protobuf::RepeatedPtrField<pdserve::v1::TokenLogprob>& logprobs,
                    uint32_t* prev_token, int64_t* text_offset) {
  const bool chat = endpoint == Endpoint::kChat;
  const auto bytes_of = [&](uint32_t prev, uint32_t token) {
    return token_bytes != nullptr ? token_bytes(prev, token) : std::string();
  };
  json content = json::array();  // chat
  json names = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();  // completions
  // A worker sends one entry per token; should one be missing, the tokens without an entry are
  // left out rather than paired with another token's entry.
  const int n = std::min(tokens.size(), logprobs.size());
  for (int i = 0; i < n; ++i) {
    const uint32_t token = tokens.Get(i);
    const pdserve::v1::TokenLogprob& lp = logprobs.Get(i);
    const std::string bytes = bytes_of(*prev_token, token);
    if (chat) {
      json entry;
      entry["token"] = bytes;
      entry["logprob"] = LogprobValue(lp.logprob());
      entry["bytes"] = ByteArray(bytes);
      json top = json::array();
      for (const pdserve::v1::TopLogprob& t : lp.top()) {
        const std::string alt = bytes_of(*prev_token, t.token_id());
        top.push_back(
            {{"token", alt}, {"logprob", LogprobValue(t.logprob())}, {"bytes", ByteArray(alt)}});
      }
      entry["top_logprobs"] = std::move(top);
      content.push_back(std::move(entry));
    } else {
      names.push_back(bytes);
      values.push_back(LogprobValue(lp.logprob()));
      json top = json::object();
      for (const pdserve::v1::TopLogprob& t : lp.top()) {
        top[bytes_of(*prev_token, t.token_id())] = LogprobValue(t.logprob());
      }
      top[bytes] = LogprobValue(lp.logprob());  // the sampled token is always listed
      tops.push_back(std::move(top));
      offsets.push_back(*text_offset);
      *text_offset += CodePoints(bytes);
    }
    *prev_token = token;
  }
  json out = json::object();
  if (chat) {
    out["content"] = std::move(content);
    out["refusal"] = nullptr;
  } else {
    out["tokens"] = std::move(names);
    out["token_logprobs"] = std::move(values);
    out["top_logprobs"] = std::move(tops);
    out["text_offset"] = std::move(offsets);
  }
  return out;
}

}  // namespace

double JsonLogprob(float logprob) {
  if (std::isinf(logprob) && logprob < 0) return -9999.0;
  return static_cast<double>(logprob);
}

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
                                 std::string model, std::string echo_text, TokenBytesFn token_bytes,
                                 ToolCallFormat tool_format, std::optional<bool> reasoning)
    : endpoint_(request.endpoint),
      include_usage_(request.include_usage),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      echo_text_(std::move(echo_text)),
      logprobs_(request.logprobs),
      token_bytes_(std::move(token_bytes)),
      text_offset_(CodePoints(echo_text_)) {
  // (Under a constraint too: pd-router then lets the block come before the constrained answer,
  // HttpRoutes::ConstrainAfterReasoning.)
  if (endpoint_ == Endpoint::kChat && reasoning.has_value()) {
    reasoning_.emplace(*reasoning);
  }
  const ToolsSpec& tools = request.tools;
  if (endpoint_ != Endpoint::kChat || !tools.offered()) return;
  legacy_functions_ = tools.legacy;
  if (tools.enforced()) {
    tools_.emplace(ToolCallParser::Mode::kEnforced, tool_format, tools.CallableNames(),
                   tools.enforced_list());
  } else if (!request.sampling.has_constraint()) {
    // "auto" under a response format: the format decides the output; nothing is parsed.
    tools_.emplace(ToolCallParser::Mode::kAuto, tool_format, tools.CallableNames());
  }
}

void ResponseBuilder::SplitReasoning(const std::string& text, bool last, std::string* reasoning,
                                     std::string* content) {
  if (!reasoning_.has_value()) {
    *content = text;
    return;
  }
  std::vector<ReasoningEvent> events = reasoning_->Feed(text);
  if (last) {
    for (ReasoningEvent& e : reasoning_->Finish()) events.push_back(std::move(e));
  }
  for (const ReasoningEvent& e : events) {
    (e.kind == ReasoningEvent::Kind::kReasoning ? reasoning : content)->append(e.text);
  }
}

void ResponseBuilder::Collect(std::vector<ToolCallEvent> events) {
  for (ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::kContent:
        text_ += e.text;
        break;
      case ToolCallEvent::Kind::kCallStart:
        calls_.push_back({std::move(e.id), std::move(e.name), ""});
        break;
      case ToolCallEvent::Kind::kArguments:
        if (e.index >= 0 && static_cast<size_t>(e.index) < calls_.size()) {
          calls_[e.index].arguments += e.text;
        }
        break;
    }
  }
}

std::string ResponseBuilder::FinishReason() const {
  const bool called = tools_.has_value() && tools_->num_calls() > 0;
  if (called && finish_reason_ != pdserve::v1::FINISH_REASON_LENGTH) {
    return legacy_functions_ ? "function_call" : "tool_calls";
  }
  return std::string(FinishReasonName(finish_reason_));
}

std::string ResponseBuilder::UsageJson(const pdserve::v1::Usage& usage) {
  json u;
  u["prompt_tokens"] = usage.prompt_tokens();
  u["completion_tokens"] = usage.completion_tokens();
  u["total_tokens"] = usage.prompt_tokens() + usage.completion_tokens();
  u["prompt_tokens_details"] = {{"cached_tokens", usage.cached_tokens()}};
  return Dump(u);
}

pdserve::v1::Usage ResponseBuilder::CombinedUsage(const std::vector<pdserve::v1::Usage>& choices) {
  pdserve::v1::Usage out;
  if (choices.empty()) return out;
  out.set_prompt_tokens(choices[0].prompt_tokens());
  out.set_cached_tokens(choices[0].cached_tokens());
  out.set_tier_cached_tokens(choices[0].tier_cached_tokens());
  uint32_t completion = 0;
  for (const pdserve::v1::Usage& u : choices) completion += u.completion_tokens();
  out.set_completion_tokens(completion);
  return out;
}

std::string ResponseBuilder::UsageEvent(const pdserve::v1::Usage& usage) const {
  return Event(absl::StrCat(
      "{\"id\":", Dump(id_), ",\"object\":\"",
      endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion", "\",\"created\":",
      created_, ",\"model\":", Dump(model_), ",\"choices\":[],\"usage\":", UsageJson(usage), "}"));
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
  auto text_choice = [&](const std::string& text, json logprobs) {
    json c;
    c["index"] = choice_index_;
    if (chat) {
      c["delta"] = {{"content", text}};
    } else {
      c["text"] = text;
    }
    c["logprobs"] = std::move(logprobs);
    c["finish_reason"] = nullptr;
    return Dump(c);
  };
  if (!started_) {
    started_ = true;
    if (chat) {
      json c;
      c["index"] = choice_index_;
      c["delta"] = {{"role", "assistant"}, {"content", ""}};
      c["logprobs"] = nullptr;
      c["finish_reason"] = nullptr;
      out += Event(Chunk(Dump(c), true));
    } else if (!echo_text_.empty()) {
      out += Event(Chunk(text_choice(echo_text_, nullptr), true));
    }
  }
  // Tokens whose text is held back still get their logprobs now, in a chunk with no text.
  const bool logprobs = wants_logprobs() && msg.logprobs_size() > 0;
  const bool last = msg.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED;
  std::string reasoning, content;
  SplitReasoning(msg.text(), last, &reasoning, &content);
  json lp = logprobs ? RenderLogprobs(endpoint_, token_bytes_, msg.token_ids(), msg.logprobs(),
                                      &prev_token_, &text_offset_)
                     : json(nullptr);
  bool lp_sent = false;  // (a message's logprobs go with its first chunk)
  if (!reasoning.empty()) {
    json c;
    c["index"] = choice_index_;
    c["delta"] = {{"reasoning_content", reasoning}};
    c["logprobs"] = std::exchange(lp, json(nullptr));
    c["finish_reason"] = nullptr;
    out += Event(Chunk(Dump(c), true));
    lp_sent = true;
  }
  if (tools_.has_value()) {
    std::vector<ToolCallEvent> events = tools_->Feed(content);
    if (last) {
      for (ToolCallEvent& e : tools_->Finish()) events.push_back(std::move(e));
    }
    if (events.empty() && logprobs && !lp_sent) {
      out += Event(Chunk(text_choice("", std::move(lp)), true));
    }
    for (ToolCallEvent& e : events) {
      if (e.kind == ToolCallEvent::Kind::kContent) {
        out += Event(Chunk(text_choice(e.text, std::exchange(lp, json(nullptr))), true));
        continue;
      }
      if (legacy_functions_ && e.index != 0) continue;  // the legacy API answers one call
      json function = e.kind == ToolCallEvent::Kind::kCallStart
                          ? json{{"name", e.name}, {"arguments", ""}}
                          : json{{"arguments", e.text}};
      json c;
      c["index"] = choice_index_;
      if (legacy_functions_) {
        c["delta"] = {{"function_call", std::move(function)}};
      } else {
        json call = {{"index", e.index}};
        if (e.kind == ToolCallEvent::Kind::kCallStart) {
          call["id"] = e.id;
          call["type"] = "function";
        }
        call["function"] = std::move(function);
        c["delta"] = {{"tool_calls", json::array({std::move(call)})}};
      }
      c["logprobs"] = std::exchange(lp, json(nullptr));
      c["finish_reason"] = nullptr;
      out += Event(Chunk(Dump(c), true));
    }
  } else if (!content.empty() || (logprobs && !lp_sent)) {
    out += Event(Chunk(text_choice(content, std::move(lp)), true));
  }
  if (last) {
    finish_reason_ = msg.finish_reason();
    usage_ = msg.usage();
    json c;
    c["index"] = choice_index_;
    if (chat) {
      c["delta"] = json::object();
    } else {
      c["text"] = "";
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = FinishReason();
    out += Event(Chunk(Dump(c), true));
    if (include_usage_ && usage_chunk_) out += UsageEvent(usage_);
  }
  return out;
}

std::string ResponseBuilder::DoneEvent() { return "data: [DONE]\n\n"; }

std::string ResponseBuilder::ErrorEvent(const ApiError& error) { return Event(ErrorBody(error)); }

void ResponseBuilder::Add(const pdserve::v1::GenerateResponse& msg) {
  const bool last = msg.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED;
  std::string content;
  SplitReasoning(msg.text(), last, &reasoning_text_, &content);
  if (tools_.has_value()) {
    Collect(tools_->Feed(content));
    if (last) Collect(tools_->Finish());
  } else {
    text_ += content;
  }
  if (wants_logprobs()) {
    // Paired by position; a message whose entries do not match its tokens contributes only the
    // pairs it has (RenderLogprobs), so later tokens still meet their own entries.
    const int n = std::min(msg.token_ids_size(), msg.logprobs_size());
    for (int i = 0; i < n; ++i) {
      tokens_.Add(msg.token_ids(i));
      *token_logprobs_.Add() = msg.logprobs(i);
    }
  }
  if (msg.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = msg.finish_reason();
    usage_ = msg.usage();
  }
}

std::string ResponseBuilder::Body() const { return BodyOf({ChoiceJson()}, usage_); }

std::string ResponseBuilder::BodyOf(const std::vector<std::string>& choices,
                                    const pdserve::v1::Usage& usage) const {
  return absl::StrCat("{\"id\":", Dump(id_), ",\"object\":\"",
                      endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion",
                      "\",\"created\":", created_, ",\"model\":", Dump(model_), ",\"choices\":[",
                      absl::StrJoin(choices, ","), "],\"usage\":", UsageJson(usage), "}");
}

std::string ResponseBuilder::ChoiceJson() const {
  const bool chat = endpoint_ == Endpoint::kChat;
  json c;
  c["index"] = choice_index_;
  if (chat) {
    c["message"] = {{"role", "assistant"}, {"content", text_}};
    if (reasoning_.has_value()) {
      c["message"]["reasoning_content"] =
          reasoning_->in_block() ? json(reasoning_text_) : json(nullptr);
      // Nothing after the block (or a block that never ended): content null, as vLLM has it.
      if (text_.empty() && reasoning_->in_block()) c["message"]["content"] = nullptr;
    }
    if (!calls_.empty()) {
      // As OpenAI: content is null unless the model wrote text before its calls.
      if (text_.empty()) c["message"]["content"] = nullptr;
      if (legacy_functions_) {
        // The legacy API has one call at most: the first.
        c["message"]["function_call"] = {{"name", calls_[0].name},
                                         {"arguments", calls_[0].arguments}};
      } else {
        json calls = json::array();
        for (const Call& call : calls_) {
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        c["message"]["tool_calls"] = std::move(calls);
      }
    }
  } else {
    c["text"] = echo_text_ + text_;
  }
  if (wants_logprobs()) {
    uint32_t prev = kNoPrevToken;
    int64_t offset = CodePoints(echo_text_);
    c["logprobs"] =
        RenderLogprobs(endpoint_, token_bytes_, tokens_, token_logprobs_, &prev, &offset);
  } else {
    c["logprobs"] = nullptr;
  }
  c["finish_reason"] = FinishReason();
  return Dump(c);
}

}  // namespace pd::router::openai
