// Tokenizer: text <-> token ids, plus DecodeStream, which turns a token stream into text deltas
// that never split a UTF-8 character.
//
// Token ids are uint32_t in [0, vocab_size()). Decoding is per token and context dependent only
// through the previous token (`prev`), which is what llama2.c/SentencePiece-style tokenizers
// need (a leading space is dropped after BOS). Decoded pieces are raw bytes: a byte-fallback
// token yields one byte, which may be part of a multi-byte UTF-8 character; DecodeStream holds
// such bytes back until the character is complete.
//
// Thread-safety: implementations are immutable after construction and all methods are const,
// so one Tokenizer may be shared by any number of threads. DecodeStream is thread-compatible
// (one per request).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pd::engine {

class Tokenizer {
 public:
  // A `prev` value meaning "no previous token" (start of a stream without BOS).
  static constexpr uint32_t kNoToken = std::numeric_limits<uint32_t>::max();

  virtual ~Tokenizer() = default;

  // Encodes `text` (arbitrary bytes; normally UTF-8), optionally framed by BOS / EOS.
  // Errors: InvalidArgument when the text cannot be represented by this vocabulary.
  virtual absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view text, bool add_bos,
                                                       bool add_eos) const = 0;

  // Bytes of token `next` when it follows `prev` (any value, including kNoToken; only used as
  // context). May be empty (control tokens) or an incomplete UTF-8 sequence (byte fallback).
  // Errors: InvalidArgument when `next` >= vocab_size().
  virtual absl::StatusOr<std::string> DecodeToken(uint32_t prev, uint32_t next) const = 0;

  virtual uint32_t vocab_size() const = 0;
  virtual uint32_t bos_id() const = 0;
  virtual uint32_t eos_id() const = 0;

  // The text of special token `id` (a control token, Mistral's "[TOOL_CALLS]" say, which
  // DecodeToken gives as nothing), or "" when `id` is no special token: how structured outputs
  // name it (engine/grammar/grammar.h, special tokens).
  virtual std::string SpecialTokenText(uint32_t /*id*/) const { return {}; }

  // Concatenated DecodeToken() of `ids`, the first one decoded after `prev`. The result is raw
  // bytes and may end in (or contain) incomplete UTF-8 if the ids do.
  // Errors: InvalidArgument naming the position of the first out-of-range id.
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids,
                                     uint32_t prev = kNoToken) const;
};

// Incremental detokenizer for streaming output: feed generated tokens one at a time and get back
// text deltas whose concatenation equals Tokenizer::Decode of the whole stream, but where every
// delta ends on a UTF-8 character boundary. Bytes that start a multi-byte character are held
// until the character completes; bytes that can never complete one (invalid UTF-8) are passed
// through unchanged rather than held forever, so the stream never stalls.
//
// The tokenizer must outlive the stream. Thread-compatible.
class DecodeStream {
 public:
  // `prev` is the token that precedes the first Step() token, usually the last prompt token
  // (BOS for an empty prompt), so the first generated piece is decoded in context.
  explicit DecodeStream(const Tokenizer* tokenizer, uint32_t prev = Tokenizer::kNoToken);

  // Decodes `token` and returns the newly completed text (possibly empty).
  // Errors: InvalidArgument for an out-of-range id; the stream state is then unchanged.
  absl::StatusOr<std::string> Step(uint32_t token);

  // Ends the stream: returns any held-back bytes (an incomplete UTF-8 sequence, passed through
  // raw) and clears them. Call when generation stops.
  std::string Flush();

  // Number of bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  uint32_t prev_;
  std::string pending_;
};

namespace tokenizer_internal {

// Length of the longest prefix of `bytes` that does not end inside an incomplete (but so far
// valid-looking) UTF-8 sequence: the trailing lead byte plus continuation bytes are excluded
// when fewer than the lead byte announces. Exposed for tests.
size_t CompleteUtf8Prefix(absl::string_view bytes);

}  // namespace tokenizer_internal
}  // namespace pd::engine
