#include "engine/grammar/grammar.h"

#include <memory>
#include <string>

#include "common/utf8/utf8.h"
#include "engine/grammar/matcher.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Build(const Grammar& g) {
  auto c = CompiledGrammar::Compile(g);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::string Utf8(uint32_t cp) {
  std::string s;
  utf8::Append(cp, &s);
  return s;
}

TEST(GrammarTest, CodePointRangesMatchExactlyTheirUtf8Encodings) {
  // Ranges crossing every encoding-length boundary and the surrogates.
  Grammar g;
  const uint32_t r = g.AddCodePoints("c", {{0x41, 0x5A}, {0x7E, 0x801}, {0xD000, 0xE100},
                                           {0xFFF0, 0x10010}, {0x10FFF0, 0x10FFFF}});
  g.set_root(r);
  auto c = Build(g);
  auto inside = [](uint32_t cp) {
    return (cp >= 0x41 && cp <= 0x5A) || (cp >= 0x7E && cp <= 0x801) ||
           (cp >= 0xD000 && cp <= 0xE100 && !(cp >= 0xD800 && cp <= 0xDFFF)) ||
           (cp >= 0xFFF0 && cp <= 0x10010) || cp >= 0x10FFF0;
  };
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x11000 ? 1 : 0x3F)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    EXPECT_EQ(Matches(c, Utf8(cp)), inside(cp)) << std::hex << cp;
  }
  for (uint32_t cp = 0x10FFF0; cp <= 0x10FFFF; ++cp) EXPECT_TRUE(Matches(c, Utf8(cp)));
  // Surrogates encoded as if they were characters, overlong forms, a lone continuation byte.
  EXPECT_FALSE(Matches(c, "\xED\xA0\x80"));
  EXPECT_FALSE(Matches(c, "\xC1\x81"));  // overlong 'A'
  EXPECT_FALSE(Matches(c, "\xE0\x81\xBE"));
  EXPECT_FALSE(Matches(c, "\x80"));
  EXPECT_FALSE(Matches(c, "\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(GrammarTest, RepeatBoundsAreExact) {
  Grammar g;
  const uint32_t a = g.AddChoice("a", {g.Literal("a")});
  g.set_root(g.AddRepeat("r", a, 2, 4));
  auto c = Build(g);
  for (int n = 0; n < 7; ++n) EXPECT_EQ(Matches(c, std::string(n, 'a')), n >= 2 && n <= 4) << n;
  Grammar h;
  const uint32_t b = h.AddChoice("b", {h.Literal("ab")});
  h.set_root(h.AddRepeat("r", b, 1, -1));
  auto d = Build(h);
  EXPECT_FALSE(Matches(d, ""));
  EXPECT_TRUE(Matches(d, "ababab"));
  EXPECT_FALSE(Matches(d, "aba"));
}

TEST(GrammarTest, LeftRecursionAndUndefinedRulesAreRefused) {
  Grammar g;
  const uint32_t e = g.NewRule("expr");
  const uint32_t opt = g.NewRule("opt");
  g.AddAlternative(opt, {});
  g.AddAlternative(opt, g.Literal(" "));
  // expr ::= opt expr "+" | "1": left-recursive through a nullable rule.
  g.AddAlternative(e, {Grammar::Ref(opt), Grammar::Ref(e), g.Byte('+')});
  g.AddAlternative(e, g.Literal("1"));
  g.set_root(e);
  const absl::Status s = g.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'expr' is left-recursive"), std::string::npos) << s;

  Grammar h;
  const uint32_t empty = h.NewRule("nothing");
  const uint32_t root = h.NewRule("root");
  h.AddAlternative(root, {Grammar::Ref(empty)});
  h.set_root(root);
  EXPECT_NE(h.Validate().message().find("'nothing' has no alternatives"), std::string::npos);
}

TEST(GrammarTest, RightRecursionMatchesNestingAndReportsNextBytes) {
  // balanced ::= "(" balanced ")" balanced | ε
  Grammar g;
  const uint32_t b = g.NewRule("balanced");
  g.AddAlternative(b, {g.Byte('('), Grammar::Ref(b), g.Byte(')'), Grammar::Ref(b)});
  g.AddAlternative(b, {});
  g.set_root(b);
  auto c = Build(g);
  EXPECT_TRUE(Matches(c, ""));
  EXPECT_TRUE(Matches(c, "(()())()"));
  EXPECT_FALSE(Matches(c, "(()"));
  EXPECT_FALSE(Matches(c, "())"));
  Matcher m(c);
  EXPECT_TRUE(m.CanEnd());
  ASSERT_TRUE(m.AcceptBytes("(("));
  EXPECT_FALSE(m.CanEnd());
  ByteSet next = m.NextBytes();
  EXPECT_TRUE(next.test('('));
  EXPECT_TRUE(next.test(')'));
  EXPECT_EQ(next.count(), 2u);
  EXPECT_FALSE(m.AcceptBytes("))x"));  // all or nothing
  EXPECT_TRUE(m.AcceptBytes("))"));
  EXPECT_TRUE(m.CanEnd());
  // A deep nesting stays linear: one stack.
  Matcher deep(c);
  ASSERT_TRUE(deep.AcceptBytes(std::string(5000, '(')));
  EXPECT_LE(deep.num_stacks(), 2u);  // next is "(" or ")"
}

TEST(GrammarTest, AmbiguityIsBoundedNotUnlimited) {
  // s ::= a s | a a s | ε over "a": the number of parses grows, the stacks stay deduplicated.
  Grammar g;
  const uint32_t s = g.NewRule("s");
  g.AddAlternative(s, {g.Byte('a'), Grammar::Ref(s)});
  g.AddAlternative(s, {g.Byte('a'), g.Byte('a'), Grammar::Ref(s)});
  g.AddAlternative(s, {});
  g.set_root(s);
  auto c = Build(g);
  Matcher m(c);
  ASSERT_TRUE(m.AcceptBytes(std::string(200, 'a')));
  EXPECT_LE(m.num_stacks(), 4u);
  EXPECT_TRUE(m.CanEnd());
}

}  // namespace
}  // namespace pd::grammar
