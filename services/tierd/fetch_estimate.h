// FetchEstimate: the measured cost of fetching blocks from one other node (one "path"; issue
// #19 item 2): a latency per request and a time per byte, kept as moving estimates fitted to
// every request's (bytes, seconds). PeerLink predicts a fetch with it and compares that with
// the worker's measured time to compute the same blocks.
//
// The fit: exponentially weighted moments of bytes b and seconds t (mean b, mean t, mean b*b,
// mean b*t; each new sample weighs `weight`) give the least-squares line t = latency + b * spb.
// While the requests seen are all about the same size (no spread in b) the line is not
// determined: the latency is taken as 0 and the time per byte as mean t / mean b, the average
// with the latency folded in. A fitted line with a negative slope or intercept (noise) falls
// back the same way.
//
// Thread-safety: thread-compatible (PeerLink guards it with its mutex).
#pragma once

#include <cstdint>

namespace pd::tierd {

class FetchEstimate {
 public:
  // `weight` in (0, 1]: how much each new sample counts (0.2: about the last five requests).
  explicit FetchEstimate(double weight = 0.2) : weight_(weight) {}

  // One request that moved `bytes` (> 0) in `seconds` (>= 0); other samples are ignored.
  void Add(double bytes, double seconds);

  // No sample yet.
  bool empty() const { return samples_ == 0; }
  int64_t samples() const { return samples_; }
  // The fitted latency per request (s) and time per byte (s/B); 0 while empty.
  double latency_seconds() const;
  double seconds_per_byte() const;
  // Estimated seconds to move `bytes` in `requests` requests; 0 while empty.
  double Predict(double bytes, int64_t requests) const;

 private:
  // The fitted line; false when it is not determined or not plausible (see the file comment).
  bool Fit(double* latency, double* spb) const;
  // mean t / mean b: the time per byte with the latency folded in (0 while empty).
  double Average() const;

  double weight_;
  int64_t samples_ = 0;
  double mean_b_ = 0, mean_t_ = 0, mean_bb_ = 0, mean_bt_ = 0;
};

}  // namespace pd::tierd
