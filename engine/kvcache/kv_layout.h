// KvLayout: the shape and byte layout of one KV-cache block (docs/architecture.md, "KV layout").
//
// A block holds `block_size` tokens of K and V for every layer, as one contiguous extent in the
// cache dtype, so a block is the unit to transfer, spill, checksum and index:
//
//   block  // [num_layers][2 (K, V)][num_kv_heads][block_size][head_dim]
//
// All strides and offsets are in elements (multiply by element_size_bytes() for bytes) and are
// relative to the first element of a block. This header describes memory; it owns none.
//
// Thread-safety: plain value type (thread-compatible; const methods are safe concurrently).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/attention_params.h"  // DenseKvBlockBytes
#include "kernels/type_names.h"  // DTypeName: the layout dtype's name in messages and handshakes
#include "kernels/types.h"

namespace pd::kvcache {

// Which half of a layer's KV: the K part comes first in a block, then the V part.
enum class KvPart : uint8_t { kKey = 0, kValue = 1 };

struct KvLayout {
  int64_t num_layers = 0;    // > 0
  int64_t num_kv_heads = 0;  // > 0 (GQA: the number of KV heads, not of query heads)
  int64_t head_dim = 0;      // > 0, elements
  int64_t block_size = 16;   // > 0, tokens per block
  kernels::DType dtype = kernels::DType::kF32;

  // InvalidArgument naming the field when a dimension is not positive or the dtype is unknown;
  // InvalidArgument when one block would exceed kMaxBlockBytes.
  absl::Status Validate() const;

  // Upper bound on block_bytes() accepted by Validate() (1 GiB): keeps every offset and the
  // byte size of realistic pools far from int64 overflow.
  static constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;

  // Bytes per element of `dtype`.
  int64_t element_size_bytes() const { return kernels::DTypeSize(dtype); }

  // Element strides inside a block (require a valid layout; i4's unit is the byte of two
  // codes).
  int64_t token_stride() const { return kernels::KvRowPitch(dtype, head_dim); }  // t -> t + 1
  int64_t head_stride() const { return block_size * token_stride(); }  // kv head h -> h + 1
  int64_t kv_stride() const { return num_kv_heads * head_stride(); }  // K part -> V part
  int64_t layer_stride() const { return 2 * kv_stride(); }            // layer l -> l + 1

  // Elements and bytes of one whole block.
  int64_t block_elements() const { return num_layers * layer_stride(); }
  // For the quantized dtypes (i8, fp8_e4m3, i4) block_elements() is the data bytes; the block
  // then continues with its f32 scales (kernels::DenseKvBlockBytes, the one definition).
  int64_t block_bytes() const {
    return kernels::DenseKvBlockBytes(dtype, num_layers, num_kv_heads, block_size, head_dim);
  }

  // Elements of one layer's K (or V) part of a block: [num_kv_heads][block_size][row pitch].
  int64_t part_elements() const { return kv_stride(); }

  // Offset in elements from the block start of element [layer][part][head][token][0].
  // Arguments must be in range (DCHECKed): layer < num_layers, head < num_kv_heads,
  // token < block_size (the token's index inside the block, not in the sequence).
  int64_t ElementOffset(int64_t layer, KvPart part, int64_t head, int64_t token) const;
  // ElementOffset() in bytes.
  int64_t ByteOffset(int64_t layer, KvPart part, int64_t head, int64_t token) const {
    return ElementOffset(layer, part, head, token) * element_size_bytes();
  }

  // Human-readable, stable summary for logs and error messages, e.g.
  // "layers=2 kv_heads=4 head_dim=64 block_size=16 dtype=f32 block_bytes=65536".
  std::string ToString() const;

  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

}  // namespace pd::kvcache
