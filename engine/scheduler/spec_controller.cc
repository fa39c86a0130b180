#include "engine/scheduler/spec_controller.h"

#include <algorithm>
#include <cmath>

namespace pd::engine {
namespace {

// Weight of the past per observation: about the last 200 steps count.
constexpr double kDecay = 0.995;
constexpr double kAcceptanceDecay = 0.98;

}  // namespace

void SpecController::ObserveStep(int64_t rows, double seconds) {
  if (rows <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const auto x = static_cast<double>(rows);
  s0_ = kDecay * s0_ + 1;
  sx_ = kDecay * sx_ + x;
  sy_ = kDecay * sy_ + seconds;
  sxx_ = kDecay * sxx_ + x * x;
  sxy_ = kDecay * sxy_ + x * seconds;
}

void SpecController::ObserveDraft(int64_t passes, double seconds) {
  if (passes <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const double per_pass = seconds / static_cast<double>(passes);
  draft_weight_ = kDecay * draft_weight_ + 1;
  draft_seconds_ += (per_pass - draft_seconds_) / draft_weight_;
}

void SpecController::ObserveVerify(int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  // Per-token acceptance a from accepted tokens out of proposed: the proposal stops at the
  // first rejection, so E[accepted] = a + a^2 + ... + a^k; the fraction is a plain estimate.
  const double rate = static_cast<double>(accepted) / static_cast<double>(proposed);
  acceptance_ = kAcceptanceDecay * acceptance_ + (1 - kAcceptanceDecay) * rate;
}

bool SpecController::Fit(double* a, double* b) const {
  const double var = s0_ * sxx_ - sx_ * sx_;
  // The rows must vary (relative to their mean) for the slope to mean anything.
  if (s0_ < 8 || var <= 1e-3 * s0_ * s0_) return false;
  *b = (s0_ * sxy_ - sx_ * sy_) / var;
  *a = (sy_ - *b * sx_) / s0_;
  return true;
}

int64_t SpecController::MaxProposal(int64_t plain_rows, int64_t max_k) {
  ++steps_;
  exploring_ = false;
  if (max_k <= 0) return 0;
  double a = 0, b = 0;
  if (steps_ % explore_every_ == 0 || !Fit(&a, &b)) {  // measure
    exploring_ = true;
    return max_k;
  }
  b = std::max(b, 0.0);
  a = std::max(a, 0.0);
  const double r = static_cast<double>(std::max<int64_t>(plain_rows, 1));
  const double step = a + b * r;
  if (step <= 0) return max_k;
  const double threshold = (b * r + draft_seconds_) / step;
  // E(k) / k for a proposal of k, with per-token acceptance p: (p + p^2 + ... + p^k) / k,
  // decreasing in k; the longest k above the threshold.
  const double p = acceptance_;
  double expected = 0;
  double power = 1;
  int64_t best = 0;
  for (int64_t k = 1; k <= max_k; ++k) {
    power *= p;
    expected += power;
    if (expected / static_cast<double>(k) > threshold) best = k;
  }
  return best;
}

}  // namespace pd::engine
