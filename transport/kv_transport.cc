#include "transport/kv_transport.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

namespace {

class MmapAllocation : public HostAllocation {
 public:
  MmapAllocation(void* data, uint64_t size) : data_(data), size_(size) {}
  ~MmapAllocation() override { ::munmap(data_, size_); }
  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  std::string Describe() const override { return "anonymous mmap"; }

 private:
  void* const data_;
  const uint64_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostAllocation>> KvTransport::AllocateHost(uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("allocate host memory: 0 bytes");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocate host memory: mmap of ", bytes, " bytes: ", std::strerror(errno)));
  }
  return std::unique_ptr<HostAllocation>(new MmapAllocation(p, bytes));
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
