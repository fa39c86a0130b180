#include "transport/kv_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pd::transport {

absl::Status KvTransport::Disconnect(PeerHandle peer) {
  return absl::UnimplementedError(
      absl::StrCat(Name(), " transport does not implement Disconnect (peer ", peer.value(), ")"));
}

absl::Status KvTransport::Cancel(TransferId id) {
  return absl::UnimplementedError(
      absl::StrCat(Name(), " transport does not implement Cancel (transfer ", id.value(), ")"));
}

std::vector<BlockRun> CoalescePairs(absl::Span<const BlockPair> pairs) {
  std::vector<BlockPair> sorted(pairs.begin(), pairs.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const BlockPair& a, const BlockPair& b) { return a.dst < b.dst; });
  std::vector<BlockRun> runs;
  for (const BlockPair& p : sorted) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (p.src.value() == last.src_first + last.num_blocks &&
          p.dst.value() == last.dst_first + last.num_blocks) {
        ++last.num_blocks;
        continue;
      }
    }
    runs.push_back(BlockRun{p.src.value(), p.dst.value(), 1});
  }
  return runs;
}

absl::string_view TransferPhaseName(TransferPhase phase) {
  switch (phase) {
    case TransferPhase::kPending:
      return "pending";
    case TransferPhase::kDone:
      return "done";
    case TransferPhase::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace pd::transport
