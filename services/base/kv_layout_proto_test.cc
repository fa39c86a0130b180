#include "services/base/kv_layout_proto.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::services {
namespace {

using ::testing::HasSubstr;

TEST(KvLayoutProtoTest, LayoutMismatchNamesEveryField) {
  kvcache::KvLayout a{4, 2, 8, 16, kernels::DType::kF32};
  kvcache::KvLayout b{4, 2, 8, 32, kernels::DType::kF32};
  auto pa = LayoutToProto(a, "abc");
  EXPECT_TRUE(CheckLayout(pa, pa, "prefill", "decode").ok());
  auto pb = LayoutToProto(b, "abd");
  absl::Status s = CheckLayout(pa, pb, "prefill", "decode");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("block_size prefill=16 decode=32"));
  EXPECT_THAT(s.message(), HasSubstr("model_fingerprint prefill=abc decode=abd"));
  EXPECT_THAT(s.message(), HasSubstr("block_bytes"));
}

TEST(KvLayoutProtoTest, StampsTheVersions) {
  const auto p = LayoutToProto({4, 2, 8, 16, kernels::DType::kF32}, "abc");
  EXPECT_EQ(p.layout_version(), kLayoutVersion);
  EXPECT_EQ(p.protocol_version(), kHandoffProtocolVersion);
  EXPECT_EQ(p.block_size(), 16u);
}

}  // namespace
}  // namespace pd::services
