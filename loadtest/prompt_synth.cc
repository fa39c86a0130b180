#include "loadtest/prompt_synth.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pd::loadtest {
namespace {

// splitmix64's finaliser: a bijective 64-bit mixer with good avalanche.
uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status VocabRange::Validate() const {
  if (lo >= hi) {
    return absl::InvalidArgumentError(absl::StrCat("token id range [", lo, ", ", hi, ") is empty"));
  }
  return absl::OkStatus();
}

uint64_t BlockKey(KeyDomain domain, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = Mix64(static_cast<uint64_t>(domain));
  h = Mix64(h ^ a);
  h = Mix64(h ^ b);
  return Mix64(h ^ c);
}

uint32_t SynthToken(uint64_t key, uint64_t position, VocabRange vocab) {
  const uint64_t h = Mix64(key ^ Mix64(position));
  return vocab.lo + static_cast<uint32_t>(h % (vocab.hi - vocab.lo));
}

void AppendBlock(uint64_t key, int64_t num_tokens, VocabRange vocab, std::vector<uint32_t>* out) {
  out->reserve(out->size() + static_cast<size_t>(std::max<int64_t>(num_tokens, 0)));
  for (int64_t i = 0; i < num_tokens; ++i) {
    out->push_back(SynthToken(key, static_cast<uint64_t>(i), vocab));
  }
}

std::vector<uint32_t> SynthesizeTracePrompt(absl::Span<const uint64_t> hash_ids, int64_t input_len,
                                            int64_t block_tokens, VocabRange vocab) {
  std::vector<uint32_t> prompt;
  prompt.reserve(static_cast<size_t>(input_len));
  for (size_t j = 0; j < hash_ids.size(); ++j) {
    const int64_t remaining = input_len - static_cast<int64_t>(prompt.size());
    if (remaining <= 0) {
      break;
    }
    AppendBlock(BlockKey(KeyDomain::kTraceBlock, hash_ids[j]), std::min(remaining, block_tokens),
                vocab, &prompt);
  }
  return prompt;
}

}  // namespace pd::loadtest
