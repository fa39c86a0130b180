#include "common/utf8/utf8.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pd::utf8 {
namespace {

// The decoding of s[0..] as (code point, length).
std::pair<int32_t, size_t> DecodeFirst(absl::string_view s) {
  const Char c = Decode(s, 0);
  return {c.code_point, c.length};
}

std::pair<int32_t, size_t> Bad(size_t length) { return {-1, length}; }

TEST(Utf8Test, DecodesEachLengthAtItsBounds) {
  EXPECT_EQ(DecodeFirst(std::string(1, '\0')), std::make_pair(0, size_t{1}));
  EXPECT_EQ(DecodeFirst("\x7F"), std::make_pair(0x7F, size_t{1}));
  EXPECT_EQ(DecodeFirst("\xC2\x80"), std::make_pair(0x80, size_t{2}));
  EXPECT_EQ(DecodeFirst("\xDF\xBF"), std::make_pair(0x7FF, size_t{2}));
  EXPECT_EQ(DecodeFirst("\xE0\xA0\x80"), std::make_pair(0x800, size_t{3}));
  EXPECT_EQ(DecodeFirst("\xED\x9F\xBF"), std::make_pair(0xD7FF, size_t{3}));
  EXPECT_EQ(DecodeFirst("\xEE\x80\x80"), std::make_pair(0xE000, size_t{3}));
  EXPECT_EQ(DecodeFirst("\xEF\xBF\xBF"), std::make_pair(0xFFFF, size_t{3}));
  EXPECT_EQ(DecodeFirst("\xF0\x90\x80\x80"), std::make_pair(0x10000, size_t{4}));
  EXPECT_EQ(DecodeFirst("\xF4\x8F\xBF\xBF"), std::make_pair(0x10FFFF, size_t{4}));  // 4-byte max
  // Only the character at `pos` is read.
  EXPECT_EQ(Decode("a\xC3\xA9z", 1).code_point, 0xE9);
  EXPECT_EQ(Decode("a\xC3\xA9z", 1).length, 2u);
}

TEST(Utf8Test, IllFormedTakesTheMaximalSubpart) {
  // Overlong forms: C0/C1 never start a character; E0 80..9F and F0 80..8F are overlong.
  EXPECT_EQ(DecodeFirst("\xC0\xAF"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xC1\xBF"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xE0\x9F\xBF"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xF0\x8F\xBF\xBF"), Bad(1));
  // Surrogates U+D800..U+DFFF.
  EXPECT_EQ(DecodeFirst("\xED\xA0\x80"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xED\xBF\xBF"), Bad(1));
  // Above U+10FFFF: F4 90.., F5..F7, and the old 5- and 6-byte leads.
  EXPECT_EQ(DecodeFirst("\xF4\x90\x80\x80"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xF5\x80\x80\x80"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xF8\x88\x80\x80\x80"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xFE"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xFF"), Bad(1));
  // A continuation byte alone.
  EXPECT_EQ(DecodeFirst("\x80"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xBF\x80"), Bad(1));
  // Truncated: the prefix read so far is the subpart.
  EXPECT_EQ(DecodeFirst("\xC3"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xE2\x82"), Bad(2));
  EXPECT_EQ(DecodeFirst("\xF0\x9F\x98"), Bad(3));
  // Broken by a byte that is not a continuation.
  EXPECT_EQ(DecodeFirst("\xC3\x41"), Bad(1));
  EXPECT_EQ(DecodeFirst("\xE2\x82\x41"), Bad(2));
  EXPECT_EQ(DecodeFirst("\xF0\x9F\x98\xC3"), Bad(3));
}

TEST(Utf8Test, ValidPrefixIsTheFirstIllFormedOffset) {
  EXPECT_EQ(ValidPrefix(""), 0u);
  EXPECT_EQ(ValidPrefix("plain"), 5u);
  EXPECT_EQ(ValidPrefix("h\xC3\xA9llo \xE6\x97\xA5 \xF0\x9F\x98\x80"), 15u);
  EXPECT_EQ(ValidPrefix(std::string("a\0b", 3)), 3u);  // NUL is a character
  EXPECT_EQ(ValidPrefix("ab\xC3"), 2u);
  EXPECT_EQ(ValidPrefix("\xC3\xA9\xED\xA0\x80"), 2u);
  EXPECT_EQ(ValidPrefix("\x80"), 0u);
  EXPECT_TRUE(IsValid("\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(IsValid("\xF4\x90\x80\x80"));
  EXPECT_FALSE(IsValid("ok\xC0\xAF"));
}

TEST(Utf8Test, ToValidReplacesEachMaximalSubpart) {
  EXPECT_EQ(ToValid("plain"), "plain");
  EXPECT_EQ(ToValid("h\xC3\xA9llo \xE6\x97\xA5 \xF0\x9F\x98\x80"),
            "h\xC3\xA9llo \xE6\x97\xA5 \xF0\x9F\x98\x80");
  EXPECT_EQ(ToValid("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(ToValid("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // lone continuations
  EXPECT_EQ(ToValid("x\xE6\x97"), "x\xEF\xBF\xBD");               // truncated: one U+FFFD
  EXPECT_EQ(ToValid("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");     // overlong
  EXPECT_EQ(ToValid("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(ToValid("\xF4\x90\x80\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // > U+10FFFF
  EXPECT_EQ(ToValid("\xE2\x82\x41\xE2\x82\xAC"), "\xEF\xBF\xBD\x41\xE2\x82\xAC");
  EXPECT_EQ(ToValid(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(Utf8Test, AppendEncodesAndRoundTrips) {
  for (uint32_t cp : {0u, 0x41u, 0x7Fu, 0x80u, 0x143u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFDu,
                      0xFFFFu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    std::string s;
    Append(cp, &s);
    const Char c = Decode(s, 0);
    EXPECT_EQ(c.code_point, static_cast<int32_t>(cp)) << cp;
    EXPECT_EQ(c.length, s.size()) << cp;
    EXPECT_EQ(s.size(), cp < 0x80 ? 1u : cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u) << cp;
  }
  std::string s;
  Append(0xE9, &s);
  Append(0x1F600, &s);
  EXPECT_EQ(s, "\xC3\xA9\xF0\x9F\x98\x80");
}

TEST(Utf8Test, AppendWritesReplacementForNonCharacters) {
  std::string s;
  Append(0xD800, &s);
  Append(0xDFFF, &s);
  Append(0x110000, &s);
  Append(0xFFFFFFFF, &s);
  EXPECT_EQ(s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8Test, ByteGroupLengthCountsContinuationBytes) {
  EXPECT_EQ(ByteGroupLength("abc", 0), 1u);
  EXPECT_EQ(ByteGroupLength("\xC3\xA9x", 0), 2u);
  EXPECT_EQ(ByteGroupLength("\xF0\x9F\x98\x80", 0), 4u);
  // Defined on ill-formed bytes too: any lead, at most 4 in all.
  EXPECT_EQ(ByteGroupLength("\xC0\xAF", 0), 2u);                 // overlong: still one group
  EXPECT_EQ(ByteGroupLength("\x80\x80", 0), 2u);                 // continuation as a lead
  EXPECT_EQ(ByteGroupLength("\xC3\xA9\x80\x80\x80\x80", 0), 4u);  // capped at 4
  EXPECT_EQ(ByteGroupLength("\xE2\x82", 0), 2u);                  // truncated at the end
  EXPECT_EQ(ByteGroupLength("a\xE2\x82\xAC", 1), 3u);
}

// Every 1- and 2-byte string, and every 3-byte string with a 3-byte lead, decodes as the rule
// of table 3-7 says: well-formed exactly when each byte lies in its row's range.
TEST(Utf8Test, ShortSequencesFollowTable37) {
  auto in = [](int x, int lo, int hi) { return x >= lo && x <= hi; };
  for (int a = 0; a < 256; ++a) {
    const std::string one(1, static_cast<char>(a));
    EXPECT_EQ(Decode(one, 0).valid(), a < 0x80) << a;
    for (int b = 0; b < 256; ++b) {
      const std::string two = {static_cast<char>(a), static_cast<char>(b)};
      const bool want = in(a, 0xC2, 0xDF) && in(b, 0x80, 0xBF);
      if (a >= 0x80) {
        ASSERT_EQ(Decode(two, 0).valid(), want) << a << " " << b;
      }
      if (!in(a, 0xE0, 0xEF)) {
        continue;
      }
      const int lo = a == 0xE0 ? 0xA0 : 0x80;
      const int hi = a == 0xED ? 0x9F : 0xBF;
      for (int c = 0; c < 256; ++c) {
        const std::string three = {static_cast<char>(a), static_cast<char>(b),
                                   static_cast<char>(c)};
        const Char ch = Decode(three, 0);
        const bool ok = in(b, lo, hi) && in(c, 0x80, 0xBF);
        ASSERT_EQ(ch.valid(), ok) << a << " " << b << " " << c;
        ASSERT_EQ(ch.length, ok ? 3u : in(b, lo, hi) ? 2u : 1u) << a << " " << b << " " << c;
        if (ok) {
          ASSERT_EQ(ch.code_point, ((a & 0x0F) << 12) | ((b & 0x3F) << 6) | (c & 0x3F));
        }
      }
    }
  }
}

}  // namespace
}  // namespace pd::utf8
