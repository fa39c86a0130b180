#include "services/router/openai/http_routes.h"

#include <httplib.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/base/constraint_proto.h"
#include "services/router/generation_service.h"
#include "services/router/openai/http_connections.h"
#include "services/router/openai/http_stream.h"
#include "services/router/openai/reasoning_parser.h"
#include "services/router/openai/sibling_streams.h"
#include "services/router/request_validation.h"
#include "services/router/router_stream.h"

namespace pd::router::openai {

namespace v1 = pdserve::v1;

using json = nlohmann::json;

namespace {

void SetError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) {
    res.set_header("Retry-After", "1");
  }
  res.set_content(ErrorBody(e), "application/json");
}

void Reply(httplib::Response& res, const absl::Status& status) {
  SetError(res, ErrorFromStatus(status));
}

std::string Header(const httplib::Request& req, const char* name) {
  return req.has_header(name) ? req.get_header_value(name) : std::string();
}

CallerAuth Caller(const httplib::Request& req) {
  CallerAuth caller;
  if (req.has_header("Authorization")) {
    caller.authorization = req.get_header_value("Authorization");
  }
  return caller;
}

// Writes an event stream's bytes to httplib's chunked response.
class DataSinkWriter final : public EventWriter {
 public:
  explicit DataSinkWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool Write(absl::string_view bytes) override { return sink_.write(bytes.data(), bytes.size()); }
  void Done() override { sink_.done(); }

 private:
  httplib::DataSink& sink_;
};

// The messages as the chat template sees them: role and content, plus the tool-calling keys
// a message has (chat::ChatMessage::fields).
absl::StatusOr<std::vector<chat::ChatMessage>> TemplateMessages(const OpenAiRequest& r) {
  std::vector<chat::ChatMessage> messages;
  messages.reserve(r.messages.size());
  for (size_t i = 0; i < r.messages.size(); ++i) {
    const ChatMessage& m = r.messages[i];
    chat::ChatMessage out;
    out.role = m.role;
    out.content = m.content;
    out.content_none = m.content_null;
    out.call_arguments = m.tool_call_arguments;
    chat::Dict fields;
    // A null content (an assistant's tool calls) reaches the template as "", as vLLM passes
    // it: real templates (Qwen3's) test `'</think>' in content`, which None fails; templates
    // that test `content is none` (DeepSeek's) get None (chat::ChatTemplate).
    if (!m.tool_calls_json.empty()) {
      absl::StatusOr<chat::Value> calls = chat::ParseJsonValue(m.tool_calls_json);
      if (!calls.ok()) {
        return WithParam(calls.status(), absl::StrCat("messages[", i, "].tool_calls"));
      }
      fields.Set(chat::Value::String("tool_calls"), *std::move(calls));
    }
    if (!m.tool_call_id.empty()) {
      fields.Set(chat::Value::String("tool_call_id"), chat::Value::String(m.tool_call_id));
    }
    if (!m.name.empty()) fields.Set(chat::Value::String("name"), chat::Value::String(m.name));
    if (!fields.items.empty()) out.fields = chat::Value::MakeDict(std::move(fields));
    messages.push_back(std::move(out));
  }
  return messages;
}

// The response of `streams` (an HttpStream, or the SiblingStreams of n > 1) whose first
// message(s) came: one JSON body, or an event stream written as the client reads it.
template <typename Streams, typename Firsts>
void Respond(bool stream, std::shared_ptr<Streams> streams, const Firsts& firsts,
             httplib::Response& res) {
  if (!stream) {
    absl::StatusOr<std::string> body = streams->ReadBody(firsts);
    if (!body.ok()) {
      Reply(res, body.status());
      return;
    }
    res.set_content(*body, "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  streams->StartEvents(firsts);
  res.set_chunked_content_provider("text/event-stream",
                                   [streams](size_t /*offset*/, httplib::DataSink& sink) {
                                     DataSinkWriter out(sink);
                                     return streams->WriteEvents(out);
                                   });
}

}  // namespace

absl::string_view RouteLabel(absl::string_view path) {
  if (absl::StartsWith(path, "/v1/models/")) return "/v1/models/{id}";
  for (absl::string_view route :
       {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions"}) {
    if (path == route) return route;
  }
  return "other";
}

ApiError HttpLayerError(int http_status, absl::string_view method, absl::string_view path) {
  ApiError e;
  e.http_status = http_status;
  e.type = "invalid_request_error";
  if (http_status == 404) {
    e.message = absl::StrCat("no such endpoint: ", method, " ", path);
    e.code = "not_found";
  } else if (http_status == 413) {
    e.message = "request body is too large (--http_max_body_bytes)";
    e.code = "request_too_large";
  } else {
    e.message = absl::StrCat("http error ", http_status);
    if (http_status >= 500) e.type = "server_error";
  }
  return e;
}

ParseLimits WithVocabulary(ParseLimits limits, const engine::ModelFront* model) {
  if (limits.vocab_size == 0 && model != nullptr) {
    limits.vocab_size = static_cast<uint32_t>(model->config().vocab_size);
  }
  return limits;
}

absl::StatusOr<v1::GenerateRequest> ToGenerateRequest(const OpenAiRequest& r,
                                                      const PromptEncoder& prompts,
                                                      const engine::Tokenizer& tokenizer,
                                                      std::string* echo) {
  v1::GenerateRequest g;
  g.set_model(r.model);
  *g.mutable_sampling() = r.sampling;
  if (r.logprobs >= 0) g.mutable_sampling()->set_logprobs(static_cast<uint32_t>(r.logprobs));
  if (r.cache_salt.has_value()) g.set_cache_salt(*r.cache_salt);
  if (r.endpoint == Endpoint::kCompletions) {
    if (r.prompt_text.has_value()) {
      g.set_text(*r.prompt_text);
      if (r.echo) *echo = *r.prompt_text;
    } else {
      g.mutable_token_ids()->mutable_ids()->Add(r.prompt_ids->begin(), r.prompt_ids->end());
      if (r.echo) {
        absl::StatusOr<std::string> text = tokenizer.Decode(*r.prompt_ids);
        if (!text.ok()) return WithParam(text.status(), "prompt");
        *echo = *std::move(text);
      }
    }
    return g;
  }
  PD_ASSIGN_OR_RETURN(std::vector<chat::ChatMessage> messages, TemplateMessages(r));
  chat::Value extra_vars;
  chat::Dict vars;
  if (!r.chat_template_kwargs.empty()) {
    // More template variables (e.g. Qwen3's enable_thinking), as apply_chat_template(**kwargs).
    absl::StatusOr<chat::Value> kwargs = chat::ParseJsonValue(r.chat_template_kwargs);
    if (!kwargs.ok()) return WithParam(kwargs.status(), "chat_template_kwargs");
    if (kwargs->is_dict()) vars = kwargs->dict();
  }
  if (r.tools.offered()) {
    // The template sees the tools as sent (Hugging Face's apply_chat_template(tools=...)); with
    // tool_choice "none" it sees none, as vLLM does.
    absl::StatusOr<chat::Value> tools = chat::ParseJsonValue(r.tools.tools_json);
    if (!tools.ok()) return WithParam(tools.status(), "tools");
    vars.Set(chat::Value::String("tools"), *std::move(tools));
  }
  if (!vars.items.empty()) extra_vars = chat::Value::MakeDict(std::move(vars));
  absl::StatusOr<std::vector<uint32_t>> ids =
      prompts.EncodeChat(messages, r.add_generation_prompt, extra_vars);
  if (!ids.ok()) {
    // Too many renders at once (503, retry) is no fault of a field.
    if (absl::IsUnavailable(ids.status())) return ids.status();
    return WithParam(ids.status(), "messages");
  }
  g.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  return g;
}

ToolCallFormat ChooseToolCallFormat(std::optional<ToolCallFormat> forced,
                                    const chat::ChatTemplate* chat_template) {
  if (forced.has_value()) return *forced;
  return DetectToolCallFormat(chat_template != nullptr ? chat_template->source() : "");
}

namespace {

// Whether `text` is one special token of `tokenizer` (not text that encodes to tokens).
bool IsSpecialToken(const engine::Tokenizer& tokenizer, absl::string_view text) {
  absl::StatusOr<std::vector<uint32_t>> ids = tokenizer.Encode(text, false, false);
  return ids.ok() && ids->size() == 1 && tokenizer.SpecialTokenText(ids->front()) == text;
}

}  // namespace

HttpRoutes::HttpRoutes(GenerationService* service, const engine::ModelFront* model,
                       ParseLimits limits, LiveStreams* live, const std::atomic<bool>* draining,
                       metrics::Family<metrics::Counter>* requests,
                       std::optional<ToolCallFormat> tool_call_format, bool reasoning,
                       bool constrain_auto_calls)
    : service_(service),
      model_(model),
      limits_(WithVocabulary(limits, model)),
      live_(live),
      draining_(draining),
      requests_(requests),
      tool_call_format_(
          ChooseToolCallFormat(tool_call_format, service->prompts().chat_template())),
      reasoning_(reasoning),
      constrain_auto_calls_(constrain_auto_calls) {}

void HttpRoutes::ConstrainAfterReasoning(const OpenAiRequest& r, std::optional<bool> opened,
                                         v1::GenerateRequest* g) const {
  // (The auto-call tag, set on `g` only, is free text already.)
  if (!r.sampling.has_constraint() || !opened.has_value()) return;
  v1::OutputConstraint::Reasoning* reasoning =
      g->mutable_sampling()->mutable_constraint()->mutable_reasoning();
  reasoning->set_start(std::string(kThinkStart));
  reasoning->set_end(std::string(kThinkEnd));
  reasoning->set_opened(*opened);
}

void HttpRoutes::ConstrainAutoCalls(const OpenAiRequest& r, v1::GenerateRequest* g) const {
  v1::SamplingParams* s = g->mutable_sampling();
  if (!constrain_auto_calls_ || r.endpoint != Endpoint::kChat || !r.tools.offered() ||
      r.tools.choice != ToolChoice::kAuto || s->has_constraint() || s->min_tokens() > 0 ||
      s->ignore_eos()) {
    return;
  }
  // The format's variant, from the template: DeepSeek-V3's template fences the arguments in
  // ```json, V3.1's does not; Mistral's v11+ templates write `[TOOL_CALLS]NAME[ARGS]`, v3's a
  // list after `[TOOL_CALLS]`. Mistral's markers are special tokens in its tokenizers.
  const chat::ChatTemplate* t = service_->prompts().chat_template();
  CallTagVariant variant;
  variant.fenced = t == nullptr || absl::StrContains(t->source(), "```json");
  variant.mistral_named = t != nullptr && absl::StrContains(t->source(), "[ARGS]");
  variant.mistral_special =
      tool_call_format_ == ToolCallFormat::kMistral && model_ != nullptr &&
      IsSpecialToken(model_->tokenizer(), "[TOOL_CALLS]") &&
      (!variant.mistral_named || IsSpecialToken(model_->tokenizer(), "[ARGS]"));
  s->mutable_constraint()->set_structural_tag(AutoCallTag(r.tools, tool_call_format_, variant));
  if (!services::CompileConstraintOf(*s, RouterGrammarCache()).ok()) {
    s->clear_constraint();  // a parameters keyword the engine cannot enforce: parsed only
  }
}

absl::Status HttpRoutes::Admit() const {
  if (*draining_) {
    return absl::UnavailableError("router is draining; retry on another router");
  }
  return absl::OkStatus();
}

void HttpRoutes::Register(httplib::Server& s) {
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  s.Get("/v1/models",
        [this](const httplib::Request& req, httplib::Response& res) { HandleModels(req, res); });
  s.Get(R"(/v1/models/(.+))",
        [this](const httplib::Request& req, httplib::Response& res) { HandleModels(req, res); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kChat, req, res);
  });
  // 404 (no route), 413 (body too large) and the like from httplib itself get an error object.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        res.set_content(ErrorBody(HttpLayerError(res.status, req.method, req.path)),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  // The status is one httplib or a handler set.
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    requests_->WithLabels({std::string(RouteLabel(req.path)), absl::StrCat(res.status)})
        .Increment();
  });
}

void HttpRoutes::HandleHealth(httplib::Response& res) {
  absl::Status ok = Admit();
  if (ok.ok() && !service_->ServesModel()) {
    ok = absl::UnavailableError("no healthy decode worker");
  }
  if (ok.ok()) {
    res.set_content("", "text/plain");
  } else {
    Reply(res, ok);
  }
}

void HttpRoutes::HandleModels(const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<std::string> tenant = service_->Authenticate(Caller(req), nullptr);
  if (!tenant.ok()) {
    Reply(res, tenant.status());
    return;
  }
  json model = {{"id", service_->model_id()},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "pdserve"},
                {"max_model_len", model_->config().seq_len}};
  if (req.matches.size() > 1) {
    if (req.matches[1] != service_->model_id()) {
      Reply(res, WithParam(absl::NotFoundError(absl::StrCat("model '", std::string(req.matches[1]),
                                                            "' does not exist")),
                           "model"));
      return;
    }
    res.set_content(model.dump(), "application/json");
    return;
  }
  json list = {{"object", "list"}, {"data", json::array()}};
  if (service_->ServesModel()) list["data"].push_back(model);
  res.set_content(list.dump(), "application/json");
}

void HttpRoutes::HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                                httplib::Response& res) {
  if (absl::Status ok = Admit(); !ok.ok()) {
    Reply(res, ok);
    return;
  }
  // Authentication first, as OpenAI does: a client without a key learns nothing else.
  absl::StatusOr<std::string> tenant = service_->Authenticate(Caller(req), nullptr);
  if (!tenant.ok()) {
    Reply(res, tenant.status());
    return;
  }
  absl::StatusOr<OpenAiRequest> parsed = ParseRequest(endpoint, req.body, limits_);
  if (!parsed.ok()) {
    Reply(res, parsed.status());
    return;
  }
  const OpenAiRequest& r = *parsed;
  std::string echo;
  absl::StatusOr<v1::GenerateRequest> g =
      ToGenerateRequest(r, service_->prompts(), model_->tokenizer(), &echo);
  if (!g.ok()) {
    Reply(res, g.status());
    return;
  }
  g->set_client_request_id(Header(req, "X-Request-Id"));
  const std::optional<bool> reasoning = ReasoningFor(r, *g);
  ConstrainAutoCalls(r, &*g);
  ConstrainAfterReasoning(r, reasoning, &*g);
  if (r.n > 1) {
    ServeChoices(r, *std::move(g), std::move(echo), reasoning, req, res);
    return;
  }
  HttpStreamOptions options;
  options.client_gone = CurrentClientGone;
  auto st = std::make_shared<HttpStream>(live_, std::move(options));
  absl::StatusOr<std::unique_ptr<RouterStream>> stream =
      service_->NewStream(*g, Caller(req), absl::InfiniteFuture(), st->sink());
  if (!stream.ok()) {
    Reply(res, stream.status());
    return;
  }
  RouterStream* started = stream->get();
  st->Attach(*std::move(stream));
  started->Start();
  // The first message (or an early end) decides the HTTP status.
  v1::GenerateResponse first;
  if (absl::Status s = st->WaitFirst(&first); !s.ok()) {
    Reply(res, s);
    return;
  }
  st->SetBuilder(NewBuilder(r, first.request_id(), echo, reasoning));
  Respond(r.stream, std::move(st), first, res);
}

std::optional<bool> HttpRoutes::ReasoningFor(const OpenAiRequest& r,
                                             const v1::GenerateRequest& g) const {
  if (!reasoning_ || r.endpoint != Endpoint::kChat) return std::nullopt;
  // The prompt's last tokens, as text, say whether the generation prompt opened a block.
  const auto& ids = g.token_ids().ids();
  const int tail = std::min(ids.size(), 16);
  absl::StatusOr<std::string> text = model_->tokenizer().Decode(
      std::vector<uint32_t>(ids.end() - tail, ids.end()));
  return text.ok() && PromptOpensThinkBlock(*text);
}

ResponseBuilder HttpRoutes::NewBuilder(const OpenAiRequest& r, const std::string& request_id,
                                       const std::string& echo,
                                       std::optional<bool> reasoning) const {
  const std::string id =
      absl::StrCat(r.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", request_id);
  TokenBytesFn token_bytes;
  if (r.logprobs >= 0) {
    token_bytes = [tokenizer = &model_->tokenizer()](uint32_t prev, uint32_t token) {
      absl::StatusOr<std::string> bytes = tokenizer->DecodeToken(prev, token);
      return bytes.ok() ? *std::move(bytes) : std::string();
    };
  }
  return ResponseBuilder(r, id, absl::ToUnixSeconds(absl::Now()), service_->model_id(), echo,
                         std::move(token_bytes), tool_call_format_, reasoning);
}

void HttpRoutes::ServeChoices(const OpenAiRequest& r, v1::GenerateRequest g, std::string echo,
                              std::optional<bool> reasoning,
                              const httplib::Request& req, httplib::Response& res) {
  auto doorbell = std::make_unique<Doorbell>();  // outlives the streams ringing it
  HttpStreamOptions options;
  options.client_gone = CurrentClientGone;
  options.doorbell = doorbell.get();
  std::vector<std::unique_ptr<HttpStream>> streams;
  std::vector<v1::GenerateResponse> firsts(static_cast<size_t>(r.n));
  // Seeded sampling: choice i draws with seed + i, so the choices differ and each is what a
  // request of n = 1 with that seed produces. Unseeded: the router draws a seed per choice.
  const bool seeded = g.sampling().has_seed();
  const uint64_t seed = g.sampling().seed();
  std::string sibling_decode;
  for (int i = 0; i < r.n; ++i) {
    if (seeded) g.mutable_sampling()->set_seed(seed + static_cast<uint64_t>(i));
    auto st = std::make_unique<HttpStream>(live_, options);
    absl::StatusOr<std::unique_ptr<RouterStream>> stream =
        service_->NewStream(g, Caller(req), absl::InfiniteFuture(), st->sink(), sibling_decode);
    if (!stream.ok()) {
      Reply(res, stream.status());  // the choices started are cancelled as `streams` goes
      return;
    }
    RouterStream* started = stream->get();
    st->Attach(*std::move(stream));
    started->Start();
    if (absl::Status s = st->WaitFirst(&firsts[static_cast<size_t>(i)]); !s.ok()) {
      Reply(res, s);
      return;
    }
    if (i == 0) {
      // The first choice's prompt is computed on its decode worker now: the others run there
      // and share its blocks (GenerationService::NewStream, sibling_decode).
      const int index = started->decode_index();
      for (const WorkerSnapshot& w : service_->workers()->Snapshot()) {
        if (w.index == index) sibling_decode = w.address;
      }
    }
    streams.push_back(std::move(st));
  }
  for (auto& st : streams) st->SetBuilder(NewBuilder(r, firsts[0].request_id(), echo, reasoning));
  Respond(r.stream,
          std::make_shared<SiblingStreams>(std::move(doorbell), std::move(streams), options),
          firsts, res);
}

}  // namespace pd::router::openai
