#include "engine/grammar/json_schema.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/grammar/matcher.h"
#include "gmock/gmock.h"
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

// Bounds on type 'number': exact digit by digit against the bounds' decimals, written without
// an exponent. Checked against exact decimal comparison on every number with at most three
// fraction digits in [-250, 250] (as thousandths).
TEST(JsonSchemaTest, NumberRangesAreExact) {
  struct Range {
    const char* schema_bounds;
    std::optional<int64_t> lo, hi;  // thousandths
    bool lo_open, hi_open;
  };
  const std::vector<Range> ranges = {
      {R"("minimum": 0, "maximum": 1)", 0, 1000, false, false},
      {R"("minimum": -90, "maximum": 90)", -90000, 90000, false, false},
      {R"("exclusiveMinimum": 0)", 0, std::nullopt, true, false},
      {R"("minimum": 0.5, "exclusiveMaximum": 2.25)", 500, 2250, false, true},
      {R"("minimum": -1.25, "maximum": -0.125)", -1250, -125, false, false},
      {R"("exclusiveMinimum": -1.5, "exclusiveMaximum": 0)", -1500, 0, true, true},
      {R"("maximum": 0.05)", std::nullopt, 50, false, false},
      {R"("minimum": 3.5, "maximum": 3.5)", 3500, 3500, false, false},
      {R"("minimum": 100.001, "maximum": 200)", 100001, 200000, false, false},
      {R"("minimum": 2, "exclusiveMaximum": 2.5)", 2000, 2500, false, true},
      {R"("exclusiveMinimum": 7, "maximum": 8)", 7000, 8000, true, false},
  };
  std::vector<std::pair<std::string, int64_t>> numbers;  // text, value in thousandths
  for (int whole = 0; whole <= 250; ++whole) {
    for (const char* frac : {"", ".0", ".5", ".25", ".05", ".125", ".9", ".99", ".001", ".50",
                             ".000", ".999"}) {
      const std::string f = frac;
      int64_t milli = 0;
      if (!f.empty()) {
        std::string digits = f.substr(1);
        while (digits.size() < 3) digits += '0';
        milli = std::stoll(digits);
      }
      const int64_t v = whole * 1000 + milli;
      numbers.emplace_back(absl::StrCat(whole, f), v);
      if (v != 0) numbers.emplace_back(absl::StrCat("-", whole, f), -v);
    }
  }
  for (const Range& r : ranges) {
    SCOPED_TRACE(r.schema_bounds);
    auto c = Schema(absl::StrCat(R"({"type": "number", )", r.schema_bounds, "}"));
    ASSERT_NE(c, nullptr);
    for (const auto& [text, v] : numbers) {
      const bool above = !r.lo || (r.lo_open ? v > *r.lo : v >= *r.lo);
      const bool below = !r.hi || (r.hi_open ? v < *r.hi : v <= *r.hi);
      ASSERT_EQ(Matches(c, text), above && below) << text;
    }
    for (const char* bad : {"1e0", "-0", "00.5", "1.", ".5", "0x1"}) EXPECT_FALSE(Matches(c, bad));
  }
  // Far beyond the integer bounds: long integer parts.
  auto big = Schema(R"({"type": "number", "exclusiveMinimum": 0.5})");
  EXPECT_TRUE(Matches(big, "123456789012345678901234567890.5"));
  EXPECT_TRUE(Matches(big, "0.5000001"));
  EXPECT_FALSE(Matches(big, "0.50000"));
  // Empty ranges are "nothing"; bounds past 9e15 are refused by name.
  EXPECT_FALSE(Refusal(R"({"type": "number", "minimum": 2, "maximum": 1.5})").ok());
  EXPECT_FALSE(Refusal(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})").ok());
  EXPECT_THAT(std::string(Refusal(R"({"type": "number", "minimum": 1e20})").message()),
              ::testing::HasSubstr("minimum out of range"));
}

// format uri / uri-reference (RFC 3986 without IPv6 hosts), byte (base64) and hostname (RFC
// 1123 labels).
TEST(JsonSchemaTest, UriAndHostnameFormats) {
  auto uri = Schema(R"({"type": "string", "format": "uri"})");
  for (const char* ok : {R"("https://example.com/a/b?x=1&y=%20#f")", R"("urn:isbn:0451450523")",
                         R"("mailto:a@b.c")", R"("file:///tmp/x")", R"("http://u:p@h:8080/")",
                         R"("a:")", R"("git+ssh://h/r.git")"}) {
    EXPECT_TRUE(Matches(uri, ok)) << ok;
  }
  for (const char* bad : {R"("example.com")", R"("http://a b")", R"("1http://x")",
                          R"("http://x/%zz")", R"("http://[::1]/")", R"("")", R"("/a/b")",
                          R"("h:\"x")", R"("a:b#c#d")"}) {
    EXPECT_FALSE(Matches(uri, bad)) << bad;
  }
  auto ref = Schema(R"({"type": "string", "format": "uri-reference"})");
  for (const char* ok : {R"("/a/b")", R"("a/b?c")", R"("#frag")", R"("")", R"("//host/p")",
                         R"("https://x.y/z")", R"("./a:b")"}) {
    EXPECT_TRUE(Matches(ref, ok)) << ok;
  }
  for (const char* bad : {R"("a b")", R"("%zz")", R"("1a:b")"}) {
    EXPECT_FALSE(Matches(ref, bad)) << bad;
  }
  auto b64 = Schema(R"({"type": "string", "format": "byte"})");
  for (const char* ok : {R"("")", R"("QUJD")", R"("QUI=")", R"("QQ==")", R"("a+/9QQ==")"}) {
    EXPECT_TRUE(Matches(b64, ok)) << ok;
  }
  for (const char* bad : {R"("QUJ")", R"("Q===")", R"("QU=I")", R"("QU I=")"}) {
    EXPECT_FALSE(Matches(b64, bad)) << bad;
  }
  auto host = Schema(R"({"type": "string", "format": "hostname"})");
  for (const char* ok : {R"("example.com")", R"("a-b.c")", R"("localhost")", R"("x1")"}) {
    EXPECT_TRUE(Matches(host, ok)) << ok;
  }
  for (const char* bad : {R"("-a.com")", R"("a..b")", R"("a.com.")", R"("a_b")", R"("")"}) {
    EXPECT_FALSE(Matches(host, bad)) << bad;
  }
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

// Objects told apart by a member: a tagged union, or a member one branch requires and the
// other forbids. Members that only may differ are no proof.
TEST(JsonSchemaTest, OneOfOfObjectsToldApartByAMember) {
  auto tagged = Schema(R"({"type": "object", "oneOf": [
      {"properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
       "required": ["kind", "r"]},
      {"properties": {"kind": {"enum": ["square", "box"]}, "side": {"type": "number"}},
       "required": ["kind"]}]})");
  EXPECT_TRUE(Matches(tagged, R"({"kind":"circle","r":1})"));
  EXPECT_TRUE(Matches(tagged, R"({"kind":"box"})"));
  EXPECT_FALSE(Matches(tagged, R"({"kind":"circle"})"));
  EXPECT_FALSE(Matches(tagged, R"({"kind":"triangle"})"));
  auto forbidden = Schema(R"({"oneOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"type": "object", "properties": {"b": {"type": "integer"}},
       "additionalProperties": false}]})");
  EXPECT_TRUE(Matches(forbidden, R"({"a":1})"));
  EXPECT_TRUE(Matches(forbidden, R"({"b":1})"));
  EXPECT_TRUE(Matches(forbidden, R"({})"));  // only the second: a is required by the first
  for (const char* schema : {
           // Both may lack the tag: {} matches both.
           R"({"type": "object", "oneOf": [{"properties": {"k": {"const": 1}}},
               {"properties": {"k": {"const": 2}}}]})",
           // The tags share a value.
           R"({"type": "object", "oneOf": [
               {"properties": {"k": {"enum": [1, 2]}}, "required": ["k"]},
               {"properties": {"k": {"enum": [2, 3]}}, "required": ["k"]}]})",
           // 1 and 1.0 are the same number.
           R"({"type": "object", "oneOf": [
               {"properties": {"k": {"const": 1}}, "required": ["k"]},
               {"properties": {"k": {"const": 1.0}}, "required": ["k"]}]})",
           // No type: both accept any number.
           R"({"oneOf": [{"properties": {"k": {"const": 1}}, "required": ["k"]},
               {"properties": {"k": {"const": 2}}, "required": ["k"]}]})",
       }) {
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
  EXPECT_NE(
      Refusal(R"({"not": {"required": ["a", "b"]}})").message().find("'not' is not supported"),
      std::string::npos);
  EXPECT_NE(Refusal(R"({"not": {"pattern": "a"}})").message().find("'not' is not supported"),
            std::string::npos);
}

// not of not is the inner schema; not of one required property is an object without it.
TEST(JsonSchemaTest, NotOfNotAndOfARequiredProperty) {
  auto twice = Schema(R"({"not": {"not": {"type": "integer", "minimum": 3}}})");
  EXPECT_TRUE(Matches(twice, "5"));
  EXPECT_FALSE(Matches(twice, "2"));
  EXPECT_FALSE(Matches(twice, R"("x")"));
  auto absent = Schema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "not": {"required": ["b"]}})");
  EXPECT_TRUE(Matches(absent, R"({"a":1})"));
  EXPECT_TRUE(Matches(absent, R"({"c":1})"));  // additionalProperties: any, but not b
  EXPECT_FALSE(Matches(absent, R"({"b":1})"));
  EXPECT_FALSE(Matches(absent, R"({"a":1,"b":1})"));
  auto only = Schema(R"({"not": {"required": ["a"]}})");
  EXPECT_TRUE(Matches(only, R"({})"));
  EXPECT_FALSE(Matches(only, R"({"a":1})"));
  EXPECT_FALSE(Matches(only, "5"));  // `required` holds for a number: its negation does not
  EXPECT_THAT(std::string(Refusal(R"({"required": ["a"], "not": {"required": ["a"]}})").message()),
              ::testing::HasSubstr("matches nothing"));
  EXPECT_THAT(std::string(Refusal(R"({"type": "string", "not": {"required": ["a"]}})").message()),
              ::testing::HasSubstr("matches nothing"));
}

TEST(JsonSchemaTest, AllOfMergesProperties) {
  auto c = Schema(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"]}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(Matches(c, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(Matches(c, R"({"a":1})"));
}

// patternProperties (one pattern): the members after the known ones have keys matching it
// and values of its schema; keys outside it are not produced.
TEST(JsonSchemaTest, PatternPropertiesGiveTheKeysAndValuesOfExtraMembers) {
  auto map = Schema(R"({"type": "object", "properties": {"id": {"type": "integer"}},
      "required": ["id"], "patternProperties": {"^x_[a-z]+$": {"type": "string"}},
      "additionalProperties": false})");
  EXPECT_TRUE(Matches(map, R"({"id":1})"));
  EXPECT_TRUE(Matches(map, R"({"id":1,"x_a":"s","x_bc":"t"})"));
  EXPECT_FALSE(Matches(map, R"({"id":1,"x_a":2})"));    // the pattern's schema
  EXPECT_FALSE(Matches(map, R"({"id":1,"y":"s"})"));    // additionalProperties false
  EXPECT_FALSE(Matches(map, R"({"id":1,"x_A":"s"})"));  // no match
  // additionalProperties absent: keys outside the pattern are valid but not produced.
  auto open =
      Schema(R"({"type": "object", "patternProperties": {"^[0-9]+$": {"type": "boolean"}}})");
  EXPECT_TRUE(Matches(open, R"({"12":true})"));
  EXPECT_FALSE(Matches(open, R"({"12":1})"));
  EXPECT_FALSE(Matches(open, R"({"ab":1})"));
  // A pattern whose values may be anything, when anything may appear: nothing changes.
  auto any = Schema(R"({"type": "object", "patternProperties": {"^a": {}}})");
  EXPECT_TRUE(Matches(any, R"({"b":[1]})"));
  // Search semantics: "b" matches any key containing a b.
  auto search = Schema(R"({"type": "object", "patternProperties": {"b": {"const": 1}},
      "additionalProperties": false})");
  EXPECT_TRUE(Matches(search, R"({"abc":1})"));
  EXPECT_FALSE(Matches(search, R"({"ac":1})"));
  // Refused: several patterns, a pattern matching a known property (both schemas would apply).
  EXPECT_NE(Refusal(R"({"patternProperties": {"a": {}, "b": {}}})").message().find(
                "more than one pattern"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"properties": {"ab": {}}, "patternProperties": {"^a": {"type": "null"}}})")
                .message()
                .find("matches the property 'ab'"),
            std::string::npos);
}

// A property dependency: the trigger absent, or present with what it requires.
TEST(JsonSchemaTest, PropertyDependencies) {
  auto names = Schema(R"({"type": "object", "properties": {"card": {"type": "integer"},
      "address": {"type": "string"}, "name": {"type": "string"}},
      "dependencies": {"card": ["address"]}, "additionalProperties": false})");
  EXPECT_TRUE(Matches(names, R"({"name":"a"})"));
  EXPECT_TRUE(Matches(names, R"({"address":"x"})"));
  EXPECT_TRUE(Matches(names, R"({"card":1,"address":"x"})"));
  EXPECT_FALSE(Matches(names, R"({"card":1})"));
  EXPECT_FALSE(Matches(names, R"({"card":1,"name":"a"})"));
  auto schema = Schema(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "integer"}}, "dependentSchemas": {"a": {"properties": {"b": {"minimum": 5}},
      "required": ["b"]}}})");
  EXPECT_TRUE(Matches(schema, R"({"b":1})"));
  EXPECT_TRUE(Matches(schema, R"({"a":1,"b":7})"));
  EXPECT_FALSE(Matches(schema, R"({"a":1,"b":1})"));
  EXPECT_FALSE(Matches(schema, R"({"a":1})"));
  auto required = Schema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"], "dependentRequired": {"a": ["z"]}})");
  EXPECT_TRUE(Matches(required, R"({"a":1,"z":null})"));
  EXPECT_FALSE(Matches(required, R"({"a":1})"));
  EXPECT_NE(Refusal(R"({"dependencies": {"a": [], "b": [], "c": [], "d": [], "e": []}})")
                .message()
                .find("more than 4"),
            std::string::npos);
}

// A required name outside `properties` takes additionalProperties' value; with
// additionalProperties false nothing validates.
TEST(JsonSchemaTest, RequiredNamesOutsidePropertiesFollowAdditionalProperties) {
  auto typed = Schema(R"({"type": "object", "required": ["x"],
      "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(Matches(typed, R"({"x":1})"));
  EXPECT_FALSE(Matches(typed, R"({"x":"s"})"));
  EXPECT_THAT(std::string(Refusal(R"({"type": "object", "required": ["x"],
      "additionalProperties": false})").message()),
              ::testing::HasSubstr("matches nothing"));
}

TEST(JsonSchemaTest, KeywordsItCannotEnforceAreNamedNotIgnored) {
  for (const char* keyword : {"multipleOf", "uniqueItems", "unevaluatedProperties", "if",
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
