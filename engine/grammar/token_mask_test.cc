#include <memory>
#include <random>
#include <string>
#include <vector>

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
