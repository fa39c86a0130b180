#include "services/router/openai/tool_parser.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "services/router/openai/openai_request.h"

namespace pd::router::openai {
namespace {

// Deepest nesting of arrays and objects a parsed call may have (as requests: ParseLimits).
constexpr size_t kMaxCallDepth = 64;

using ordered_json = nlohmann::ordered_json;

constexpr absl::string_view kHermesOpen = "<tool_call>";
constexpr absl::string_view kHermesClose = "</tool_call>";
constexpr absl::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr absl::string_view kLlamaMarker = "<|python_tag|>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

absl::string_view SkipSpace(absl::string_view s) {
  size_t i = 0;
  while (i < s.size() && IsSpace(s[i])) ++i;
  return s.substr(i);
}

// One byte of JSON text (not inside a number or literal): follows strings, with their escapes,
// and the nesting of arrays and objects. True when the byte ends a string or a container.
bool ScanJsonByte(char c, bool* in_string, bool* escape, int* depth) {
  if (*in_string) {
    if (*escape) {
      *escape = false;
    } else if (c == '\\') {
      *escape = true;
    } else if (c == '"') {
      *in_string = false;
      return true;
    }
    return false;
  }
  if (c == '"') {
    *in_string = true;
  } else if (c == '{' || c == '[') {
    ++*depth;
  } else if (c == '}' || c == ']') {
    --*depth;
    return true;
  }
  return false;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`: text that may
// still turn into the marker when more arrives.
size_t MarkerPrefixSuffix(absl::string_view text, absl::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (absl::EndsWith(text, marker.substr(0, n))) return n;
  }
  return 0;
}

std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// Matches the head of a call, `{"name": "<name>", "arguments":` (or Llama 3's "parameters";
// whitespace allowed where JSON allows it), at the start of `s`, up to the value's first byte
// (s[*end]).
enum class Head { kNeedMore, kMismatch, kMatched };
Head MatchHead(absl::string_view s, std::string* name, size_t* end) {
  size_t i = 0;
  auto space = [&] {
    while (i < s.size() && IsSpace(s[i])) ++i;
  };
  auto literal = [&](absl::string_view lit) {
    const size_t n = std::min(lit.size(), s.size() - i);
    if (s.substr(i, n) != lit.substr(0, n)) return Head::kMismatch;
    i += n;
    return n == lit.size() ? Head::kMatched : Head::kNeedMore;
  };
  for (absl::string_view lit : {"{", "\"name\"", ":"}) {
    space();
    if (Head h = literal(lit); h != Head::kMatched) return h;
  }
  space();
  if (i == s.size()) return Head::kNeedMore;
  if (s[i] != '"') return Head::kMismatch;
  // The name's string literal: its end is the first quote not escaped.
  size_t j = i + 1;
  bool escape = false;
  for (; j < s.size(); ++j) {
    if (escape) {
      escape = false;
    } else if (s[j] == '\\') {
      escape = true;
    } else if (s[j] == '"') {
      break;
    }
  }
  if (j == s.size()) return Head::kNeedMore;
  const ordered_json parsed = ordered_json::parse(s.substr(i, j + 1 - i), nullptr, false);
  if (!parsed.is_string()) return Head::kMismatch;
  *name = parsed.get<std::string>();
  i = j + 1;
  space();
  if (Head h = literal(","); h != Head::kMatched) return h;
  space();
  // The arguments' key, either spelling.
  const size_t key = i;
  Head h = Head::kMismatch;
  for (absl::string_view lit : {"\"arguments\"", "\"parameters\""}) {
    i = key;
    h = literal(lit);
    if (h != Head::kMismatch) break;
  }
  if (h != Head::kMatched) return h;
  space();
  if (Head h = literal(":"); h != Head::kMatched) return h;
  space();
  if (i == s.size()) return Head::kNeedMore;  // the value's first byte decides its kind
  *end = i;
  return Head::kMatched;
}

// Mistral's newer templates (v11+) write a call as `[TOOL_CALLS]name[ARGS]{...}`; both markers
// are control tokens that may decode as nothing.
constexpr absl::string_view kMistralArgs = "[ARGS]";

// DeepSeek-V3/R1 write calls between these (plain added tokens: they decode as text):
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
// <｜tool▁call▁end｜>... <｜tool▁calls▁end｜>; V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
// <｜tool▁call▁end｜>.
// (With a length: UBSan builds do not take a pointer's null check as a constant expression.)
constexpr absl::string_view kDeepseekOpen(kDeepseekCallsOpen, sizeof(kDeepseekCallsOpen) - 1);
constexpr absl::string_view kDeepseekClose(kDeepseekCallsClose, sizeof(kDeepseekCallsClose) - 1);

// The index just past the JSON object that `s` starts with ('{'), honouring strings and their
// escapes; npos when it does not end within `s`.
size_t JsonObjectEnd(absl::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      ++depth;
    } else if (ch == '}' || ch == ']') {
      if (--depth == 0) return i + 1;
      if (depth < 0) return absl::string_view::npos;
    }
  }
  return absl::string_view::npos;
}

}  // namespace

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepseek:
      return "deepseek";
  }
  return "hermes";
}

absl::StatusOr<ToolCallFormat> ParseToolCallFormat(absl::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3,
                           ToolCallFormat::kMistral, ToolCallFormat::kDeepseek}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tool call format must be \"hermes\", \"llama3\", \"mistral\" or "
                   "\"deepseek\", got \"",
                   name, "\""));
}

ToolCallFormat DetectToolCallFormat(absl::string_view source) {
  if (absl::StrContains(source, kDeepseekOpen)) return ToolCallFormat::kDeepseek;
  if (absl::StrContains(source, kMistralMarker)) return ToolCallFormat::kMistral;
  if (absl::StrContains(source, kLlamaMarker) ||
      absl::StrContains(source, "<|start_header_id|>ipython")) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kHermes;
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

ToolCallParser::ToolCallParser(Mode mode, ToolCallFormat format, std::vector<std::string> names,
                               bool list)
    : mode_(mode), list_(list), format_(format), names_(std::move(names)) {
  if (mode_ == Mode::kEnforced) {
    state_ = list_ ? State::kListOpen : State::kHead;
  } else {
    state_ = format_ == ToolCallFormat::kHermes || format_ == ToolCallFormat::kDeepseek
                 ? State::kText
                 : State::kUndecided;
  }
}

bool ToolCallParser::Known(absl::string_view name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

void ToolCallParser::Content(std::string text, std::vector<ToolCallEvent>* out) {
  if (after_call_) {
    // The separator between calls (Qwen writes "\n") is not content.
    const size_t keep = text.size() - SkipSpace(text).size();
    text.erase(0, keep);
    if (text.empty()) return;
    after_call_ = false;
  }
  if (text.empty()) return;
  if (!out->empty() && out->back().kind == ToolCallEvent::Kind::kContent) {
    out->back().text += text;
    return;
  }
  ToolCallEvent e;
  e.text = std::move(text);
  out->push_back(std::move(e));
}

bool ToolCallParser::EmitCalls(absl::string_view body, bool list, std::vector<ToolCallEvent>* out) {
  // Model output nests as deep as it likes: what is deeper than any call needs stays content
  // (re-serializing it recursively could exhaust the stack).
  if (JsonNestingDepth(body, kMaxCallDepth).depth > kMaxCallDepth) return false;
  const ordered_json doc = ordered_json::parse(body.begin(), body.end(), nullptr, false);
  if (doc.is_discarded()) return false;
  std::vector<const ordered_json*> objects;
  if (list && doc.is_array()) {
    for (const ordered_json& o : doc) objects.push_back(&o);
  } else {
    objects.push_back(&doc);
  }
  if (objects.empty()) return false;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  for (const ordered_json* o : objects) {
    if (!o->is_object()) return false;
    auto name = o->find("name");
    if (name == o->end() || !name->is_string() || !Known(name->get<std::string>())) return false;
    auto args = o->find("arguments");
    if (args == o->end()) args = o->find("parameters");  // Llama 3's spelling
    std::string text;
    if (args == o->end() || args->is_null()) {
      text = "{}";
    } else if (args->is_object()) {
      text = Dump(*args);
    } else if (args->is_string()) {
      // Some models write the arguments as a JSON string, as the API carries them.
      const std::string& inner_text = args->get_ref<const std::string&>();
      if (JsonNestingDepth(inner_text, kMaxCallDepth).depth > kMaxCallDepth) return false;
      const ordered_json inner = ordered_json::parse(inner_text, nullptr, false);
      if (!inner.is_object()) return false;
      text = Dump(inner);
    } else {
      return false;
    }
    calls.emplace_back(name->get<std::string>(), std::move(text));
  }
  return EmitParsedCalls(std::move(calls), out);
}

std::vector<ToolCallEvent> ToolCallParser::Feed(absl::string_view text) {
  std::vector<ToolCallEvent> out;
  if (text.empty()) return out;
  if (mode_ == Mode::kEnforced) {
    if (state_ == State::kText) {
      Content(std::string(text), &out);
    } else {
      buf_.append(text.data(), text.size());
      RunCalls(&out);
    }
    return out;
  }
  if (format_ == ToolCallFormat::kHermes) {
    buf_.append(text.data(), text.size());
    FeedHermes(&out);
    return out;
  }
  if (format_ == ToolCallFormat::kDeepseek) {
    buf_.append(text.data(), text.size());
    FeedDeepseek(&out);
    return out;
  }
  switch (state_) {
    case State::kText:
      Content(std::string(text), &out);
      break;
    case State::kHold:
      held_.append(text.data(), text.size());
      break;
    case State::kUndecided:
      held_.append(text.data(), text.size());
      FeedWhole(&out);
      break;
    default:
      // Until a call starts, the end may still return the whole output as content.
      if (num_calls_ == 0) held_.append(text.data(), text.size());
      buf_.append(text.data(), text.size());
      FeedWhole(&out);
      break;
  }
  return out;
}

ToolCallParser::Named ToolCallParser::NamedCallStart(absl::string_view rest) const {
  bool maybe = false;
  for (const std::string& name : names_) {
    if (rest.size() < name.size()) {
      maybe = maybe || absl::StartsWith(name, rest);
      continue;
    }
    if (!absl::StartsWith(rest, name)) continue;
    const absl::string_view after = rest.substr(name.size());
    if (after.empty() || absl::StartsWith(kMistralArgs, after)) {
      maybe = true;
    } else if (after[0] == '{' || absl::StartsWith(after, kMistralArgs)) {
      return Named::kYes;
    }
  }
  return maybe ? Named::kMaybe : Named::kNo;
}

bool ToolCallParser::EmitNamedCalls(absl::string_view body, std::vector<ToolCallEvent>* out) {
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  body = SkipSpace(body);
  while (!body.empty()) {
    if (absl::StartsWith(body, kMistralMarker))
      body = SkipSpace(body.substr(kMistralMarker.size()));
    // The longest offered name the text starts with.
    const std::string* name = nullptr;
    for (const std::string& n : names_) {
      if (absl::StartsWith(body, n) && (name == nullptr || n.size() > name->size())) name = &n;
    }
    if (name == nullptr) return false;
    body.remove_prefix(name->size());
    if (absl::StartsWith(body, kMistralArgs)) body.remove_prefix(kMistralArgs.size());
    body = SkipSpace(body);
    if (body.empty() || body[0] != '{') return false;
    const size_t end = JsonObjectEnd(body);
    if (end == absl::string_view::npos) return false;
    const absl::string_view object = body.substr(0, end);
    if (JsonNestingDepth(object, kMaxCallDepth).depth > kMaxCallDepth) return false;
    const ordered_json args = ordered_json::parse(object.begin(), object.end(), nullptr, false);
    if (!args.is_object()) return false;
    calls.emplace_back(*name, Dump(args));
    body = SkipSpace(body.substr(end));
  }
  return EmitParsedCalls(std::move(calls), out);
}

bool ToolCallParser::EmitDeepseekCalls(absl::string_view body, std::vector<ToolCallEvent>* out) {
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  while (true) {
    body = SkipSpace(body);
    if (body.empty()) break;
    if (!absl::ConsumePrefix(&body, kDeepseekCallBegin)) return false;
    const size_t sep = body.find(kDeepseekSep);
    const size_t end = body.find(kDeepseekCallEnd);
    if (sep == absl::string_view::npos || end == absl::string_view::npos || sep > end) {
      return false;
    }
    const absl::string_view head = absl::StripAsciiWhitespace(body.substr(0, sep));
    absl::string_view rest = body.substr(sep + absl::string_view(kDeepseekSep).size(),
                                         end - sep - absl::string_view(kDeepseekSep).size());
    body.remove_prefix(end + absl::string_view(kDeepseekCallEnd).size());
    absl::string_view name = head, args = rest;
    if (head == "function") {  // V3 / R1: the name on its own line, then a fenced JSON block
      const size_t newline = rest.find('\n');
      if (newline == absl::string_view::npos) return false;
      name = absl::StripAsciiWhitespace(rest.substr(0, newline));
      args = rest.substr(newline + 1);
    }
    args = absl::StripAsciiWhitespace(args);
    if (absl::ConsumePrefix(&args, "```json") || absl::ConsumePrefix(&args, "```")) {
      if (!absl::ConsumeSuffix(&args, "```")) return false;
      args = absl::StripAsciiWhitespace(args);
    }
    if (!Known(name) || args.empty() || args[0] != '{' || JsonObjectEnd(args) != args.size() ||
        JsonNestingDepth(args, kMaxCallDepth).depth > kMaxCallDepth) {
      return false;
    }
    const ordered_json parsed = ordered_json::parse(args.begin(), args.end(), nullptr, false);
    if (!parsed.is_object()) return false;
    calls.emplace_back(std::string(name), Dump(parsed));
  }
  return EmitParsedCalls(std::move(calls), out);
}

bool ToolCallParser::EmitParsedCalls(std::vector<std::pair<std::string, std::string>> calls,
                                     std::vector<ToolCallEvent>* out) {
  if (calls.empty()) return false;
  for (auto& [name, args] : calls) {
    ToolCallEvent start;
    start.kind = ToolCallEvent::Kind::kCallStart;
    start.index = num_calls_;
    start.id = NewToolCallId();
    start.name = name;
    out->push_back(std::move(start));
    ToolCallEvent piece;
    piece.kind = ToolCallEvent::Kind::kArguments;
    piece.index = num_calls_;
    piece.text = std::move(args);
    out->push_back(std::move(piece));
    ++num_calls_;
  }
  after_call_ = true;
  return true;
}

void ToolCallParser::HeadFailed(std::vector<ToolCallEvent>* out) {
  if (mode_ == Mode::kEnforced) {
    // Not a call (the constraint makes one, so this is no output of this server's engine):
    // everything is content.
    state_ = State::kText;
    Content(std::exchange(buf_, std::string()), out);
  } else if (format_ == ToolCallFormat::kHermes) {
    state_ = State::kInCall;  // held until </tool_call>: parsed whole, or content
  } else if (num_calls_ == 0) {
    state_ = State::kHold;  // the whole output, parsed at the end, or content
    buf_.clear();
  } else {
    // A later element of a list that is no call that can stream: the rest is content.
    state_ = State::kText;
    after_call_ = true;
    Content(std::exchange(buf_, std::string()), out);
  }
}

void ToolCallParser::RunCalls(std::vector<ToolCallEvent>* out) {
  const bool hermes = mode_ == Mode::kAuto && format_ == ToolCallFormat::kHermes;
  // A list runs the call states once per call: kHead, kArgs, kTail, then kHead again after ','.
  while (InCall()) {
    if (state_ == State::kListOpen) {
      size_t i = 0;
      while (i < buf_.size() && IsSpace(buf_[i])) ++i;
      if (i == buf_.size()) return;
      if (buf_[i] != '[') {
        // Not a list (the constraint makes one, so this is no output of this server's engine).
        state_ = State::kText;
        Content(std::exchange(buf_, std::string()), out);
        return;
      }
      buf_.erase(0, i + 1);
      state_ = State::kHead;
    }
    if (state_ == State::kHead) {
      std::string name;
      size_t end = 0;
      const Head head = MatchHead(buf_, &name, &end);
      if (head == Head::kNeedMore) {
        // A Hermes call closed before its head was complete: the held path decides.
        if (hermes && absl::StrContains(buf_, kHermesClose)) state_ = State::kInCall;
        return;
      }
      // Only an offered function streams (enforced: the constraint names one); auto: only
      // one whose arguments are an object (a call that will not parse stays content; other
      // spellings are parsed whole).
      if (head == Head::kMismatch || !Known(name) || (mode_ == Mode::kAuto && buf_[end] != '{')) {
        HeadFailed(out);
        return;
      }
      ToolCallEvent start;
      start.kind = ToolCallEvent::Kind::kCallStart;
      start.index = num_calls_++;
      start.id = NewToolCallId();
      start.name = std::move(name);
      out->push_back(std::move(start));
      held_.clear();
      buf_.erase(0, end);
      state_ = State::kArgs;
      depth_ = 0;
      in_string_ = escape_ = scalar_ = false;
      // The value's first byte decides how its end is found.
      const char c = buf_[0];
      if (c == '{' || c == '[') {
        depth_ = 1;
      } else if (c == '"') {
        in_string_ = true;
      } else {
        scalar_ = true;
      }
      if (!scalar_) {
        ToolCallEvent piece;
        piece.kind = ToolCallEvent::Kind::kArguments;
        piece.index = num_calls_ - 1;
        piece.text = buf_.substr(0, 1);
        out->push_back(std::move(piece));
        buf_.erase(0, 1);
      }
    }
    if (state_ == State::kArgs) {
      // Hermes: </tool_call> ends the call even inside its arguments (the model cut them).
      size_t limit = buf_.size();
      bool closed = false;
      if (hermes) {
        const size_t close = absl::string_view(buf_).find(kHermesClose);
        if (close != absl::string_view::npos) {
          limit = close;
          closed = true;
        } else {
          limit -= MarkerPrefixSuffix(buf_, kHermesClose);
        }
      }
      size_t i = 0;
      bool done = false;
      for (; i < limit && !done; ++i) {
        const char c = buf_[i];
        if (scalar_) {
          if (IsSpace(c) || c == ',' || c == '}') {
            done = true;
            break;  // the delimiter is not part of the value
          }
        } else {
          done = ScanJsonByte(c, &in_string_, &escape_, &depth_) && depth_ == 0;
        }
      }
      if (i > 0) {
        ToolCallEvent piece;
        piece.kind = ToolCallEvent::Kind::kArguments;
        piece.index = num_calls_ - 1;
        piece.text = buf_.substr(0, i);
        out->push_back(std::move(piece));
      }
      buf_.erase(0, i);
      if (!done) {
        if (closed) {
          buf_.erase(0, kHermesClose.size());
          state_ = State::kText;
          after_call_ = true;
        }
        return;
      }
      state_ = State::kTail;
      call_closed_ = false;
      tail_depth_ = 1;  // auto: inside the call object
    }
    // kTail: the call's closing brace and whitespace; in a list, then ',' (the next call) or
    // ']' (the end).
    if (mode_ == Mode::kEnforced) {
      if (!list_ || list_closed_) {
        buf_.clear();
        return;
      }
      size_t i = 0;
      bool next_call = false;
      for (; i < buf_.size(); ++i) {
        const char c = buf_[i];
        if (IsSpace(c)) continue;
        if (!call_closed_) {
          call_closed_ = c == '}';
        } else if (c == ',') {
          next_call = true;
          break;
        } else if (c == ']') {
          list_closed_ = true;
          break;
        }
      }
      if (!next_call) {
        buf_.clear();
        return;
      }
      buf_.erase(0, i + 1);
      state_ = State::kHead;
      continue;
    }
    if (hermes) {
      // The rest of the call (its '}', keys the model added) up to </tool_call> is markup.
      const size_t close = absl::string_view(buf_).find(kHermesClose);
      if (close == absl::string_view::npos) {
        buf_.erase(0, buf_.size() - MarkerPrefixSuffix(buf_, kHermesClose));
        return;
      }
      buf_.erase(0, close + kHermesClose.size());
      state_ = State::kText;
      after_call_ = true;
      return;
    }
    // kLlama3/kMistral: the rest of the call object (keys after the arguments are dropped).
    size_t i = 0;
    for (; i < buf_.size() && !call_closed_; ++i) {
      call_closed_ = ScanJsonByte(buf_[i], &in_string_, &escape_, &tail_depth_) && tail_depth_ == 0;
    }
    buf_.erase(0, i);
    if (!call_closed_) return;
    const size_t text = buf_.size() - SkipSpace(buf_).size();
    buf_.erase(0, text);
    if (buf_.empty()) return;
    if (list_ && buf_[0] == ',') {
      buf_.erase(0, 1);
      state_ = State::kHead;
      continue;
    }
    // The end of the calls: what follows (after a list's ']') is content.
    if (list_ && buf_[0] == ']') buf_.erase(0, 1);
    state_ = State::kText;
    after_call_ = true;
    Content(std::exchange(buf_, std::string()), out);
    return;
  }
}

void ToolCallParser::FeedHermes(std::vector<ToolCallEvent>* out) {
  while (true) {
    if (state_ == State::kText) {
      const size_t open = absl::string_view(buf_).find(kHermesOpen);
      if (open == absl::string_view::npos) {
        const size_t keep = MarkerPrefixSuffix(buf_, kHermesOpen);
        Content(buf_.substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      Content(buf_.substr(0, open), out);
      buf_.erase(0, open + kHermesOpen.size());
      state_ = State::kHead;
    }
    if (InCall()) {
      RunCalls(out);
      if (InCall()) return;
      continue;  // kText after the call, or kInCall (held)
    }
    // kInCall: a call that does not stream, held until it is complete.
    const size_t close = absl::string_view(buf_).find(kHermesClose);
    if (close == absl::string_view::npos) return;
    const std::string body = buf_.substr(0, close);
    buf_.erase(0, close + kHermesClose.size());
    state_ = State::kText;
    if (!EmitCalls(body, /*list=*/false, out)) {
      Content(absl::StrCat(kHermesOpen, body, kHermesClose), out);
    }
  }
}

void ToolCallParser::FeedDeepseek(std::vector<ToolCallEvent>* out) {
  while (true) {
    if (state_ == State::kText) {
      const size_t open = absl::string_view(buf_).find(kDeepseekOpen);
      if (open == absl::string_view::npos) {
        const size_t keep = MarkerPrefixSuffix(buf_, kDeepseekOpen);
        Content(buf_.substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      Content(buf_.substr(0, open), out);
      buf_.erase(0, open + kDeepseekOpen.size());
      state_ = State::kInCall;
    }
    // kInCall: the calls, held until <｜tool▁calls▁end｜>, then parsed whole.
    const size_t close = absl::string_view(buf_).find(kDeepseekClose);
    if (close == absl::string_view::npos) return;
    const std::string body = buf_.substr(0, close);
    buf_.erase(0, close + kDeepseekClose.size());
    state_ = State::kText;
    if (!EmitDeepseekCalls(body, out)) {
      Content(absl::StrCat(kDeepseekOpen, body, kDeepseekClose), out);
    }
  }
}

void ToolCallParser::FeedWhole(std::vector<ToolCallEvent>* out) {
  const absl::string_view marker =
      format_ == ToolCallFormat::kMistral ? kMistralMarker : kLlamaMarker;
  if (state_ == State::kUndecided) {
    absl::string_view rest = SkipSpace(held_);
    if (rest.empty()) return;
    if (!absl::StartsWith(rest, marker)) {         // the model announced a call
      if (absl::StartsWith(marker, rest)) return;  // may still become the marker
      const bool call_like =
          rest[0] == '[' || (format_ == ToolCallFormat::kLlama3 && rest[0] == '{');
      if (!call_like && format_ == ToolCallFormat::kMistral) {
        // Mistral v11+: `name[ARGS]{...}` with the markers decoded as nothing or not.
        const Named named = NamedCallStart(rest);
        if (named == Named::kMaybe) return;
        if (named == Named::kYes) {
          state_ = State::kHold;  // parsed whole at the end (not streamed)
          return;
        }
      }
      if (!call_like) {
        state_ = State::kText;
        Content(std::exchange(held_, std::string()), out);
        return;
      }
    }
    state_ = State::kWholeStart;
    buf_ = held_;
  }
  if (state_ == State::kWholeStart) {
    absl::string_view rest = SkipSpace(buf_);
    if (absl::StartsWith(marker, rest)) return;  // "[TOOL" may be Mistral's marker
    if (absl::StartsWith(rest, marker)) rest = SkipSpace(rest.substr(marker.size()));
    if (rest.empty()) return;
    if (rest[0] == '[') {
      list_ = true;
      rest.remove_prefix(1);
    } else if (rest[0] == '{') {
      list_ = false;
    } else {
      state_ = State::kHold;  // no call: content at the end
      buf_.clear();
      return;
    }
    buf_ = std::string(rest);
    state_ = State::kHead;
  }
  if (InCall()) RunCalls(out);
}

std::vector<ToolCallEvent> ToolCallParser::Finish() {
  std::vector<ToolCallEvent> out;
  // kLlama3/kMistral auto before a call streamed: the whole output, parsed.
  auto finish_whole = [&] {
    const absl::string_view marker =
        format_ == ToolCallFormat::kMistral ? kMistralMarker : kLlamaMarker;
    absl::string_view body = SkipSpace(held_);
    if (absl::StartsWith(body, marker)) body.remove_prefix(marker.size());
    body = SkipSpace(body);
    const bool list = !body.empty() && body[0] == '[';
    if (!EmitCalls(body, list, &out) &&
        !(format_ == ToolCallFormat::kMistral && EmitNamedCalls(held_, &out))) {
      Content(std::exchange(held_, std::string()), &out);
    }
    held_.clear();
  };
  // kHermes: a call not complete (cut by max_tokens, or the model ended without the tag).
  auto finish_hermes = [&] {
    const std::string body = std::exchange(buf_, std::string());
    if (!EmitCalls(body, /*list=*/false, &out)) {
      Content(absl::StrCat(kHermesOpen, body), &out);
    }
  };
  switch (state_) {
    case State::kListOpen:
    case State::kHead:
      if (mode_ == Mode::kEnforced) {
        // Cut before a call began: content when no call came (a list's earlier calls stand).
        if (num_calls_ == 0) Content(std::exchange(buf_, std::string()), &out);
      } else if (format_ == ToolCallFormat::kHermes) {
        finish_hermes();
      } else if (num_calls_ == 0) {
        finish_whole();
      }
      buf_.clear();  // a list cut in a later call's head: the calls before it stand
      break;
    case State::kArgs:
      // Hermes: what was held back as a possible </tool_call> is the arguments' end.
      if (!buf_.empty()) {
        ToolCallEvent piece;
        piece.kind = ToolCallEvent::Kind::kArguments;
        piece.index = num_calls_ - 1;
        piece.text = std::exchange(buf_, std::string());
        out.push_back(std::move(piece));
      }
      break;
    case State::kTail:
      break;
    case State::kText:
      Content(std::exchange(buf_, std::string()), &out);
      break;
    case State::kInCall:
      if (format_ == ToolCallFormat::kDeepseek) {
        // The output ended before <｜tool▁calls▁end｜> (max_tokens, or the model stopped).
        const std::string body = std::exchange(buf_, std::string());
        if (!EmitDeepseekCalls(body, &out)) Content(absl::StrCat(kDeepseekOpen, body), &out);
      } else {
        finish_hermes();
      }
      break;
    case State::kUndecided:
      Content(std::exchange(held_, std::string()), &out);
      break;
    case State::kWholeStart:
    case State::kHold:
      finish_whole();
      break;
  }
  state_ = State::kTail;
  buf_.clear();
  return out;
}

}  // namespace pd::router::openai
