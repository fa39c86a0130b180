#include "services/router/openai/connection_caps.h"

#include "gtest/gtest.h"

namespace pd::router::openai {
namespace {

using Verdict = ConnectionCaps::Verdict;

TEST(ConnectionCapsTest, PerClientCapLeavesRoomForOthers) {
  ConnectionCaps caps(/*max_open=*/10, /*max_per_client=*/2);
  EXPECT_EQ(caps.TryOpen("10.0.0.1"), Verdict::kAdmit);
  EXPECT_EQ(caps.TryOpen("10.0.0.1"), Verdict::kAdmit);
  EXPECT_EQ(caps.TryOpen("10.0.0.1"), Verdict::kClientLimit);
  EXPECT_EQ(caps.TryOpen("10.0.0.2"), Verdict::kAdmit);
  EXPECT_EQ(caps.open(), 3);
  caps.Close("10.0.0.1");
  EXPECT_EQ(caps.TryOpen("10.0.0.1"), Verdict::kAdmit);
}

TEST(ConnectionCapsTest, HardCapRefusesEveryoneAndRecovers) {
  ConnectionCaps caps(/*max_open=*/3, /*max_per_client=*/0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(caps.TryOpen("::1"), Verdict::kAdmit);
  EXPECT_EQ(caps.TryOpen("::1"), Verdict::kOpenLimit);
  EXPECT_EQ(caps.TryOpen("10.0.0.9"), Verdict::kOpenLimit);
  caps.Close("::1");
  EXPECT_EQ(caps.TryOpen("10.0.0.9"), Verdict::kAdmit);
  EXPECT_EQ(caps.open(), 3);
}

TEST(ConnectionCapsTest, ClientsWithNothingOpenAreForgotten) {
  ConnectionCaps caps(100, 5);
  EXPECT_EQ(caps.TryOpen("a"), Verdict::kAdmit);
  EXPECT_EQ(caps.TryOpen("b"), Verdict::kAdmit);
  EXPECT_EQ(caps.clients(), 2u);
  caps.Close("a");
  caps.Close("b");
  caps.Close("never-opened");  // ignored
  EXPECT_EQ(caps.clients(), 0u);
  EXPECT_EQ(caps.open(), 0);
}

}  // namespace
}  // namespace pd::router::openai
