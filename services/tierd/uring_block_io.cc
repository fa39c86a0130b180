// The io_uring BlockIo (built when liburing is found; uring_block_io_none.cc otherwise).
#include <liburing.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "services/tierd/block_io.h"  // the interface this file implements

namespace pd::tierd {
namespace {

class UringBlockIo : public BlockIo {
 public:
  UringBlockIo(int queue_depth, size_t max_op_bytes)
      : queue_depth_(static_cast<size_t>(queue_depth)), max_op_bytes_(max_op_bytes) {}
  ~UringBlockIo() override {
    if (initialized_) {
      io_uring_queue_exit(&ring_);
    }
  }
  UringBlockIo(const UringBlockIo&) = delete;
  UringBlockIo& operator=(const UringBlockIo&) = delete;

  // Returns the negative errno of io_uring_queue_init (0 on success).
  int Init() {
    const int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth_), &ring_, 0);
    initialized_ = rc == 0;
    return rc;
  }

  const char* Name() const override { return "io_uring"; }

  void Run(absl::Span<IoRequest> requests, bool write,
           absl::FunctionRef<void(size_t)> on_done) override {
    std::vector<IoOp> ops = PlanIoOps(requests, max_op_bytes_);
    size_t next = 0;
    size_t in_flight = 0;
    size_t done = 0;
    // Sliding window: keep up to queue_depth_ operations in flight, refill as they complete.
    while (done < ops.size()) {
      while (next < ops.size() && in_flight < queue_depth_) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) {
          break;
        }
        IoOp& op = ops[next];
        const auto n = static_cast<unsigned>(op.iov.size());
        if (write) {
          io_uring_prep_writev(sqe, op.fd, op.iov.data(), n, static_cast<uint64_t>(op.offset));
        } else {
          io_uring_prep_readv(sqe, op.fd, op.iov.data(), n, static_cast<uint64_t>(op.offset));
        }
        io_uring_sqe_set_data(sqe, &op);
        ++next;
        ++in_flight;
      }
      const int rc = io_uring_submit_and_wait(&ring_, 1);
      // EINTR: a signal; EAGAIN/EBUSY: kernel short of resources or completions to reap. The
      // queued entries stay queued, so reaping and looping is the retry.
      CHECK(rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY)
          << "io_uring_submit_and_wait: " << std::strerror(-rc);
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0;
      unsigned reaped = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        Complete(*static_cast<IoOp*>(io_uring_cqe_get_data(cqe)), cqe->res, write, requests,
                 on_done);
        ++reaped;
      }
      io_uring_cq_advance(&ring_, reaped);
      in_flight -= reaped;
      done += reaped;
    }
  }

 private:
  static void Complete(const IoOp& op, int res, bool write, absl::Span<IoRequest> requests,
                       absl::FunctionRef<void(size_t)> on_done) {
    int result = 0;
    if (res == -EAGAIN || res == -EINTR || res == -EOPNOTSUPP) {
      result = FinishIoOpSync(op, write, 0);  // transient, or an op this kernel cannot queue
    } else if (res < 0) {
      result = res;
    } else if (static_cast<size_t>(res) < op.total_bytes) {
      result = FinishIoOpSync(op, write, static_cast<size_t>(res));
    }
    for (size_t i : op.requests) {
      requests[i].result = result;
      on_done(i);
    }
  }

  const size_t queue_depth_;
  const size_t max_op_bytes_;
  io_uring ring_{};
  bool initialized_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockIo>> CreateUringBlockIo(int queue_depth, size_t max_op_bytes) {
  auto io = std::make_unique<UringBlockIo>(queue_depth, max_op_bytes);
  if (const int rc = io->Init(); rc < 0) {
    return absl::UnavailableError(
        absl::StrCat("io_uring_queue_init(", queue_depth, "): ", std::strerror(-rc)));
  }
  return io;
}

}  // namespace pd::tierd
