// The penalties and min_p every request of a load run asks for (pd-loadtest --presence_penalty,
// --frequency_penalty, --repetition_penalty, --min_p), sent over either backend: OpenAI's
// presence_penalty and frequency_penalty, vLLM's repetition_penalty, min_p. Zero = unset (not
// sent; the server's default). Meanings: docs/openai.md.
#pragma once

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pd::loadtest {

struct SamplingPenalties {
  double presence_penalty = 0;    // [-2, 2]
  double frequency_penalty = 0;   // [-2, 2]
  double repetition_penalty = 0;  // > 0 (1 = off); 0 = unset
  double min_p = 0;               // [0, 1]

  bool any() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 0 ||
           min_p != 0;
  }

  // InvalidArgument naming the flag (the ranges the servers accept).
  absl::Status Validate() const {
    auto in = [](const char* flag, double v, double lo, double hi) {
      return std::isfinite(v) && v >= lo && v <= hi
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(
                       absl::StrCat("--", flag, " must be in [", lo, ", ", hi, "], got ", v));
    };
    if (absl::Status s = in("presence_penalty", presence_penalty, -2, 2); !s.ok()) return s;
    if (absl::Status s = in("frequency_penalty", frequency_penalty, -2, 2); !s.ok()) return s;
    if (absl::Status s = in("min_p", min_p, 0, 1); !s.ok()) return s;
    if (!std::isfinite(repetition_penalty) || repetition_penalty < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--repetition_penalty must be > 0 (1 = off; 0 = unset), got ", repetition_penalty));
    }
    return absl::OkStatus();
  }
};

}  // namespace pd::loadtest
