#include "engine/grammar/constraint.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> MustCompile(const ConstraintSpec& spec) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = CompileConstraint(spec);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(ConstraintTest, EveryKindCompilesAndMatches) {
  ConstraintSpec schema{ConstraintSpec::Kind::kJsonSchema,
                        R"({"type":"object","properties":{"a":{"type":"integer"}},)"
                        R"("required":["a"],"additionalProperties":false})",
                        {}};
  auto g = MustCompile(schema);
  EXPECT_TRUE(Matches(g, R"({"a":12})"));
  EXPECT_FALSE(Matches(g, R"({"a":"x"})"));

  auto obj = MustCompile({ConstraintSpec::Kind::kJsonObject, "", {}});
  EXPECT_TRUE(Matches(obj, R"({"x":[1,true,null]})"));
  EXPECT_FALSE(Matches(obj, "[1]"));

  auto re = MustCompile({ConstraintSpec::Kind::kRegex, "[0-9]{3}-[a-z]+", {}});
  EXPECT_TRUE(Matches(re, "123-abc"));
  EXPECT_FALSE(Matches(re, "x123-abc"));  // the whole output must match

  auto choice = MustCompile({ConstraintSpec::Kind::kChoice, "", {"yes", "no", "yes please"}});
  EXPECT_TRUE(Matches(choice, "yes"));
  EXPECT_TRUE(Matches(choice, "yes please"));
  EXPECT_FALSE(Matches(choice, "maybe"));
}

TEST(ConstraintTest, BadConstraintsAreClearErrors) {
  auto error = [](const ConstraintSpec& spec) {
    absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = CompileConstraint(spec);
    EXPECT_FALSE(g.ok()) << ConstraintKindName(spec.kind) << " " << spec.text.substr(0, 40);
    return g.ok() ? std::string() : std::string(g.status().message());
  };
  EXPECT_THAT(error({ConstraintSpec::Kind::kRegex, "(ab", {}}), HasSubstr("regex"));
  EXPECT_THAT(error({ConstraintSpec::Kind::kChoice, "", {}}), HasSubstr("empty"));
  std::string big_enum = R"({"enum":[)";
  for (int i = 0; i < 5000; ++i) absl::StrAppend(&big_enum, i ? "," : "", "\"v", i, "\"");
  EXPECT_THAT(error({ConstraintSpec::Kind::kJsonSchema, big_enum + "]}", {}}),
              HasSubstr("alternatives are open at the start"));
  EXPECT_THAT(
      error({ConstraintSpec::Kind::kJsonSchema, std::string(kMaxConstraintBytes + 1, ' '), {}}),
      HasSubstr("at most"));
  EXPECT_THAT(
      error({ConstraintSpec::Kind::kJsonSchema, R"({"type":"array","uniqueItems":true})", {}}),
      HasSubstr("uniqueItems"));
}

TEST(ConstraintTest, CacheReturnsTheSameGrammarAndIsBounded) {
  GrammarCache cache(2);
  const ConstraintSpec a{ConstraintSpec::Kind::kRegex, "a+", {}};
  const ConstraintSpec b{ConstraintSpec::Kind::kRegex, "b+", {}};
  const ConstraintSpec c{ConstraintSpec::Kind::kChoice, "", {"a+"}};  // same text, other kind
  auto a1 = cache.Get(a);
  auto a2 = cache.Get(a);
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(a1->get(), a2->get());
  auto c1 = cache.Get(c);
  ASSERT_TRUE(c1.ok());
  EXPECT_NE(a1->get(), c1->get());
  ASSERT_TRUE(cache.Get(b).ok());  // evicts a (least recently used)
  EXPECT_EQ(cache.stats().entries, 2);
  auto a3 = cache.Get(a);
  ASSERT_TRUE(a3.ok());
  EXPECT_NE(a1->get(), a3->get());
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_FALSE(cache.Get({ConstraintSpec::Kind::kRegex, "(", {}}).ok());

  // A byte bound: a grammar bigger than the whole budget is served but not kept.
  GrammarCache small(16, 64);
  auto big = small.Get({ConstraintSpec::Kind::kChoice, "", {"a long choice", "another one"}});
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(small.stats().entries, 0);
  EXPECT_LE(small.stats().bytes, 64);
}

}  // namespace
}  // namespace pd::grammar
