#include "engine/parallel/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pd::engine {
namespace {

absl::Status CudaError(const char* call, cudaError_t e) {
  return absl::InternalError(
      absl::StrCat("nccl collective: ", call, " failed: ", cudaGetErrorString(e)));
}

absl::Status NcclError(const char* call, ncclResult_t r) {
  return absl::InternalError(
      absl::StrCat("nccl collective: ", call, " failed: ", ncclGetErrorString(r)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(
    void* comm, void* stream, int rank, int size,
    std::vector<std::pair<int64_t, int64_t>> column_split, int64_t max_gather_rows) {
  if (comm == nullptr || size < 1 || rank < 0 || rank >= size ||
      static_cast<int>(column_split.size()) != size || max_gather_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl collective: rank ", rank, " of ", size, ", a communicator, ", column_split.size(),
        " column ranges and max_gather_rows ", max_gather_rows, " >= 1 are needed"));
  }
  int64_t max_cols = 0;
  for (size_t r = 0; r < column_split.size(); ++r) {
    const auto [begin, cols] = column_split[r];
    if (begin < 0 || cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat("nccl collective: rank ", r, "'s columns [",
                                                     begin, ", ", begin + cols, ") are empty"));
    }
    max_cols = std::max(max_cols, cols);
  }
  std::unique_ptr<NcclCollective> c(new NcclCollective());
  c->comm_ = comm;
  c->stream_ = stream;
  c->rank_ = rank;
  c->size_ = size;
  c->split_ = std::move(column_split);
  c->max_rows_ = max_gather_rows;
  c->max_cols_ = max_cols;
  void* p = nullptr;
  const size_t bytes = static_cast<size_t>(size * max_gather_rows * max_cols) * sizeof(float);
  if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) return CudaError("cudaMalloc", e);
  c->staging_ = static_cast<float*>(p);
  if (cudaError_t e = cudaMalloc(&p, sizeof(float)); e != cudaSuccess) {
    return CudaError("cudaMalloc", e);
  }
  c->one_ = static_cast<float*>(p);
  return c;
}

NcclCollective::~NcclCollective() {
  if (staging_ != nullptr) cudaFree(staging_);
  if (one_ != nullptr) cudaFree(one_);
}

absl::Status NcclCollective::AllReduceSum(float* data, int64_t n) {
  if (aborted_) return absl::AbortedError("nccl collective: the communicator was aborted");
  if (n <= 0) return absl::OkStatus();
  const ncclResult_t r =
      ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum,
                    static_cast<ncclComm_t>(comm_), static_cast<cudaStream_t>(stream_));
  return r == ncclSuccess ? absl::OkStatus() : NcclError("ncclAllReduce", r);
}

absl::Status NcclCollective::AllGatherColumns(const float* local, int64_t rows, int64_t cols,
                                              int64_t col_begin, float* out, int64_t out_stride) {
  if (aborted_) return absl::AbortedError("nccl collective: the communicator was aborted");
  const auto [my_begin, my_cols] = split_[static_cast<size_t>(rank_)];
  if (cols != my_cols || col_begin != my_begin || rows < 1 || rows > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl collective: rank ", rank_, " gathers columns [", col_begin, ", ",
                     col_begin + cols, ") of ", rows, " rows; its split is [", my_begin, ", ",
                     my_begin + my_cols, "), at most ", max_rows_, " rows"));
  }
  auto* s = static_cast<cudaStream_t>(stream_);
  const size_t chunk = static_cast<size_t>(rows * max_cols_);
  const size_t pitch = static_cast<size_t>(max_cols_) * sizeof(float);
  float* mine = staging_ + static_cast<size_t>(rank_) * chunk;
  if (cudaError_t e = cudaMemcpy2DAsync(mine, pitch, local, static_cast<size_t>(cols) * 4,
                                        static_cast<size_t>(cols) * 4, static_cast<size_t>(rows),
                                        cudaMemcpyDeviceToDevice, s);
      e != cudaSuccess) {
    return CudaError("cudaMemcpy2DAsync", e);
  }
  if (ncclResult_t r =
          ncclAllGather(mine, staging_, chunk, ncclFloat, static_cast<ncclComm_t>(comm_), s);
      r != ncclSuccess) {
    return NcclError("ncclAllGather", r);
  }
  for (int r = 0; r < size_; ++r) {
    const auto [begin, n] = split_[static_cast<size_t>(r)];
    if (cudaError_t e = cudaMemcpy2DAsync(out + begin, static_cast<size_t>(out_stride) * 4,
                                          staging_ + static_cast<size_t>(r) * chunk, pitch,
                                          static_cast<size_t>(n) * 4, static_cast<size_t>(rows),
                                          cudaMemcpyDeviceToDevice, s);
        e != cudaSuccess) {
      return CudaError("cudaMemcpy2DAsync", e);
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::Barrier() {
  if (aborted_) return absl::AbortedError("nccl collective: the communicator was aborted");
  if (ncclResult_t r =
          ncclAllReduce(one_, one_, 1, ncclFloat, ncclSum, static_cast<ncclComm_t>(comm_),
                        static_cast<cudaStream_t>(stream_));
      r != ncclSuccess) {
    return NcclError("ncclAllReduce", r);
  }
  if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)); e != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", e);
  }
  return absl::OkStatus();
}

void NcclCollective::Abort() {
  if (aborted_.exchange(true)) return;
  ncclCommAbort(static_cast<ncclComm_t>(comm_));
}

}  // namespace pd::engine
