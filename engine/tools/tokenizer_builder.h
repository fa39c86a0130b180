// Builds a real byte-level BPE tokenizer.json (Llama 3 layout) deterministically, for generated
// test models (pd-make-model).
//
// Vocabulary layout for vocab_size V (see TokenizerLayout):
//   [0, 256)                 the 256 byte tokens in GPT-2 order (ByteOrder() in pre_tokenizer.h)
//   [256, 256 + learned)     tokens learned by BPE training on TrainingCorpus(), one per merge
//                            that creates a new token, at most first_special - 256 of them
//   [256 + learned, first_special)  "<|reserved_special_token_K|>" padding when the corpus
//                            supports fewer merges than that
//   [first_special, V)       <|begin_of_text|> (BOS), <|end_of_text|> (EOS), then reserved
//                            special tokens; num_special = clamp(V / 64, 2, 256), so V = 128256
//                            puts BOS at 128000 and EOS at 128001 as in Llama 3.
// Pre-tokenizer: Split on the Llama 3 regex (Isolated) + ByteLevel without regex; post-processor
// TemplateProcessing "<|begin_of_text|> $A"; decoder ByteLevel. Training pre-tokenizes the corpus
// the same way and repeatedly merges the most frequent adjacent pair (ties: the pair whose
// byte strings compare smallest), so the output depends only on V.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::engine {

struct TokenizerLayout {
  uint32_t vocab_size = 0;
  uint32_t num_special = 0;    // clamp(vocab_size / 64, 2, 256)
  uint32_t first_special = 0;  // vocab_size - num_special; == bos_id
  uint32_t bos_id = 0;
  uint32_t eos_id = 0;
};

// Smallest vocab_size accepted (256 byte tokens plus the special block).
inline constexpr uint32_t kMinTokenizerVocab = 260;

// InvalidArgument when vocab_size < kMinTokenizerVocab.
absl::StatusOr<TokenizerLayout> ComputeTokenizerLayout(uint32_t vocab_size);

// The embedded training text: original English prose (written for this project, dedicated to
// the public domain), a few thousand bytes with digits and punctuation.
absl::string_view TrainingCorpus();

// The tokenizer.json text for `vocab_size`. Errors: InvalidArgument as ComputeTokenizerLayout.
absl::StatusOr<std::string> BuildTokenizerJson(uint32_t vocab_size);

}  // namespace pd::engine
