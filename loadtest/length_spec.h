// LengthSpec: a distribution of token counts (prompt or output lengths) given on the command
// line, e.g. --input_len=uniform:64,256.
//
// Syntax (documented in docs/loadtest.md):
//   N  or  fixed:N                 always N
//   uniform:A,B                    uniform integer in [A, B], both inclusive
//   normal:MEAN,SD                 round(normal(MEAN, SD)) clamped to [1, 2*MEAN]
//   normal:MEAN,SD,MIN,MAX         the same, clamped to [MIN, MAX]
// Every length is >= 1. Thread-compatible value type.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::loadtest {

class LengthSpec {
 public:
  enum class Kind { kFixed, kUniform, kNormal };

  // InvalidArgument naming `text` for a malformed spec, a length < 1, A > B, SD < 0,
  // or MIN > MAX.
  static absl::StatusOr<LengthSpec> Parse(absl::string_view text);
  static LengthSpec Fixed(int64_t n);

  // Draws one length; consumes the generator's state only for random kinds.
  int64_t Sample(std::mt19937_64& rng) const;

  Kind kind() const { return kind_; }
  // Largest value Sample can return.
  int64_t max() const { return max_; }
  // The canonical spelling ("128", "uniform:64,256", "normal:512,64,1,1024").
  std::string ToString() const;

 private:
  LengthSpec() = default;

  Kind kind_ = Kind::kFixed;
  double mean_ = 0;  // kNormal
  double sd_ = 0;    // kNormal
  int64_t min_ = 1;  // kFixed: the value; kUniform: A; kNormal: MIN
  int64_t max_ = 1;  // kFixed: the value; kUniform: B; kNormal: MAX
};

}  // namespace pd::loadtest
