#include "loadtest/openai_stream.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pd::loadtest {
namespace {

using json = nlohmann::json;

// Longest excerpt of a non-JSON error body put into a message.
constexpr size_t kMaxBodyExcerpt = 200;

int64_t IntField(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

bool NonEmptyString(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

// The message of an error object ({"message": ...}) or of {"error": {...}} / {"error": "..."}.
std::string ErrorMessage(const json& j) {
  if (!j.is_object()) {
    return "";
  }
  if (auto it = j.find("error"); it != j.end()) {
    if (it->is_string()) {
      return it->get<std::string>();
    }
    if (it->is_object()) {
      return ErrorMessage(*it);
    }
  }
  if (auto it = j.find("message"); it != j.end() && it->is_string()) {
    return it->get<std::string>();
  }
  return "";
}

// The code of an error payload inside a 200 stream: its numeric "code" (an HTTP status, as
// vLLM sends) when present, else INTERNAL.
absl::StatusCode StreamErrorCode(const json& error) {
  if (error.is_object()) {
    if (auto it = error.find("code"); it != error.end() && it->is_number_integer()) {
      return HttpStatusToCode(it->get<int>());
    }
  }
  return absl::StatusCode::kInternal;
}

}  // namespace

absl::StatusOr<OpenAiUrl> ParseOpenAiUrl(absl::string_view flag, absl::string_view url) {
  absl::string_view rest = url;
  const bool http = absl::ConsumePrefix(&rest, "http://");
  const bool https = !http && absl::ConsumePrefix(&rest, "https://");
  const size_t slash = rest.find('/');
  absl::string_view host_port = rest.substr(0, slash);
  if ((!http && !https) || host_port.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " of an openai backend must be a URL like http://HOST:PORT[/v1], got '", url,
        "'"));
  }
  OpenAiUrl out;
  out.origin = absl::StrCat(http ? "http://" : "https://", host_port);
  absl::string_view path = slash == absl::string_view::npos ? "" : rest.substr(slash);
  while (absl::ConsumeSuffix(&path, "/")) {
  }
  out.api_root = absl::EndsWith(path, "/v1") ? std::string(path) : absl::StrCat(path, "/v1");
  return out;
}

absl::StatusOr<OpenAiEndpoint> ParseOpenAiEndpoint(absl::string_view flag, absl::string_view text) {
  if (text == "completions") {
    return OpenAiEndpoint::kCompletions;
  }
  if (text == "chat") {
    return OpenAiEndpoint::kChat;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be completions or chat, got '", text, "'"));
}

absl::string_view OpenAiEndpointName(OpenAiEndpoint endpoint) {
  return endpoint == OpenAiEndpoint::kChat ? "chat" : "completions";
}

absl::string_view OpenAiEndpointPath(OpenAiEndpoint endpoint) {
  return endpoint == OpenAiEndpoint::kChat ? "/chat/completions" : "/completions";
}

std::string OpenAiRequestBody(const OpenAiRequestFields& f) {
  json j = json::object();
  j["model"] = f.model;
  if (f.endpoint == OpenAiEndpoint::kChat) {
    j["messages"] = json::array({{{"role", "user"}, {"content", std::string(f.prompt_text)}}});
  } else {
    j["prompt"] = std::vector<uint32_t>(f.prompt_ids.begin(), f.prompt_ids.end());
  }
  j["max_tokens"] = f.max_tokens;
  j["temperature"] = f.temperature;
  const SamplingPenalties& pen = f.penalties;
  if (pen.presence_penalty != 0) j["presence_penalty"] = pen.presence_penalty;
  if (pen.frequency_penalty != 0) j["frequency_penalty"] = pen.frequency_penalty;
  if (pen.repetition_penalty != 0) j["repetition_penalty"] = pen.repetition_penalty;
  if (pen.min_p != 0) j["min_p"] = pen.min_p;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (f.ignore_eos) {
    j["ignore_eos"] = true;
  }
  if (!f.cache_salt.empty()) {
    j["cache_salt"] = f.cache_salt;
  }
  if (!f.json_schema.empty()) {
    j["response_format"] = {
        {"type", "json_schema"},
        {"json_schema",
         {{"name", "loadtest"}, {"schema", json::parse(f.json_schema, nullptr, false)}}}};
  }
  // Text decoded from random token ids may be invalid UTF-8: replace, never throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool SseDecoder::EndLine(absl::FunctionRef<bool(absl::string_view)> on_data) {
  if (line_.empty()) {  // blank line: dispatch the event
    if (!has_data_) {
      return true;
    }
    has_data_ = false;
    std::string data = std::move(data_);
    data_.clear();
    return on_data(data);
  }
  absl::string_view line = line_;
  if (line.front() != ':') {  // not a comment
    const size_t colon = line.find(':');
    absl::string_view field = line.substr(0, colon);
    absl::string_view value;
    if (colon != absl::string_view::npos) {
      value = line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') {
        value.remove_prefix(1);
      }
    }
    if (field == "data") {
      if (has_data_) {
        data_.push_back('\n');
      }
      data_.append(value.data(), value.size());
      has_data_ = true;
    }
  }
  line_.clear();
  return true;
}

bool SseDecoder::Feed(absl::string_view bytes,
                      absl::FunctionRef<bool(absl::string_view data)> on_data) {
  for (size_t i = 0; i < bytes.size();) {
    const char c = bytes[i];
    if (c == '\n' && after_cr_) {  // the LF of a CRLF whose CR ended the line already
      after_cr_ = false;
      ++i;
      continue;
    }
    after_cr_ = false;
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      ++i;
      if (!EndLine(on_data)) {
        return false;
      }
      continue;
    }
    // Copy the run of bytes up to the next line end at once.
    const size_t end = bytes.find_first_of("\r\n", i);
    const size_t stop = end == absl::string_view::npos ? bytes.size() : end;
    line_.append(bytes.data() + i, stop - i);
    i = stop;
  }
  return true;
}

OpenAiStreamRecorder::OpenAiStreamRecorder(OpenAiEndpoint endpoint, RequestRecord* record)
    : endpoint_(endpoint), record_(record) {}

void OpenAiStreamRecorder::Fail(absl::StatusCode code, std::string message) {
  if (failed_) {
    return;
  }
  failed_ = true;
  record_->code = code;
  record_->error = std::move(message);
}

bool OpenAiStreamRecorder::OnData(absl::string_view data, int64_t now_ns) {
  if (absl::StripAsciiWhitespace(data) == "[DONE]") {
    done_ = true;
    return false;
  }
  const json j = json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    Fail(absl::StatusCode::kInternal,
         absl::StrCat("malformed JSON in the event stream: '",
                      data.substr(0, std::min(data.size(), kMaxBodyExcerpt)), "'"));
    return false;
  }
  if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
    std::string message = ErrorMessage(j);
    Fail(StreamErrorCode(*it), message.empty() ? it->dump() : std::move(message));
    return false;
  }
  if (auto it = j.find("choices"); it != j.end() && it->is_array() && !it->empty()) {
    const json& choice = (*it)[0];
    bool content = false;
    if (choice.is_object()) {
      if (endpoint_ == OpenAiEndpoint::kChat) {
        auto delta = choice.find("delta");
        content =
            delta != choice.end() && delta->is_object() &&
            (NonEmptyString(*delta, "content") || NonEmptyString(*delta, "reasoning_content"));
      } else {
        content = NonEmptyString(choice, "text");
      }
      if (auto fr = choice.find("finish_reason"); fr != choice.end() && fr->is_string()) {
        record_->finish_reason = absl::AsciiStrToUpper(fr->get<std::string>());
      }
    }
    if (content) {
      if (record_->first_token_ns < 0) {
        record_->first_token_ns = now_ns;
      } else {
        record_->itl_ns.push_back(now_ns - last_content_ns_);
      }
      last_content_ns_ = now_ns;
      ++content_chunks_;
    }
  }
  if (auto it = j.find("usage"); it != j.end() && it->is_object()) {
    record_->has_usage = true;
    record_->prompt_tokens = IntField(*it, "prompt_tokens");
    record_->completion_tokens = IntField(*it, "completion_tokens");
    auto details = it->find("prompt_tokens_details");
    record_->cached_tokens =
        details != it->end() && details->is_object() ? IntField(*details, "cached_tokens") : 0;
  }
  return true;
}

void OpenAiStreamRecorder::Finish(int64_t end_ns, const absl::Status& transport) {
  record_->end_ns = end_ns;
  record_->output_tokens = record_->has_usage ? record_->completion_tokens : content_chunks_;
  if (failed_) {
    return;
  }
  if (!transport.ok()) {
    Fail(transport.code(), std::string(transport.message()));
  } else if (record_->finish_reason.empty()) {
    Fail(absl::StatusCode::kInternal, done_ ? "stream ended with [DONE] without a finish reason"
                                            : "stream ended without a finish reason");
  }
}

absl::StatusCode HttpStatusToCode(int s) {
  switch (s) {
    case 400:
    case 413:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 408:
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    case 409:
      return absl::StatusCode::kAborted;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 499:
      return absl::StatusCode::kCancelled;
    case 501:
      return absl::StatusCode::kUnimplemented;
    case 502:
    case 503:
      return absl::StatusCode::kUnavailable;
    default:
      break;
  }
  if (s >= 400 && s < 500) {
    return absl::StatusCode::kFailedPrecondition;
  }
  if (s >= 500 && s < 600) {
    return absl::StatusCode::kInternal;
  }
  return absl::StatusCode::kUnknown;
}

absl::Status HttpErrorStatus(int http_status, absl::string_view body) {
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  std::string message = j.is_discarded() ? "" : ErrorMessage(j);
  if (message.empty()) {
    message = std::string(absl::StripAsciiWhitespace(body.substr(0, kMaxBodyExcerpt)));
  }
  return absl::Status(HttpStatusToCode(http_status),
                      absl::StrCat("HTTP ", http_status, message.empty() ? "" : ": ", message));
}

absl::StatusOr<std::vector<OpenAiModel>> ParseModelList(absl::string_view body) {
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("the model list is not a JSON object");
  }
  auto data = j.find("data");
  if (data == j.end() || !data->is_array()) {
    return absl::InvalidArgumentError("the model list has no \"data\" array");
  }
  std::vector<OpenAiModel> models;
  for (const json& m : *data) {
    auto id = m.is_object() ? m.find("id") : m.end();
    if (!m.is_object() || id == m.end() || !id->is_string()) {
      return absl::InvalidArgumentError("a model of the list has no string \"id\"");
    }
    models.push_back({id->get<std::string>(), IntField(m, "max_model_len")});
  }
  return models;
}

}  // namespace pd::loadtest
