// When speculation pays (issue #33, "decided from measured step costs, not a fixed
// threshold"): the scheduler measures each forward pass of one-token rows (decodes and verify
// rows) and how many rows it had, fits the step time as a + b * rows (exponentially weighted
// least squares, so it follows load and machine),
// and tracks the share of proposed tokens accepted. A step with R plain rows yields R tokens in
// a + bR; adding k verify rows with expected accepted tokens E(k) yields R + E(k) tokens in
// a + b(R + k). That is more tokens per second exactly when E(k) / k > bR / (a + bR), so a
// proposal is cut to the longest k that passes. On a model whose step is bound by reading its
// weights, b is small against a and speculation runs; on one where every row costs as much as
// the weights (a tiny model, or a large batch), it stops. One step in kExploreEvery proposes
// anyway, so the fit and the acceptance keep being measured. With a draft model, its time is a
// cost too: a proposal of k tokens per sequence takes k draft passes (batched over the
// sequences). And a step has room for only so many verify rows (the step's row and token
// caps): when m of the R sequences can propose k, m * E(k) tokens are gained for b * m * k +
// k * c(m) seconds, c(m) the time of a draft pass of m rows (fitted as c0 + c1 * m like the
// step; scaled as the step scales with its rows while the passes seen had one size). The rule
// becomes E(k) / k > R (b m + c(m)) / (m (a + bR)); with every sequence proposing and no draft
// it is the one above. docs/engine.md.
#pragma once

#include <cstdint>
#include <limits>

namespace pd::engine {

// Exponentially weighted least squares of y = a + b * x (about the last 200 observations).
class DecayingLinearFit {
 public:
  void Observe(double x, double y);
  // False until the x seen vary enough (relative to their mean) to separate a from b.
  bool Fit(double* a, double* b) const;
  // The weighted means of x and y (0 when nothing was observed).
  double mean_x() const { return s0_ > 0 ? sx_ / s0_ : 0; }
  double mean_y() const { return s0_ > 0 ? sy_ / s0_ : 0; }
  double weight() const { return s0_; }

 private:
  double s0_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
};

class SpecController {
 public:
  static constexpr int64_t kExploreEvery = 16;
  // With a draft model: an exploring step first computes what the draft missed since the last
  // (a prefill's worth), so it explores four times less often.
  static constexpr int64_t kDraftExploreEvery = 64;
  // While the steps between explorations all decline, each exploration waits twice as long as
  // the last, up to this many times the base interval: measuring costs (an exploring step's
  // proposal, and with a draft model its catch-up), and an answer that stays "no" needs asking
  // less often. A step that proposes again resets the interval.
  static constexpr int64_t kMaxExploreBackoff = 16;
  // A draft model proposes: explorations every kDraftExploreEvery steps, and the first
  // proposals (before a draft pass is timed) explore on one sequence too.
  void UseDraft() {
    base_explore_every_ = explore_every_ = kDraftExploreEvery;
    draft_ = true;
  }
  // Steps from one exploration to the next, as backed off now.
  int64_t explore_every() const { return explore_every_; }

  // A forward pass of `rows` one-token rows took `seconds`.
  void ObserveStep(int64_t rows, double seconds);
  // A draft model's proposals for one step (`rows` sequences', batched) ran `passes` forward
  // passes of the draft in `seconds`: an added cost of proposing, counted against what the
  // proposals save.
  void ObserveDraft(int64_t passes, int64_t rows, double seconds);
  // A verification: `proposed` tokens, `accepted` of them taken.
  void ObserveVerify(int64_t proposed, int64_t accepted);
  // Called once per step that could speculate, with its plain rows and the verify rows the
  // step has room for: the longest proposal worth verifying, at most `max_k` (0: none).
  int64_t MaxProposal(int64_t plain_rows, int64_t max_k,
                      int64_t spare_rows = std::numeric_limits<int64_t>::max());
  // Seconds of one draft pass of `rows` rows: fitted as c0 + c1 * rows once the passes seen
  // had several sizes; before, the mean pass scaled as the model's step scales with its rows
  // (the draft runs the same kernels on the same device), or in proportion to the rows while
  // the step has no fit. 0 before any pass.
  double DraftPassSeconds(int64_t rows) const;

  // The current fit (for tests and logs): step seconds = a + b * rows; false until the rows seen
  // vary enough to separate a from b.
  bool Fit(double* a, double* b) const;
  double acceptance() const { return acceptance_; }
  // The last MaxProposal allowed max_k only to measure (an exploring step, or no fit yet).
  bool exploring() const { return exploring_; }

 private:
  // Step seconds against rows.
  DecayingLinearFit step_fit_;
  // Seconds of one draft pass against its rows.
  DecayingLinearFit draft_fit_;
  // Per-token acceptance, weighted toward recent verifications; optimistic until measured.
  double acceptance_ = 0.5;
  int64_t since_explore_ = 0;
  int64_t base_explore_every_ = kExploreEvery;
  int64_t explore_every_ = kExploreEvery;
  // Whether a step since the last exploration proposed.
  bool proposed_since_explore_ = false;
  bool draft_ = false;
  bool exploring_ = false;
};

}  // namespace pd::engine
