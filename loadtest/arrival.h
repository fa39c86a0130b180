// Arrival processes: when a load test sends its requests.
//
//   closed   a fixed number of requests in flight (--concurrency): each completion starts the
//            next request.
//   poisson  open loop, exponential gaps with mean 1 / rate.
//   gamma    open loop, Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) gaps: same
//            mean rate; burstiness < 1 is burstier than Poisson, > 1 more regular (vLLM's
//            --burstiness). burstiness = 1 is Poisson.
//   trace    the trace's timestamps (scaled by --time_scale).
// The open-loop processes send the first request at t = 0.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pd::loadtest {

enum class ArrivalMode { kClosed, kPoisson, kGamma, kTrace };

absl::string_view ArrivalModeName(ArrivalMode mode);
// Parses "closed", "poisson", "gamma" or "trace"; InvalidArgument otherwise.
absl::StatusOr<ArrivalMode> ParseArrivalMode(absl::string_view text);

// Inter-arrival gaps of an open-loop process (poisson or gamma). Deterministic for a seed.
// Thread-compatible.
class ArrivalGaps {
 public:
  // InvalidArgument unless rate_per_s > 0 and burstiness > 0 (both finite).
  static absl::StatusOr<ArrivalGaps> Create(double rate_per_s, double burstiness, uint64_t seed);

  // The gap between the previous arrival and the next one.
  absl::Duration Next();

 private:
  ArrivalGaps(double shape, double scale_s, uint64_t seed) : rng_(seed), gamma_(shape, scale_s) {}

  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;  // in seconds
};

}  // namespace pd::loadtest
