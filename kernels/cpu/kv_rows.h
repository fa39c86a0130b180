// One K or V row of a paged KV cache widened to f32, ReadKv's rule: shared by ReadKv and
// AttentionMass (which reads keys straight from the cache).
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace pd::kernels::cpu {

// Into dst[0, c.head_dim): kv head `head`'s K (kv 0) or V (kv 1) row of layer c.layer at
// position `pos` of the sequence whose blocks are `block_table` (block_table[pos /
// block_size]). f32, bf16 and f16 are converted; i8, fp8_e4m3 and i4 decoded with their
// scales (i4 rotated back).
void ReadKvRow(const KvCacheView& c, const int32_t* block_table, int64_t pos, int64_t head,
               int kv, float* dst);

}  // namespace pd::kernels::cpu
