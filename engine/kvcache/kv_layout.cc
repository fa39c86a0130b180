#include "engine/kvcache/kv_layout.h"

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::kvcache {

absl::Status KvLayout::Validate() const {
  struct Field {
    const char* name;
    int64_t value;
  };
  for (const Field& f : {Field{"num_layers", num_layers}, Field{"num_kv_heads", num_kv_heads},
                         Field{"head_dim", head_dim}, Field{"block_size", block_size}}) {
    if (f.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv layout: ", f.name, " must be positive, got ", f.value));
    }
  }
  if (kernels::DTypeName(dtype) == "unknown") {
    return absl::InvalidArgumentError(
        absl::StrCat("kv layout: unknown dtype ", static_cast<int>(dtype)));
  }
  if (dtype == kernels::DType::kI4 && head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv layout: an i4 cache packs two values a byte and needs an even head_dim, got ",
        head_dim));
  }
  // Multiply step by step against the limit so no intermediate product can overflow.
  int64_t bytes = element_size_bytes();
  for (int64_t factor : {int64_t{2}, num_layers, num_kv_heads, block_size, head_dim}) {
    if (bytes > kMaxBlockBytes / factor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv layout: block of layers=", num_layers, " kv_heads=", num_kv_heads,
          " head_dim=", head_dim, " block_size=", block_size, " dtype=", kernels::DTypeName(dtype),
          " exceeds ", kMaxBlockBytes, " bytes"));
    }
    bytes *= factor;
  }
  // Quantized blocks add their scales (at most 4 bytes per 2 values: no overflow).
  if (block_bytes() > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat("kv layout: block of ", block_bytes(),
                                                   " bytes (with scales) exceeds ",
                                                   kMaxBlockBytes, " bytes"));
  }
  return absl::OkStatus();
}

int64_t KvLayout::ElementOffset(int64_t layer, KvPart part, int64_t head, int64_t token) const {
  DCHECK(layer >= 0 && layer < num_layers) << "layer " << layer;
  DCHECK(head >= 0 && head < num_kv_heads) << "head " << head;
  DCHECK(token >= 0 && token < block_size) << "token " << token;
  return layer * layer_stride() + static_cast<int64_t>(part) * kv_stride() + head * head_stride() +
         token * token_stride();
}

std::string KvLayout::ToString() const {
  return absl::StrCat("layers=", num_layers, " kv_heads=", num_kv_heads, " head_dim=", head_dim,
                      " block_size=", block_size, " dtype=", kernels::DTypeName(dtype),
                      " block_bytes=", Validate().ok() ? block_bytes() : 0);
}

}  // namespace pd::kvcache
