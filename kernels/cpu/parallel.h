// Helpers that run a CPU kernel's loop on OpContext::parallel (or inline when it is null).
// Private to kernels/cpu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/threads/parallel_for.h"
#include "kernels/types.h"

namespace pd::kernels::cpu {

// Threads that may run a kernel's chunks (the caller included).
inline int NumThreads(const OpContext& ctx) {
  return ctx.parallel != nullptr ? ctx.parallel->num_threads() : 1;
}

// fn(begin, end) over contiguous static chunks of [0, n), each >= min_chunk items (so small
// problems stay on the calling thread and skip the fork-join cost).
template <typename Fn>
void ParallelRange(const OpContext& ctx, int64_t n, int64_t min_chunk, Fn&& fn) {
  if (n <= 0) {
    return;
  }
  if (ctx.parallel == nullptr || n < 2 * min_chunk) {
    fn(int64_t{0}, n);
    return;
  }
  ctx.parallel->Run(n, fn, min_chunk);
}

// fn(slot, task) for every task in [0, num_tasks): slot s of `slots` runs tasks s, s + slots,
// s + 2 * slots, ... Interleaving balances tasks whose cost grows with the index (causal
// attention), and `slot` (< slots) indexes per-thread scratch.
template <typename Fn>
void ParallelStrided(const OpContext& ctx, int64_t num_tasks, int slots, Fn&& fn) {
  slots = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(slots, num_tasks)));
  auto run_slots = [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t t = s; t < num_tasks; t += slots) {
        fn(static_cast<int>(s), t);
      }
    }
  };
  if (ctx.parallel == nullptr || slots == 1) {
    run_slots(0, slots);
    return;
  }
  ctx.parallel->Run(slots, run_slots);
}

}  // namespace pd::kernels::cpu
