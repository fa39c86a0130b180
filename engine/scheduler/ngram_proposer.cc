#include "engine/scheduler/ngram_proposer.h"

#include <algorithm>

namespace pd::engine {

std::vector<uint32_t> ProposeNgram(absl::Span<const uint32_t> tokens, int k,
                                   const NgramOptions& options) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return {};
  for (int n = std::min<int64_t>(options.max_n, len - 1); n >= std::max(options.min_n, 1); --n) {
    const absl::Span<const uint32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
    // Latest first: the start s of an earlier occurrence, s + n <= len - 1 so that at least
    // one token follows it. An occurrence near the end has few tokens after it: the latest
    // with k after it wins, else the one with the most.
    int64_t best_from = -1;
    int64_t best_count = 0;
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + s)) continue;
      const int64_t from = s + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      if (count > best_count) {
        best_from = from;
        best_count = count;
      }
      if (count == k) break;
    }
    if (best_from >= 0) {
      return std::vector<uint32_t>(tokens.begin() + best_from,
                                   tokens.begin() + best_from + best_count);
    }
  }
  return {};
}

}  // namespace pd::engine
