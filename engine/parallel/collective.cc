#include "engine/parallel/collective.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace pd::engine {

namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

absl::Status AbortedError() {
  return absl::AbortedError("collective: a rank of the tensor-parallel group failed");
}

}  // namespace

class ShmCollectiveGroup::Rank final : public Collective {
 public:
  Rank(ShmCollectiveGroup* group, int rank) : g_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size_; }

  absl::Status AllReduceSum(float* data, int64_t n) override {
    const int size = g_->size_;
    if (size == 1) return g_->aborted() ? AbortedError() : absl::OkStatus();
    for (int64_t piece = 0; piece < n; piece += g_->capacity_) {
      const int64_t len = std::min(g_->capacity_, n - piece);
      g_->slots_[static_cast<size_t>(rank_)].data = data + piece;
      if (absl::Status s = g_->Barrier(); !s.ok()) return s;
      // This rank adds its share of the piece, every rank's values in rank order.
      const int64_t begin = len * rank_ / size, end = len * (rank_ + 1) / size;
      float* out = g_->scratch_.data();
      const float* first = g_->slots_[0].data;
      std::copy(first + begin, first + end, out + begin);
      for (int r = 1; r < size; ++r) {
        const float* in = g_->slots_[static_cast<size_t>(r)].data;
        for (int64_t i = begin; i < end; ++i) out[i] += in[i];
      }
      if (absl::Status s = g_->Barrier(); !s.ok()) return s;
      std::memcpy(data + piece, out, static_cast<size_t>(len) * sizeof(float));
    }
    // The next collective starts with a barrier every rank must reach after its copy, so the
    // scratch is not overwritten while a rank still reads it.
    return absl::OkStatus();
  }

  absl::Status AllGatherColumns(const float* local, int64_t rows, int64_t cols, int64_t col_begin,
                                float* out, int64_t out_stride) override {
    Slot& mine = g_->slots_[static_cast<size_t>(rank_)];
    mine.data = local;
    mine.cols = cols;
    mine.col_begin = col_begin;
    if (absl::Status s = g_->Barrier(); !s.ok()) return s;
    for (int r = 0; r < g_->size_; ++r) {
      const Slot& src = g_->slots_[static_cast<size_t>(r)];
      for (int64_t row = 0; row < rows; ++row) {
        std::memcpy(out + row * out_stride + src.col_begin, src.data + row * src.cols,
                    static_cast<size_t>(src.cols) * sizeof(float));
      }
    }
    // The sources stay valid until every rank has copied them.
    return g_->Barrier();
  }

  absl::Status Barrier() override { return g_->Barrier(); }
  void Abort() override { g_->Abort(); }

 private:
  ShmCollectiveGroup* const g_;
  const int rank_;
};

ShmCollectiveGroup::ShmCollectiveGroup(int size, int64_t reduce_capacity, bool yield)
    : size_(std::max(size, 1)),
      capacity_(std::max<int64_t>(reduce_capacity, 1)),
      yield_(yield),
      scratch_(static_cast<size_t>(capacity_)),
      slots_(static_cast<size_t>(size_)) {
  for (int r = 0; r < size_; ++r) ranks_.push_back(std::make_unique<Rank>(this, r));
}

ShmCollectiveGroup::~ShmCollectiveGroup() = default;

Collective* ShmCollectiveGroup::rank(int r) { return ranks_[static_cast<size_t>(r)].get(); }

absl::Status ShmCollectiveGroup::Barrier() {
  uint32_t s = state_.load(std::memory_order_acquire);
  if ((s & 1u) != 0) return AbortedError();
  const uint32_t round = s >> 1;
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
    arrived_.store(0, std::memory_order_relaxed);
    state_.fetch_add(2u, std::memory_order_acq_rel);  // the next round (keeps the abort bit)
    state_.notify_all();
    return absl::OkStatus();
  }
  // Spin (the peers are usually microseconds behind; a futex sleep and wake-up costs tens of
  // microseconds in a VM, more than most steps' imbalance), then sleep on the futex. With more
  // busy threads than cores, yield while spinning: the peer may need this core.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    s = state_.load(std::memory_order_acquire);
    if ((s >> 1) != round) return absl::OkStatus();
    if ((s & 1u) != 0) return AbortedError();
    CpuRelax();
    if ((i & 63) != 63) continue;
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(100)) {
      state_.wait(s, std::memory_order_acquire);
    } else if (yield_) {
      std::this_thread::yield();
    }
  }
}

void ShmCollectiveGroup::Abort() {
  state_.fetch_or(1u, std::memory_order_acq_rel);
  state_.notify_all();
}

void ShmCollectiveGroup::Reset() {
  arrived_.store(0, std::memory_order_relaxed);
  state_.fetch_and(~1u, std::memory_order_acq_rel);
}

}  // namespace pd::engine
