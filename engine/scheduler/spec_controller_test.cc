#include "engine/scheduler/spec_controller.h"

#include <vector>

#include "gtest/gtest.h"

namespace pd::engine {
namespace {

// Feeds steps of 1..8 rows costing a + b * rows, and verifications accepting `rate`.
void Feed(SpecController* c, double a, double b, double rate) {
  for (int i = 0; i < 400; ++i) {
    const int rows = 1 + i % 8;
    c->ObserveStep(rows, a + b * rows);
    c->ObserveVerify(100, static_cast<int64_t>(rate * 100));
  }
}

TEST(SpecControllerTest, FitsTheStepCostAndProposesWhereItPays) {
  // A weight-bound model: 75 ms a step, 1 ms a row; a tenth of the proposals accepted still
  // pays.
  SpecController bound;
  Feed(&bound, 0.075, 0.001, 0.1);
  double a = 0, b = 0;
  ASSERT_TRUE(bound.Fit(&a, &b));
  EXPECT_NEAR(a, 0.075, 1e-6);
  EXPECT_NEAR(b, 0.001, 1e-6);
  int proposed = 0;
  for (int i = 0; i < 32; ++i) proposed += bound.MaxProposal(1, 4) > 0 ? 1 : 0;
  EXPECT_EQ(proposed, 32);
  EXPECT_GE(bound.MaxProposal(1, 4), 1);

  // A model where each row costs twice the rest of the step: a third accepted does not pay,
  // except on the steps that keep measuring, which come ever rarer while the answer stays no:
  // after 16 steps, then 32, 64, ... up to 16 x 16.
  SpecController rows;
  Feed(&rows, 0.00005, 0.0001, 0.35);
  std::vector<int> explored;
  for (int i = 1; i <= 1100; ++i) {
    const int64_t k = rows.MaxProposal(1, 4);
    EXPECT_TRUE(k == 0 || k == 4) << k;
    if (k == 4) explored.push_back(i);
  }
  EXPECT_EQ(explored, (std::vector<int>{16, 48, 112, 240, 496, 752, 1008}));
  EXPECT_EQ(rows.explore_every(), 256);
  // Once proposals pay again (nearly all accepted), the next exploration resets the interval.
  for (int i = 0; i < 400; ++i) rows.ObserveVerify(100, 98);
  int paid = 0;
  for (int i = 0; i < 300; ++i) paid += rows.MaxProposal(1, 4) > 0 ? 1 : 0;
  EXPECT_EQ(paid, 300);
  EXPECT_EQ(rows.explore_every(), SpecController::kExploreEvery);
  // With nearly every proposal accepted it pays again.
  SpecController good;
  Feed(&good, 0.00005, 0.0001, 0.95);
  EXPECT_GT(good.MaxProposal(1, 4) + good.MaxProposal(1, 4), 0);
}

// With a draft model, its passes cost too, and a step with room for few verify rows spreads
// that cost over few sequences: the proposal gets shorter, then stops.
TEST(SpecControllerTest, DraftPassesAndRoomForFewVerifyRowsShortenTheProposal) {
  SpecController c;
  Feed(&c, 0.075, 0.001, 0.7);
  for (int i = 0; i < 400; ++i) {
    const int rows = 1 + i % 8;
    c.ObserveDraft(4, rows, 4 * (0.005 + 0.0005 * rows));
  }
  EXPECT_NEAR(c.DraftPassSeconds(32), 0.005 + 0.0005 * 32, 1e-9);
  EXPECT_EQ(c.MaxProposal(1, 4), 4);
  // 32 sequences all proposing: E(k)/k > (32b + c(32)) / (a + 32b) = 0.495 up to k = 3.
  EXPECT_EQ(c.MaxProposal(32, 4), 3);
  // Room for 8 verify rows: one token each for 8 sequences pays (0.7 > 0.636), two each for 4
  // does not (0.595 < 0.822).
  EXPECT_EQ(c.MaxProposal(32, 4, 8), 1);
  EXPECT_EQ(c.MaxProposal(32, 4, 2), 0);
  EXPECT_EQ(c.MaxProposal(32, 4, 0), 0);

  // Passes of one size only: a pass grows with its rows as the model's step does. Weight-bound
  // (the step grows 41% from 1 row to 32): 32 sequences proposing 4 still pay.
  SpecController one;
  Feed(&one, 0.075, 0.001, 0.7);
  for (int i = 0; i < 20; ++i) one.ObserveDraft(2, 1, 0.02);
  EXPECT_NEAR(one.DraftPassSeconds(1), 0.01, 1e-12);
  EXPECT_NEAR(one.DraftPassSeconds(32), 0.01 * 0.107 / 0.076, 1e-9);
  EXPECT_EQ(one.MaxProposal(1, 4), 4);
  EXPECT_EQ(one.MaxProposal(32, 4), 4);
  // Bound by arithmetic (each row costs twice the rest of the step): at 32 rows nothing pays.
  SpecController arith;
  Feed(&arith, 0.00005, 0.0001, 0.7);
  for (int i = 0; i < 20; ++i) arith.ObserveDraft(1, 1, 0.00003);
  EXPECT_NEAR(arith.DraftPassSeconds(32), 0.00003 * 0.00325 / 0.00015, 1e-12);
  EXPECT_EQ(arith.MaxProposal(32, 4), 0);
  // Garbage is ignored.
  one.ObserveDraft(0, 1, 1.0);
  one.ObserveDraft(1, 0, 1.0);
  one.ObserveDraft(1, 1, -1.0);
  EXPECT_NEAR(one.DraftPassSeconds(1), 0.01, 1e-12);
}

// With a draft model, steps explore (one sequence proposes) until a draft pass has been timed:
// a first proposal from every sequence would make each draft catch up on its whole context.
TEST(SpecControllerTest, WithADraftTheFirstProposalsExplore) {
  SpecController c;
  c.UseDraft();
  Feed(&c, 0.075, 0.001, 0.7);
  EXPECT_EQ(c.MaxProposal(8, 4), 4);
  EXPECT_TRUE(c.exploring());
  EXPECT_EQ(c.MaxProposal(8, 4), 4);
  EXPECT_TRUE(c.exploring());
  c.ObserveDraft(4, 1, 0.004);
  EXPECT_GT(c.MaxProposal(8, 4), 0);
  EXPECT_FALSE(c.exploring());
  EXPECT_EQ(c.explore_every(), SpecController::kDraftExploreEvery);
}

TEST(SpecControllerTest, ProposesWhileItCannotTellACostFromTheRows) {
  SpecController c;
  EXPECT_EQ(c.MaxProposal(3, 4), 4);  // nothing measured
  for (int i = 0; i < 50; ++i) c.ObserveStep(4, 0.01);  // always 4 rows: no slope
  double a = 0, b = 0;
  EXPECT_FALSE(c.Fit(&a, &b));
  EXPECT_EQ(c.MaxProposal(4, 3), 3);
  EXPECT_EQ(c.MaxProposal(4, 0), 0);
  // Garbage is ignored.
  c.ObserveStep(0, 1.0);
  c.ObserveStep(3, -1.0);
  c.ObserveVerify(0, 5);
  EXPECT_FALSE(c.Fit(&a, &b));
}

}  // namespace
}  // namespace pd::engine
