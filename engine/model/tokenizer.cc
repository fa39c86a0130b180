#include "engine/model/tokenizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::engine {

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const uint32_t> ids, uint32_t prev) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::StatusOr<std::string> piece = DecodeToken(prev, ids[i]);
    if (!piece.ok()) {
      return absl::Status(piece.status().code(),
                          absl::StrCat("decode position ", i, ": ", piece.status().message()));
    }
    out += *piece;
    prev = ids[i];
  }
  return out;
}

namespace tokenizer_internal {

size_t CompleteUtf8Prefix(absl::string_view bytes) {
  const size_t n = bytes.size();
  // Walk back over at most 3 continuation bytes (10xxxxxx) to the last lead byte.
  size_t i = n;
  size_t continuation = 0;
  while (i > 0 && continuation < 3 && (static_cast<unsigned char>(bytes[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++continuation;
  }
  if (i == 0) {
    return n;  // only continuation bytes: invalid, nothing to wait for
  }
  const unsigned char lead = static_cast<unsigned char>(bytes[i - 1]);
  size_t expected = 0;  // total length the lead byte announces
  if ((lead & 0xE0) == 0xC0) {
    expected = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    expected = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    expected = 4;
  } else {
    return n;  // ASCII or an invalid byte: complete as far as we can tell
  }
  const size_t have = continuation + 1;
  return have < expected ? i - 1 : n;
}

}  // namespace tokenizer_internal

DecodeStream::DecodeStream(const Tokenizer* tokenizer, uint32_t prev)
    : tokenizer_(tokenizer), prev_(prev) {
  CHECK(tokenizer_ != nullptr);
}

absl::StatusOr<std::string> DecodeStream::Step(uint32_t token) {
  absl::StatusOr<std::string> piece = tokenizer_->DecodeToken(prev_, token);
  if (!piece.ok()) {
    return piece.status();
  }
  prev_ = token;
  pending_ += *piece;
  const size_t complete = tokenizer_internal::CompleteUtf8Prefix(pending_);
  std::string out = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return out;
}

std::string DecodeStream::Flush() { return std::exchange(pending_, std::string()); }

}  // namespace pd::engine
