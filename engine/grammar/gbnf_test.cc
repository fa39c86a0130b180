#include "engine/grammar/gbnf.h"

#include <memory>
#include <random>
#include <string>

#include "engine/grammar/constraint.h"
#include "engine/grammar/matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> Compile(const std::string& text) {
  absl::StatusOr<Grammar> g = CompileGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::Compile(*g);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

void ExpectError(const std::string& text, const std::string& message) {
  absl::StatusOr<Grammar> g = CompileGbnf(text);
  ASSERT_FALSE(g.ok()) << "compiled: " << text;
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr(message)) << text;
}

TEST(GbnfTest, AJsonLikeGrammarOverSeveralLinesWithComments) {
  auto g = Compile(R"(
# a flat object of lower-case keys and small numbers
root   ::= "{" ws pair ("," ws pair)* "}"
pair   ::= name ":" ws
           num          # the value
num    ::= [0-9]{1,3} | "-" [1-9]
name   ::= "\"" [a-z_]+ "\""
ws     ::= [ \t\n]?
)");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"{\"a\":1}", "{ \"ab_c\": 123,\n\"x\":-4}", "{\"z\":007}"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad : {"{}", "{\"a\":1234}", "{\"A\":1}", "{\"a\":-0}", "{\"a\":1,}", "{\"a\":1} "}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

// llama.cpp's grammars/json.gbnf, as llama.cpp ships it: multi-line definitions, an empty
// alternative, classes with quotes and escapes, comments after alternatives.
TEST(GbnfTest, LlamaCppJsonGrammar) {
  auto g = Compile(R"gbnf(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)gbnf");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"{}", "{\"a\": [1, -2.5e+3, \"x\\n\\u00e9\", true, null]}",
                         "{\"k\":{\"n\":{}}}\n  "}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad : {"[]", "{\"a\":}", "{\"a\":01}", "{\"a\":\"\x01\"}", "{'a':1}"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

TEST(GbnfTest, LiteralsClassesAndEscapes) {
  auto g = Compile(R"(root ::= 'it''s' "\x41\u00e9\U0001F600" [^a-z\n] [\]\-\\] . "\t")");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "its" "A\xC3\xA9\xF0\x9F\x98\x80" "Q" "-" "\xE4\xB8\xAD" "\t"));
  EXPECT_TRUE(Matches(g, "itsA\xC3\xA9\xF0\x9F\x98\x80" "#]x\t"));
  EXPECT_FALSE(Matches(g, "itsA\xC3\xA9\xF0\x9F\x98\x80" "q]x\t"));   // q is in a-z
  EXPECT_FALSE(Matches(g, "itsA\xC3\xA9\xF0\x9F\x98\x80" "\n]x\t"));  // \n is refused
  EXPECT_FALSE(Matches(g, "itsA\xC3\xA9\xF0\x9F\x98\x80" "Q]\xFF\t"));  // not UTF-8
}

TEST(GbnfTest, RepetitionBoundsAndGroups) {
  auto g = Compile(R"(root ::= ("ab" | "c"){2,3} "x"{0} "y"{2,} "z"?)");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "abcyy"));
  EXPECT_TRUE(Matches(g, "ccabyyyyz"));
  EXPECT_FALSE(Matches(g, "abyy"));       // one group
  EXPECT_FALSE(Matches(g, "cccciyy"));
  EXPECT_FALSE(Matches(g, "ababababyy"));  // four groups
  EXPECT_FALSE(Matches(g, "abcy"));        // one y
  EXPECT_FALSE(Matches(g, "abcxyy"));      // x{0}
}

TEST(GbnfTest, RecursionToTheRightIsFine) {
  auto g = Compile(R"(
root ::= list
list ::= "[" (item ("," item)*)? "]"
item ::= [0-9] | list
)");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "[1,[2,[]],[[3]]]"));
  EXPECT_FALSE(Matches(g, "[1,[2,[]],[[3]]"));
}

TEST(GbnfTest, ConstraintKindGrammar) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kGrammar;
  spec.text = R"(root ::= "yes" | "no")";
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompileConstraint(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(Matches(*c, "no"));
  EXPECT_FALSE(Matches(*c, "maybe"));
  EXPECT_STREQ(ConstraintKindName(spec.kind), "grammar");
  spec.text = "root ::= root \"a\"";
  EXPECT_THAT(std::string(CompileConstraint(spec).status().message()), HasSubstr("left-recursive"));
}

TEST(GbnfTest, BadGrammarsAreRefusedWithLineAndColumn) {
  ExpectError("", "the grammar is empty");
  ExpectError("start ::= \"a\"", "no rule named 'root'");
  ExpectError("root ::= \"a\" b", "rule 'b' is used but not defined");
  ExpectError("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice");
  ExpectError("root ::= expr\nexpr ::= expr \"+\" [0-9] | [0-9]", "rule 'expr' is left-recursive");
  ExpectError("root ::= \"abc", "without its closing quote");
  ExpectError("root ::= [a-", "without its closing ']'");
  ExpectError("root ::= [z-a]", "end is below its start");
  ExpectError("root ::= [^\\x00-\\U0010FFFF]", "matches no character");
  ExpectError("root ::= (\"a\" | \"b\"", "expected ')'");
  ExpectError("root ::= \"a\"{3,2}", "below the count");
  ExpectError("root ::= \"a\"{1001}", "repetition bound above 1000");
  ExpectError("root ::= \"a\"{,2}", "expected a number");
  ExpectError("root ::= \"\\q\"", "unknown escape '\\q'");
  ExpectError("root ::= \"\\uD800\"", "surrogate");
  ExpectError("root ::= \"\xFF\"", "invalid UTF-8");
  ExpectError("root = \"a\"", "expected '::=' after the rule name 'root'");
  ExpectError("root ::= \"a\" @", "line 1, column 14: unexpected '@'");
  ExpectError("root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')'),
              "nested too deeply");
  // Bounded repetitions expand to a rule per count (nested ones share theirs, so they add up
  // rather than multiply): 600 of them are past the 1M-element bound.
  std::string many = "root ::=";
  for (int i = 0; i < 600; ++i) many += " \"a\"{0,1000}";
  ExpectError(many, "expands to more than 1048576 elements");
  EXPECT_TRUE(CompileGbnf("root ::= ((\"a\"{0,1000}){0,1000}){0,1000}").ok());
}

// Broken grammars never crash the compiler: llama.cpp's JSON grammar, mutated at random (bytes
// flipped, punctuation inserted, pieces deleted), either compiles into a grammar the matcher
// can start, or is refused with InvalidArgument.
TEST(GbnfTest, MutatedGrammarsCompileOrAreRefusedNeverCrash) {
  const std::string base = R"(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";
  ASSERT_TRUE(CompileGbnf(base).ok());
  std::mt19937 rng(31);
  const std::string punctuation = "()[]{}|*+?\"'\\:=#^-.,0123456789 \n\xC3\xFF";
  int compiled = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !t.empty(); ++e) {
      const size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0:
          t[at] = punctuation[rng() % punctuation.size()];
          break;
        case 1:
          t.insert(at, 1, punctuation[rng() % punctuation.size()]);
          break;
        default:
          t.erase(at, 1 + rng() % 8);
          break;
      }
    }
    absl::StatusOr<Grammar> g = CompileGbnf(t);
    if (!g.ok()) {
      EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << t;
      continue;
    }
    ++compiled;
    auto c = CompiledGrammar::Compile(*g);
    ASSERT_TRUE(c.ok()) << c.status() << "\n" << t;
    Matcher m(*c);
    m.AcceptBytes("{\"a\": 1}");
  }
  EXPECT_GT(compiled, 100);  // the mutations do not all break the grammar
}

}  // namespace
}  // namespace pd::grammar
