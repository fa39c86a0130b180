#include "engine/model/llama2c_tokenizer.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTokenizerPath[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";
constexpr uint32_t kVocab = 512;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class Llama2cTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Load(kTokenizerPath, kVocab);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = new Llama2cTokenizer(std::move(*tok));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }

  std::vector<uint32_t> Encode(absl::string_view text, bool bos = true, bool eos = false) {
    absl::StatusOr<std::vector<uint32_t>> ids = tok_->Encode(text, bos, eos);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.value_or(std::vector<uint32_t>{});
  }

  static Llama2cTokenizer* tok_;
};

Llama2cTokenizer* Llama2cTokenizerTest::tok_ = nullptr;

// run.c's encode() transcribed literally (O(n^2) merge loop), as an oracle for Encode().
std::vector<uint32_t> RunCEncode(const Llama2cTokenizer& tok, absl::string_view text) {
  absl::flat_hash_map<std::string, int> lookup;
  for (uint32_t id = 0; id < tok.vocab_size(); ++id) {
    lookup.try_emplace(tok.piece(id), id);
  }
  auto find = [&](const std::string& s) {
    auto it = lookup.find(s);
    return it == lookup.end() ? -1 : it->second;
  };
  std::vector<int> tokens = {1};
  if (!text.empty()) {
    tokens.push_back(find(" "));
  }
  std::string buf;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      buf.clear();
    }
    buf += text[i];
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 &&
        buf.size() < 4) {
      continue;
    }
    const int id = find(buf);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (char c : buf) {
        tokens.push_back(static_cast<unsigned char>(c) + 3);
      }
    }
    buf.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1;
    int best_idx = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int id = find(tok.piece(tokens[i]) + tok.piece(tokens[i + 1]));
      if (id != -1 && tok.score(id) > best_score) {
        best_score = tok.score(id);
        best_id = id;
        best_idx = static_cast<int>(i);
      }
    }
    if (best_idx == -1) {
      break;
    }
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  return std::vector<uint32_t>(tokens.begin(), tokens.end());
}

TEST_F(Llama2cTokenizerTest, LoadsVocabulary) {
  EXPECT_EQ(tok_->vocab_size(), 512u);
  EXPECT_EQ(tok_->bos_id(), 1u);
  EXPECT_EQ(tok_->eos_id(), 2u);
  EXPECT_EQ(tok_->max_token_length(), 7);
  EXPECT_EQ(tok_->piece(0), "<unk>");
  EXPECT_EQ(tok_->piece(1), "\n<s>\n");
  EXPECT_EQ(tok_->piece(3), "<0x00>");
  EXPECT_EQ(tok_->piece(259), " t");
  EXPECT_EQ(tok_->piece(265), " the");
  EXPECT_EQ(tok_->piece(410), " ");
}

TEST_F(Llama2cTokenizerTest, EncodesReadmeExample) {
  EXPECT_THAT(Encode("Once upon a time"), ElementsAre(1, 403, 407, 261, 378));
  EXPECT_THAT(Encode("Once upon a time", /*bos=*/false, /*eos=*/true),
              ElementsAre(403, 407, 261, 378, 2));
}

TEST_F(Llama2cTokenizerTest, EmptyText) {
  EXPECT_THAT(Encode(""), ElementsAre(1));
  EXPECT_THAT(Encode("", false, false), ElementsAre());
  EXPECT_THAT(Encode("", true, true), ElementsAre(1, 2));
}

TEST_F(Llama2cTokenizerTest, ByteFallbackRoundTrips) {
  // "ü" (C3 BC) and "😀" (F0 9F 98 80) have no pieces; "é" (id 485) has one.
  EXPECT_THAT(Encode("ü"), ElementsAre(1, 410, 0xC3 + 3, 0xBC + 3));
  EXPECT_THAT(Encode("\xF0\x9F\x98\x80", false, false),
              ElementsAre(410, 0xF0 + 3, 0x9F + 3, 0x98 + 3, 0x80 + 3));
  EXPECT_THAT(Encode("é", false, false), ElementsAre(410, 485));
  for (absl::string_view text : {"ü", "\xF0\x9F\x98\x80", "Tim saw a ü and a \xF0\x9F\x98\x80."}) {
    absl::StatusOr<std::string> decoded = tok_->Decode(Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST_F(Llama2cTokenizerTest, DecodeDropsSpaceAfterBosOnly) {
  EXPECT_EQ(*tok_->DecodeToken(1, 403), "Once");
  EXPECT_EQ(*tok_->DecodeToken(Tokenizer::kNoToken, 403), " Once");
  EXPECT_EQ(*tok_->DecodeToken(403, 407), " upon");
  EXPECT_EQ(*tok_->DecodeToken(1, 410), "");
  EXPECT_EQ(*tok_->DecodeToken(400, 0x0A + 3), "\n");    // <0x0A> is a raw newline
  EXPECT_EQ(*tok_->DecodeToken(400, 0x01 + 3), "\x01");  // raw, unlike run.c's display rule
  EXPECT_EQ(*tok_->DecodeToken(400, 1), "");             // control tokens decode to nothing
  EXPECT_EQ(*tok_->DecodeToken(400, 2), "");
}

TEST_F(Llama2cTokenizerTest, AsciiRoundTrip) {
  for (absl::string_view text : {
           "Once upon a time, there was a little girl named Lily.",
           "She loved to play outside in the park. One day, she saw a big, red ball!",
           "\"Can I play?\" asked Tom.\nMom said: \"Yes, 3 times.\"",
           "  two leading spaces and a tab\there",
           "x",
           "Zebra QUIZ 1234567890 ~`|[]{}<>#@^_=+",
       }) {
    const std::vector<uint32_t> ids = Encode(text);
    absl::StatusOr<std::string> decoded = tok_->Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
    // Without BOS the dummy-prefix space stays.
    absl::StatusOr<std::string> raw = tok_->Decode(Encode(text, false, false));
    ASSERT_TRUE(raw.ok()) << raw.status();
    EXPECT_EQ(*raw, absl::StrCat(" ", text));
  }
}

TEST_F(Llama2cTokenizerTest, MatchesRunCOracleOnRandomText) {
  std::mt19937 rng(20240501);
  const std::vector<std::string> alphabet = {"a",
                                             "e",
                                             "t",
                                             "o",
                                             "n",
                                             " ",
                                             " ",
                                             " ",
                                             "h",
                                             "s",
                                             "d",
                                             "l",
                                             "y",
                                             "O",
                                             "T",
                                             ".",
                                             ",",
                                             "!",
                                             "\"",
                                             "'",
                                             "\n",
                                             "é",
                                             "ü",
                                             "\xE2\x80\x9C",
                                             "\xF0\x9F\x98\x80",
                                             "\x80",
                                             "\xFF",
                                             "7",
                                             "?"};
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> length(0, 40);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    for (int n = length(rng); n > 0; --n) {
      text += alphabet[pick(rng)];
    }
    EXPECT_EQ(Encode(text), RunCEncode(*tok_, text)) << "text: " << text;
  }
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
  EXPECT_EQ(Encode(story), RunCEncode(*tok_, story));
}

TEST_F(Llama2cTokenizerTest, TextCannotProduceControlOrByteTokens) {
  const std::vector<uint32_t> ids = Encode("\n<s>\n<0x41></s><unk>", false, false);
  for (uint32_t id : ids) {
    EXPECT_GE(id, 3u);
  }
  EXPECT_THAT(ids, Not(Contains(0x41 + 3)));
  EXPECT_EQ(*tok_->Decode(ids, /*prev=*/1), "\n<s>\n<0x41></s><unk>");
}

TEST_F(Llama2cTokenizerTest, StreamHoldsPartialEmoji) {
  DecodeStream stream(tok_, /*prev=*/1);
  EXPECT_EQ(*stream.Step(403), "Once");  // " Once" after BOS
  const uint32_t emoji[] = {0xF0 + 3, 0x9F + 3, 0x98 + 3, 0x80 + 3};
  EXPECT_EQ(*stream.Step(emoji[0]), "");
  EXPECT_EQ(*stream.Step(emoji[1]), "");
  EXPECT_EQ(*stream.Step(emoji[2]), "");
  EXPECT_EQ(*stream.Step(emoji[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.Flush(), "");
}

TEST_F(Llama2cTokenizerTest, OutOfRangeIdIsInvalidArgument) {
  absl::StatusOr<std::string> piece = tok_->DecodeToken(1, 512);
  EXPECT_EQ(piece.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(piece.status().message(), HasSubstr("token id 512 out of range [0, 512)"));
  absl::StatusOr<std::string> text = tok_->Decode(std::vector<uint32_t>{1, 403, 600});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("position 2: token id 600"));
}

TEST(Llama2cTokenizerFileTest, TruncatedFileIsInvalidArgument) {
  const std::string bytes = ReadFile(kTokenizerPath);
  ASSERT_EQ(bytes.size(), 6227u);
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string path = dir->File("tok.bin");
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Load(path, kVocab);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tok.status().message(), HasSubstr(path));
  EXPECT_THAT(tok.status().message(), HasSubstr("truncated at id 511"));
  EXPECT_THAT(tok.status().message(), HasSubstr("the 6224-byte file"));

  // Cut inside an entry's score/length pair.
  absl::StatusOr<Llama2cTokenizer> cut = Llama2cTokenizer::Parse(bytes.substr(0, 10), kVocab, "x");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cut.status().message(), HasSubstr("truncated at id 0 of 512"));
  EXPECT_THAT(cut.status().message(), HasSubstr("offset 4"));
}

TEST(Llama2cTokenizerFileTest, WrongVocabSizeIsInvalidArgument) {
  const std::string bytes = ReadFile(kTokenizerPath);
  absl::StatusOr<Llama2cTokenizer> small = Llama2cTokenizer::Parse(bytes, 500, "tok512");
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("trailing bytes after the last of 500"));
  absl::StatusOr<Llama2cTokenizer> big = Llama2cTokenizer::Parse(bytes, 600, "tok512");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("truncated at id 512 of 600"));
  absl::StatusOr<Llama2cTokenizer> tiny = Llama2cTokenizer::Parse(bytes, 2, "tok512");
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
}

// Found by tests/fuzz/llama2c_tokenizer_fuzzer: a vocab_size far beyond what the file holds
// reserved vocab_size entries up front (128 GiB here: std::bad_alloc, i.e. a crash).
TEST(Llama2cTokenizerFileTest, HugeVocabSizeIsTruncatedNotAnAllocation) {
  const std::string bytes = ReadFile(kTokenizerPath);
  absl::StatusOr<Llama2cTokenizer> huge = Llama2cTokenizer::Parse(bytes, 0xFFFFFFFFu, "tok512");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), HasSubstr("truncated at id 512 of 4294967295"));
}

TEST(Llama2cTokenizerFileTest, NegativeLengthIsInvalidArgument) {
  std::string bytes = ReadFile(kTokenizerPath);
  const int32_t negative = -5;
  std::memcpy(bytes.data() + 4 + 4, &negative, sizeof(negative));  // id 0's length
  absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Parse(bytes, kVocab, "tok512");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tok.status().message(), HasSubstr("id 0 has negative length -5 at offset 8"));
}

// Found by tests/fuzz/llama2c_tokenizer_fuzzer: a control id spelled like a byte-fallback piece
// ("<0x02>" at BOS) made byte 0x02 encode as BOS, which decodes to "".
TEST(Llama2cTokenizerFileTest, ControlIdsAreNeverByteFallback) {
  std::string bytes(4, '\0');  // max_token_length 0
  for (const std::string piece : {"<unk>", "<0x02>", "</s>", " ", "a", "<0x02>"}) {
    const float score = 0;
    const int32_t len = static_cast<int32_t>(piece.size());
    bytes.append(reinterpret_cast<const char*>(&score), sizeof(score));
    bytes.append(reinterpret_cast<const char*>(&len), sizeof(len));
    bytes += piece;
  }
  absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Parse(bytes, 6, "six");
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::vector<uint32_t>> ids = tok->Encode("a\x02", /*add_bos=*/false, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(3, 4, 5));
  absl::StatusOr<std::string> text = tok->Decode(*ids, Llama2cTokenizer::kBosId);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "a\x02");
}

TEST(Llama2cTokenizerFileTest, MissingFileIsNotFound) {
  absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Load("/nonexistent/tok.bin", kVocab);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::engine
