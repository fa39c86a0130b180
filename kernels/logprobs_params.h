// Parameters of the LogProbs op (log-probabilities of tokens from logits, for the logprobs /
// top_logprobs an OpenAI-style response carries). Plain struct shared by every backend (keep it
// free of Abseil and glog, like every param header).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// Most alternatives LogProbs reports per row (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// For each sequence s, over its logits row x = logits[s][0, vocab_size):
//  - out_token_logprobs[s] = log p(tokens[s]);
//  - out_top_ids[s][j], out_top_logprobs[s][j] for j < top_n: the j-th most likely token and
//    its log p, ranked by (logprob descending, id ascending), the tie order of Sample. Slots
//    past the number of tokens with p > 0 (see below) hold id -1 and logprob -inf.
// p is the raw model distribution, softmax(x): before temperature, top-k and top-p, as vLLM
// reports by default; it is the distribution Sample draws from at temperature 1 with no
// truncation, including its handling of non-finite logits:
//  - NaN logits have p = 0 (logprob -inf) and never appear among the alternatives;
//  - when some logit is +inf, the +inf logits share all the mass (logprob -log(count)) and
//    every other token has p = 0;
//  - when every non-NaN logit is -inf, p is uniform over them (logprob -log(count));
//  - otherwise -inf logits have p = 0 and the rest follow log_softmax, computed as
//    (x[i] - max) - log(sum_j exp(x[j] - max)) (max-subtracted, so no overflow or underflow in
//    the sum) and rounded to f32 once. A finite logit more than ~3.4e38 below the maximum (only
//    possible with |logits| > 1.7e38) rounds to -inf but still counts as p > 0;
//  - a row with no non-NaN logit has no distribution: every logprob is NaN, no alternatives.
// Tokens with p = 0 get logprob -inf. Rows are independent: a row's result never depends on its
// batch neighbours or the thread count.
struct LogProbsParams {
  const float* logits = nullptr;  // [num_seqs][logits_stride], first vocab_size used
  int64_t num_seqs = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;  // >= vocab_size
  // The token whose logprob is wanted (the sampled one), each in [0, vocab_size); nullptr
  // together with out_token_logprobs when only the alternatives are wanted.
  const int32_t* tokens = nullptr;      // [num_seqs]
  float* out_token_logprobs = nullptr;  // [num_seqs]
  int32_t top_n = 0;                    // alternatives per row, in [0, kMaxTopLogprobs]
  int32_t* out_top_ids = nullptr;       // [num_seqs][top_n]; may be nullptr when top_n is 0
  float* out_top_logprobs = nullptr;    // [num_seqs][top_n]; may be nullptr when top_n is 0
};

}  // namespace pd::kernels
