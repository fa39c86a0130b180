#include "engine/model/hf_tokenizer.h"

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/log/log.h"
#include "common/testing/temp_dir.h"
#include "engine/model/pre_tokenizer.h"
#include "engine/tools/tokenizer_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// The generated 512-token tokenizer (the tiny preset's), built once.
const HfTokenizer& Tiny() {
  static const HfTokenizer* tok = [] {
    absl::StatusOr<std::string> json = BuildTokenizerJson(512);
    CHECK(json.ok()) << json.status();
    absl::StatusOr<HfTokenizer> t = HfTokenizer::Parse(*json);
    CHECK(t.ok()) << t.status();
    return new HfTokenizer(std::move(*t));
  }();
  return *tok;
}

std::vector<uint32_t> Ids(const HfTokenizer& tok, absl::string_view text, bool bos = false) {
  absl::StatusOr<std::vector<uint32_t>> ids = tok.Encode(text, bos, false);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<uint32_t>{};
}

std::string RoundTrip(const HfTokenizer& tok, absl::string_view text) {
  absl::StatusOr<std::string> s = tok.Decode(Ids(tok, text));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "<error>";
}

// A small hand-written byte-level tokenizer; MERGES and EXTRA are substituted.
constexpr char kMiniTemplate[] = R"({
  "added_tokens": [{"id": 6, "content": "<eos>", "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5},
            "merges": MERGES EXTRA}
})";

absl::StatusOr<HfTokenizer> Mini(absl::string_view merges, absl::string_view extra = "",
                                 const HfTokenizerOptions& options = {}) {
  return HfTokenizer::Parse(
      absl::StrReplaceAll(kMiniTemplate, {{"MERGES", merges}, {"EXTRA", extra}}), options);
}

// The ids below were produced by the reference implementation (Hugging Face tokenizers.js 0.2.0
// on the same tokenizer.json); 429 further strings, and GPT-2 / ignore_merges / Removed
// variants of this file, matched it exactly when this was written.
TEST(HfTokenizerTest, KnownIdsOfTheGeneratedTokenizer) {
  const HfTokenizer& tok = Tiny();
  EXPECT_EQ(tok.vocab_size(), 512u);
  EXPECT_EQ(tok.bos_id(), 504u);
  EXPECT_EQ(tok.eos_id(), 505u);
  EXPECT_TRUE(tok.add_bos_by_default());
  EXPECT_FALSE(tok.add_eos_by_default());
  EXPECT_EQ(tok.TokenToId("!"), 0u);  // the byte tokens come in GPT-2 order
  EXPECT_EQ(tok.TokenToId("A"), 32u);
  EXPECT_EQ(tok.TokenToId("Ġ"), 220u);  // ' '
  EXPECT_EQ(tok.TokenToId("Ċ"), 198u);  // '\n'
  EXPECT_EQ(tok.TokenToId("Ġthe"), 259u);
  EXPECT_EQ(tok.TokenToId("<|end_of_text|>"), 505u);
  EXPECT_FALSE(tok.TokenToId("nope").has_value());
  EXPECT_EQ(tok.TokenBytes(259), " the");
  EXPECT_THAT(Ids(tok, " the"), ElementsAre(259));
  EXPECT_THAT(Ids(tok, "the"), ElementsAre(390));
  EXPECT_THAT(Ids(tok, "Hello world"), ElementsAre(39, 68, 300, 78, 261, 294, 322));
  EXPECT_THAT(Ids(tok, "The lighthouse keeper"), ElementsAre(422, 486, 71, 267, 327, 482));
  EXPECT_THAT(Ids(tok, "héllo 你好"),
              ElementsAre(71, 127, 102, 300, 78, 220, 160, 121, 254, 161, 98, 121));
  EXPECT_THAT(Ids(tok, "👋🏽"), ElementsAre(172, 253, 239, 233, 172, 253, 237, 121));
  EXPECT_THAT(Ids(tok, "IT'S 2024..."),
              ElementsAre(40, 51, 6, 50, 220, 17, 15, 17, 19, 13, 13, 13));
  EXPECT_THAT(Ids(tok, "Hello", /*bos=*/true), ElementsAre(504, 39, 68, 300, 78));
  absl::StatusOr<std::vector<uint32_t>> framed = tok.Encode("", true, true);
  ASSERT_TRUE(framed.ok());
  EXPECT_THAT(*framed, ElementsAre(504, 505));
}

TEST(HfTokenizerTest, SpecialTokensAreMatchedInText) {
  const HfTokenizer& tok = Tiny();
  EXPECT_THAT(Ids(tok, "<|begin_of_text|>hi<|end_of_text|>"), ElementsAre(504, 71, 72, 505));
  // An incomplete special token is ordinary text.
  const std::vector<uint32_t> partial = Ids(tok, "<|end_of_text");
  EXPECT_GT(partial.size(), 1u);
  EXPECT_THAT(partial, ::testing::Not(::testing::Contains(505u)));
  EXPECT_THAT(Ids(tok, "x<|reserved_special_token_3|>"), ElementsAre(87, 509));
  EXPECT_TRUE(tok.IsSpecial(505));
  EXPECT_FALSE(tok.IsSpecial(259));
  // Its text, for grammars that name it (structured outputs), whatever decoding does.
  EXPECT_EQ(tok.SpecialTokenText(509), "<|reserved_special_token_3|>");
  EXPECT_EQ(tok.SpecialTokenText(259), "");
  EXPECT_EQ(tok.SpecialTokenText(1u << 30), "");
  // Special tokens decode to nothing unless asked.
  EXPECT_EQ(*tok.DecodeToken(Tokenizer::kNoToken, 505), "");
  absl::StatusOr<HfTokenizer> raw =
      HfTokenizer::Parse(*BuildTokenizerJson(512), {.skip_special_tokens = false});
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(*raw->DecodeToken(Tokenizer::kNoToken, 505), "<|end_of_text|>");
  const std::string text = "a<|begin_of_text|> b <|end_of_text|>";
  EXPECT_EQ(RoundTrip(*raw, text), text);
  EXPECT_EQ(tok.DecodeToken(0, 512).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfTokenizerTest, RoundTripsArbitraryText) {
  const HfTokenizer& tok = Tiny();
  const std::string texts[] = {
      "",
      " ",
      "The lighthouse stands at the end of a long stone pier.\n\nIt's 1923!",
      "naïve café résumé Ωμέγα Привет мир",
      "你好，世界！日本語のテキスト 한국어",
      "👋🏽 family 👨‍👩‍👧 flags 🇫🇷 ok",
      "tabs\tand\r\nnewlines\n\n\n   trailing   ",
      std::string("nul\0byte", 8),
      "invalid \xff\xfe utf8 \xc3 and \xe2\x82",
      "non\u00a0breaking\u3000ideographic",
  };
  for (const std::string& t : texts) {
    EXPECT_EQ(RoundTrip(tok, t), t);
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    std::string bytes(rng() % 40, '\0');
    for (char& c : bytes) {
      c = static_cast<char>(rng() & 0xff);
    }
    ASSERT_EQ(RoundTrip(tok, bytes), bytes) << i;
  }
}

TEST(HfTokenizerTest, DecodeStreamHoldsPartialCharacters) {
  const HfTokenizer& tok = Tiny();
  const std::string text = "👋🏽 héllo 你好";
  const std::vector<uint32_t> ids = Ids(tok, text);
  DecodeStream stream(&tok);
  std::string out;
  int empty_steps = 0;
  for (uint32_t id : ids) {
    absl::StatusOr<std::string> delta = stream.Step(id);
    ASSERT_TRUE(delta.ok()) << delta.status();
    EXPECT_EQ(tokenizer_internal::CompleteUtf8Prefix(*delta), delta->size());
    empty_steps += delta->empty() ? 1 : 0;
    out += *delta;
  }
  out += stream.Flush();
  EXPECT_EQ(out, text);
  EXPECT_GT(empty_steps, 0);  // byte tokens of the emoji were held back
}

TEST(HfTokenizerTest, Llama3RegexSplitsAsSpecified) {
  absl::StatusOr<RegexSplitter> split = RegexSplitter::Create(kLlama3SplitPattern);
  ASSERT_TRUE(split.ok()) << split.status();
  std::vector<absl::string_view> pieces;
  ASSERT_TRUE(
      split->Split("Hello world! It's 2024... I'm here\n\n  ok 12345 héllo 你好", &pieces).ok());
  // Derived by hand from the alternatives, tried left to right at each position:
  // contractions | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ' ?[^\s\p{L}\p{N}]+[\r\n]*' |
  // \s*[\r\n]+ | \s+(?!\S) | \s+.
  EXPECT_THAT(pieces,
              ElementsAre("Hello", " world", "!", " It", "'s", " ", "202", "4", "...", " I", "'m",
                          " here", "\n\n", " ", " ok", " ", "123", "45", " héllo", " 你好"));
  pieces.clear();
  ASSERT_TRUE(split->Split("IT'S DON'T end   ", &pieces).ok());
  EXPECT_THAT(pieces, ElementsAre("IT", "'S", " DON", "'T", " end", "   "));
  pieces.clear();
  ASSERT_TRUE(split->Split("a\r\nb abc123def hi 👋!\n", &pieces).ok());
  EXPECT_THAT(pieces, ElementsAre("a", "\r\n", "b", " abc", "123", "def", " hi", " 👋!\n"));
  // Invalid UTF-8 never matches; it is kept between the matches.
  pieces.clear();
  ASSERT_TRUE(split->Split("ab\xff\xfe cd", &pieces).ok());
  EXPECT_THAT(pieces, ElementsAre("ab", "\xff\xfe", " cd"));
}

TEST(HfTokenizerTest, Gpt2ByteLevelPreTokenizer) {
  absl::StatusOr<RegexSplitter> split = RegexSplitter::Create(kGpt2SplitPattern);
  ASSERT_TRUE(split.ok()) << split.status();
  std::vector<absl::string_view> pieces;
  ASSERT_TRUE(split->Split("Hello world  it's 42x", &pieces).ok());
  EXPECT_THAT(pieces, ElementsAre("Hello", " world", " ", " it", "'s", " 42", "x"));
  // ByteLevel with add_prefix_space prepends a space to each segment.
  absl::StatusOr<HfTokenizer> tok = Mini(R"(["a b"])");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::string json = absl::StrReplaceAll(
      kMiniTemplate, {{"\"add_prefix_space\": false", "\"add_prefix_space\": true"},
                      {"MERGES", "[]"},
                      {"EXTRA", ""}});
  absl::StatusOr<HfTokenizer> prefixed = HfTokenizer::Parse(json);
  ASSERT_TRUE(prefixed.ok()) << prefixed.status();
  absl::StatusOr<std::vector<std::string>> p = prefixed->PreTokenize("ab cab");
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(*p, ElementsAre(" ab", " cab"));
}

TEST(HfTokenizerTest, MergeFormsAndIgnoreMerges) {
  absl::StatusOr<HfTokenizer> strings = Mini(R"(["a b", "ab c"])");
  absl::StatusOr<HfTokenizer> lists = Mini(R"([["a", "b"], ["ab", "c"]])");
  ASSERT_TRUE(strings.ok()) << strings.status();
  ASSERT_TRUE(lists.ok()) << lists.status();
  EXPECT_EQ(strings->num_merges(), 2u);
  EXPECT_THAT(Ids(*strings, "abcab"), ElementsAre(5, 3));
  EXPECT_THAT(Ids(*lists, "abcab"), ElementsAre(5, 3));
  // Rank decides, not position: "b c" (rank 0) beats the earlier "a b" (rank 1).
  absl::StatusOr<HfTokenizer> ranked = Mini(R"(["b c", "a b"])");
  ASSERT_TRUE(ranked.ok()) << ranked.status();
  EXPECT_THAT(Ids(*ranked, "abc"), ElementsAre(0, 4));
  // ignore_merges: a pre-token that is a vocab entry is emitted whole.
  absl::StatusOr<HfTokenizer> whole = Mini(R"(["a b"])", R"(, "ignore_merges": true)");
  absl::StatusOr<HfTokenizer> merged = Mini(R"(["a b"])");
  ASSERT_TRUE(whole.ok() && merged.ok());
  EXPECT_THAT(Ids(*whole, "abc"), ElementsAre(5));
  EXPECT_THAT(Ids(*merged, "abc"), ElementsAre(3, 2));
  // Bytes without a byte token cannot be encoded.
  absl::StatusOr<std::vector<uint32_t>> z = merged->Encode("abz", false, false);
  EXPECT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(z.status().message(), HasSubstr("0x7a"));
}

TEST(HfTokenizerTest, BosEosResolution) {
  absl::StatusOr<HfTokenizer> mini = Mini("[]");
  ASSERT_TRUE(mini.ok()) << mini.status();
  EXPECT_EQ(mini->bos_id(), Tokenizer::kNoToken);  // no template, no conventional name
  EXPECT_EQ(mini->eos_id(), Tokenizer::kNoToken);
  EXPECT_EQ(mini->Encode("a", true, false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(mini->Encode("a", false, true).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<HfTokenizer> with = Mini("[]", "", {.bos_id = 0, .eos_id = 6});
  ASSERT_TRUE(with.ok()) << with.status();
  absl::StatusOr<std::vector<uint32_t>> ids = with->Encode("b", true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ElementsAre(0, 1, 6));
  EXPECT_EQ(Mini("[]", "", {.eos_id = 7}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfTokenizerTest, AddedTokenStripping) {
  const std::string json = absl::StrReplaceAll(
      kMiniTemplate,
      {{R"({"id": 6, "content": "<eos>", "special": true})",
        R"({"id": 6, "content": "<eos>", "special": true, "lstrip": true, "rstrip": true},
           {"id": 7, "content": "<eos>x", "special": false})"},
       {"MERGES", "[]"},
       {"EXTRA", ""}});
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::Parse(json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 8u);
  // Whitespace around <eos> is absorbed; the longer "<eos>x" wins where it matches.
  EXPECT_THAT(Ids(*tok, "a  <eos>  b"), ElementsAre(0, 6, 1));
  EXPECT_THAT(Ids(*tok, "a<eos>xb"), ElementsAre(0, 7, 1));
  EXPECT_EQ(*tok->DecodeToken(0, 7), "<eos>x");  // not special: decoded
}

TEST(HfTokenizerTest, UnsupportedComponentsAreUnimplemented) {
  const std::string base = absl::StrReplaceAll(kMiniTemplate, {{"MERGES", "[]"}, {"EXTRA", ""}});
  const std::pair<std::string, std::string> cases[] = {
      {R"("type": "BPE")", R"("type": "WordPiece")"},
      {R"("normalizer": null)", R"("normalizer": {"type": "NFKC"})"},
      {R"("type": "BPE")", R"("type": "BPE", "byte_fallback": true)"},
      {R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "Metaspace"})"},
      {R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})",
       R"("pre_tokenizer": {"type": "Whitespace"})"},
      {R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})",
       R"("pre_tokenizer": null)"},
      {R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})",
       R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split",
           "pattern": {"Regex": "a"}, "behavior": "Contiguous"}, {"type": "ByteLevel"}]})"},
      {R"("post_processor": null)", R"("post_processor": {"type": "BertProcessing"})"},
      {R"("special": true})", R"("special": true, "single_word": true})"},
  };
  for (const auto& [from, to] : cases) {
    const std::string json = absl::StrReplaceAll(base, {{from, to}});
    ASSERT_NE(json, base) << from;
    absl::StatusOr<HfTokenizer> tok = HfTokenizer::Parse(json, {}, "/m/tokenizer.json");
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented) << to << tok.status();
    EXPECT_THAT(tok.status().message(), HasSubstr("/m/tokenizer.json")) << to;
  }
  absl::StatusOr<HfTokenizer> wp = HfTokenizer::Parse(
      absl::StrReplaceAll(base, {{R"("type": "BPE")", R"("type": "WordPiece")"}}));
  EXPECT_THAT(wp.status().message(), HasSubstr("WordPiece"));
  absl::StatusOr<HfTokenizer> nfkc = HfTokenizer::Parse(
      absl::StrReplaceAll(base, {{R"("normalizer": null)", R"("normalizer": {"type": "NFKC"})"}}));
  EXPECT_THAT(nfkc.status().message(), HasSubstr("NFKC"));
}

// Qwen's normalizer: NFC of the text between added tokens, before pre-tokenization. (The e2e
// test real_templates_e2e_test checks Qwen3's real tokenizer against transformers.js.)
TEST(HfTokenizerTest, NfcNormalizerComposesBeforeEncoding) {
  absl::StatusOr<std::string> json = BuildTokenizerJson(512);
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_THAT(*json, HasSubstr(R"("normalizer": null)"));
  for (const char* normalizer :
       {R"({"type":"NFC"})", R"({"type":"Sequence","normalizers":[{"type":"NFC"}]})"}) {
    SCOPED_TRACE(normalizer);
    absl::StatusOr<HfTokenizer> nfc = HfTokenizer::Parse(
        absl::StrReplaceAll(*json, {{R"("normalizer": null)",
                                     absl::StrCat(R"("normalizer":)", normalizer)}}));
    ASSERT_TRUE(nfc.ok()) << nfc.status();
    const HfTokenizer& plain = Tiny();
    // e + U+0301 (combining acute) composes to U+00E9; so do Hangul jamo to a syllable.
    EXPECT_EQ(Ids(*nfc, "Cafe\xcc\x81 cre\xcc\x80me"), Ids(plain, "Caf\xc3\xa9 cr\xc3\xa8me"));
    EXPECT_EQ(Ids(*nfc, "\xe1\x84\x80\xe1\x85\xa1"), Ids(plain, "\xea\xb0\x80"));
    EXPECT_EQ(Ids(*nfc, "Once upon a time"), Ids(plain, "Once upon a time"));
    // Added tokens are matched in the raw text; each side is normalized on its own.
    EXPECT_EQ(Ids(*nfc, "e\xcc\x81<|end_of_text|>e\xcc\x81"),
              Ids(plain, "\xc3\xa9<|end_of_text|>\xc3\xa9"));
    // Bytes that are no UTF-8 stay as they are; the text around them is still composed.
    absl::StatusOr<std::string> back =
        nfc->Decode(Ids(*nfc, "a\xff e\xcc\x81\xc3 b\xcc\x81"));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, "a\xff \xc3\xa9\xc3 b\xcc\x81");  // "b" + U+0301 has no composed form
  }
}

TEST(HfTokenizerTest, MalformedFilesAreInvalidArgument) {
  absl::StatusOr<HfTokenizer> t = Mini(R"(["a q"])");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("merge #0"));
  EXPECT_THAT(t.status().message(), HasSubstr("\"q\" is not in the vocab"));
  t = Mini(R"(["a b", "b a"])");  // "ba" is not in the vocab
  EXPECT_THAT(t.status().message(), HasSubstr("merge #1"));
  t = Mini(R"(["a b c"])");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  t = Mini(R"([5])");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string base = absl::StrReplaceAll(kMiniTemplate, {{"MERGES", "[]"}, {"EXTRA", ""}});
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("abc": 5)", R"("abc": 4)"},  // duplicate id
           {R"("abc": 5)", R"("abc": -1)"},
           {R"("merges": [])", R"("merges": {})"},
       }) {
    const std::string json = absl::StrReplaceAll(base, {{from, to}});
    EXPECT_EQ(HfTokenizer::Parse(json).status().code(), absl::StatusCode::kInvalidArgument) << to;
  }
  const std::string bad_regex = absl::StrReplaceAll(
      base,
      {{R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})",
        R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split",
                 "pattern": {"Regex": "(a"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]})"}});
  t = HfTokenizer::Parse(bad_regex);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("does not compile"));
  EXPECT_EQ(HfTokenizer::Parse("{nope").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HfTokenizer::Parse("{}").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfTokenizerTest, LoadsFromFile) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(HfTokenizer::Load(dir->File("tokenizer.json")).status().code(),
            absl::StatusCode::kNotFound);
  {
    std::ofstream out(dir->File("tokenizer.json"));
    out << *BuildTokenizerJson(300);
  }
  absl::StatusOr<HfTokenizer> tok = HfTokenizer::Load(dir->File("tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 300u);
  EXPECT_EQ(tok->bos_id(), 296u);  // 4 special tokens at the end
  EXPECT_EQ(RoundTrip(*tok, "Hello, world"), "Hello, world");
}

TEST(ByteLevelTest, Gpt2Tables) {
  const auto& to = ByteToUnicode();
  EXPECT_EQ(to[' '], 0x120u);
  EXPECT_EQ(to['\n'], 0x10Au);
  EXPECT_EQ(to['!'], static_cast<uint32_t>('!'));
  EXPECT_EQ(to[0xAD], 0x143u);  // soft hyphen is the last non-printable byte
  EXPECT_EQ(ByteOrder()[0], '!');
  EXPECT_EQ(ByteOrder()[188], 0);
  EXPECT_EQ(ByteOrder()[255], 0xAD);
  std::string all;
  for (int b = 0; b < 256; ++b) {
    all.push_back(static_cast<char>(b));
  }
  const std::string encoded = ByteLevelEncode(all);
  EXPECT_EQ(ByteLevelDecode(encoded), all);
  EXPECT_EQ(ByteLevelEncode(" the"), "Ġthe");
  EXPECT_FALSE(ByteLevelDecode("a€").has_value());        // U+20AC is no byte's image
  EXPECT_FALSE(ByteLevelDecode("\xc0\x80").has_value());  // overlong
}

}  // namespace
}  // namespace pd::engine
