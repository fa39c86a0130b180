#include "kernels/cuda/cuda_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace pd::kernels::cuda {
namespace {

absl::Status FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

cudaStream_t Stream(const OpContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

}  // namespace

absl::Status RmsNorm(const OpContext& ctx, const RmsNormParams& p) {
  return FromCuda(LaunchRmsNorm(p, Stream(ctx)), "rms_norm launch");
}

absl::Status Convert(const OpContext& ctx, const ConvertParams& p) {
  return FromCuda(LaunchConvert(p, Stream(ctx)), "convert launch");
}

absl::Status SiluMul(const OpContext& ctx, const SiluMulParams& p) {
  return FromCuda(LaunchSiluMul(p, Stream(ctx)), "silu_mul launch");
}

absl::Status Add(const OpContext& ctx, const AddParams& p) {
  return FromCuda(LaunchAdd(p, Stream(ctx)), "add launch");
}

absl::Status ScaledScatterAdd(const OpContext& ctx, const ScaledScatterAddParams& p) {
  return FromCuda(LaunchScaledScatterAdd(p, Stream(ctx)), "scaled_scatter_add launch");
}

absl::Status Rope(const OpContext& ctx, const RopeParams& p) {
  return FromCuda(LaunchRope(p, Stream(ctx)), "rope launch");
}

absl::Status WriteKv(const OpContext& ctx, const WriteKvParams& p) {
  return FromCuda(LaunchWriteKv(p, Stream(ctx)), "write_kv launch");
}

absl::Status ReadKv(const OpContext& ctx, const ReadKvParams& p) {
  return FromCuda(LaunchReadKv(p, Stream(ctx)), "read_kv launch");
}

absl::Status LatentAttention(const OpContext& ctx, const LatentAttentionParams& p) {
  return FromCuda(LaunchLatentAttention(p, Stream(ctx)), "latent_attention launch");
}

absl::Status AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  return FromCuda(LaunchAttentionMass(p, Stream(ctx)), "attention_mass launch");
}

absl::Status GatherKvRows(const OpContext& ctx, const GatherKvRowsParams& p) {
  return FromCuda(LaunchGatherKvRows(p, Stream(ctx)), "gather_kv_rows launch");
}

absl::Status PrefillAttention(const OpContext& ctx, const PrefillAttentionParams& p) {
  return FromCuda(LaunchPrefillAttention(p, Stream(ctx)), "prefill_attention launch");
}

absl::Status DecodeAttention(const OpContext& ctx, const DecodeAttentionParams& p) {
  return FromCuda(LaunchDecodeAttention(p, Stream(ctx)), "decode_attention launch");
}

absl::Status Sample(const OpContext& ctx, const SamplingParams& p) {
  return FromCuda(LaunchSample(p, Stream(ctx)), "sample launch");
}

absl::Status ApplyTokenMask(const OpContext& ctx, const TokenMaskParams& p) {
  return FromCuda(LaunchApplyTokenMask(p, Stream(ctx)), "token_mask launch");
}

absl::Status ApplyLogitEdits(const OpContext& ctx, const LogitEditParams& p) {
  return FromCuda(LaunchApplyLogitEdits(p, Stream(ctx)), "logit_edits launch");
}

absl::Status CopyBlocks(const OpContext& ctx, const CopyBlocksParams& p) {
  return FromCuda(LaunchCopyBlocks(p, Stream(ctx)), "copy_blocks launch");
}

int VisibleDeviceCount() {
  int count = 0;
  // cudaErrorInsufficientDriver / cudaErrorNoDevice on machines without a GPU: report 0.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    return 0;
  }
  return count;
}

}  // namespace pd::kernels::cuda
