// Fuzzes the tool-call parser pd-router runs on model output (services/router/openai/
// tool_parser.h): with tools offered, a model's output is text no one controls, in every family
// format, enforced or auto, one call or a list.
//
// Input: byte 0 picks the mode, the family and `list`, and whether the reasoning parser
// (reasoning_parser.h) runs in front, as ResponseBuilder runs it for thinking models (bit 4;
// bit 5: the prompt opened the block); byte 1 the sizes of the pieces the rest is fed in (as a
// stream's messages, from one byte each to the whole).
//
// Oracle: no crash and no sanitizer report; the events are well formed (calls start in order,
// name an offered function, arguments belong to a started call); and the result does not
// depend on how the output was cut into pieces: fed whole or piece by piece, the reasoning,
// content, calls and arguments are the same.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/log/log.h"
#include "services/router/openai/reasoning_parser.h"
#include "services/router/openai/tool_parser.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using pd::router::openai::ReasoningEvent;
using pd::router::openai::ReasoningParser;
using pd::router::openai::ToolCallEvent;
using pd::router::openai::ToolCallFormat;
using pd::router::openai::ToolCallParser;

struct Result {
  std::string reasoning;
  std::string content;
  std::vector<std::string> names;
  std::vector<std::string> arguments;
};

void Take(const std::vector<ToolCallEvent>& events, Result* r) {
  for (const ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::kContent:
        r->content += e.text;
        break;
      case ToolCallEvent::Kind::kCallStart:
        CHECK_EQ(e.index, static_cast<int>(r->names.size()));
        CHECK(e.name == "get_weather" || e.name == "f") << e.name;
        r->names.push_back(e.name);
        r->arguments.emplace_back();
        break;
      case ToolCallEvent::Kind::kArguments:
        CHECK_GE(e.index, 0);
        CHECK_LT(e.index, static_cast<int>(r->arguments.size()));
        r->arguments[e.index] += e.text;
        break;
    }
  }
}

Result Run(uint8_t config, absl::string_view text, size_t (*next_size)(size_t, uint8_t),
           uint8_t sizes) {
  static const ToolCallFormat kFormats[] = {ToolCallFormat::kHermes, ToolCallFormat::kLlama3,
                                            ToolCallFormat::kMistral};
  const auto mode =
      (config & 1) != 0 ? ToolCallParser::Mode::kEnforced : ToolCallParser::Mode::kAuto;
  ToolCallParser parser(mode, kFormats[(config >> 1) % 3], {"get_weather", "f"},
                        /*list=*/(config & 8) != 0);
  Result r;
  std::optional<ReasoningParser> reasoning;
  if ((config & 16) != 0) reasoning.emplace((config & 32) != 0);
  // The content of a piece of output (all of it without the reasoning parser).
  auto content_of = [&](std::vector<ReasoningEvent> events) {
    std::string content;
    for (const ReasoningEvent& e : events) {
      (e.kind == ReasoningEvent::Kind::kReasoning ? r.reasoning : content) += e.text;
    }
    return content;
  };
  size_t pos = 0;
  for (size_t i = 0; pos < text.size(); ++i) {
    const size_t n = std::min(next_size(i, sizes), text.size() - pos);
    const absl::string_view piece = text.substr(pos, n);
    Take(parser.Feed(reasoning ? content_of(reasoning->Feed(piece)) : std::string(piece)), &r);
    pos += n;
  }
  if (reasoning) Take(parser.Feed(content_of(reasoning->Finish())), &r);
  Take(parser.Finish(), &r);
  if (reasoning && !reasoning->in_block()) CHECK(r.reasoning.empty()) << "reasoning without a block";
  CHECK_EQ(parser.num_calls(), static_cast<int>(r.names.size()));
  return r;
}

size_t Whole(size_t, uint8_t) { return ~size_t{0}; }
size_t Pieces(size_t i, uint8_t sizes) {
  // Piece i is 1 to 8 bytes long, cycling through the bits of `sizes`.
  return 1 + ((sizes >> (i % 6)) & 7);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t config = data[0];
  const uint8_t sizes = data[1];
  const absl::string_view text = pd::fuzz::AsView(data + 2, size - 2);
  const Result whole = Run(config, text, Whole, sizes);
  const Result pieces = Run(config, text, Pieces, sizes);
  CHECK(whole.reasoning == pieces.reasoning) << "reasoning depends on the pieces";
  CHECK(whole.content == pieces.content) << "content depends on the pieces";
  CHECK(whole.names == pieces.names) << "calls depend on the pieces";
  CHECK(whole.arguments == pieces.arguments) << "arguments depend on the pieces";
  return 0;
}
