#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_trie.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

// A byte-level vocabulary like a BPE model's: every single byte, pieces of JSON, words with a
// leading space, multi-byte characters whole and split in the middle, and random byte strings.
std::vector<std::string> Vocabulary(uint32_t seed) {
  std::vector<std::string> v;
  v.push_back("");  // a special token: no bytes
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece :
       {"{\"", "\":", "\",", "\"}", "true", "false", "null", " \"", "12", "-3", ".5", "e+",
        "name", " name", "\":\"", "\\\"", "\\n", "\\u00", "\xC3\xA9", "\xC3", "\xA9t",
        "\xE4\xB8\xAD\xE6", "\x96\x87", "]}", "[{", "},{", "  ", "\n  ", "0", "00", "2026-",
        "11-28", "\"a", "abc\"", "\xF0\x9F\x98\x80"}) {
    v.push_back(piece);
  }
  std::mt19937 rng(seed);
  const std::string alphabet = "{}[]\":,. -0123456789aeflnrstu\\\xC3\xA9";
  for (int i = 0; i < 700; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    v.push_back(s);
  }
  return v;
}

std::vector<uint32_t> BruteForceMask(const Matcher& m, const std::vector<std::string>& vocab,
                                     const std::vector<int32_t>& end_tokens) {
  std::vector<uint32_t> mask((vocab.size() + 31) / 32, 0);
  for (size_t t = 0; t < vocab.size(); ++t) {
    if (vocab[t].empty()) continue;
    Matcher copy = m;
    if (copy.AcceptBytes(vocab[t])) mask[t >> 5] |= 1u << (t & 31);
  }
  if (m.CanEnd()) {
    for (const int32_t t : end_tokens) mask[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
  }
  return mask;
}

TEST(TokenMaskTest, MaskEqualsTheMatcherTokenByTokenAlongADocument) {
  const std::vector<std::string> vocab = Vocabulary(31);
  const std::vector<int32_t> end = {0};  // the empty special token ends the output
  const TokenTrie trie(vocab, end);
  EXPECT_EQ(trie.vocab_size(), vocab.size());
  auto g = CompileJsonSchema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": -3,
      "maximum": 120}, "tags": {"type": "array", "items": {"enum": ["a", "b\u00e9"]}},
      "ok": {"type": "boolean"}}, "required": ["name", "n"], "additionalProperties": false})",
                             JsonSchemaOptions{.max_whitespace = 2});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc = "{\"name\":\"\xC3\xA9t\\\"\xE4\xB8\xAD\",\"n\": -3,\"tags\":[\"b\xC3\xA9\"],\"ok\":true}";
  Matcher m(*c);
  std::vector<uint32_t> mask;
  for (size_t i = 0; i <= doc.size(); ++i) {
    const size_t allowed = m.FillTokenMask(trie, &mask);
    const std::vector<uint32_t> expected = BruteForceMask(m, vocab, end);
    ASSERT_EQ(mask, expected) << "after " << i << " bytes: " << doc.substr(0, i);
    EXPECT_GT(allowed, 0u);
    if (i < doc.size()) {
      ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
    }
  }
  EXPECT_TRUE(m.CanEnd());
  // At the end only the end token is allowed.
  EXPECT_EQ(m.FillTokenMask(trie, &mask), 1u);
  EXPECT_EQ(mask[0] & 1u, 1u);
}

TEST(TokenMaskTest, PlainStringBytesAreUtf8WithoutEscapesOrControls) {
  auto run = [](const std::string& bytes) {
    int state = 0;
    for (const char c : bytes) {
      state = PlainStringStep(state, static_cast<uint8_t>(c));
      if (state < 0) return -1;
    }
    return state;
  };
  EXPECT_EQ(run("abc XYZ 09 {}[]:,/'"), 0);
  EXPECT_EQ(run("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"), 0);  // é 中 😀
  EXPECT_EQ(run("\xE4\xB8"), 1);  // inside a character
  for (const char* bad : {"\"", "\\", "\n", "\x7F", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80",
                          "\xED\xA0\x80", "\xF0\x80\x80\x80", "\xF4\x90\x80\x80", "\xF5",
                          "\xA9", "\xC3" "a", "\xFF"}) {
    EXPECT_EQ(run(bad), -1) << bad;
  }
}

// A vocabulary big enough that string states are cut and cached rather than walked whole:
// Vocabulary(seed) plus 6,000 random tokens (from `rng_seed`), mostly plain string content:
// a tenth of them hold a quote, an escape or a control.
std::vector<std::string> BigVocabulary(uint32_t seed, uint32_t rng_seed) {
  std::vector<std::string> vocab = Vocabulary(seed);
  std::mt19937 rng(rng_seed);
  const std::vector<std::string> pieces = {"a", "e", "n", "s", "t", "x", " ", "-", "_", "0", "7",
                                           "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                                           "\xC3", "\xB8", "\"", "\\", "\n", ":", ",", "}"};
  for (int i = 0; i < 6000; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 7);
    for (int k = 0; k < len; ++k) {
      const size_t p = rng() % 10 == 0 ? rng() % pieces.size() : rng() % 16;
      s += pieces[p];
    }
    vocab.push_back(s);
  }
  return vocab;
}

// With a vocabulary large enough that string states are not walked whole, masks inside free
// strings and keys are the trie's plain tokens plus a walk of the others; they equal the whole
// walk, and strings that do not accept every plain run (maxLength, a pattern) are walked.
TEST(TokenMaskTest, PlainTokensAtOnceGiveTheWholeWalksMask) {
  const std::vector<std::string> vocab = BigVocabulary(7, 11);
  const std::vector<int32_t> end = {0};
  const TokenTrie trie(vocab, end);
  ASSERT_NE(trie.rest(), nullptr);
  EXPECT_GT(trie.num_plain(), vocab.size() / 2);
  EXPECT_LT(trie.rest()->num_nodes(), trie.num_nodes());
  auto g = CompileJsonSchema(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "note": {"type": "string", "maxLength": 5},
      "id": {"type": "string", "pattern": "^[a-f0-9]+$"}, "n": {"type": "integer"}},
      "required": ["name"]})",
                             JsonSchemaOptions{.max_whitespace = 1});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc =
      "{\"name\":\"t\xC3\xA9 st_\xE4\xB8\xAD\\\"x\",\"note\":\"ab\",\"id\":\"0af\",\"n\":7,"
      "\"namex\":\"a \xF0\x9F\x98\x80 e\",\"s\":[\"x\"]}";
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  size_t plain_masks = 0;
  for (int pass = 0; pass < 2; ++pass) {  // the second time, every state is cached
    Matcher m(*c);
    for (size_t i = 0; i <= doc.size(); ++i) {
      const size_t allowed = m.FillTokenMask(trie, &mask);
      const size_t expected = m.FillTokenMaskUncached(trie, &reference);
      ASSERT_EQ(mask, reference) << "pass " << pass << ", after " << doc.substr(0, i);
      ASSERT_EQ(allowed, expected) << "pass " << pass << ", after " << doc.substr(0, i);
      if (i < doc.size()) {
        ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
      }
    }
    EXPECT_TRUE(m.CanEnd());
    plain_masks += m.plain_universal_masks();
  }
  EXPECT_GT(plain_masks, 20u);
}

// A string of maxLength N: each position is a state of its own (N - k characters left), and
// no plain run of more than that is accepted, so the plain tokens cannot all be taken at once.
// Those of at most N - k characters are (TokenTrie::plain_mask_upto), and the masks equal the
// whole walk, including tokens that end inside a character at the bound.
TEST(TokenMaskTest, ABoundedStringTakesItsShortPlainTokensAtOnce) {
  const std::vector<std::string> vocab = BigVocabulary(13, 17);
  const TokenTrie trie(vocab, {0});
  auto g = CompileJsonSchema(R"({"type": "string", "maxLength": 6})",
                             JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  // (A multi-byte character at the bound, an escape, a two-byte one split by the tokens.)
  const std::vector<std::string> docs = {"\"ab \xE4\xB8\xAD\\n\xC3\xA9\"", "\"x\"",
                                         "\"\xF0\x9F\x98\x80-_07e\""};
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  size_t plain_masks = 0;
  for (const std::string& doc : docs) {
    Matcher m(*c);
    for (size_t i = 0; i <= doc.size(); ++i) {
      const size_t allowed = m.FillTokenMask(trie, &mask);
      const size_t expected = m.FillTokenMaskUncached(trie, &reference);
      ASSERT_EQ(mask, reference) << "after " << doc.substr(0, i);
      ASSERT_EQ(allowed, expected) << "after " << doc.substr(0, i);
      if (i < doc.size()) {
        ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
      }
    }
    EXPECT_TRUE(m.CanEnd());
    plain_masks += m.plain_universal_masks();
  }
  EXPECT_GE(plain_masks, 6u);
}

// Walks `doc` byte by byte twice (two matchers: the second meets the grammar's caches), every
// cached mask checked against the whole walk; *most_boundaries: the most a mask walked from
// below a cut. `doc` must be a whole sentence.
void WalkTwiceCheckingMasks(const std::shared_ptr<const CompiledGrammar>& c, const TokenTrie& trie,
                            const std::string& doc, size_t* most_boundaries) {
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  for (int pass = 0; pass < 2; ++pass) {
    Matcher m(c);
    for (size_t i = 0; i <= doc.size(); ++i) {
      const size_t allowed = m.FillTokenMask(trie, &mask);
      *most_boundaries = std::max(*most_boundaries, m.last_mask_boundaries());
      ASSERT_EQ(allowed, m.FillTokenMaskUncached(trie, &reference));
      ASSERT_EQ(mask, reference) << "pass " << pass << ", after " << doc.substr(0, i);
      if (i < doc.size()) {
        ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << doc.substr(0, i + 1);
      }
    }
    EXPECT_TRUE(m.CanEnd());
  }
}

// A string of minLength 1: after its first character every stack shares the rest of the
// string, and a cut just below that entry would let almost every token reach the cut (one
// walk from below per trie node, every mask). The cut goes one entry deeper instead, below the
// closing quote, and the masks still equal the whole walk.
TEST(TokenMaskTest, AStringOfMinLengthOneIsCutBelowItsClosingQuote) {
  const std::vector<std::string> vocab = BigVocabulary(5, 105);
  const TokenTrie trie(vocab, {0});
  auto g = CompileJsonSchema(R"({"type": "object", "properties": {
      "s": {"type": "string", "minLength": 1}, "t": {"type": "string", "minLength": 1}},
      "required": ["s", "t"], "additionalProperties": false})",
                             JsonSchemaOptions{.max_whitespace = 1});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc = "{\"s\":\"ax e\",\"t\":\"n_0 t\"}";
  size_t most_boundaries = 0;
  ASSERT_NO_FATAL_FAILURE(WalkTwiceCheckingMasks(*c, trie, doc, &most_boundaries));
  EXPECT_LE(most_boundaries, Matcher::kMaxBoundaries);
}

// maxLength 1000: each position of the string is its own level of the bounded repeat, but a
// token of at most max_token_bytes() bytes cannot tell levels above that apart, so the
// positions share one cached mask part (one walk, then hits) and the masks equal the whole
// walk, up to the bound and at it.
TEST(TokenMaskTest, PositionsOfALongBoundedStringShareOneCachedMask) {
  const std::vector<std::string> vocab = BigVocabulary(6, 106);
  const TokenTrie trie(vocab, {0});
  ASSERT_LE(trie.max_token_bytes(), 28u);
  for (const int max_length : {1000, 40}) {
    auto g = CompileJsonSchema(
        absl::StrCat(R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": )",
                     max_length, R"(}}, "required": ["s"], "additionalProperties": false})"),
        JsonSchemaOptions{.max_whitespace = 0});
    ASSERT_TRUE(g.ok()) << g.status();
    auto c = CompiledGrammar::Compile(*g);
    ASSERT_TRUE(c.ok());
    Matcher m(*c);
    ASSERT_TRUE(m.AcceptBytes("{\"s\":\""));
    std::vector<uint32_t> mask;
    std::vector<uint32_t> reference;
    size_t walked = 0;
    for (int i = 0; i < 40; ++i) {
      const size_t allowed = m.FillTokenMask(trie, &mask);
      walked += m.last_mask_path() == Matcher::MaskPath::kCutWalked ? 1 : 0;
      ASSERT_EQ(allowed, m.FillTokenMaskUncached(trie, &reference));
      ASSERT_EQ(mask, reference) << max_length << ", after " << i << " characters";
      ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>("ax e-"[i % 5]))) << i;
    }
    ASSERT_TRUE(m.AcceptByte('"'));
    if (max_length == 1000) {
      EXPECT_LE(walked, 2u);
    } else {
      EXPECT_GT(walked, 10u);  // (each level near the bound is a state of its own)
    }
  }
}

// The values of an object of many members of one type: each value's stacks share what
// follows it (the rest of the object, different for each member), and are cut above that
// entry, so the first value's walk serves the others (a cache hit each), and the masks still
// equal the whole walk.
TEST(TokenMaskTest, ValuesOfOneTypeShareOneCutAcrossMembers) {
  std::vector<std::string> vocab = BigVocabulary(10, 110);
  std::mt19937 rng(210);
  // Many tokens that open a string (a few close it and go on), so a value's state is not
  // cheap to walk whole.
  const std::string letters = "aenstx_-07";
  for (int i = 0; i < 6000; ++i) {
    std::string s = "\"";
    const int len = 2 + static_cast<int>(rng() % 6);
    for (int k = 0; k < len; ++k) s += letters[rng() % letters.size()];
    if (rng() % 128 == 0) s += rng() % 2 ? "\"," : "\"}";
    vocab.push_back(s);
  }
  const TokenTrie trie(vocab, {0});
  std::string schema = R"({"type": "object", "properties": {)";
  std::string doc = "{";
  for (int i = 0; i < 12; ++i) {
    absl::StrAppend(&schema, i ? ", " : "", "\"p", i, "\": {\"type\": [\"string\", \"null\"]}");
    absl::StrAppend(&doc, i ? "," : "", "\"p", i, "\":", i % 3 == 0 ? "null" : "\"ax e\"");
  }
  schema += R"(}, "additionalProperties": false})";
  doc += "}";
  auto g = CompileJsonSchema(schema, JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  size_t values = 0;
  size_t hits = 0;
  for (size_t i = 0; i <= doc.size(); ++i) {
    const size_t allowed = m.FillTokenMask(trie, &mask);
    if (i > 0 && doc[i - 1] == ':') {
      ++values;
      hits += m.last_mask_path() == Matcher::MaskPath::kCutHit ? 1 : 0;
    }
    ASSERT_EQ(allowed, m.FillTokenMaskUncached(trie, &reference));
    ASSERT_EQ(mask, reference) << "after " << doc.substr(0, i);
    if (i < doc.size()) {
      ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
    }
  }
  EXPECT_TRUE(m.CanEnd());
  EXPECT_EQ(values, 12u);
  EXPECT_GE(hits, 10u);
}

// A URI (format "uri" / "uri-reference"): its authority and path nest deeper inside the string
// than kCutDepth entries, so a cut at kCutDepth would be crossed by almost every token (each
// crossing a walk from below, every mask). The cut goes deeper there too, and the masks still
// equal the whole walk.
TEST(TokenMaskTest, AUriStringIsCutDeeperThanItsNesting) {
  std::vector<std::string> vocab = Vocabulary(9);
  std::mt19937 rng(109);
  const std::vector<std::string> pieces = {"a", "e",   "x",   "0",   ".",   "/",     "-", "_",
                                           "~", "%2F", "com", "www", "://", "https", "@", ":",
                                           "?", "#",   "=",   "&",   "\"",  ",",     "}"};
  for (int i = 0; i < 6000; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < len; ++k) s += pieces[rng() % pieces.size()];
    vocab.push_back(s);
  }
  const TokenTrie trie(vocab, {0});
  auto g = CompileJsonSchema(R"({"type": "object", "properties": {
      "loc": {"type": "string", "format": "uri"},
      "ref": {"type": "string", "format": "uri-reference"}},
      "required": ["loc", "ref"], "additionalProperties": false})",
                             JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc =
      "{\"loc\":\"https://a@www.ex-a.com:80/a/e_x/0%2F.~?x=a&e=0#a/x\","
      "\"ref\":\"//www.x.com/a/e/x?a#0\"}";
  size_t most_boundaries = 0;
  ASSERT_NO_FATAL_FAILURE(WalkTwiceCheckingMasks(*c, trie, doc, &most_boundaries));
  EXPECT_LE(most_boundaries, Matcher::kMaxBoundaries);
}

// A JSON Schema `pattern` is unanchored: `.*P.*`. Inside such a string the state holds the
// prefix loop's stacks beside partial matches of P, a new state at each character. A plain
// run that completes P lets the string end there: that stack reaches the cut (the closing
// quote lies below it). It drops out of the search for "every plain run is accepted" (the
// loop's stacks take the run), so the plain tokens are taken at once at every position
// instead of walking the whole trie, and the masks equal the whole walk.
TEST(TokenMaskTest, AnUnanchoredPatternTakesPlainTokensAtOnce) {
  const std::vector<std::string> vocab = BigVocabulary(21, 23);
  const TokenTrie trie(vocab, {0});
  auto g = CompileJsonSchema(R"({"type": "object", "properties": {
      "id": {"type": "string", "pattern":
          "[a-fA-F0-9]{8}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-[a-fA-F0-9]{12}"}},
      "required": ["id"], "additionalProperties": false})",
                             JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc = "{\"id\":\"x 123e4567-e89b-12d3-a456-426655440000 tail \xC3\xA9\"}";
  size_t most_boundaries = 0;
  ASSERT_NO_FATAL_FAILURE(WalkTwiceCheckingMasks(*c, trie, doc, &most_boundaries));
  // Up to the first whole match (after it the state is the union of two groups, masked as
  // such): every mask takes the plain tokens at once.
  Matcher m(*c);
  const size_t open = doc.find(":\"") + 2;
  const size_t matched = doc.find("440000");
  ASSERT_TRUE(m.AcceptBytes(doc.substr(0, open)));
  std::vector<uint32_t> mask;
  for (size_t i = open; i < matched; ++i) {
    m.FillTokenMask(trie, &mask);
    ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i])));
  }
  EXPECT_EQ(m.plain_universal_masks(), matched - open);
}

// A state of more stacks than kMaxCutStacks whose stacks do not merge (an enum of 200
// strings after its opening quote: each its own literal, more than kMaxMergedCuts) is walked whole the first time and
// its mask is kept in the grammar: the next request with the same schema takes it from
// there, equal to the whole walk.
TEST(TokenMaskTest, AStateOfManyStacksIsCachedForTheNextRequest) {
  const std::vector<std::string> vocab = BigVocabulary(8, 108);
  const TokenTrie trie(vocab, {0});
  std::string schema = R"({"enum": [)";
  for (int i = 0; i < 200; ++i) absl::StrAppend(&schema, i ? ", " : "", "\"k", i, "x\"");
  schema += "]}";
  auto g = CompileJsonSchema(schema, JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  for (int request = 0; request < 2; ++request) {
    Matcher m(*c);
    ASSERT_TRUE(m.AcceptBytes("\"k"));
    ASSERT_GT(m.num_stacks(), Matcher::kMaxMergedCuts);
    const size_t allowed = m.FillTokenMask(trie, &mask);
    EXPECT_EQ(m.last_mask_path(), request == 0 ? Matcher::MaskPath::kWholeManyStacks
                                               : Matcher::MaskPath::kWholeManyHit);
    ASSERT_EQ(allowed, m.FillTokenMaskUncached(trie, &reference));
    ASSERT_EQ(mask, reference);
  }
}

// Inside a string under an anyOf of 40 objects, stacks per branch: the stacks differ only
// below the string, so they merge into stacks over a placeholder for all 40 tails; the
// string takes the plain tokens at once, and the masks (in the string and as it closes into
// each branch's next member) equal the whole walk.
TEST(TokenMaskTest, StacksThatDifferOnlyBelowACutMergeUnderOnePlaceholder) {
  const std::vector<std::string> vocab = BigVocabulary(10, 110);
  const TokenTrie trie(vocab, {0});
  std::string schema = R"({"anyOf": [)";
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&schema, i ? ", " : "",
                    R"({"type": "object", "properties": {"s": {"type": "string"}, "v)", i,
                    R"(": {"type": "integer"}}, "required": ["s"], "additionalProperties": false})");
  }
  schema += "]}";
  auto g = CompileJsonSchema(schema, JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc = "{\"s\":\"ax e-n\",\"v17\":7}";
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  Matcher m(*c);
  size_t merged_in_string = 0;
  for (size_t i = 0; i <= doc.size(); ++i) {
    const size_t plain_before = m.plain_universal_masks();
    const size_t allowed = m.FillTokenMask(trie, &mask);
    if (i >= 6 && i < 13) {
      ASSERT_GT(m.num_stacks(), Matcher::kMaxCutStacks) << i;
      merged_in_string += m.plain_universal_masks() - plain_before;
    }
    ASSERT_EQ(allowed, m.FillTokenMaskUncached(trie, &reference));
    ASSERT_EQ(mask, reference) << "after " << doc.substr(0, i);
    if (i < doc.size()) {
      ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
    }
  }
  EXPECT_TRUE(m.CanEnd());
  EXPECT_GE(merged_in_string, 6u);
}

// An object of many optional properties, other keys allowed: at each key, the stacks of the
// names not yet used sit beside the trie of the other keys, which accepts every plain run by
// itself. That group's answer is found once for the grammar (too big a search for the whole
// state's bound), so keys take the plain tokens at once; the masks equal the whole walk.
TEST(TokenMaskTest, KeysOfAnObjectOfManyNamesTakePlainTokensAtOnce) {
  std::vector<std::string> vocab = Vocabulary(9);
  std::mt19937 rng(5);
  const std::vector<std::string> pieces = {"a", "e", "n", "s", "t", "x", "_", "-", "0",
                                           "\xC3\xA9", "\xE4\xB8\xAD", "\"", ":", ","};
  for (int i = 0; i < 6000; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < len; ++k) {
      s += pieces[rng() % 10 == 0 ? rng() % pieces.size() : rng() % 11];
    }
    vocab.push_back(s);
  }
  const TokenTrie trie(vocab, {0});
  std::string schema = R"({"type": "object", "properties": {)";
  std::vector<std::string> names;
  // The names of a real configuration file's schema (a development server's).
  for (const char* name : {"port", "host", "proxy", "insecure-proxy", "watcher", "live-reload",
                           "live-reload-host", "live-reload-port", "environment", "output-path",
                           "ssl", "ssl-key", "ssl-cert"}) {
    schema += (names.empty() ? "\"" : ", \"") + std::string(name) + R"(": {"type": "string"})";
    names.push_back(name);
  }
  schema += "}}";
  auto g = CompileJsonSchema(schema, JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  const std::string doc =
      "{\"port\":\"80\",\"live-reload\":\"x\",\"live-reload-port\":\"\xC3\xA9\",\"ssl\":\"1\","
      "\"ssl-cart\":\"2\",\"ss\":\"\",\"ssl-cert-x\":\"3\"}";
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  for (int pass = 0; pass < 2; ++pass) {
    Matcher m(*c);
    size_t key_starts = 0;
    size_t plain_key_starts = 0;
    for (size_t i = 0; i <= doc.size(); ++i) {
      const size_t plain_before = m.plain_universal_masks();
      m.FillTokenMask(trie, &mask);
      // (The first key, where every name may come, has more than kMaxCutStacks stacks: it
      // is walked whole.)
      if (i > 2 && doc[i - 1] == '"' && doc[i - 2] == ',') {
        ++key_starts;
        // (The second pass takes a key's whole mask, merged in the first, from the cache.)
        plain_key_starts += m.last_mask_path() == Matcher::MaskPath::kGroupsHit
                                ? 1
                                : m.plain_universal_masks() - plain_before;
      }
      m.FillTokenMaskUncached(trie, &reference);
      ASSERT_EQ(mask, reference) << "pass " << pass << ", after " << doc.substr(0, i);
      if (i < doc.size()) {
        ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
      }
    }
    EXPECT_TRUE(m.CanEnd());
    EXPECT_EQ(key_starts, 6u);
    EXPECT_EQ(plain_key_starts, key_starts) << "pass " << pass;
  }
}

// An object's key position holds one stack per name still to come and the other keys'
// stacks, a new state at each position. Its mask is the union of its groups' masks, each cut
// and cached on its own: the parts are the same at every key position and in every request.
TEST(TokenMaskTest, KeyPositionsAreTheUnionOfTheirGroupsMasks) {
  std::vector<std::string> vocab = Vocabulary(11);
  for (const char* piece : {"\"port\"", "\":", "\",\"", "host", "proxy", "-", "ssl", "\":\"",
                            "cert", "key", "live", "reload", "\"}", "\\u001f", "\\n", "\\"}) {
    vocab.push_back(piece);
  }
  const TokenTrie trie(vocab, {0});
  std::string schema = R"({"type": "object", "properties": {)";
  bool first = true;
  for (const char* name : {"port", "host", "proxy", "insecure-proxy", "watcher", "live-reload",
                           "live-reload-host", "live-reload-port", "environment", "output-path",
                           "ssl", "ssl-key", "ssl-cert"}) {
    schema += (first ? "\"" : ", \"") + std::string(name) + R"(": {"type": "string"})";
    first = false;
  }
  schema += "}}";
  auto g = CompileJsonSchema(schema, JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  // Two requests, the second with other names in another order and escapes in the values;
  // then the first again.
  const std::vector<std::string> docs = {
      "{\"port\":\"80\",\"proxy\":\"x\",\"watcher\":\"w\",\"ssl\":\"1\",\"zz\":\"2\"}",
      "{\"host\":\"h\\n\",\"live-reload\":\"\\u001f\",\"environment\":\"\\\\\",\"ssl-key\":\"k\"}",
      "{\"port\":\"80\",\"proxy\":\"x\",\"watcher\":\"w\",\"ssl\":\"1\",\"zz\":\"2\"}"};
  std::vector<uint32_t> mask;
  std::vector<uint32_t> reference;
  size_t merged = 0;
  size_t new_parts_second = 0;  // parts walked at the second request's key positions
  size_t whole_hits_third = 0;  // the third request's key positions whose whole mask was kept
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::string& doc = docs[d];
    Matcher m(*c);
    for (size_t i = 0; i <= doc.size(); ++i) {
      const size_t misses = (*c)->mask_cache().stats().misses;
      const size_t entries = (*c)->mask_cache().stats().entries;
      m.FillTokenMask(trie, &mask);
      if (i > 2 && doc[i - 1] == '"' && doc[i - 2] == ',') {
        merged += m.last_mask_path() == Matcher::MaskPath::kGroups ? 1 : 0;
        if (d == 1) {
          EXPECT_GT((*c)->mask_cache().stats().misses, misses);  // (the whole state: new)
          // (One new entry: the merged whole mask; every group's part was kept.)
          new_parts_second += (*c)->mask_cache().stats().entries - entries - 1;
        }
        if (d == 2) {
          whole_hits_third += m.last_mask_path() == Matcher::MaskPath::kGroupsHit ? 1 : 0;
          EXPECT_EQ((*c)->mask_cache().stats().entries, entries);
        }
      }
      m.FillTokenMaskUncached(trie, &reference);
      ASSERT_EQ(mask, reference) << "doc " << d << ", after " << doc.substr(0, i);
      if (i < doc.size()) {
        ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(doc[i]))) << i;
      }
    }
    EXPECT_TRUE(m.CanEnd());
  }
  // Every key that follows a comma: 4 in the first request, 3 in the second; the third
  // request meets the first's states again.
  EXPECT_EQ(merged, 7u);
  EXPECT_EQ(new_parts_second, 0u);
  EXPECT_EQ(whole_hits_third, 4u);
}

TEST(TokenMaskTest, SplitUtf8TokensAreAllowedOnlyAsPrefixesOfAllowedCharacters) {
  const std::vector<std::string> vocab = {"\xC3", "\xA9", "\xC3\xA9", "\xE4", "a", "\"", "\xFF"};
  const TokenTrie trie(vocab, {});
  // A string of one character out of {é, a}.
  auto g = CompileJsonSchema(R"({"enum": ["\u00e9", "a"]})", JsonSchemaOptions{.max_whitespace = 0});
  ASSERT_TRUE(g.ok());
  auto c = CompiledGrammar::Compile(*g);
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  ASSERT_TRUE(m.AcceptByte('"'));
  std::vector<uint32_t> mask;
  m.FillTokenMask(trie, &mask);
  EXPECT_EQ(mask[0], 0b10101u);  // \xC3, \xC3\xA9, a; not \xA9, \xE4 (a different character), \xFF
  ASSERT_TRUE(m.AcceptByte(0xC3));
  m.FillTokenMask(trie, &mask);
  EXPECT_EQ(mask[0], 0b10u);  // only the continuation \xA9
}

// The mask caches keep what was used last: past their bound the least recently used part
// goes, so a long-running server's cache follows its traffic instead of keeping its first
// masks forever.
TEST(TokenMaskCacheTest, PastItsBoundTheLeastRecentlyUsedPartGoes) {
  auto part = [] {
    auto p = std::make_shared<CachedTokenMask>();
    p->accepted.assign(256, 0);  // 1 KiB
    return p;
  };
  TokenMaskCache cache(3500);  // three parts with their keys and bookkeeping, not four
  cache.Store({1}, part());
  cache.Store({2}, part());
  cache.Store({3}, part());
  ASSERT_EQ(cache.stats().entries, 3u);
  ASSERT_NE(cache.Find({1}), nullptr);  // 1 is now the most recently used; 2 the least
  cache.Store({4}, part());
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.Find({2}), nullptr);
  EXPECT_NE(cache.Find({1}), nullptr);
  EXPECT_NE(cache.Find({3}), nullptr);
  EXPECT_NE(cache.Find({4}), nullptr);
  EXPECT_LE(cache.stats().bytes, 3500u);
  // A part bigger than the whole bound is not kept (and evicts nothing).
  auto huge = std::make_shared<CachedTokenMask>();
  huge->accepted.assign(4096, 0);
  cache.Store({5}, huge);
  EXPECT_EQ(cache.Find({5}), nullptr);
  EXPECT_EQ(cache.stats().entries, 3u);
}

}  // namespace
}  // namespace pd::grammar
