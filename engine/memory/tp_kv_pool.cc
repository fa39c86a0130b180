#include "engine/memory/tp_kv_pool.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "kernels/attention_params.h"

namespace pd::memory {
namespace {

// A HostKvPool and its KvPoolMemory view, owned together.
class OwnedHostPool final : public KvPoolMemory {
 public:
  explicit OwnedHostPool(std::unique_ptr<HostKvPool> pool)
      : pool_(std::move(pool)), view_(pool_.get()) {}
  kernels::Device device() const override { return view_.device(); }
  void* base() override { return view_.base(); }
  size_t size_bytes() const override { return view_.size_bytes(); }
  int64_t num_blocks() const override { return view_.num_blocks(); }
  size_t block_bytes() const override { return view_.block_bytes(); }
  const kvcache::KvLayout& layout() const override { return view_.layout(); }
  absl::Status ReadBlock(BlockId block, uint8_t* dst) override {
    return view_.ReadBlock(block, dst);
  }
  absl::Status WriteBlock(BlockId block, const uint8_t* src) override {
    return view_.WriteBlock(block, src);
  }

 private:
  std::unique_ptr<HostKvPool> pool_;
  HostKvPoolMemory view_;
};

absl::Status CheckHeads(const kvcache::KvLayout& layout, const std::vector<TpKvPool::RankHeads>& r,
                        std::vector<int>* first_holder) {
  PD_RETURN_IF_ERROR(layout.Validate());
  if (r.empty()) return absl::InvalidArgumentError("tp kv pool: no ranks");
  first_holder->assign(static_cast<size_t>(layout.num_kv_heads), -1);
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].count <= 0 || r[i].begin < 0 || r[i].begin + r[i].count > layout.num_kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp kv pool: rank ", i, " holds heads [", r[i].begin, ", ", r[i].begin + r[i].count,
          "), outside the ", layout.num_kv_heads, " KV heads of the layout"));
    }
    for (int64_t h = r[i].begin; h < r[i].begin + r[i].count; ++h) {
      int& first = (*first_holder)[static_cast<size_t>(h)];
      if (first < 0) first = static_cast<int>(i);
    }
  }
  for (size_t h = 0; h < first_holder->size(); ++h) {
    if ((*first_holder)[h] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tp kv pool: KV head ", h, " is held by no rank"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

kvcache::KvLayout TpKvPool::RankLayout(const kvcache::KvLayout& layout, const RankHeads& heads) {
  kvcache::KvLayout l = layout;
  l.num_kv_heads = heads.count;
  return l;
}

absl::StatusOr<std::unique_ptr<TpKvPool>> TpKvPool::CreateHost(const kvcache::KvLayout& layout,
                                                               int64_t num_blocks,
                                                               std::vector<RankHeads> ranks,
                                                               HostKvPoolOptions options) {
  std::vector<int> first;
  PD_RETURN_IF_ERROR(CheckHeads(layout, ranks, &first));
  std::vector<std::unique_ptr<KvPoolMemory>> pools;
  for (const RankHeads& r : ranks) {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<HostKvPool> pool,
                        HostKvPool::Create(RankLayout(layout, r), num_blocks, options));
    pools.push_back(std::make_unique<OwnedHostPool>(std::move(pool)));
  }
  return FromRanks(layout, num_blocks, std::move(ranks), std::move(pools));
}

absl::StatusOr<std::unique_ptr<TpKvPool>> TpKvPool::FromRanks(
    const kvcache::KvLayout& layout, int64_t num_blocks, std::vector<RankHeads> ranks,
    std::vector<std::unique_ptr<KvPoolMemory>> pools) {
  std::vector<int> first;
  PD_RETURN_IF_ERROR(CheckHeads(layout, ranks, &first));
  if (pools.size() != ranks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp kv pool: ", pools.size(), " pools for ", ranks.size(), " ranks"));
  }
  for (size_t i = 0; i < pools.size(); ++i) {
    const kvcache::KvLayout want = RankLayout(layout, ranks[i]);
    if (pools[i] == nullptr || pools[i]->layout() != want || pools[i]->num_blocks() != num_blocks ||
        pools[i]->device() != pools[0]->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp kv pool: rank ", i, "'s pool is not ", num_blocks, " blocks of ", want.ToString(),
          pools[i] == nullptr ? " (none)" : "", " on the first rank's device"));
    }
  }
  std::unique_ptr<TpKvPool> p(new TpKvPool(layout, num_blocks, std::move(ranks), std::move(pools)));
  p->first_holder_ = std::move(first);
  return p;
}

TpKvPool::TpKvPool(const kvcache::KvLayout& layout, int64_t num_blocks,
                   std::vector<RankHeads> heads, std::vector<std::unique_ptr<KvPoolMemory>> ranks)
    : layout_(layout),
      num_blocks_(num_blocks),
      heads_(std::move(heads)),
      ranks_(std::move(ranks)) {}

size_t TpKvPool::size_bytes() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r->size_bytes();
  return n;
}

void TpKvPool::CopyHead(int64_t h, const kvcache::KvLayout& from, int64_t from_begin,
                        const uint8_t* src, const kvcache::KvLayout& to, int64_t to_begin,
                        uint8_t* dst) const {
  const int64_t rows = from.head_stride() * from.element_size_bytes();  // a head's rows, bytes
  const bool quantized = kernels::IsQuantizedKvDType(layout_.dtype);
  const int64_t scales =
      quantized ? from.block_size * kernels::KvScalesPerRow(from.dtype, from.head_dim) * 4 : 0;
  const auto scale_base = [](const kvcache::KvLayout& l) {
    return kernels::DenseKvScaleOffset(l.dtype, l.num_layers, l.num_kv_heads, l.block_size,
                                       l.head_dim);
  };
  for (int64_t layer = 0; layer < layout_.num_layers; ++layer) {
    for (const kvcache::KvPart part : {kvcache::KvPart::kKey, kvcache::KvPart::kValue}) {
      const int64_t fh = h - from_begin, th = h - to_begin;
      std::memcpy(dst + to.ByteOffset(layer, part, th, 0),
                  src + from.ByteOffset(layer, part, fh, 0), static_cast<size_t>(rows));
      if (quantized) {
        const int64_t p = part == kvcache::KvPart::kKey ? 0 : 1;
        const int64_t fi = (layer * 2 + p) * from.num_kv_heads + fh;
        const int64_t ti = (layer * 2 + p) * to.num_kv_heads + th;
        std::memcpy(dst + scale_base(to) + ti * scales, src + scale_base(from) + fi * scales,
                    static_cast<size_t>(scales));
      }
    }
  }
}

absl::Status TpKvPool::ReadBlock(BlockId block, uint8_t* dst) {
  PD_RETURN_IF_ERROR(internal::CheckBlockCopy(block, num_blocks_, dst));
  // Padding between a quantized block's data and its scales reads as zeros, as in a pool.
  std::memset(dst, 0, block_bytes());
  std::vector<uint8_t> scratch;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    KvPoolMemory& rank = *ranks_[r];
    const uint8_t* src = nullptr;
    if (rank.device() == kernels::Device::kCpu && rank.base() != nullptr) {
      src = static_cast<const uint8_t*>(rank.base()) + block.value() * rank.block_bytes();
    } else {
      scratch.resize(rank.block_bytes());
      PD_RETURN_IF_ERROR(rank.ReadBlock(block, scratch.data()));
      src = scratch.data();
    }
    const RankHeads& heads = heads_[r];
    for (int64_t h = heads.begin; h < heads.begin + heads.count; ++h) {
      if (first_holder_[static_cast<size_t>(h)] != static_cast<int>(r)) continue;
      CopyHead(h, rank.layout(), heads.begin, src, layout_, 0, dst);
    }
  }
  return absl::OkStatus();
}

absl::Status TpKvPool::WriteBlock(BlockId block, const uint8_t* src) {
  PD_RETURN_IF_ERROR(internal::CheckBlockCopy(block, num_blocks_, src));
  std::vector<uint8_t> scratch;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    KvPoolMemory& rank = *ranks_[r];
    const bool in_place = rank.device() == kernels::Device::kCpu && rank.base() != nullptr;
    uint8_t* dst = nullptr;
    if (in_place) {
      dst = static_cast<uint8_t*>(rank.base()) + block.value() * rank.block_bytes();
    } else {
      scratch.assign(rank.block_bytes(), 0);
      dst = scratch.data();
    }
    const RankHeads& heads = heads_[r];
    for (int64_t h = heads.begin; h < heads.begin + heads.count; ++h) {
      CopyHead(h, layout_, 0, src, rank.layout(), heads.begin, dst);
    }
    if (!in_place) PD_RETURN_IF_ERROR(rank.WriteBlock(block, dst));
  }
  return absl::OkStatus();
}

}  // namespace pd::memory
