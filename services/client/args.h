// Command-line handling of pd-client: the argv pre-pass that runs before absl parses flags, and
// the translation of the parsed options into a pdserve.v1.GenerateRequest.
//
// Everything here is pure (no flags, no I/O), so pd-client's usage errors are unit-tested; the
// flags themselves are defined in services/client/main.cc. Thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pd/v1/generation.pb.h"

namespace pd::client {

// What the pre-pass needs to know about one defined flag.
struct FlagInfo {
  // Boolean flags take no separate value argument (`--json`, `--nojson`, `--json=false`).
  bool is_bool = false;
  // Checks a value without keeping it; returns "" when valid, else absl's reason. Null = any
  // value is accepted.
  std::function<std::string(absl::string_view value)> check;
};

// Looks a flag up by its (underscore) name; nullopt when no such flag is defined.
using FlagLookup = std::function<std::optional<FlagInfo>(absl::string_view name)>;

// The result of PreparseArgs.
struct PreparsedArgs {
  // argv for absl::ParseCommandLine: dashed names rewritten, --stop occurrences removed.
  std::vector<std::string> argv;
  // The value of every --stop occurrence, in order, still unsplit (see SplitStopList).
  std::vector<std::string> stop;
};

// The pre-pass over argv (argv[0] first), so that usage errors exit with status 2 instead of
// absl's 1 and repeated --stop flags accumulate instead of the last one winning:
//  - dashed flag names are accepted (UndashFlag, common/base/dashed_flags.h);
//  - every flag must exist (`lookup`; --noNAME is NAME for booleans) and its value must pass
//    the flag's check; a non-boolean flag without "=" takes the next argument as its value;
//  - `--stop V` / `--stop=V` occurrences are taken out into `stop`;
//  - after "--" everything is positional and left alone.
// InvalidArgument naming the argument on an unknown flag, a missing or invalid value.
absl::StatusOr<PreparsedArgs> PreparseArgs(const std::vector<std::string>& argv,
                                           const FlagLookup& lookup);

// Splits --stop values on commas into stop strings; "\," is a literal comma and "\\" a
// backslash. InvalidArgument on an empty stop string (as in "a,,b") or a dangling backslash.
absl::StatusOr<std::vector<std::string>> SplitStopList(const std::vector<std::string>& values);

// Parses a comma-separated list of token ids ("1, 403,407"); spaces around ids are ignored.
// InvalidArgument on an empty list, an empty entry or a value that is not a uint32.
absl::StatusOr<std::vector<uint32_t>> ParseTokenIds(absl::string_view text);

// The generation options of pd-client, as the flags give them.
struct RequestOptions {
  std::string model;                      // "" = the router's default model
  std::vector<std::string> prompt_words;  // positional arguments, joined with single spaces
  std::string token_ids;                  // --token_ids: comma list; exclusive with the prompt
  uint32_t max_tokens = 0;                // 0 = until EOS or the context window
  float temperature = 0;                  // 0 = greedy
  float top_p = 0;                        // 0 = disabled
  uint32_t top_k = 0;                     // 0 = disabled
  std::string seed;                       // "" = the server draws one; else a uint64
  std::vector<std::string> stop;          // raw --stop values (SplitStopList)
  bool ignore_eos = false;
  // Logit processing (docs/openai.md, "Order of the sampling steps"); 0 = off. The server
  // checks the ranges and the token ids against the vocabulary.
  float presence_penalty = 0;
  float frequency_penalty = 0;
  float repetition_penalty = 0;  // 0 = 1 = off
  float min_p = 0;
  std::string logit_bias;  // --logit_bias: "ID:BIAS,ID:BIAS"; "" = none
  std::string cache_salt;  // "" = unset (the server rejects a set-but-empty salt)
  std::string tenant;      // "" = unset
};

// Builds the request. InvalidArgument (a usage error) when there is neither a prompt nor
// --token_ids or both, the prompt text is empty, or a value is out of range (temperature < 0
// or not finite, top_p outside [0, 1], bad seed, token ids, stop list or logit_bias list).
// Limits that depend on the model (context length, vocabulary) and the ranges of the
// penalties are left to the server, which names the field it refuses.
absl::StatusOr<pdserve::v1::GenerateRequest> BuildRequest(const RequestOptions& options);

}  // namespace pd::client
