// Checks every tokenizer fuzz target runs on decoded output (engine/model/tokenizer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/utf8/utf8.h"
#include "engine/model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace pd::fuzz {

// Streams `ids` through DecodeStream one token at a time: the deltas must concatenate (with the
// final Flush) to Decode(ids, prev), and no delta ends inside a character that is well-formed
// UTF-8 in the whole text (invalid bytes may pass through). Returns the decoded text.
inline std::string CheckDecodeStream(const engine::Tokenizer& t, const std::vector<uint32_t>& ids,
                                     uint32_t prev) {
  absl::StatusOr<std::string> whole = t.Decode(ids, prev);
  CHECK(whole.ok()) << whole.status();
  engine::DecodeStream stream(&t, prev);
  std::string streamed;
  std::vector<size_t> boundaries;  // end of each delta in the streamed text
  for (uint32_t id : ids) {
    absl::StatusOr<std::string> delta = stream.Step(id);
    CHECK(delta.ok()) << delta.status();
    CHECK_LE(stream.pending_bytes(), 3u);
    streamed += *delta;
    boundaries.push_back(streamed.size());
  }
  streamed += stream.Flush();
  CHECK_EQ(stream.pending_bytes(), 0u);
  CHECK(streamed == *whole) << "DecodeStream deltas differ from Decode";
  // No delta boundary falls strictly inside a well-formed character of the whole text.
  std::vector<bool> inside(whole->size() + 1, false);
  for (size_t i = 0; i < whole->size();) {
    const utf8::Char c = utf8::Decode(*whole, i);
    for (size_t k = 1; c.valid() && k < c.length; ++k) {
      inside[i + k] = true;
    }
    i += c.valid() ? c.length : 1;
  }
  for (size_t boundary : boundaries) {
    CHECK(!inside[boundary]) << "a DecodeStream delta splits a UTF-8 character at byte "
                             << boundary;
  }
  // Out-of-range ids fail without changing the stream.
  CHECK(!t.DecodeToken(prev, t.vocab_size()).ok());
  CHECK(!stream.Step(t.vocab_size()).ok());
  return *whole;
}

}  // namespace pd::fuzz
