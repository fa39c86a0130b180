#include "loadtest/arrival.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pd::loadtest {

absl::string_view ArrivalModeName(ArrivalMode mode) {
  switch (mode) {
    case ArrivalMode::kClosed:
      return "closed";
    case ArrivalMode::kPoisson:
      return "poisson";
    case ArrivalMode::kGamma:
      return "gamma";
    case ArrivalMode::kTrace:
      return "trace";
  }
  return "?";
}

absl::StatusOr<ArrivalMode> ParseArrivalMode(absl::string_view text) {
  for (ArrivalMode m :
       {ArrivalMode::kClosed, ArrivalMode::kPoisson, ArrivalMode::kGamma, ArrivalMode::kTrace}) {
    if (text == ArrivalModeName(m)) {
      return m;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--arrival must be auto, closed, poisson, gamma or trace, got '", text, "'"));
}

absl::StatusOr<ArrivalGaps> ArrivalGaps::Create(double rate_per_s, double burstiness,
                                                uint64_t seed) {
  if (!(rate_per_s > 0) || !std::isfinite(rate_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--request_rate must be > 0 and finite, got ", rate_per_s));
  }
  if (!(burstiness > 0) || !std::isfinite(burstiness)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--burstiness must be > 0 and finite, got ", burstiness));
  }
  // Mean of Gamma(k, theta) is k * theta = 1 / rate.
  return ArrivalGaps(burstiness, 1.0 / (rate_per_s * burstiness), seed);
}

absl::Duration ArrivalGaps::Next() { return absl::Seconds(gamma_(rng_)); }

}  // namespace pd::loadtest
