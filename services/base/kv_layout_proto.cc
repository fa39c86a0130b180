#include "services/base/kv_layout_proto.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pd::services {

pdserve::internal::v1::KvLayout LayoutToProto(const kvcache::KvLayout& layout,
                                              const std::string& fingerprint) {
  pdserve::internal::v1::KvLayout p;
  p.set_model_fingerprint(fingerprint);
  p.set_dtype(KvDtypeToProto(layout.dtype));
  p.set_block_size(static_cast<uint32_t>(layout.block_size));
  p.set_num_layers(static_cast<uint32_t>(layout.num_layers));
  p.set_num_kv_heads(static_cast<uint32_t>(layout.num_kv_heads));
  p.set_head_dim(static_cast<uint32_t>(layout.head_dim));
  p.set_block_bytes(static_cast<uint64_t>(layout.block_bytes()));
  p.set_layout_version(kLayoutVersion);
  p.set_protocol_version(kHandoffProtocolVersion);
  return p;
}

absl::Status CheckLayout(const pdserve::internal::v1::KvLayout& mine,
                         const pdserve::internal::v1::KvLayout& theirs, absl::string_view mine_name,
                         absl::string_view theirs_name) {
  std::vector<std::string> diffs;
  auto cmp = [&](absl::string_view field, const auto& a, const auto& b) {
    if (a != b) {
      diffs.push_back(absl::StrCat(field, " ", mine_name, "=", a, " ", theirs_name, "=", b));
    }
  };
  cmp("model_fingerprint", mine.model_fingerprint(), theirs.model_fingerprint());
  cmp("dtype", pdserve::internal::v1::KvDtype_Name(mine.dtype()),
      pdserve::internal::v1::KvDtype_Name(theirs.dtype()));
  cmp("block_size", mine.block_size(), theirs.block_size());
  cmp("num_layers", mine.num_layers(), theirs.num_layers());
  cmp("num_kv_heads", mine.num_kv_heads(), theirs.num_kv_heads());
  cmp("head_dim", mine.head_dim(), theirs.head_dim());
  cmp("block_bytes", mine.block_bytes(), theirs.block_bytes());
  cmp("layout_version", mine.layout_version(), theirs.layout_version());
  cmp("protocol_version", mine.protocol_version(), theirs.protocol_version());
  if (diffs.empty()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("kv layout mismatch: ", absl::StrJoin(diffs, ", ")));
}

}  // namespace pd::services
