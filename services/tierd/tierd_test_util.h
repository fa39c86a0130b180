// Shared by the tierd service tests: the stories260K KV layout as workers send it, and a
// TierdServer config on a free loopback port with a private shared-memory name. Test-only.
#pragma once

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/runtime/model_front.h"
#include "engine/runtime/model_runtime.h"
#include "gtest/gtest.h"
#include "pd/v1/worker.pb.h"
#include "services/base/kv_layout_proto.h"
#include "services/tierd/tierd_config.h"

namespace pd::tierd::testing {

inline constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
inline constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

// The layout a stories260K worker with 16-token blocks sends at Attach.
inline pdserve::internal::v1::KvLayout Stories260KLayout() {
  auto front = engine::ModelFront::Load(kModel, kTokenizer);
  EXPECT_TRUE(front.ok()) << front.status();
  if (!front.ok()) return {};
  return services::LayoutToProto(engine::KvLayoutForModel((*front)->config(), 16),
                                 (*front)->fingerprint());
}

// tierd on 127.0.0.1:0 for stories260K with a `dram_mib` DRAM tier and no NVMe, Redis or
// security; `tag` makes the shm name unique per test file and process.
inline TierdConfig TestTierdConfig(const std::string& tag, int64_t dram_mib) {
  TierdConfig c;
  c.grpc_address = {"127.0.0.1", 0};
  c.node_name = tag;
  c.shm_name = absl::StrCat("/pd-", tag, "-", ::getpid());
  c.model = kModel;
  c.tokenizer = kTokenizer;
  c.dram_mib = dram_mib;
  return c;
}

}  // namespace pd::tierd::testing
