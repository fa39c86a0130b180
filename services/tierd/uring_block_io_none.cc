// Stand-in for uring_block_io.cc when tierd is built without liburing: NvmeStore then always
// uses preadv/pwritev.
#include "services/tierd/block_io.h"

namespace pd::tierd {

absl::StatusOr<std::unique_ptr<BlockIo>> CreateUringBlockIo(int /*queue_depth*/,
                                                            size_t /*max_op_bytes*/) {
  return absl::UnimplementedError(
      "io_uring: pd-tierd was built without liburing (install liburing-dev and reconfigure)");
}

}  // namespace pd::tierd
