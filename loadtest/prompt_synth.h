// Prompt synthesis: token ids derived from keys, so that prompts sharing a key share tokens.
//
// Token t at position i of a block with key k is Mix(k, i) mapped into [vocab.lo, vocab.hi), with
// Mix a 64-bit hash (splitmix64 finaliser). Consequences the load tests rely on:
//  - equal keys give equal blocks (and a partial block equals the prefix of the full one);
//  - different keys give different blocks (two 512-token blocks agree on every token with
//    probability (1/(hi-lo))^512);
//  - every token is a valid id for a vocabulary of at least `hi` tokens.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pd::loadtest {

// Token ids are drawn from [lo, hi).
struct VocabRange {
  uint32_t lo = 0;
  uint32_t hi = 0;

  // InvalidArgument unless lo < hi.
  absl::Status Validate() const;
};

// Key namespaces, so that e.g. trace hash id 5 and shared-prefix prefix 5 never collide.
enum class KeyDomain : uint64_t {
  kTraceBlock = 1,    // a = trace hash id
  kUniquePrompt = 2,  // a = seed, b = request index
  kSharedPrefix = 3,  // a = seed, b = prefix index
  kSharedSuffix = 4,  // a = seed, b = prefix index, c = suffix index
  kChatSystem = 5,    // a = seed
  kChatUser = 6,      // a = seed, b = conversation, c = turn
  kChatReply = 7,     // a = seed, b = conversation, c = turn
};

// The 64-bit key of a token block.
uint64_t BlockKey(KeyDomain domain, uint64_t a, uint64_t b = 0, uint64_t c = 0);

// The token at `position` of the block with key `key`.
uint32_t SynthToken(uint64_t key, uint64_t position, VocabRange vocab);

// Appends tokens [0, num_tokens) of the block with key `key` to `out`.
void AppendBlock(uint64_t key, int64_t num_tokens, VocabRange vocab, std::vector<uint32_t>* out);

// The prompt of a trace request: block j (j = 0, 1, ...) holds the tokens of hash_ids[j], each
// block `block_tokens` long except the last, which is cut so the prompt has `input_len` tokens.
// Requires hash_ids.size() == ceil(input_len / block_tokens) (checked by the trace parser).
std::vector<uint32_t> SynthesizeTracePrompt(absl::Span<const uint64_t> hash_ids, int64_t input_len,
                                            int64_t block_tokens, VocabRange vocab);

}  // namespace pd::loadtest
