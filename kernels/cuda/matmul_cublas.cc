// MatMul on CUDA through cuBLAS: y^T = op_T(w) x^T in cuBLAS's column-major terms (the call
// shapes come from MatMulTile in launch_config.h, which says what each weight dtype does). f32
// and f16 weights: all arithmetic f32, like the CPU kernel (f16 widened into the workspace one
// tile of output rows at a time; the handle keeps CUBLAS_DEFAULT_MATH, no TF32). bf16 weights:
// one cublasGemmEx on the weights as stored, x rounded to bf16 once, f32 accumulation. int8
// weights: W8A8, bitwise the CPU's result (launch_config.h, MatMulI8Layout).
#include <cublas_v2.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

constexpr int kMaxDevices = 64;
// Each handle's own workspace (cuBLAS's recommendation for Hopper; 4 MiB would do elsewhere).
// Set again after every cublasSetStream (which resets a handle to cuBLAS's default pool), so a
// call captured into a CUDA graph uses this memory, allocated before the capture.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// One cuBLAS handle per (thread, device): cuBLAS handles must not be shared by threads that
// set different streams concurrently. Destroyed at thread exit.
class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (handles_[d] != nullptr) {
        (void)cublasDestroy(handles_[d]);  // may fail at process exit once the driver is gone
      }
      if (workspaces_[d] != nullptr) {
        (void)cudaFree(workspaces_[d]);
      }
    }
  }

  // The handle of the current device, bound to `stream` with its workspace.
  absl::Status Get(cudaStream_t stream, cublasHandle_t* out) {
    int device = 0;
    const cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("matmul: cudaGetDevice: ", cudaGetErrorName(err)));
    }
    if (device < 0 || device >= kMaxDevices) {
      return absl::InternalError(absl::StrCat("matmul: device ", device, " >= ", kMaxDevices));
    }
    if (handles_[device] == nullptr) {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
          capturing != cudaStreamCaptureStatusNone) {
        return absl::FailedPreconditionError(absl::StrCat(
            "matmul: no cuBLAS handle yet on device ", device,
            " for this thread while its stream captures a graph (call PrepareMatMul first)"));
      }
      void* ws = nullptr;
      const cudaError_t alloc = cudaMalloc(&ws, kCublasWorkspaceBytes);
      if (alloc != cudaSuccess) {
        return absl::InternalError(absl::StrCat("matmul: cudaMalloc of the ", kCublasWorkspaceBytes,
                                                "-byte cuBLAS workspace on device ", device, ": ",
                                                cudaGetErrorName(alloc)));
      }
      cublasHandle_t h = nullptr;
      const cublasStatus_t st = cublasCreate(&h);
      if (st != CUBLAS_STATUS_SUCCESS) {
        (void)cudaFree(ws);
        return absl::InternalError(
            absl::StrCat("matmul: cublasCreate on device ", device, ": ", cublasGetStatusName(st)));
      }
      handles_[device] = h;
      workspaces_[device] = ws;
    }
    cublasHandle_t h = handles_[device];
    cublasStatus_t st = cublasSetStream(h, stream);
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasSetWorkspace(h, workspaces_[device], kCublasWorkspaceBytes);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("matmul: cublasSetStream/cublasSetWorkspace: ", cublasGetStatusName(st)));
    }
    *out = h;
    return absl::OkStatus();
  }

 private:
  cublasHandle_t handles_[kMaxDevices] = {};
  void* workspaces_[kMaxDevices] = {};
};

ThreadHandles& Handles() {
  thread_local ThreadHandles handles;
  return handles;
}

absl::Status FromCublas(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("matmul: ", what, ": ", cublasGetStatusName(st), " (",
                                          cublasGetStatusString(st), ")"));
}

absl::Status FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("matmul: ", what, ": ", cudaGetErrorName(err)));
}

}  // namespace

absl::Status PrepareMatMul(const OpContext& ctx) {
  cublasHandle_t handle = nullptr;
  return Handles().Get(static_cast<cudaStream_t>(ctx.stream), &handle);
}

absl::Status MatMul(const OpContext& ctx, const MatMulParams& p) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cublasHandle_t handle = nullptr;
  PD_RETURN_IF_ERROR(Handles().Get(stream, &handle));
  if (p.w_dtype == DType::kI8) {
    // W8A8: x's rows to int8 codes and scales, exact int32 sums, then the f32 epilogue (bias and
    // accumulate included), each step as the CPU does it.
    const MatMulI8Workspace lay = MatMulI8Layout(p);
    auto* ws = static_cast<uint8_t*>(p.workspace);
    auto* xq = reinterpret_cast<int8_t*>(ws + lay.xq);
    auto* sx = reinterpret_cast<float*>(ws + lay.sx);
    auto* acc = reinterpret_cast<int32_t*>(ws + lay.acc);
    PD_RETURN_IF_ERROR(FromCuda(
        LaunchQuantizeRowsI8(p.x, p.num_rows, p.in_features, p.x_row_stride, xq, sx, stream),
        "x to int8 launch"));
    const GemmCall g = MatMulTile(p, 0);
    const int32_t one = 1, zero = 0;
    PD_RETURN_IF_ERROR(
        FromCublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, g.m, g.n, g.k, &one, p.w,
                                CUDA_R_8I, g.lda, xq, CUDA_R_8I, g.ldb, &zero, acc, CUDA_R_32I,
                                g.ldc, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (int8)"));
    return FromCuda(LaunchMatMulI8Epilogue(acc, sx, p.w_scales, p.bias, p.y, p.num_rows,
                                           p.out_features, p.y_row_stride, p.accumulate, stream),
                    "int8 epilogue launch");
  }
  float beta = p.accumulate ? 1.0f : 0.0f;
  if (p.bias != nullptr) {
    // y = (accumulate ? y : 0) + bias, then the GEMM accumulates onto it.
    PD_RETURN_IF_ERROR(FromCuda(LaunchBiasInit(p.y, p.bias, p.num_rows, p.out_features,
                                               p.y_row_stride, p.accumulate, stream),
                                "bias launch"));
    beta = 1.0f;
  }
  const float alpha = 1.0f;
  if (MatMulNativeBf16(p)) {
    // x rounded to bf16, packed: one conversion when its rows are contiguous, else per row.
    auto* xb = static_cast<uint16_t*>(p.workspace);
    ConvertParams round;
    round.in_dtype = DType::kF32;
    round.out_dtype = DType::kBF16;
    if (p.x_row_stride == p.in_features) {
      round.in = p.x;
      round.out = xb;
      round.n = p.num_rows * p.in_features;
      PD_RETURN_IF_ERROR(FromCuda(LaunchConvert(round, stream), "x to bf16 launch"));
    } else {
      round.n = p.in_features;
      for (int64_t r = 0; r < p.num_rows; ++r) {
        round.in = p.x + r * p.x_row_stride;
        round.out = xb + r * p.in_features;
        PD_RETURN_IF_ERROR(FromCuda(LaunchConvert(round, stream), "x row to bf16 launch"));
      }
    }
    const GemmCall g = MatMulTile(p, 0);
    return FromCublas(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, g.m, g.n, g.k, &alpha, p.w, CUDA_R_16BF,
                     g.lda, xb, CUDA_R_16BF, g.ldb, &beta, p.y + g.y_offset, CUDA_R_32F, g.ldc,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (bf16)");
  }
  const int64_t tile = MatMulTileRows(p);
  for (int64_t first = 0; first < p.out_features; first += tile) {
    const GemmCall g = MatMulTile(p, first);
    const float* w = nullptr;
    if (p.w_dtype == DType::kF32) {
      w = static_cast<const float*>(p.w) + g.w_offset;
    } else {
      ConvertParams widen;
      widen.in = static_cast<const uint16_t*>(p.w) + g.w_offset;
      widen.out = p.workspace;
      widen.n = static_cast<int64_t>(g.m) * g.k;
      widen.in_dtype = p.w_dtype;
      widen.out_dtype = DType::kF32;
      PD_RETURN_IF_ERROR(FromCuda(LaunchConvert(widen, stream), "widen launch"));
      w = static_cast<const float*>(p.workspace);
    }
    PD_RETURN_IF_ERROR(
        FromCublas(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, g.m, g.n, g.k, &alpha, w, g.lda,
                               p.x, g.ldb, &beta, p.y + g.y_offset, g.ldc),
                   "cublasSgemm"));
  }
  return absl::OkStatus();
}

}  // namespace pd::kernels::cuda
