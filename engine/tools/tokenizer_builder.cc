#include "engine/tools/tokenizer_builder.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/model/pre_tokenizer.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr char kBosToken[] = "<|begin_of_text|>";
constexpr char kEosToken[] = "<|end_of_text|>";

// Written for pdserve and dedicated to the public domain.
constexpr char kCorpus[] = R"(The Lighthouse Keeper's Notebook

The lighthouse stands at the end of a long stone pier, and every evening the keeper climbs one
hundred and twelve steps to light the lamp. She writes the weather in a small notebook: wind from
the west, rain at four o'clock, the sea calm by nightfall. On clear nights she counts the ships
that pass, and on foggy nights she sounds the horn every thirty seconds until morning.

In the spring of 1923 a storm broke the great window at the top of the tower. The keeper wrote
that the wind was stronger than anything she had seen in twenty years. She kept the lamp burning
with a spare lens and a blanket nailed across the opening, and not one ship was lost that night.
When the supply boat came, she asked for glass, nails, paint, coffee, and three new pencils.

Rivers and Roads

A river does not hurry, but it is never late. It carries sand from the mountains to the sea, a
little every day, and over many thousands of years it cuts a valley deep enough to hide a town.
People built roads beside the rivers because the ground was flat and the water was close. Later
they built bridges, and the bridges became markets, and the markets became cities.

If you walk along an old road you can still read its history: a milestone that says 14 miles, a
stone trough where horses drank, an inn with a painted sign, a church that was rebuilt twice. Each
of these things was made by someone who expected other people to come after them.

The Garden in Winter

In winter the garden looks empty, but it is only resting. The seeds are asleep under the soil,
the roots of the apple tree are still growing slowly, and the birds come every morning to look for
crumbs. A good gardener uses these months to plan: which beds will hold potatoes, where the beans
will climb, how many rows of carrots, onions, and lettuce there should be.

When the days grow longer, the first green shoots appear. Snowdrops come first, then crocuses, then
the yellow daffodils along the fence. By May the garden is loud with bees, and by August there is
more food than one family can eat, so the neighbours receive baskets of tomatoes and plums.

Numbers and Letters

Counting is older than writing. Shepherds cut notches in sticks to count their sheep: 1, 2, 3, 4,
5, and so on, until the stick was full. Merchants needed to record what was owed, so they made
marks on clay tablets. Over time the marks became symbols, the symbols became letters, and the
letters became words. Today we write numbers like 3.14159, 2048, and 1,000,000 without thinking
about how strange and wonderful it is that a few shapes on a page can hold so much meaning.

A Letter to a Friend

Dear Thomas, thank you for your letter, which arrived on Tuesday. We are all well here. The
weather has been cold but bright, and the children have been skating on the pond every afternoon.
I have finished reading the book you sent; I liked the chapters about the sea best of all. Please
write again soon and tell me whether you will visit us in the summer. With warm wishes, Anna.

Questions

What makes a good question? It should be short enough to remember and open enough to explore.
Why is the sky blue? How do birds find their way home? Where does the wind begin? Who was the first
person to taste honey? Children ask these questions all the time, and the best answers usually
begin with the words: let's find out together.
)";

struct Word {
  std::vector<uint32_t> symbols;
  uint64_t count = 0;
};

// Byte strings of the regular tokens and the merges (as pairs of ids) learned from the corpus,
// until `num_tokens` regular tokens exist or no pair is left.
struct Trained {
  std::vector<std::string> tokens;                    // id -> bytes
  std::vector<std::pair<uint32_t, uint32_t>> merges;  // rank -> (left, right)
};

// The corpus pre-tokenized with the Llama 3 pattern: distinct pieces (sorted, so the order is
// deterministic) as byte-token ids, with their counts.
std::vector<Word> CorpusWords(const uint32_t (&id_of_byte)[256]) {
  absl::StatusOr<RegexSplitter> splitter = RegexSplitter::Create(kLlama3SplitPattern);
  CHECK(splitter.ok()) << splitter.status();
  std::vector<absl::string_view> pieces;
  const absl::Status split = splitter->Split(kCorpus, &pieces);
  CHECK(split.ok()) << split;
  absl::btree_map<std::string, uint64_t> counts;
  for (absl::string_view p : pieces) {
    ++counts[std::string(p)];
  }
  std::vector<Word> words;
  for (const auto& [bytes, count] : counts) {
    Word w;
    w.count = count;
    for (char c : bytes) {
      w.symbols.push_back(id_of_byte[static_cast<unsigned char>(c)]);
    }
    words.push_back(std::move(w));
  }
  return words;
}

// Replaces every occurrence of (left, right) in `w`, left to right, by `merged`.
void MergeInWord(uint32_t left, uint32_t right, uint32_t merged, Word* w) {
  std::vector<uint32_t>& s = w->symbols;
  size_t out = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
      s[out++] = merged;
      ++i;
    } else {
      s[out++] = s[i];
    }
  }
  s.resize(out);
}

Trained Train(uint32_t num_tokens) {
  Trained t;
  const auto& order = ByteOrder();
  uint32_t id_of_byte[256];
  for (uint32_t i = 0; i < 256; ++i) {
    t.tokens.emplace_back(1, static_cast<char>(order[i]));
    id_of_byte[order[i]] = i;
  }
  std::vector<Word> words = CorpusWords(id_of_byte);
  absl::flat_hash_map<std::string, uint32_t> id_of_token;
  for (uint32_t i = 0; i < t.tokens.size(); ++i) {
    id_of_token[t.tokens[i]] = i;
  }
  absl::flat_hash_map<uint64_t, uint64_t> pair_counts;
  while (t.tokens.size() < num_tokens) {
    pair_counts.clear();
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
        pair_counts[(static_cast<uint64_t>(w.symbols[i]) << 32) | w.symbols[i + 1]] += w.count;
      }
    }
    if (pair_counts.empty()) {
      break;
    }
    // Most frequent pair; ties broken by the byte strings, so hash order does not matter.
    uint64_t best = 0, best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      const auto bytes = [&](uint64_t k) {
        return std::pair<const std::string&, const std::string&>(t.tokens[k >> 32],
                                                                 t.tokens[k & 0xffffffffu]);
      };
      if (count > best_count || (count == best_count && bytes(key) < bytes(best))) {
        best = key;
        best_count = count;
      }
    }
    const uint32_t left = static_cast<uint32_t>(best >> 32);
    const uint32_t right = static_cast<uint32_t>(best & 0xffffffffu);
    const std::string merged = t.tokens[left] + t.tokens[right];
    auto [it, inserted] = id_of_token.emplace(merged, static_cast<uint32_t>(t.tokens.size()));
    if (inserted) {
      t.tokens.push_back(merged);
    }
    t.merges.emplace_back(left, right);
    for (Word& w : words) {
      MergeInWord(left, right, it->second, &w);
    }
  }
  return t;
}

// Llama 3's pre-tokenizer: Split on its regex, then ByteLevel without a regex.
OrderedJson PreTokenizerJson() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", kLlama3SplitPattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

// "<|begin_of_text|> $A" (and "<|begin_of_text|> $A <|begin_of_text|> $B" for pairs).
OrderedJson PostProcessorJson(uint32_t bos_id) {
  const OrderedJson bos_item = {{"SpecialToken", {{"id", kBosToken}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {bos_item,
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            {{"SpecialToken", {{"id", kBosToken}, {"type_id", 1}}}},
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens",
           {{kBosToken, {{"id", kBosToken}, {"ids", {bos_id}}, {"tokens", {kBosToken}}}}}}};
}

}  // namespace

absl::StatusOr<TokenizerLayout> ComputeTokenizerLayout(uint32_t vocab_size) {
  if (vocab_size < kMinTokenizerVocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size ", vocab_size, " is too small: need at least ", kMinTokenizerVocab));
  }
  TokenizerLayout l;
  l.vocab_size = vocab_size;
  l.num_special = std::clamp<uint32_t>(vocab_size / 64, 2, 256);
  l.first_special = vocab_size - l.num_special;
  l.bos_id = l.first_special;
  l.eos_id = l.first_special + 1;
  return l;
}

absl::string_view TrainingCorpus() { return kCorpus; }

absl::StatusOr<std::string> BuildTokenizerJson(uint32_t vocab_size) {
  PD_ASSIGN_OR_RETURN(TokenizerLayout layout, ComputeTokenizerLayout(vocab_size));
  const Trained trained = Train(layout.first_special);
  OrderedJson vocab = OrderedJson::object();
  for (uint32_t id = 0; id < trained.tokens.size(); ++id) {
    vocab[ByteLevelEncode(trained.tokens[id])] = id;
  }
  OrderedJson merges = OrderedJson::array();
  for (const auto& [left, right] : trained.merges) {
    merges.push_back(
        {ByteLevelEncode(trained.tokens[left]), ByteLevelEncode(trained.tokens[right])});
  }
  OrderedJson added = OrderedJson::array();
  uint32_t reserved = 0;
  for (uint32_t id = static_cast<uint32_t>(trained.tokens.size()); id < vocab_size; ++id) {
    const std::string content = id == layout.bos_id ? kBosToken
                                : id == layout.eos_id
                                    ? kEosToken
                                    : absl::StrCat("<|reserved_special_token_", reserved++, "|>");
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  OrderedJson j = OrderedJson::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = PreTokenizerJson();
  j["post_processor"] = PostProcessorJson(layout.bos_id);
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  return j.dump(1) + "\n";
}

}  // namespace pd::engine
