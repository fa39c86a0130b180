#include "transport/internal/peer_table.h"

#include <memory>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::transport::transport_internal {
namespace {

struct FakeConn {
  uint64_t instance = 0;
  bool dead = false;
};
using Table = PeerTable<std::shared_ptr<FakeConn>>;

TEST(PeerTableTest, HandlesAreFreshAndNeverReused) {
  Table t;
  const PeerHandle a = t.Add(std::make_shared<FakeConn>());
  const PeerHandle b = t.Add(std::make_shared<FakeConn>());
  EXPECT_NE(a, b);
  ASSERT_TRUE(t.Remove(a).ok());
  const PeerHandle c = t.Add(std::make_shared<FakeConn>());
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(t.Values().size(), 2u);
}

TEST(PeerTableTest, GetAndRemoveNameTheOperationAndPeer) {
  Table t;
  auto conn = std::make_shared<FakeConn>();
  const PeerHandle h = t.Add(conn);
  absl::StatusOr<std::shared_ptr<FakeConn>> got = t.Get(h, "post");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, conn);

  const PeerHandle unknown(h.value() + 7);
  EXPECT_EQ(t.Get(unknown, "post").status(),
            absl::NotFoundError(absl::StrCat("post: unknown peer ", unknown.value())));
  EXPECT_EQ(t.Remove(unknown).status(),
            absl::NotFoundError(absl::StrCat("disconnect: unknown peer ", unknown.value())));

  absl::StatusOr<std::shared_ptr<FakeConn>> removed = t.Remove(h);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, conn);
  EXPECT_EQ(t.Get(h, "post").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(t.Values().empty());
}

TEST(PeerTableTest, FindIfReturnsTheMatchingPeer) {
  Table t;
  auto dead = std::make_shared<FakeConn>(FakeConn{42, true});
  auto live = std::make_shared<FakeConn>(FakeConn{42, false});
  t.Add(dead);
  const PeerHandle want = t.Add(live);
  t.Add(std::make_shared<FakeConn>(FakeConn{7, false}));
  auto live_of = [](uint64_t instance) {
    return [instance](const std::shared_ptr<FakeConn>& c) {
      return c->instance == instance && !c->dead;
    };
  };
  EXPECT_EQ(t.FindIf(live_of(42)), std::optional<PeerHandle>(want));
  EXPECT_EQ(t.FindIf(live_of(9)), std::nullopt);
}

TEST(PeerTableTest, ClosedPeerErrorIsUnavailable) {
  EXPECT_EQ(ClosedPeerError(PeerHandle(3)),
            absl::UnavailableError("post: connection to peer 3 is closed; Connect again"));
}

}  // namespace
}  // namespace pd::transport::transport_internal
