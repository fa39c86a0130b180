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

// out[i] = a[i] + b[i] (out may be a: each element is read before it is written), four lanes
// at a time with the compilers' vector extension (the -O2 build does not vectorize the plain
// loop; the sum of each element is the same one float addition either way).
void AddInto(float* out, const float* a, const float* b, int64_t n) {
  using V4 = float __attribute__((vector_size(16)));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V4 a0, a1, b0, b1;
    std::memcpy(&a0, a + i, 16);
    std::memcpy(&a1, a + i + 4, 16);
    std::memcpy(&b0, b + i, 16);
    std::memcpy(&b1, b + i + 4, 16);
    a0 += b0;
    a1 += b1;
    std::memcpy(out + i, &a0, 16);
    std::memcpy(out + i + 4, &a1, 16);
  }
  for (; i < n; ++i) out[i] = a[i] + b[i];
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
      if (absl::Status s = g_->Barrier(rank_); !s.ok()) return s;
      // This rank adds its share of the piece, every rank's values in rank order.
      const int64_t begin = len * rank_ / size, end = len * (rank_ + 1) / size;
      float* out = g_->scratch_.data();
      AddInto(out + begin, g_->slots_[0].data + begin, g_->slots_[1].data + begin, end - begin);
      for (int r = 2; r < size; ++r) {
        AddInto(out + begin, out + begin, g_->slots_[static_cast<size_t>(r)].data + begin,
                end - begin);
      }
      if (absl::Status s = g_->Barrier(rank_); !s.ok()) return s;
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
    if (absl::Status s = g_->Barrier(rank_); !s.ok()) return s;
    for (int r = 0; r < g_->size_; ++r) {
      const Slot& src = g_->slots_[static_cast<size_t>(r)];
      for (int64_t row = 0; row < rows; ++row) {
        std::memcpy(out + row * out_stride + src.col_begin, src.data + row * src.cols,
                    static_cast<size_t>(src.cols) * sizeof(float));
      }
    }
    // The sources stay valid until every rank has copied them.
    return g_->Barrier(rank_);
  }

  absl::Status Barrier() override { return g_->Barrier(rank_); }
  void Abort() override { g_->Abort(); }
  int64_t WaitNanos() const override {
    return g_->wait_ns_[static_cast<size_t>(rank_)].load(std::memory_order_relaxed);
  }

 private:
  ShmCollectiveGroup* const g_;
  const int rank_;
};

ShmCollectiveGroup::ShmCollectiveGroup(int size, int64_t reduce_capacity, bool yield)
    : size_(std::max(size, 1)),
      capacity_(std::max<int64_t>(reduce_capacity, 1)),
      yield_(yield),
      scratch_(static_cast<size_t>(capacity_)),
      slots_(static_cast<size_t>(size_)),
      wait_ns_(new std::atomic<int64_t>[static_cast<size_t>(size_)]) {
  for (int r = 0; r < size_; ++r) wait_ns_[static_cast<size_t>(r)].store(0);
  for (int r = 0; r < size_; ++r) ranks_.push_back(std::make_unique<Rank>(this, r));
}

ShmCollectiveGroup::~ShmCollectiveGroup() = default;

Collective* ShmCollectiveGroup::rank(int r) { return ranks_[static_cast<size_t>(r)].get(); }

absl::Status ShmCollectiveGroup::Barrier(int rank) {
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
  const auto waited = [&] {
    wait_ns_[static_cast<size_t>(rank)].fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                             start)
            .count(),
        std::memory_order_relaxed);
  };
  for (int i = 0;; ++i) {
    s = state_.load(std::memory_order_acquire);
    if ((s >> 1) != round) {
      waited();
      return absl::OkStatus();
    }
    if ((s & 1u) != 0) {
      waited();
      return AbortedError();
    }
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
