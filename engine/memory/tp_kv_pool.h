// TpKvPool: a tensor-parallel worker's KV pool as one pool per rank (docs/engine.md, "Tensor
// parallelism", "Per-rank pools"): rank r holds only the KV heads it computes and reads, in a
// pool of its own (on a GPU, its device's memory), while the rest of the worker sees one pool in
// the TP = 1 layout.
//
// A rank's pool has the TP = 1 layout with fewer heads (KvLayout::num_kv_heads = the rank's
// count): block b of rank r holds, for every layer and K|V part, the rows of heads
// [begin_r, begin_r + count_r) of the worker's block b. Heads may be held by several ranks (KV
// heads replicated when there are fewer than ranks, or an MLA latent entry every rank reads
// whole); each holder keeps its own copy.
//
// ReadBlock gathers a block into the TP = 1 layout (a head from the first rank that holds it),
// WriteBlock scatters one to every holder of each head, so the tiers, the Redis index and the
// tier restore copy blocks of the same bytes at every TP size: a block a TP = 2 worker spilled is
// restored by a TP = 1 or TP = 4 worker. There is no single region: base() is null, and a
// transport cannot register the pool as one (the head-slice hand-off is separate work).
//
// Ownership: owns the ranks' pools. Thread-safety: as KvPoolMemory (distinct blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kvcache/kv_layout.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/memory/kv_pool_memory.h"

namespace pd::memory {

class TpKvPool final : public KvPoolMemory {
 public:
  // The KV heads one rank holds: [begin, begin + count) of the TP = 1 layout's.
  struct RankHeads {
    int64_t begin = 0;
    int64_t count = 0;
  };

  // One host pool per rank (kCpu), each of `num_blocks` blocks of `layout` cut to its heads.
  // InvalidArgument when a rank's heads fall outside [0, layout.num_kv_heads), a head is held
  // by no rank, or `ranks` is empty; HostKvPool::Create's errors otherwise.
  static absl::StatusOr<std::unique_ptr<TpKvPool>> CreateHost(const kvcache::KvLayout& layout,
                                                              int64_t num_blocks,
                                                              std::vector<RankHeads> ranks,
                                                              HostKvPoolOptions options = {});
  // Over pools made elsewhere (one per rank, e.g. each on its rank's device), which must have
  // RankLayout's layout and `num_blocks` blocks and the same device. Errors as CreateHost, and
  // InvalidArgument naming the rank whose pool does not fit.
  static absl::StatusOr<std::unique_ptr<TpKvPool>> FromRanks(
      const kvcache::KvLayout& layout, int64_t num_blocks, std::vector<RankHeads> ranks,
      std::vector<std::unique_ptr<KvPoolMemory>> pools);

  // The layout of a rank's pool: `layout` with the rank's head count.
  static kvcache::KvLayout RankLayout(const kvcache::KvLayout& layout, const RankHeads& heads);

  int num_ranks() const { return static_cast<int>(ranks_.size()); }
  const RankHeads& rank_heads(int r) const { return heads_[static_cast<size_t>(r)]; }
  KvPoolMemory* rank(int r) { return ranks_[static_cast<size_t>(r)].get(); }

  kernels::Device device() const override { return ranks_[0]->device(); }
  // Null: the bytes are the ranks' (rank(r)->base()).
  void* base() override { return nullptr; }
  // All ranks' bytes together (more than num_blocks() * block_bytes() when heads are held by
  // several ranks).
  size_t size_bytes() const override;
  int64_t num_blocks() const override { return num_blocks_; }
  // The TP = 1 layout's: what ReadBlock and WriteBlock copy.
  size_t block_bytes() const override { return static_cast<size_t>(layout_.block_bytes()); }
  const kvcache::KvLayout& layout() const override { return layout_; }
  absl::Status ReadBlock(BlockId block, uint8_t* dst) override;
  absl::Status WriteBlock(BlockId block, const uint8_t* src) override;

 private:
  TpKvPool(const kvcache::KvLayout& layout, int64_t num_blocks, std::vector<RankHeads> heads,
           std::vector<std::unique_ptr<KvPoolMemory>> ranks);
  // Copies head `h`'s rows (data and, quantized, scales) of every layer and part between a
  // block of `from` (heads starting at from_begin) and one of `to` (at to_begin).
  void CopyHead(int64_t h, const kvcache::KvLayout& from, int64_t from_begin, const uint8_t* src,
                const kvcache::KvLayout& to, int64_t to_begin, uint8_t* dst) const;

  const kvcache::KvLayout layout_;
  const int64_t num_blocks_;
  const std::vector<RankHeads> heads_;
  const std::vector<std::unique_ptr<KvPoolMemory>> ranks_;
  std::vector<int> first_holder_;  // by head: the rank ReadBlock takes it from
};

}  // namespace pd::memory
