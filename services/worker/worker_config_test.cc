// WorkerConfig: the per-rank pools' staging area (its automatic size and the flag's checks).
#include "services/worker/worker_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::worker {
namespace {

using ::testing::HasSubstr;

TEST(WorkerConfigTest, StagingAreaIsAQuarterOfThePoolAndHoldsOneFullContextSequence) {
  EXPECT_EQ(StagingBlocksFor(1024, 16, 2048), 256);  // a quarter
  EXPECT_EQ(StagingBlocksFor(256, 16, 4096), 256);   // one 4k sequence is 256 blocks
  EXPECT_EQ(StagingBlocksFor(64, 16, 4096), 64);     // never more than the pool
  EXPECT_EQ(StagingBlocksFor(8, 16, 20), 2);         // 20 tokens: two blocks
  EXPECT_EQ(StagingBlocksFor(1, 16, 1), 1);
}

TEST(WorkerConfigTest, StagingBlocksAreForPerRankPoolsOnly) {
  WorkerConfig c;
  c.runtime.model = "m";
  c.transport = "tcp";
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  c.kv_staging_blocks = 8;
  EXPECT_THAT(c.Validate().message(),
              HasSubstr("--kv_staging_blocks must be >= 0 and is for --tp_kv_pools=per_rank"));
  c.runtime.tensor_parallel = 2;
  c.runtime.tp_rank_pools = true;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  c.kv_staging_blocks = -1;
  EXPECT_FALSE(c.Validate().ok());
  c.kv_staging_blocks = c.runtime.kv_blocks + 1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("is more than --kv_blocks"));
}

}  // namespace
}  // namespace pd::worker
