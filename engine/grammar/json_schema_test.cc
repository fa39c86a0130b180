#include "engine/grammar/json_schema.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/grammar/matcher.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Schema(const std::string& schema, int ws = 0) {
  JsonSchemaOptions options;
  options.max_whitespace = ws;
  auto g = CompileJsonSchema(schema, options);
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::Compile(*g);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

absl::Status Refusal(const std::string& schema) {
  auto g = CompileJsonSchema(schema);
  return g.ok() ? absl::OkStatus() : g.status();
}

TEST(JsonSchemaTest, ScalarsAndUnions) {
  auto c = Schema(R"({"type": ["integer", "null", "boolean"]})");
  for (const char* ok : {"0", "-12", "null", "true", "false", "123456789012"}) {
    EXPECT_TRUE(Matches(c, ok)) << ok;
  }
  for (const char* bad : {"01", "-", "1.5", "\"1\"", "nul", "-0x1", "1e5"}) {
    EXPECT_FALSE(Matches(c, bad)) << bad;
  }
  auto num = Schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0.5", "1e-07", "2.5E+10", "10"}) EXPECT_TRUE(Matches(num, ok)) << ok;
  for (const char* bad : {".5", "1.", "+1", "1e", "00"}) EXPECT_FALSE(Matches(num, bad)) << bad;
}

TEST(JsonSchemaTest, IntegerRangesAreExact) {
  for (const auto& [lo, hi] : std::vector<std::pair<int, int>>{
           {-123, 4567}, {0, 0}, {7, 7}, {1, 100}, {-50, -3}, {99, 1001}, {0, 9}}) {
    auto c = Schema(absl::StrCat(R"({"type": "integer", "minimum": )", lo, R"(, "maximum": )",
                                 hi, "}"));
    for (int v = -2000; v <= 6000; ++v) {
      ASSERT_EQ(Matches(c, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << ": " << v;
    }
    EXPECT_FALSE(Matches(c, "-0"));
  }
  auto open = Schema(R"({"type": "integer", "exclusiveMinimum": 95})");
  for (int v = 0; v < 3000; ++v) ASSERT_EQ(Matches(open, std::to_string(v)), v > 95) << v;
  EXPECT_TRUE(Matches(open, "123456789123456789"));
  auto below = Schema(R"({"type": "integer", "maximum": -7})");
  for (int v = -3000; v < 100; ++v) ASSERT_EQ(Matches(below, std::to_string(v)), v <= -7) << v;
}

TEST(JsonSchemaTest, StringsAreCanonicallyEscapedAndLengthBounded) {
  auto c = Schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(Matches(c, R"("ab")"));
  EXPECT_TRUE(Matches(c, "\"\xC3\xA9\xE4\xB8\xAD\""));  // two code points
  EXPECT_TRUE(Matches(c, R"("\"\\\n")"));           // three escaped characters
  EXPECT_TRUE(Matches(c, R"("a\u001f")"));
  EXPECT_FALSE(Matches(c, R"("a")"));
  EXPECT_FALSE(Matches(c, R"("abcd")"));
  EXPECT_FALSE(Matches(c, "\"a\nb\""));   // raw control character
  EXPECT_FALSE(Matches(c, "\"a\xC3\""));  // broken UTF-8
  EXPECT_FALSE(Matches(c, R"("a\q")"));
}

TEST(JsonSchemaTest, PatternsAndFormatsApplyToTheDecodedString) {
  auto c = Schema(R"({"type": "string", "pattern": "^a\"b[0-9]+$"})");
  EXPECT_TRUE(Matches(c, R"("a\"b12")"));
  EXPECT_FALSE(Matches(c, R"("a"b12")"));
  EXPECT_FALSE(Matches(c, R"("a\"b")"));
  auto date = Schema(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(Matches(date, R"("2026-11-28")"));
  EXPECT_FALSE(Matches(date, R"("2026-13-01")"));
  auto uuid = Schema(R"({"format": "uuid", "type": "string"})");
  EXPECT_TRUE(Matches(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(Matches(uuid, R"("123e4567-e89b-12d3-a456-42661417400")"));
}

TEST(JsonSchemaTest, ObjectsKeepOrderAndCommasWithOptionalMembers) {
  auto c = Schema(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"],
      "additionalProperties": false})");
  for (const char* ok : {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})",
                         R"({"a":1,"b":"x","c":false})"}) {
    EXPECT_TRUE(Matches(c, ok)) << ok;
  }
  for (const char* bad : {R"({})", R"({"a":1})", R"({,"b":"x"})", R"({"b":"x",})",
                          R"({"b":"x","d":1})", R"({"a":"1","b":"x"})"}) {
    EXPECT_FALSE(Matches(c, bad)) << bad;
  }
}

TEST(JsonSchemaTest, AdditionalPropertiesNeverRepeatAKnownKey) {
  auto c = Schema(R"({"type": "object", "properties": {"name": {"type": "string"}},
      "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(Matches(c, R"({"name":"x","age":3,"nam":4,"names":5})"));
  EXPECT_TRUE(Matches(c, R"({"other":1})"));
  EXPECT_FALSE(Matches(c, R"({"name":"x","name":1})"));  // a known key among the extras
  EXPECT_FALSE(Matches(c, R"({"name":"x","age":"3"})"));
  auto open = Schema(R"({"type": "object"})");
  EXPECT_TRUE(Matches(open, R"({"a":[1,{"b":null}],"c":"d"})"));
}

TEST(JsonSchemaTest, ArraysPrefixItemsAndCounts) {
  auto c = Schema(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
      "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4})");
  for (const char* ok : {R"(["a"])", R"(["a",1])", R"(["a",1,true])", R"(["a",1,true,false])"}) {
    EXPECT_TRUE(Matches(c, ok)) << ok;
  }
  for (const char* bad : {"[]", R"([1])", R"(["a",1,true,false,true])", R"(["a","b"])",
                          R"(["a",1,2])"}) {
    EXPECT_FALSE(Matches(c, bad)) << bad;
  }
  auto plain = Schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2})");
  EXPECT_FALSE(Matches(plain, "[1]"));
  EXPECT_TRUE(Matches(plain, "[1,2,3]"));
}

TEST(JsonSchemaTest, RefsRecurseAndAnyOfChooses) {
  auto c = Schema(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
      "required": ["v", "next"], "additionalProperties": false}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Matches(c, R"({"v":1,"next":{"v":2,"next":null}})"));
  EXPECT_FALSE(Matches(c, R"({"v":1,"next":{"v":2}})"));
  EXPECT_EQ(Refusal(R"({"$ref": "#/definitions/missing"})").code(),
            absl::StatusCode::kInvalidArgument);
  // Percent-encoded pointers resolve; a stray '%' or non-ASCII byte is not a crash.
  auto pct = Schema(R"({"$defs": {"a b": {"type": "null"}}, "$ref": "#/$defs/a%20b"})");
  EXPECT_TRUE(Matches(pct, "null"));
  EXPECT_FALSE(Refusal("{\"$ref\": \"#/$defs/%\xC3\xA9%\"}").ok());
  // A schema that is only itself is left-recursive: refused, not an endless loop.
  EXPECT_FALSE(Refusal(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})").ok());
}

TEST(JsonSchemaTest, EnumConstAndDisjointOneOf) {
  auto c = Schema(R"({"oneOf": [{"type": "string", "enum": ["a\"b", "c"]}, {"const": 5},
      {"type": "array"}]})");
  EXPECT_TRUE(Matches(c, R"("a\"b")"));
  EXPECT_TRUE(Matches(c, "5"));
  EXPECT_TRUE(Matches(c, "[]"));
  EXPECT_FALSE(Matches(c, R"("d")"));
  EXPECT_FALSE(Matches(c, "6"));
  const absl::Status overlap =
      Refusal(R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})");
  EXPECT_NE(overlap.message().find("oneOf whose branches may overlap"), std::string::npos)
      << overlap;
  // A constant of a branch's type overlaps it (5 would match both branches).
  for (const char* schema : {R"({"oneOf": [{"type": "integer"}, {"const": 5}]})",
                             R"({"oneOf": [{"enum": ["a", 1]}, {"type": "string"}]})",
                             R"({"oneOf": [{"type": "number"}, {"const": 5}]})"}) {
    EXPECT_NE(Refusal(schema).message().find("may overlap"), std::string::npos) << schema;
  }
}

TEST(JsonSchemaTest, NotOfNothingAndOfTypes) {
  // `not: {}` forbids a property; `not` of types leaves the other types.
  auto c = Schema(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "gone": {"not": {}}}, "additionalProperties": false})");
  EXPECT_TRUE(Matches(c, R"({"a":1})"));
  EXPECT_FALSE(Matches(c, R"({"a":1,"gone":2})"));
  auto t = Schema(R"({"not": {"type": ["string", "number"]}})");
  EXPECT_TRUE(Matches(t, "null"));
  EXPECT_TRUE(Matches(t, "[1]"));
  EXPECT_FALSE(Matches(t, "1"));
  EXPECT_FALSE(Matches(t, R"("x")"));
  EXPECT_NE(Refusal(R"({"not": {"type": "integer"}})").message().find("'not' is not supported"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"not": {"required": ["a"]}})").message().find("'not' is not supported"),
            std::string::npos);
}

TEST(JsonSchemaTest, AllOfMergesProperties) {
  auto c = Schema(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"]}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(Matches(c, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(Matches(c, R"({"a":1})"));
}

TEST(JsonSchemaTest, KeywordsItCannotEnforceAreNamedNotIgnored) {
  for (const char* keyword : {"multipleOf", "uniqueItems", "patternProperties", "if",
                              "contains", "propertyNames"}) {
    const absl::Status s =
        Refusal(absl::StrCat(R"({"type": "object", "properties": {"x": {")", keyword,
                             R"(": 2}}})"));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << keyword;
    EXPECT_NE(s.message().find(absl::StrCat("'", keyword, "' is not supported")),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("#/properties/x"), std::string::npos) << s;
  }
  EXPECT_NE(Refusal(R"({"type": "string", "format": "hostname-ish"})").message().find(
                "format 'hostname-ish' is not supported"),
            std::string::npos);
  EXPECT_NE(Refusal("{").message().find("not valid JSON"), std::string::npos);
  // Annotations are not constraints: ignored.
  EXPECT_TRUE(Refusal(R"({"title": "t", "description": "d", "examples": [1], "x-custom": 1,
      "type": "integer"})").ok());
  // Nesting beyond the limit is an error, not a crash.
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}";
  for (int i = 0; i < 200; ++i) deep += "}";
  EXPECT_NE(Refusal(deep).message().find("nested too deeply"), std::string::npos);
  // A deep document (here an enum value) is refused before it is parsed or walked.
  const std::string huge = R"({"enum": [)" + std::string(200000, '[') + std::string(200000, ']') +
                           "]}";
  EXPECT_NE(Refusal(huge).message().find("nested deeper than 256 levels"), std::string::npos);
  // Deep allOf merges are bounded too.
  std::string merge = R"({"allOf": [)";
  std::string left;
  std::string right;
  for (int i = 0; i < 140; ++i) {
    left += R"({"properties": {"a": )";
    right += "}}";
  }
  merge += left + "{}" + right + "," + left + R"({"type": "integer"})" + right + "]}";
  EXPECT_FALSE(Refusal(merge).ok());
}

TEST(JsonSchemaTest, WhitespaceIsBounded) {
  auto c = Schema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"], "additionalProperties": false})", /*ws=*/4);
  EXPECT_TRUE(Matches(c, "{ \"a\" :\n 1 }"));
  EXPECT_TRUE(Matches(c, "{    \"a\":1}"));
  EXPECT_FALSE(Matches(c, "{     \"a\":1}"));  // five spaces
  Matcher m(c);
  ASSERT_TRUE(m.AcceptBytes("{    "));
  EXPECT_FALSE(m.NextBytes().test(' '));  // a model cannot loop on spaces
}

TEST(JsonSchemaTest, AnyJson) {
  auto g = AnyJsonGrammar(/*object_only=*/true);
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(Matches(*c, R"({"a": [1, 2.5, "x", null, true, {}]})"));
  EXPECT_FALSE(Matches(*c, R"( {"a": 1})"));  // nothing around the document
  EXPECT_FALSE(Matches(*c, "[1]"));
  EXPECT_FALSE(Matches(*c, R"({"a": 1,})"));
}

}  // namespace
}  // namespace pd::grammar
