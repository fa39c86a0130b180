// Tool calling on POST /v1/chat/completions, response side: finds the tool calls in a model's
// output text, incrementally, so that a stream can send `delta.tool_calls` as the text arrives
// and a non-streamed answer gets `message.tool_calls` from the same parser.
//
// Two modes:
//  - enforced (tool_choice "required" or a named function): the output is the JSON document
//    {"name": ..., "arguments": {...}} that the request's constraint (EnforcedCallSchema) made
//    it, or with `list` an array of them; each call starts once its name is known and its
//    arguments stream as they are generated.
//  - auto: the output is text in the model family's tool-call format (ToolCallFormat); text
//    that may start a call is held back until known. A call written `{"name": <an offered
//    function>, "arguments"|"parameters": {` starts once that much is seen and its arguments
//    stream as they are generated, as enforced calls do (they are the model's text: like
//    OpenAI's, they may not be valid JSON). Any other call (an unknown function, the keys in
//    another order, arguments written as a JSON string) is held until complete and returned
//    as a call when it parses, else as content.
//
// Thread-compatible (one per response).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::router::openai {

// How a model family writes tool calls when free to ("auto"):
//  - kHermes (Qwen 2.5/3, Hermes, and the default): `<tool_call>{"name": ..., "arguments":
//    {...}}</tool_call>`, any number of them, possibly after some text.
//  - kLlama3 (Llama 3.1-3.3): the whole output is `{"name": ..., "parameters": {...}}`, possibly
//    after `<|python_tag|>` (a special token, decoded as nothing), or an array of such objects.
//  - kMistral: the whole output is `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
//    (`[TOOL_CALLS]` is a control token too: an output starting with `[` is parsed as well),
//    or, as Mistral's v11+ templates write them, `[TOOL_CALLS]name[ARGS]{...}` once per call
//    (the markers may decode as nothing: `name{...}`), returned whole at the end.
//  - kDeepseek (DeepSeek-V3/R1, V3.1): text, then `<｜tool▁calls▁begin｜>` and per call
//    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`
//    (V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`), then
//    `<｜tool▁calls▁end｜>`; the calls are held and returned whole when the block ends.
enum class ToolCallFormat { kHermes, kLlama3, kMistral, kDeepseek };

// DeepSeek's call markers (plain added tokens: they decode as text).
inline constexpr char kDeepseekCallsOpen[] = "<｜tool▁calls▁begin｜>";
inline constexpr char kDeepseekCallsClose[] = "<｜tool▁calls▁end｜>";
inline constexpr char kDeepseekCallBegin[] = "<｜tool▁call▁begin｜>";
inline constexpr char kDeepseekCallEnd[] = "<｜tool▁call▁end｜>";
inline constexpr char kDeepseekSep[] = "<｜tool▁sep｜>";

// "hermes", "llama3", "mistral", "deepseek".
absl::string_view ToolCallFormatName(ToolCallFormat format);
// The inverse of ToolCallFormatName; InvalidArgument naming the accepted values.
absl::StatusOr<ToolCallFormat> ParseToolCallFormat(absl::string_view name);
// The format a chat template's text implies: `<｜tool▁calls▁begin｜>` -> kDeepseek;
// `[TOOL_CALLS]` -> kMistral; `<|python_tag|>` or `<|start_header_id|>ipython` -> kLlama3;
// anything else (`<tool_call>` included) -> kHermes.
ToolCallFormat DetectToolCallFormat(absl::string_view chat_template_source);

// A fresh call id: "call_" and 24 random alphanumeric characters.
std::string NewToolCallId();

// What the parser makes of the text fed so far, in order.
struct ToolCallEvent {
  enum class Kind {
    kContent,    // text: plain content
    kCallStart,  // a call begins: index, id, name (its arguments follow as kArguments)
    kArguments,  // text: the next piece of call `index`'s arguments (JSON text)
  };
  Kind kind = Kind::kContent;
  int index = 0;
  std::string text;
  std::string id;
  std::string name;
};

class ToolCallParser {
 public:
  enum class Mode { kEnforced, kAuto };
  // `names`: the functions a call may name (a call naming another one is content). `list`
  // (kEnforced): the output is an array of calls.
  ToolCallParser(Mode mode, ToolCallFormat format, std::vector<std::string> names,
                 bool list = false);

  // The events that `text` (the next piece of output) completes.
  std::vector<ToolCallEvent> Feed(absl::string_view text);
  // The output ended: what was held back, as calls or content.
  std::vector<ToolCallEvent> Finish();

  // Calls started so far.
  int num_calls() const { return num_calls_; }

 private:
  // Runs the call states (kListOpen, kHead, kArgs, kTail) over buf_ until more text is needed
  // or the calls end (state_ leaves them).
  void RunCalls(std::vector<ToolCallEvent>* out);
  // kHead could not start a streamed call: what follows depends on the mode.
  void HeadFailed(std::vector<ToolCallEvent>* out);
  void FeedHermes(std::vector<ToolCallEvent>* out);
  void FeedWhole(std::vector<ToolCallEvent>* out);
  bool InCall() const {
    return state_ == State::kListOpen || state_ == State::kHead || state_ == State::kArgs ||
           state_ == State::kTail;
  }
  // Parses `body` as one call object {"name", "arguments"|"parameters"} (or, when `list`, an
  // array of them); false (nothing emitted) when it is not one, or names an unknown function.
  bool EmitCalls(absl::string_view body, bool list, std::vector<ToolCallEvent>* out);
  // Mistral v11+: whether text that is no JSON call starts `name[ARGS]` or `name{` for an
  // offered name (kMaybe: it still may), and the parse of a whole output of such calls
  // (`[TOOL_CALLS]`, `[ARGS]` optional; false, nothing emitted, when it is not one).
  enum class Named { kNo, kMaybe, kYes };
  Named NamedCallStart(absl::string_view rest) const;
  bool EmitNamedCalls(absl::string_view body, std::vector<ToolCallEvent>* out);
  // kDeepseek: the calls between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>; false (nothing
  // emitted) unless every one parses and names an offered function.
  bool EmitDeepseekCalls(absl::string_view body, std::vector<ToolCallEvent>* out);
  // Emits (name, arguments) pairs as calls; false for none.
  bool EmitParsedCalls(std::vector<std::pair<std::string, std::string>> calls,
                       std::vector<ToolCallEvent>* out);
  void FeedDeepseek(std::vector<ToolCallEvent>* out);
  void Content(std::string text, std::vector<ToolCallEvent>* out);
  bool Known(absl::string_view name) const;

  enum class State {
    kText,        // plain text (auto), passed on (kHermes: scanned for <tool_call>)
    kUndecided,   // auto, kLlama3/kMistral: nothing but a possible call start so far
    kWholeStart,  // auto, kLlama3/kMistral: a call's marker, '[' or '{' seen; what is it?
    kHold,        // auto, kLlama3/kMistral: a call not streamed; the end decides
    kInCall,      // auto, kHermes: inside <tool_call>... not streamed; the close decides
    kListOpen,    // enforced list: before its '['
    kHead,        // before a call's arguments value
    kArgs,        // inside the arguments value
    kTail,        // after it (a list: until ',' starts the next call or ']' ends)
  };

  const Mode mode_;
  bool list_;  // the calls are an array's elements (enforced: `list`; auto: the output's '[')
  bool call_closed_ = false;  // kTail: the call object's '}' was seen
  bool list_closed_ = false;  // kTail, list: the ']' was seen
  int tail_depth_ = 0;        // kTail, auto: nesting within the call object (1: in it)
  const ToolCallFormat format_;
  const std::vector<std::string> names_;
  State state_;
  std::string buf_;  // text not yet accounted for
  // kLlama3/kMistral auto until a call starts: everything since the start, as generated.
  std::string held_;
  int num_calls_ = 0;
  bool after_call_ = false;  // kHermes: a call was emitted; whitespace after it is dropped
  // kArgs: the scan of the arguments value.
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool scalar_ = false;  // a value that is no object, array or string (ends at a delimiter)
};

}  // namespace pd::router::openai
