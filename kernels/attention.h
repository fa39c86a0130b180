// Paged attention over the KV block pool: WriteKv (and its inverse ReadKv), PrefillAttention
// (causal, one sequence) and DecodeAttention (batched, one query per sequence). Each validates
// once, then runs the implementation registered for ctx.device. See kernels/attention_params.h for
// the layouts.
//
// CPU results are batch invariant: a query row's output is bitwise the same whether it runs in
// a decode batch, alone, or as any row of a (chunked) prefill, on any thread count.
//
// On kCpu the block tables, positions and context lengths are host memory and dispatch checks
// every block id they reference against cache.num_blocks (O(blocks touched) per call). On kCuda
// (kernels/cuda, built with CUDA) every array, those included, is device memory: dispatch checks
// the scalar parameters only, and the caller guarantees positions, context lengths and block ids
// are in range (an out-of-range id is an illegal address on the device, reported at the next
// synchronising CUDA call). CUDA results match the CPU's within f32 rounding (different
// summation order: CUDA decode attention sums each split of 256+ keys on its own and merges the
// splits), and WriteKv stores bitwise the same cache values. Quantized caches (i8,
// fp8_e4m3): WriteKv stores bitwise the bytes (codes and scales) of kernels/reference, on kCpu
// and on kCuda.
#pragma once

#include "absl/status/status.h"
#include "kernels/attention_params.h"

namespace pd::kernels {

// Errors for all three: InvalidArgument for null pointers, non-positive sizes, strides smaller
// than a token's heads, num_heads not a multiple of num_kv_heads, head_dim above
// kMaxAttentionHeadDim, a pool view with a non-positive stride, head_stride < block_size *
// head_dim or this layer's K and V not inside one block_stride, for a quantized cache a scale
// region that is misaligned, overlaps the layer's data or leaves the block, and (kCpu only)
// positions or context lengths outside the block table, or a block id outside
// [0, cache.num_blocks); Internal with the CUDA error name when a CUDA launch fails;
// Unimplemented when no backend built for ctx.device supports cache.dtype.
absl::Status WriteKv(const OpContext& ctx, const WriteKvParams& p);
// ReadKv: the same errors as WriteKv, and InvalidArgument when k and v overlap. On kCuda the
// values are bitwise the CPU's (an exact op; a NaN row keeps the stored scale's bits).
absl::Status ReadKv(const OpContext& ctx, const ReadKvParams& p);
absl::Status PrefillAttention(const OpContext& ctx, const PrefillAttentionParams& p);
// DecodeAttention also, where DecodeAttentionWorkspaceBytes(ctx, p) > 0 (kCuda): InvalidArgument
// when p.workspace is null, not 4-byte aligned, overlaps q or out, or holds fewer bytes (the
// message names both sizes and the shape behind them).
absl::Status DecodeAttention(const OpContext& ctx, const DecodeAttentionParams& p);

// GatherKvRows (kernels/attention_params.h): InvalidArgument for a bad cache view, null arrays,
// non-positive sizes, dst blocks too few for num_keep, keep's heads not covering the view's,
// and (kCpu only: on kCuda the arrays are device memory) a block id outside the pool, a block
// in both src and dst, or a kept slot outside the source blocks; Unimplemented as WriteKv.
// Bytes as stored on every device.
absl::Status GatherKvRows(const OpContext& ctx, const GatherKvRowsParams& p);

// Bytes of p.workspace that DecodeAttention(ctx, p) needs: 0 on kCpu (and on kCuda in builds
// without CUDA); on kCuda the split-KV kernel's partial results, one (acc[head_dim], max, sum)
// record of f32 per (sequence, query head, split of 256 tokens or more), from p.num_seqs,
// p.num_heads, p.cache.head_dim, p.max_blocks_per_seq and p.cache.block_size only (never the
// context lengths, which live on the device): about num_seqs * num_heads * (head_dim + 2) * 4 *
// max_blocks_per_seq * block_size / 256 bytes. An engine sizes one buffer for its largest batch
// and block table. 0 when a size is not positive (DecodeAttention rejects the call anyway).
int64_t DecodeAttentionWorkspaceBytes(const OpContext& ctx, const DecodeAttentionParams& p);

// Whether a backend built for `device` reads and writes caches of `cache_dtype`: kCpu every
// dtype, kCuda (when built) every dtype too. The CUDA i8/fp8 kernels are written to the same
// rule as the CPU's (WriteKv bytes equal bit for bit) and tested by kernels/cuda's gpu tests,
// which have not run on a GPU yet.
bool SupportsAttention(Device device, DType cache_dtype);

}  // namespace pd::kernels
