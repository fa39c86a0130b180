#include "engine/model/tokenizer.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;
using tokenizer_internal::CompleteUtf8Prefix;

// A tokenizer whose tokens decode to fixed byte strings, with a "drop leading space after
// token 0" rule so that the `prev` plumbing is observable.
class FakeTokenizer final : public Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}

  absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view, bool, bool) const override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::string> DecodeToken(uint32_t prev, uint32_t next) const override {
    if (next >= pieces_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", next, " out of range"));
    }
    absl::string_view piece = pieces_[next];
    if (prev == 0 && !piece.empty() && piece[0] == ' ') {
      piece.remove_prefix(1);
    }
    return std::string(piece);
  }
  uint32_t vocab_size() const override { return pieces_.size(); }
  uint32_t bos_id() const override { return 0; }
  uint32_t eos_id() const override { return 0; }

 private:
  std::vector<std::string> pieces_;
};

TEST(CompleteUtf8PrefixTest, HoldsOnlyIncompleteTail) {
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3"), 1u);                 // 2-byte lead alone
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3\xA9"), 3u);             // é complete
  EXPECT_EQ(CompleteUtf8Prefix("\xE2\x80"), 0u);              // 2 of 3
  EXPECT_EQ(CompleteUtf8Prefix("x\xF0\x9F\x98"), 1u);         // 3 of 4
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\x98\x80"), 4u);      // 😀 complete
  EXPECT_EQ(CompleteUtf8Prefix("\x80\x80"), 2u);              // stray continuations pass
  EXPECT_EQ(CompleteUtf8Prefix("\xFF"), 1u);                  // never valid: pass
  EXPECT_EQ(CompleteUtf8Prefix("\xC3\x41"), 2u);              // broken sequence: pass
  EXPECT_EQ(CompleteUtf8Prefix("\xC3\xA9\x80\x80\x80"), 5u);  // too many continuations: pass
}

TEST(DecodeStreamTest, EmitsWholeCharactersOnly) {
  FakeTokenizer tok({"<s>", " Hi", "\xF0", "\x9F", "\x98", "\x80", "!", "\xC3"});
  DecodeStream stream(&tok, /*prev=*/0);
  std::string all;
  auto step = [&](uint32_t id) {
    absl::StatusOr<std::string> delta = stream.Step(id);
    EXPECT_TRUE(delta.ok()) << delta.status();
    all += delta.value_or("");
    return delta.value_or("<error>");
  };
  EXPECT_EQ(step(1), "Hi");  // leading space dropped after token 0
  EXPECT_EQ(step(2), "");
  EXPECT_EQ(step(3), "");
  EXPECT_EQ(step(4), "");
  EXPECT_EQ(stream.pending_bytes(), 3u);
  EXPECT_EQ(step(5), "\xF0\x9F\x98\x80");
  EXPECT_EQ(step(6), "!");
  EXPECT_EQ(step(7), "");
  EXPECT_EQ(stream.Flush(), "\xC3");  // an incomplete tail comes out raw at the end
  EXPECT_EQ(stream.pending_bytes(), 0u);
  EXPECT_EQ(all + "\xC3", *tok.Decode(std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7}, 0));
}

TEST(DecodeStreamTest, BrokenSequenceDoesNotStall) {
  FakeTokenizer tok({"<s>", "\xE2", "a"});
  DecodeStream stream(&tok);
  EXPECT_EQ(*stream.Step(1), "");
  EXPECT_EQ(*stream.Step(2), "\xE2\x61");
  EXPECT_EQ(stream.pending_bytes(), 0u);
}

TEST(DecodeStreamTest, OutOfRangeLeavesStateUnchanged) {
  FakeTokenizer tok({"<s>", " x", "\xC3", "\xA9"});
  DecodeStream stream(&tok, /*prev=*/0);
  EXPECT_EQ(*stream.Step(2), "");
  absl::StatusOr<std::string> bad = stream.Step(9);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stream.pending_bytes(), 1u);
  EXPECT_EQ(*stream.Step(3), "\xC3\xA9");
}

TEST(TokenizerDecodeTest, ChainsPrevAndNamesBadPosition) {
  FakeTokenizer tok({"<s>", " a", " b"});
  EXPECT_EQ(*tok.Decode(std::vector<uint32_t>{0, 1, 2}), "<s>a b");
  EXPECT_EQ(*tok.Decode(std::vector<uint32_t>{1, 2}), " a b");
  EXPECT_EQ(*tok.Decode(std::vector<uint32_t>{1, 2}, /*prev=*/0), "a b");
  absl::StatusOr<std::string> bad = tok.Decode(std::vector<uint32_t>{1, 7});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("decode position 1: token id 7"));
}

}  // namespace
}  // namespace pd::engine
