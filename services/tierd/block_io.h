// BlockIo: batched positional reads and writes of NvmeStore's slab files, through io_uring
// (liburing) or, where io_uring is refused or not built, through preadv/pwritev. Internal to
// services/tierd (NvmeStore is the only user).
//
// A batch is a list of requests (fd, offset, buffer, length). Requests on the same file at
// adjacent offsets are merged into one vectored operation (up to max_op_bytes and
// kMaxIovecs), so a run of small blocks written to consecutive slots costs one I/O, as dd with
// a large bs does. Short transfers are completed synchronously. With O_DIRECT descriptors the
// caller guarantees that buffers, offsets and lengths are multiples of 4096.
//
// Thread-safety: thread-compatible; NvmeStore serialises batches.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pd::tierd {

struct IoRequest {
  int fd = -1;
  int64_t offset = 0;      // bytes from the file start
  uint8_t* buf = nullptr;  // read destination or write source
  size_t len = 0;
  // Out: 0 when all `len` bytes moved, else -errno (-EIO for an unexpected end of file).
  int result = 0;
};

// One (possibly merged) operation on one file. Exposed for the backends and tests.
struct IoOp {
  int fd = -1;
  int64_t offset = 0;
  size_t total_bytes = 0;
  std::vector<iovec> iov;
  std::vector<size_t> requests;  // indices into the batch
};

// At most this many buffers in one merged operation (well under IOV_MAX).
inline constexpr size_t kMaxIovecs = 64;

// Groups `requests` into operations: sorted by (fd, offset), adjacent requests merged while the
// operation stays within `max_op_bytes` and kMaxIovecs (a single larger request stays alone).
std::vector<IoOp> PlanIoOps(absl::Span<const IoRequest> requests, size_t max_op_bytes);

// Moves the rest of `op` synchronously (preadv/pwritev) from byte `done` on. 0 or -errno.
int FinishIoOpSync(const IoOp& op, bool write, size_t done);

class BlockIo {
 public:
  virtual ~BlockIo() = default;

  // "io_uring" or "pread".
  virtual const char* Name() const = 0;

  // Runs every request of the batch (write: buffers -> files; else files -> buffers), setting
  // each request's `result`. Calls on_done(i) once per request i, on the calling thread, as soon
  // as its result is set, possibly while later requests are still in flight (a reader checksums
  // early blocks meanwhile). Returns when all are done.
  virtual void Run(absl::Span<IoRequest> requests, bool write,
                   absl::FunctionRef<void(size_t)> on_done) = 0;
  void Run(absl::Span<IoRequest> requests, bool write) {
    Run(requests, write, [](size_t) {});
  }
};

// preadv/pwritev, one operation at a time. Never fails.
std::unique_ptr<BlockIo> CreatePreadBlockIo(size_t max_op_bytes);

// io_uring with `queue_depth` (>= 1) operations in flight. Unavailable (the code of
// io_uring_queue_init's error, e.g. EPERM under seccomp, ENOSYS on old kernels) or
// Unimplemented when tierd was built without liburing; callers fall back to CreatePreadBlockIo.
absl::StatusOr<std::unique_ptr<BlockIo>> CreateUringBlockIo(int queue_depth, size_t max_op_bytes);

}  // namespace pd::tierd
