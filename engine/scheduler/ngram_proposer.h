// Speculative decoding's n-gram proposer (prompt lookup): the tokens that followed the latest
// earlier occurrence of the sequence's last n tokens, in its own prompt and output. No model;
// strong where the output repeats its context (summaries, code edits, RAG, multi-turn chat).
// docs/engine.md, "Speculative decoding".
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace pd::engine {

struct NgramOptions {
  int max_n = 3;  // longest suffix matched first
  int min_n = 1;  // shortest suffix tried
};

// Up to `k` tokens proposed to follow `tokens`: for n from max_n down to min_n, what followed
// the latest earlier occurrence of the last n tokens (not the suffix itself) that has k tokens
// after it, else of the one with the most. Empty when no suffix recurs or k <= 0. Costs at
// most one backward scan of `tokens` per n tried.
std::vector<uint32_t> ProposeNgram(absl::Span<const uint32_t> tokens, int k,
                                   const NgramOptions& options = {});

}  // namespace pd::engine
