#include "services/tierd/block_io.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <numeric>

namespace pd::tierd {

std::vector<IoOp> PlanIoOps(absl::Span<const IoRequest> requests, size_t max_op_bytes) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const IoRequest& ra = requests[a];
    const IoRequest& rb = requests[b];
    return ra.fd != rb.fd ? ra.fd < rb.fd : ra.offset < rb.offset;
  });
  std::vector<IoOp> ops;
  for (size_t i : order) {
    const IoRequest& r = requests[i];
    if (!ops.empty()) {
      IoOp& last = ops.back();
      const bool adjacent =
          last.fd == r.fd && last.offset + static_cast<int64_t>(last.total_bytes) == r.offset;
      if (adjacent && last.iov.size() < kMaxIovecs && last.total_bytes + r.len <= max_op_bytes) {
        last.iov.push_back(iovec{r.buf, r.len});
        last.total_bytes += r.len;
        last.requests.push_back(i);
        continue;
      }
    }
    IoOp op;
    op.fd = r.fd;
    op.offset = r.offset;
    op.total_bytes = r.len;
    op.iov.push_back(iovec{r.buf, r.len});
    op.requests.push_back(i);
    ops.push_back(std::move(op));
  }
  return ops;
}

int FinishIoOpSync(const IoOp& op, bool write, size_t done) {
  // Skip the iovecs (and the part of one) already transferred.
  std::vector<iovec> iov = op.iov;
  size_t first = 0;
  size_t skip = done;
  while (first < iov.size() && skip >= iov[first].iov_len) {
    skip -= iov[first].iov_len;
    ++first;
  }
  if (first < iov.size()) {
    iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + skip;
    iov[first].iov_len -= skip;
  }
  while (done < op.total_bytes) {
    const off_t offset = static_cast<off_t>(op.offset + static_cast<int64_t>(done));
    const int n = static_cast<int>(iov.size() - first);
    const ssize_t got = write ? pwritev(op.fd, iov.data() + first, n, offset)
                              : preadv(op.fd, iov.data() + first, n, offset);
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      return -errno;
    }
    if (got == 0) {
      return -EIO;  // end of file inside a slab: it was truncated behind our back
    }
    done += static_cast<size_t>(got);
    size_t left = static_cast<size_t>(got);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return 0;
}

namespace {

class PreadBlockIo : public BlockIo {
 public:
  explicit PreadBlockIo(size_t max_op_bytes) : max_op_bytes_(max_op_bytes) {}

  const char* Name() const override { return "pread"; }

  void Run(absl::Span<IoRequest> requests, bool write,
           absl::FunctionRef<void(size_t)> on_done) override {
    for (const IoOp& op : PlanIoOps(requests, max_op_bytes_)) {
      const int result = FinishIoOpSync(op, write, 0);
      for (size_t i : op.requests) {
        requests[i].result = result;
        on_done(i);
      }
    }
  }

 private:
  const size_t max_op_bytes_;
};

}  // namespace

std::unique_ptr<BlockIo> CreatePreadBlockIo(size_t max_op_bytes) {
  return std::make_unique<PreadBlockIo>(max_op_bytes);
}

}  // namespace pd::tierd
