#include "services/tierd/fetch_estimate.h"

#include <cmath>

namespace pd::tierd {

void FetchEstimate::Add(double bytes, double seconds) {
  if (!(bytes > 0) || !(seconds >= 0) || !std::isfinite(bytes) || !std::isfinite(seconds)) {
    return;
  }
  const double w = samples_ == 0 ? 1.0 : weight_;
  mean_b_ += w * (bytes - mean_b_);
  mean_t_ += w * (seconds - mean_t_);
  mean_bb_ += w * (bytes * bytes - mean_bb_);
  mean_bt_ += w * (bytes * seconds - mean_bt_);
  ++samples_;
}

bool FetchEstimate::Fit(double* latency, double* spb) const {
  const double var = mean_bb_ - mean_b_ * mean_b_;
  // A spread of under 5% of the mean size cannot separate latency from bandwidth.
  if (samples_ < 2 || !(var > 0.0025 * mean_b_ * mean_b_)) {
    return false;
  }
  const double slope = (mean_bt_ - mean_b_ * mean_t_) / var;
  const double intercept = mean_t_ - slope * mean_b_;
  if (!(slope > 0) || !(intercept >= 0)) {
    return false;
  }
  *latency = intercept;
  *spb = slope;
  return true;
}

double FetchEstimate::latency_seconds() const {
  double latency = 0, spb = 0;
  return Fit(&latency, &spb) ? latency : 0;
}

double FetchEstimate::seconds_per_byte() const {
  double latency = 0, spb = 0;
  return Fit(&latency, &spb) ? spb : Average();
}

double FetchEstimate::Average() const { return mean_b_ > 0 ? mean_t_ / mean_b_ : 0; }

double FetchEstimate::Predict(double bytes, int64_t requests) const {
  if (samples_ == 0) {
    return 0;
  }
  double latency = 0, spb = 0;
  if (!Fit(&latency, &spb)) {
    return bytes * Average();
  }
  return latency * static_cast<double>(requests < 1 ? 1 : requests) + bytes * spb;
}

}  // namespace pd::tierd
