// HttpRoutes: the request handlers of pd-router's OpenAI HTTP API (http_front.h lists the
// routes): authentication, parsing (openai_request.h), the prompt's tokens (the router's
// PromptEncoder, shared with the gRPC API), the generation through GenerationService, and the
// answer (http_stream.h writes it). Errors are OpenAI's {"error": {...}} objects.
//
// Thread-safety: handlers run on the connection threads at once; the class is thread-safe.
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics/metrics.h"
#include "engine/runtime/model_front.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/openai_request.h"
#include "services/router/openai/openai_response.h"
#include "services/router/openai/tool_parser.h"
#include "services/router/prompt_encoder.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace pd::router {
class GenerationService;
}  // namespace pd::router

namespace pd::router::openai {

class LiveStreams;

// The `path` label of pd_router_http_requests_total: the route's pattern, or "other" (a client
// choosing paths or model ids must not grow the label set).
absl::string_view RouteLabel(absl::string_view path);

// The error object of an error httplib answers itself (404 for no route, 413 for a body over
// the limit, ...), for `method` and `path` of the request.
ApiError HttpLayerError(int http_status, absl::string_view method, absl::string_view path);

// `limits` with vocab_size set to the model's when unset, so that logit_bias ids are checked
// (and the bad key named) while parsing.
ParseLimits WithVocabulary(ParseLimits limits, const engine::ModelFront* model);

// The request to send through the router for `r`: chat messages become token ids
// (prompts.EncodeChat), a completion's text or ids are passed on (GenerationService encodes
// them with the same PromptEncoder). `echo` gets the prompt's text when r.echo. Errors carry
// their param ("messages", "prompt"); Unavailable (too many chat renders at once) carries none.
absl::StatusOr<pdserve::v1::GenerateRequest> ToGenerateRequest(const OpenAiRequest& r,
                                                               const PromptEncoder& prompts,
                                                               const engine::Tokenizer& tokenizer,
                                                               std::string* echo);

// The tool-call format of "auto" tool choices: `forced` (--tool_call_format) when set, else
// DetectToolCallFormat of the chat template's text (kHermes without a template).
ToolCallFormat ChooseToolCallFormat(std::optional<ToolCallFormat> forced,
                                    const chat::ChatTemplate* chat_template);

class HttpRoutes {
 public:
  // Everything passed must outlive the routes. `draining`: new requests get 503 while true.
  // `requests`: pd_router_http_requests_total {path, status}. `tool_call_format`: see
  // ChooseToolCallFormat. `constrain_auto_calls`: ConstrainAutoCalls does its work.
  HttpRoutes(GenerationService* service, const engine::ModelFront* model, ParseLimits limits,
             LiveStreams* live, const std::atomic<bool>* draining,
             metrics::Family<metrics::Counter>* requests,
             std::optional<ToolCallFormat> tool_call_format = std::nullopt,
             bool reasoning = false, bool constrain_auto_calls = true);

  // Adds the routes, the error handler and the request counter to `server`.
  void Register(httplib::Server& server);

  ToolCallFormat tool_call_format() const { return tool_call_format_; }

 private:
  void HandleHealth(httplib::Response& res);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  // n > 1: the first choice placed as any request; once its first token came, the others on
  // its decode worker (sharing its prompt's blocks); one response of every choice.
  void ServeChoices(const OpenAiRequest& r, pdserve::v1::GenerateRequest g, std::string echo,
                    std::optional<bool> reasoning,
                    const httplib::Request& req, httplib::Response& res);
  // `reasoning`: ResponseBuilder's (ReasoningFor).
  ResponseBuilder NewBuilder(const OpenAiRequest& r, const std::string& request_id,
                             const std::string& echo, std::optional<bool> reasoning) const;
  // Reasoning blocks for chat request `r` whose prompt is `g` (when parsed): whether the
  // prompt opened one (PromptOpensThinkBlock of its decoded end); nullopt when not parsed.
  std::optional<bool> ReasoningFor(const OpenAiRequest& r,
                                   const pdserve::v1::GenerateRequest& g) const;
  // tool_choice "auto": a call the model starts (`<tool_call>`, `<｜tool▁calls▁begin｜>`, an
  // output starting with `{` for Llama 3, `[TOOL_CALLS]` for Mistral) is enforced (AutoCallTag, a
  // structural tag on `g`), unless the request has a constraint already, min_tokens or ignore_eos,
  // or a tool's parameters use a keyword the engine cannot enforce (then calls are only parsed, as
  // before). The response is built from `r`, whose sampling has no constraint: the output is still
  // parsed as an "auto" answer.
  void ConstrainAutoCalls(const OpenAiRequest& r, pdserve::v1::GenerateRequest* g) const;
  // A constrained chat request (response_format, guided_*, an enforced tool choice) to a
  // reasoning model (reasoning blocks parsed): the constraint applies after the reasoning block
  // (`<think> ... </think>`, or from the prompt's open block), so the model may think first and
  // the answer still follows the constraint; the block becomes reasoning_content.
  // `reasoning`: ReasoningFor(r, *g).
  void ConstrainAfterReasoning(const OpenAiRequest& r, std::optional<bool> reasoning,
                               pdserve::v1::GenerateRequest* g) const;
  // OK when the request may go on (not draining).
  absl::Status Admit() const;

  GenerationService* const service_;
  const engine::ModelFront* const model_;
  const ParseLimits limits_;
  LiveStreams* const live_;
  const std::atomic<bool>* const draining_;
  metrics::Family<metrics::Counter>* const requests_;
  const ToolCallFormat tool_call_format_;
  const bool reasoning_;
  const bool constrain_auto_calls_;
};

}  // namespace pd::router::openai
