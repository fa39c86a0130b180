// CopyBlocks: gathers, scatters or moves whole KV blocks (opaque bytes) between pools and
// staging buffers, for KV transfer (staging when the transport cannot address the pool) and
// tiering (evicting to / restoring from the DRAM tier). Validates once, then runs the
// implementation registered for ctx.device. See kernels/copy_params.h for the addressing.
#pragma once

#include "absl/status/status.h"
#include "kernels/copy_params.h"

namespace pd::kernels {

// num_copies == 0 does nothing. Errors: InvalidArgument for null src/dst, non-positive
// block_bytes, strides < block_bytes, non-positive block counts, an identity id array reaching
// past its block count, src and dst pools that partly overlap (the same pool, src == dst with
// equal strides, is fine), and (kCpu only, where ids are host memory) an id outside its range,
// two copies writing the same destination block, or, within one pool, a block that is both
// read and written; Unimplemented when no backend built for ctx.device exists. On kCuda the ids
// are device memory and are not read by dispatch: the caller guarantees their range.
absl::Status CopyBlocks(const OpContext& ctx, const CopyBlocksParams& p);

bool SupportsCopyBlocks(Device device);

}  // namespace pd::kernels
