#include "engine/grammar/regex.h"

#include <memory>
#include <string>

#include "engine/grammar/matcher.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Regex(const std::string& pattern, bool search = false) {
  Grammar g;
  RegexOptions options;
  options.search = search;
  auto rule = CompileRegex(pattern, options, &g);
  EXPECT_TRUE(rule.ok()) << pattern << ": " << rule.status();
  if (!rule.ok()) return nullptr;
  g.set_root(*rule);
  auto c = CompiledGrammar::Compile(g);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(RegexTest, WholeMatchSemantics) {
  auto c = Regex(R"(^[a-c]+\d{2,3}(x|yz)?$)");
  EXPECT_TRUE(Matches(c, "ab12"));
  EXPECT_TRUE(Matches(c, "c123yz"));
  EXPECT_FALSE(Matches(c, "c1234"));
  EXPECT_FALSE(Matches(c, "d12"));
  EXPECT_FALSE(Matches(c, "a12y"));
  auto dot = Regex("a.c");
  EXPECT_TRUE(Matches(dot, "a\xC3\xA9" "c"));  // é is one character
  EXPECT_FALSE(Matches(dot, "a\nc"));
  EXPECT_FALSE(Matches(dot, "a\xC3" "c"));  // half a character
}

TEST(RegexTest, SearchSemanticsOfJsonSchemaPatterns) {
  auto c = Regex("ab+", /*search=*/true);
  EXPECT_TRUE(Matches(c, "xxabbby"));
  EXPECT_FALSE(Matches(c, "xxay"));
  auto anchored = Regex("^ab+", /*search=*/true);
  EXPECT_TRUE(Matches(anchored, "abbby"));
  EXPECT_FALSE(Matches(anchored, "xab"));
  auto both = Regex("^a$|^b", /*search=*/true);
  EXPECT_TRUE(Matches(both, "a"));
  EXPECT_FALSE(Matches(both, "ab"));
  EXPECT_TRUE(Matches(both, "bcd"));
}

TEST(RegexTest, ClassesEscapesAndNegation) {
  auto c = Regex(R"([^a-z\d][\w-]\s\x41\u00e9[\]\\])");
  EXPECT_TRUE(Matches(c, "Q_ A\xC3\xA9]"));
  EXPECT_TRUE(Matches(c, "\xE4\xB8\xAD-\tA\xC3\xA9\\"));
  EXPECT_FALSE(Matches(c, "q_ A\xC3\xA9]"));
  EXPECT_FALSE(Matches(c, "5_ A\xC3\xA9]"));
  auto neg = Regex("[^\"]*");
  EXPECT_TRUE(Matches(neg, "abc\xF0\x9F\x98\x80"));
  EXPECT_FALSE(Matches(neg, "a\"b"));
}

TEST(RegexTest, UnsupportedConstructsAreNamed) {
  struct Case {
    const char* pattern;
    const char* message;
  };
  for (const Case& k : {Case{"(a)\\1", "backreferences"}, Case{"a(?=b)", "lookaround"},
                        Case{"\\bword", "word boundary"}, Case{"\\p{L}", "property"},
                        Case{"a{5,2}", "m < n"}, Case{"(ab", "missing ')'"},
                        Case{"ab)", "unbalanced"}, Case{"[abc", "unterminated"},
                        Case{"a{1,100000}", "repetition bound"}, Case{"a(b^c)", "'^'"},
                        Case{"*a", "without an operand"}}) {
    Grammar g;
    auto r = CompileRegex(k.pattern, RegexOptions{}, &g);
    ASSERT_FALSE(r.ok()) << k.pattern;
    EXPECT_NE(r.status().message().find(k.message), std::string::npos)
        << k.pattern << ": " << r.status();
  }
  // Deep group nesting is refused, not a stack overflow.
  Grammar g;
  auto r = CompileRegex(std::string(10000, '(') + std::string(10000, ')'), RegexOptions{}, &g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested too deeply"), std::string::npos);
}

}  // namespace
}  // namespace pd::grammar
