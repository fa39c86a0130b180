#include "engine/scheduler/spec_controller.h"

#include <algorithm>
#include <cmath>

namespace pd::engine {
namespace {

// Weight of the past per observation: about the last 200 steps count.
constexpr double kDecay = 0.995;
constexpr double kAcceptanceDecay = 0.98;

}  // namespace

void DecayingLinearFit::Observe(double x, double y) {
  s0_ = kDecay * s0_ + 1;
  sx_ = kDecay * sx_ + x;
  sy_ = kDecay * sy_ + y;
  sxx_ = kDecay * sxx_ + x * x;
  sxy_ = kDecay * sxy_ + x * y;
}

bool DecayingLinearFit::Fit(double* a, double* b) const {
  const double var = s0_ * sxx_ - sx_ * sx_;
  // The x must vary (relative to their mean) for the slope to mean anything.
  if (s0_ < 8 || var <= 1e-3 * s0_ * s0_) return false;
  *b = (s0_ * sxy_ - sx_ * sy_) / var;
  *a = (sy_ - *b * sx_) / s0_;
  return true;
}

void SpecController::ObserveStep(int64_t rows, double seconds) {
  if (rows <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  step_fit_.Observe(static_cast<double>(rows), seconds);
}

void SpecController::ObserveDraft(int64_t passes, int64_t rows, double seconds) {
  if (passes <= 0 || rows <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  draft_fit_.Observe(static_cast<double>(rows), seconds / static_cast<double>(passes));
}

double SpecController::DraftPassSeconds(int64_t rows) const {
  if (draft_fit_.weight() <= 0 || rows <= 0) return 0;
  const auto m = static_cast<double>(rows);
  double c0 = 0, c1 = 0;
  if (draft_fit_.Fit(&c0, &c1) && c1 >= 0) return std::max(c0 + c1 * m, 0.0);
  // Passes of one size only (an exploration proposes for one sequence): the draft's kernels
  // run on the model's device, so its pass grows with its rows as the model's step does.
  const double seen = draft_fit_.mean_x();
  double a = 0, b = 0;
  if (step_fit_.Fit(&a, &b)) {
    a = std::max(a, 0.0);
    b = std::max(b, 0.0);
    if (a + b * seen > 0) return draft_fit_.mean_y() * (a + b * m) / (a + b * seen);
  }
  return seen > 0 ? draft_fit_.mean_y() / seen * m : 0;
}

void SpecController::ObserveVerify(int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  // Per-token acceptance a from accepted tokens out of proposed: the proposal stops at the
  // first rejection, so E[accepted] = a + a^2 + ... + a^k; the fraction is a plain estimate.
  const double rate = static_cast<double>(accepted) / static_cast<double>(proposed);
  acceptance_ = kAcceptanceDecay * acceptance_ + (1 - kAcceptanceDecay) * rate;
}

bool SpecController::Fit(double* a, double* b) const { return step_fit_.Fit(a, b); }

int64_t SpecController::MaxProposal(int64_t plain_rows, int64_t max_k, int64_t spare_rows) {
  exploring_ = false;
  if (max_k <= 0 || spare_rows <= 0) return 0;
  double a = 0, b = 0;
  if (!Fit(&a, &b) || (draft_ && draft_fit_.weight() <= 0)) {  // measure
    exploring_ = true;
    return max_k;
  }
  if (++since_explore_ >= explore_every_) {  // measure again
    explore_every_ = proposed_since_explore_
                         ? base_explore_every_
                         : std::min(2 * explore_every_, kMaxExploreBackoff * base_explore_every_);
    since_explore_ = 0;
    proposed_since_explore_ = false;
    exploring_ = true;
    return max_k;
  }
  b = std::max(b, 0.0);
  a = std::max(a, 0.0);
  const int64_t rows = std::max<int64_t>(plain_rows, 1);
  const double r = static_cast<double>(rows);
  const double step = a + b * r;
  if (step <= 0) return max_k;
  // E(k) / k for a proposal of k, with per-token acceptance p: (p + p^2 + ... + p^k) / k,
  // decreasing in k; the longest k above its threshold, which grows as fewer sequences have
  // room for k verify rows each.
  const double p = acceptance_;
  double expected = 0;
  double power = 1;
  int64_t best = 0;
  for (int64_t k = 1; k <= max_k; ++k) {
    power *= p;
    expected += power;
    const int64_t proposing = std::min(rows, spare_rows / k);
    if (proposing <= 0) break;
    const double m = static_cast<double>(proposing);
    const double threshold = r * (b * m + DraftPassSeconds(proposing)) / (m * step);
    if (expected / static_cast<double>(k) > threshold) best = k;
  }
  if (best > 0) proposed_since_explore_ = true;
  return best;
}

}  // namespace pd::engine
