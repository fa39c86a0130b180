// NcclCollective: the Collective of a GPU rank (engine/parallel/collective.h), over an NCCL
// communicator and the rank's CUDA stream. Built where CUDA and NCCL are (PD_WITH_NCCL); the
// forward pass does not use it yet (tensor parallelism runs on CPU ranks so far: docs/engine.md,
// "Tensor parallelism"), tests run its host logic against the CPU fake of CUDA and NCCL
// (transport/nccl/fake_cuda_nccl.h) and, on a machine with two GPUs, against NCCL itself.
//
// Stream order, not host order: every call enqueues its work on the rank's stream and returns
// (Barrier excepted), so data passed in and out are device memory read and written when the
// stream gets there, and a decode step's collectives can be captured in a CUDA graph (no
// allocation, no synchronisation inside). Reproducibility: NCCL's sum order depends on its
// algorithm and protocol, which NCCL picks from the communicator's size, the message size and
// the topology: fixed for a given deployment, so results repeat run to run (set NCCL_ALGO /
// NCCL_PROTO to pin them across machines), but it is not the CPU group's rank order.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/parallel/collective.h"

namespace pd::engine {

class NcclCollective final : public Collective {
 public:
  // `comm` an initialized ncclComm_t of `size` ranks in which this is `rank`, `stream` a
  // cudaStream_t of the current device (both owned by the caller, outliving the object).
  // `column_split[r]` = (first column, columns) rank r contributes to AllGatherColumns (the
  // classifier's vocabulary split: fixed, so no call has to exchange it), of at most
  // `max_gather_rows` rows; a staging buffer of size x max_gather_rows x max columns floats is
  // allocated now. InvalidArgument for a bad split; Internal when CUDA or NCCL fail, naming
  // the call.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(
      void* comm, void* stream, int rank, int size,
      std::vector<std::pair<int64_t, int64_t>> column_split, int64_t max_gather_rows);
  ~NcclCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // ncclAllReduce in place (ncclFloat, ncclSum) on the stream.
  absl::Status AllReduceSum(float* data, int64_t n) override;
  // The block goes into this rank's slot of the staging buffer (a 2-D copy), one ncclAllGather
  // of the padded slots, then one 2-D copy per rank into `out`'s columns. `cols`/`col_begin`
  // must be this rank's column_split entry and rows <= max_gather_rows (InvalidArgument).
  absl::Status AllGatherColumns(const float* local, int64_t rows, int64_t cols, int64_t col_begin,
                                float* out, int64_t out_stride) override;
  // A one-float all-reduce, then the stream synchronised: returns once every rank got there.
  absl::Status Barrier() override;
  // ncclCommAbort of this rank's communicator: its pending and later operations end (later
  // calls return Aborted). Each rank aborts its own: a coordinator whose rank failed calls
  // Abort on every rank's collective (a peer's operations end when its communicator does).
  void Abort() override;
  int64_t WaitNanos() const override { return 0; }  // not measured on GPUs

 private:
  NcclCollective() = default;
  void* comm_ = nullptr;
  void* stream_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::vector<std::pair<int64_t, int64_t>> split_;
  int64_t max_rows_ = 0, max_cols_ = 0;
  float* staging_ = nullptr;  // [size][max_rows][max_cols], device memory
  float* one_ = nullptr;      // Barrier's float, device memory
  std::atomic<bool> aborted_{false};
};

}  // namespace pd::engine
