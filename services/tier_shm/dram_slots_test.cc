#include "services/tier_shm/dram_slots.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pd::tier_shm {
namespace {

// One object per test, named after it (tests may run in parallel processes).
std::string ShmNameOfThisTest() {
  return absl::StrCat("/pd-dram-slots-", getpid(), "-",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

TEST(DramSlotsTest, SlotsArePageAligned) {
  EXPECT_EQ(SlotBytesFor(1), 4096);
  EXPECT_EQ(SlotBytesFor(4096), 4096);
  EXPECT_EQ(SlotBytesFor(4097), 8192);
}

// A worker maps the owner's pool from the geometry Attach reports: slot i at i * slot_bytes.
TEST(DramSlotsTest, WorkerMapsThePoolFromItsGeometry) {
  const std::string name = ShmNameOfThisTest();
  absl::StatusOr<std::unique_ptr<ShmRegion>> owner = ShmRegion::Create(name, 3 * 8192);
  ASSERT_TRUE(owner.ok()) << owner.status();
  std::memcpy((*owner)->data() + 2 * 8192, "slot2", 5);
  absl::StatusOr<std::unique_ptr<ShmRegion>> worker = MapDramPool(name, 3, 8192);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(std::memcmp((*worker)->data() + 2 * 8192, "slot2", 5), 0);
  // Another size than the object's: refused, naming both sizes.
  absl::StatusOr<std::unique_ptr<ShmRegion>> bigger = MapDramPool(name, 4, 8192);
  EXPECT_EQ(bigger.status().code(), absl::StatusCode::kFailedPrecondition) << bigger.status();
}

TEST(DramSlotsTest, BadGeometryIsInvalidArgument) {
  const std::string name = ShmNameOfThisTest();
  for (auto [slots, bytes] : {std::pair<int64_t, int64_t>{0, 4096},
                              {4, 5000},
                              {4, 0},
                              {kMaxDramSlots + 1, 4096},
                              {kMaxDramSlots, int64_t{1} << 62}}) {
    absl::StatusOr<std::unique_ptr<ShmRegion>> r = MapDramPool(name, slots, bytes);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << slots << " x " << bytes;
    EXPECT_NE(r.status().message().find("bad geometry"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace pd::tier_shm
