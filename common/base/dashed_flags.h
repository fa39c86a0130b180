// Dashed flag names on the command line: the binaries that accept them (pd-client, pd-loadtest,
// pd-routesim) rewrite "--max-tokens=5" to absl's "--max_tokens=5" before absl parses argv.
// The functions are pure and thread-safe; an UndashedArgv is thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pd {

// Rewrites the name part of a flag argument from dashes to underscores, leaving the value alone:
// "--max-tokens=5" -> "--max_tokens=5", "-top-k" -> "-top_k", "--stop=a-b" -> "--stop=a-b".
// Arguments that are not flags ("prompt", "-", "--") are returned unchanged.
std::string UndashFlag(absl::string_view arg);

// UndashFlag of every argument of `args` except args[0] (the program) and everything after a
// "--" argument (positional only).
std::vector<std::string> UndashFlagNames(const std::vector<std::string>& args);

// A main's argv after UndashFlagNames, in the form absl's flag parser takes (argc(), argv(),
// argv()[argc()] == nullptr). Owns the strings argv() points to, so it is neither copied nor
// moved; keep it alive while the parsed arguments are used.
class UndashedArgv {
 public:
  UndashedArgv(int argc, char** argv);
  UndashedArgv(const UndashedArgv&) = delete;
  UndashedArgv& operator=(const UndashedArgv&) = delete;

  int argc() const { return static_cast<int>(args_.size()); }
  char** argv() { return argv_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<char*> argv_;  // into args_, then nullptr
};

}  // namespace pd
