#include "engine/model/hf_tokenizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/model/mapped_file.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

using Json = nlohmann::json;

std::string Short(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) {
    s = absl::StrCat(s.substr(0, 77), "...");
  }
  return s;
}

// The "type" string of a component object, or "" when absent.
std::string TypeOf(const Json& v) {
  auto it = v.find("type");
  return it != v.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// One symbol of a pre-token during BPE: a doubly linked list over the initial byte positions.
struct BpeSymbol {
  uint32_t id;
  int32_t prev;  // -1 at the start
  int32_t next;  // -1 at the end
};

// Applies merges to `symbols` (symbol 0 first) in Hugging Face's order: lowest rank first,
// leftmost on ties, re-examining the neighbours of every merged pair. `lookup(left, right)`
// returns the (rank, merged id) of a pair, or nullopt. O(n log n) in the piece length.
template <typename Lookup>
void ApplyMerges(const Lookup& lookup, std::vector<BpeSymbol>* symbols_ptr) {
  std::vector<BpeSymbol>& symbols = *symbols_ptr;
  struct Candidate {
    uint32_t rank;
    int32_t left;
    uint32_t left_id;
    uint32_t right_id;
    uint32_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) {
      return;
    }
    if (auto merge = lookup(symbols[left].id, symbols[right].id)) {
      queue.push(Candidate{merge->first, left, symbols[left].id, symbols[right].id, merge->second});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
    consider(i);
  }
  constexpr uint32_t kMerged = std::numeric_limits<uint32_t>::max();  // id of a dead symbol
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    BpeSymbol& left = symbols[c.left];
    // Stale when either side was merged into something else since the candidate was queued.
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) {
      continue;
    }
    const int32_t right = left.next;
    left.id = c.merged_id;
    left.next = symbols[right].next;
    if (left.next >= 0) {
      symbols[left.next].prev = c.left;
    }
    symbols[right].id = kMerged;
    if (left.prev >= 0) {
      consider(left.prev);
    }
    consider(c.left);
  }
}

}  // namespace

// Builds an HfTokenizer from parsed JSON. Every method returns the first error found.
class HfTokenizerParser {
 public:
  HfTokenizerParser(const HfTokenizerOptions& options, absl::string_view source)
      : options_(options), source_(source) {}

  absl::StatusOr<HfTokenizer> Run(const Json& j) {
    t_.skip_special_tokens_ = options_.skip_special_tokens;
    t_.byte_id_.fill(-1);
    PD_RETURN_IF_ERROR(ParseNormalizer(j));
    PD_RETURN_IF_ERROR(ParseModel(j));
    PD_RETURN_IF_ERROR(ParseAddedTokens(j));
    PD_RETURN_IF_ERROR(ParsePreTokenizer(j));
    PD_RETURN_IF_ERROR(ParseDecoder(j));
    PD_RETURN_IF_ERROR(ParsePostProcessor(j));
    PD_RETURN_IF_ERROR(ResolveSpecialIds());
    return std::move(t_);
  }

 private:
  absl::Status Invalid(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", why));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(absl::StrCat(source_, ": ", what, " is not supported"));
  }

  // Null, absent, or a component object; `out` is null for the first two.
  absl::Status Component(const Json& j, const char* key, const Json** out) const {
    auto it = j.find(key);
    *out = nullptr;
    if (it == j.end() || it->is_null()) {
      return absl::OkStatus();
    }
    if (!it->is_object()) {
      return Invalid(absl::StrCat("\"", key, "\" must be an object or null, got ", Short(*it)));
    }
    *out = &*it;
    return absl::OkStatus();
  }

  absl::Status ParseNormalizer(const Json& j) {
    const Json* n = nullptr;
    PD_RETURN_IF_ERROR(Component(j, "normalizer", &n));
    if (n == nullptr) {
      return absl::OkStatus();
    }
    // NFC (Qwen2/3), or a Sequence of NFCs (possibly empty).
    std::vector<const Json*> steps = {n};
    auto list = n->find("normalizers");
    if (TypeOf(*n) == "Sequence" && list != n->end() && list->is_array()) {
      steps.clear();
      for (const Json& step : *list) steps.push_back(&step);
    }
    for (const Json* step : steps) {
      if (!step->is_object() || TypeOf(*step) != "NFC") {
        return Unsupported(absl::StrCat("normalizer \"", step->is_object() ? TypeOf(*step) : "",
                                        "\""));
      }
      t_.nfc_ = true;
    }
    return absl::OkStatus();
  }

  absl::Status SetEntry(uint32_t id, std::string bytes, HfTokenizer::Kind kind) {
    if (id >= t_.entries_.size()) {
      t_.entries_.resize(static_cast<size_t>(id) + 1);
    }
    t_.entries_[id] = HfTokenizer::Entry{std::move(bytes), kind};
    return absl::OkStatus();
  }

  // Ids index a dense table, so they are capped: a hostile file must not make us allocate
  // gigabytes (real vocabularies are below 300k).
  static constexpr int64_t kMaxTokenId = int64_t{1} << 22;

  absl::StatusOr<uint32_t> Id(const Json& v, absl::string_view what) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxTokenId) {
      return Invalid(absl::StrCat(what, " has id ", Short(v), ", must be an integer in [0, ",
                                  kMaxTokenId, ")"));
    }
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  absl::Status ParseModel(const Json& j) {
    const Json* m = nullptr;
    PD_RETURN_IF_ERROR(Component(j, "model", &m));
    if (m == nullptr) {
      return Invalid("\"model\" is missing");
    }
    const std::string type = TypeOf(*m);
    if (type != "BPE" && !(type.empty() && m->contains("merges"))) {
      return Unsupported(absl::StrCat("model type \"", type, "\""));
    }
    auto flag = [&](const char* key) {
      auto it = m->find(key);
      return it != m->end() && it->is_boolean() && it->get<bool>();
    };
    if (flag("byte_fallback")) {
      return Unsupported("BPE byte_fallback (SentencePiece-style vocabulary)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = m->find(key);
      if (it != m->end() && !it->is_null() &&
          !(it->is_string() && it->get<std::string>().empty())) {
        return Unsupported(absl::StrCat("BPE ", key, " ", Short(*it)));
      }
    }
    auto dropout = m->find("dropout");
    if (dropout != m->end() && !dropout->is_null() &&
        !(dropout->is_number() && dropout->get<double>() == 0.0)) {
      return Unsupported(absl::StrCat("BPE dropout ", Short(*dropout)));
    }
    t_.ignore_merges_ = flag("ignore_merges");
    auto vocab = m->find("vocab");
    if (vocab == m->end() || !vocab->is_object()) {
      return Invalid("model.vocab is missing or not an object");
    }
    std::vector<bool> seen;
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
      PD_ASSIGN_OR_RETURN(uint32_t id, Id(it.value(), absl::StrCat("vocab token ", it.key())));
      if (id < seen.size() && seen[id]) {
        return Invalid(absl::StrCat("vocab id ", id, " is used twice (token ", it.key(), ")"));
      }
      if (id >= seen.size()) {
        seen.resize(static_cast<size_t>(id) + 1);
      }
      seen[id] = true;
      // HF's ByteLevel decoder falls back to the token's UTF-8 when a char is not a byte image.
      std::optional<std::string> bytes = ByteLevelDecode(it.key());
      std::string raw = bytes.has_value() ? std::move(*bytes) : it.key();
      t_.bytes_to_id_.emplace(raw, id);  // first (lowest id in file order) wins
      t_.token_to_id_.emplace(it.key(), id);
      PD_RETURN_IF_ERROR(SetEntry(id, std::move(raw), HfTokenizer::Kind::kRegular));
    }
    for (int b = 0; b < 256; ++b) {
      auto it = t_.token_to_id_.find(ByteLevelEncode(std::string(1, static_cast<char>(b))));
      t_.byte_id_[b] = it == t_.token_to_id_.end() ? -1 : static_cast<int64_t>(it->second);
    }
    return ParseMerges(*m);
  }

  absl::Status ParseMerges(const Json& m) {
    auto merges = m.find("merges");
    if (merges == m.end() || !merges->is_array()) {
      return Invalid("model.merges is missing or not a list");
    }
    t_.merges_.reserve(merges->size());
    uint32_t rank = 0;
    for (const Json& e : *merges) {
      std::string left, right;
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Invalid(absl::StrCat("merge #", rank, " ", Short(e),
                                      " is not two tokens separated by one space"));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        left = e[0].get<std::string>();
        right = e[1].get<std::string>();
      } else {
        return Invalid(
            absl::StrCat("merge #", rank, " ", Short(e), " is neither \"a b\" nor [\"a\", \"b\"]"));
      }
      uint32_t ids[3];
      const std::string parts[3] = {left, right, left + right};
      for (int k = 0; k < 3; ++k) {
        auto it = t_.token_to_id_.find(parts[k]);
        if (it == t_.token_to_id_.end()) {
          return Invalid(absl::StrCat("merge #", rank, " ", Short(e), ": token ",
                                      Short(Json(parts[k])), " is not in the vocab"));
        }
        ids[k] = it->second;
      }
      t_.merges_.emplace(HfTokenizer::PairKey(ids[0], ids[1]), HfTokenizer::Merge{rank, ids[2]});
      ++rank;
    }
    return absl::OkStatus();
  }

  absl::Status ParseAddedTokens(const Json& j) {
    auto added = j.find("added_tokens");
    if (added == j.end() || added->is_null()) {
      return absl::OkStatus();
    }
    if (!added->is_array()) {
      return Invalid("\"added_tokens\" must be a list");
    }
    for (const Json& a : *added) {
      auto content = a.find("content");
      auto id_it = a.find("id");
      if (!a.is_object() || content == a.end() || !content->is_string() || id_it == a.end()) {
        return Invalid(absl::StrCat("added token ", Short(a), " needs \"id\" and \"content\""));
      }
      const std::string& text = content->get_ref<const std::string&>();
      PD_ASSIGN_OR_RETURN(uint32_t id, Id(*id_it, absl::StrCat("added token ", text)));
      auto flag = [&](const char* key) {
        auto it = a.find(key);
        return it != a.end() && it->is_boolean() && it->get<bool>();
      };
      if (flag("single_word")) {
        return Unsupported(absl::StrCat("single_word on added token \"", text, "\""));
      }
      if (text.empty()) {
        return Invalid(absl::StrCat("added token ", id, " has empty content"));
      }
      const bool special = flag("special");
      PD_RETURN_IF_ERROR(
          SetEntry(id, text, special ? HfTokenizer::Kind::kSpecial : HfTokenizer::Kind::kAdded));
      t_.token_to_id_[text] = id;
      t_.added_.push_back(HfTokenizer::AddedToken{text, id, flag("lstrip"), flag("rstrip")});
    }
    for (uint32_t i = 0; i < t_.added_.size(); ++i) {
      const std::string& content = t_.added_[i].content;
      if (t_.added_index_.emplace(content, i).second) {
        t_.added_lengths_by_first_byte_[static_cast<unsigned char>(content[0])].push_back(
            static_cast<uint32_t>(content.size()));
      }
    }
    for (auto& lengths : t_.added_lengths_by_first_byte_) {
      std::sort(lengths.begin(), lengths.end(), std::greater<uint32_t>());
      lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    }
    return absl::OkStatus();
  }

  // One pre-tokenizer object (not a Sequence). Sets *byte_level when it is ByteLevel.
  absl::Status ParsePreStep(const Json& p, bool* byte_level) {
    const std::string type = TypeOf(p);
    auto flag = [&](const char* key, bool fallback) {
      auto it = p.find(key);
      return it != p.end() && it->is_boolean() ? it->get<bool>() : fallback;
    };
    HfTokenizer::PreStep step;
    if (type == "ByteLevel") {
      *byte_level = true;
      step.add_prefix_space = flag("add_prefix_space", true);
      if (flag("use_regex", true)) {
        PD_ASSIGN_OR_RETURN(step.splitter, RegexSplitter::Create(kGpt2SplitPattern));
      }
    } else if (type == "Split") {
      if (flag("invert", false)) {
        return Unsupported("Split pre-tokenizer with invert=true");
      }
      auto behavior = p.find("behavior");
      const std::string b =
          behavior != p.end() && behavior->is_string() ? behavior->get<std::string>() : "";
      if (b != "Isolated" && b != "Removed") {
        return Unsupported(absl::StrCat("Split behavior \"", b, "\""));
      }
      auto pattern = p.find("pattern");
      if (pattern == p.end() || !pattern->is_object()) {
        return Invalid("Split pre-tokenizer needs a \"pattern\" object");
      }
      auto regex = pattern->find("Regex");
      auto literal = pattern->find("String");
      std::string re;
      if (regex != pattern->end() && regex->is_string()) {
        re = regex->get<std::string>();
      } else if (literal != pattern->end() && literal->is_string()) {
        re = absl::StrCat("\\Q", literal->get<std::string>(), "\\E");
      } else {
        return Invalid(absl::StrCat("Split pattern ", Short(*pattern),
                                    " has neither \"Regex\" nor \"String\""));
      }
      absl::StatusOr<RegexSplitter> splitter = RegexSplitter::Create(
          re, b == "Isolated" ? SplitBehavior::kIsolated : SplitBehavior::kRemoved);
      if (!splitter.ok()) {
        return Invalid(splitter.status().message());
      }
      step.splitter = std::move(*splitter);
    } else {
      return Unsupported(absl::StrCat("pre_tokenizer \"", type, "\""));
    }
    t_.pre_steps_.push_back(std::move(step));
    return absl::OkStatus();
  }

  absl::Status ParsePreTokenizer(const Json& j) {
    const Json* p = nullptr;
    PD_RETURN_IF_ERROR(Component(j, "pre_tokenizer", &p));
    bool byte_level = false;
    if (p != nullptr && TypeOf(*p) == "Sequence") {
      auto list = p->find("pretokenizers");
      if (list == p->end() || !list->is_array()) {
        return Invalid("Sequence pre_tokenizer needs a \"pretokenizers\" list");
      }
      for (const Json& step : *list) {
        PD_RETURN_IF_ERROR(ParsePreStep(step, &byte_level));
      }
    } else if (p != nullptr) {
      PD_RETURN_IF_ERROR(ParsePreStep(*p, &byte_level));
    }
    if (!byte_level) {
      return Unsupported("a tokenizer without a ByteLevel pre_tokenizer (not byte-level BPE)");
    }
    return absl::OkStatus();
  }

  absl::Status ParseDecoder(const Json& j) {
    const Json* d = nullptr;
    PD_RETURN_IF_ERROR(Component(j, "decoder", &d));
    if (d == nullptr) {
      return Unsupported("a missing decoder (only ByteLevel)");
    }
    if (TypeOf(*d) == "ByteLevel") {
      return absl::OkStatus();
    }
    auto list = d->find("decoders");
    if (TypeOf(*d) == "Sequence" && list != d->end() && list->is_array() && !list->empty() &&
        std::all_of(list->begin(), list->end(),
                    [](const Json& e) { return TypeOf(e) == "ByteLevel"; })) {
      return absl::OkStatus();
    }
    return Unsupported(absl::StrCat("decoder \"", TypeOf(*d), "\" (only ByteLevel)"));
  }

  // The id of a template's special token: its "ids" in special_tokens, else the added token.
  absl::StatusOr<uint32_t> TemplateTokenId(const Json& tp, const std::string& name) const {
    auto specials = tp.find("special_tokens");
    if (specials != tp.end() && specials->is_object()) {
      auto entry = specials->find(name);
      if (entry != specials->end() && entry->is_object()) {
        auto ids = entry->find("ids");
        if (ids != entry->end() && ids->is_array() && ids->size() == 1) {
          return Id((*ids)[0], absl::StrCat("template token ", name));
        }
      }
    }
    auto it = t_.token_to_id_.find(name);
    if (it == t_.token_to_id_.end()) {
      return Invalid(absl::StrCat("post_processor template token \"", name, "\" is unknown"));
    }
    return it->second;
  }

  absl::Status ParseTemplate(const Json& tp) {
    auto single = tp.find("single");
    if (single == tp.end() || !single->is_array() || single->empty()) {
      return Invalid("TemplateProcessing needs a non-empty \"single\" list");
    }
    auto special_name = [](const Json& item) -> std::optional<std::string> {
      auto s = item.find("SpecialToken");
      if (s == item.end() || !s->is_object()) {
        return std::nullopt;
      }
      auto id = s->find("id");
      return id != s->end() && id->is_string() ? std::optional<std::string>(id->get<std::string>())
                                               : std::nullopt;
    };
    if (std::optional<std::string> name = special_name(single->front())) {
      PD_ASSIGN_OR_RETURN(template_bos_, TemplateTokenId(tp, *name));
      t_.add_bos_by_default_ = true;
    }
    if (single->size() > 1) {
      if (std::optional<std::string> name = special_name(single->back())) {
        PD_ASSIGN_OR_RETURN(template_eos_, TemplateTokenId(tp, *name));
        t_.add_eos_by_default_ = true;
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParsePostStep(const Json& p) {
    const std::string type = TypeOf(p);
    if (type == "ByteLevel") {
      return absl::OkStatus();  // offsets only
    }
    if (type == "TemplateProcessing") {
      return ParseTemplate(p);
    }
    return Unsupported(absl::StrCat("post_processor \"", type, "\""));
  }

  absl::Status ParsePostProcessor(const Json& j) {
    const Json* p = nullptr;
    PD_RETURN_IF_ERROR(Component(j, "post_processor", &p));
    if (p == nullptr) {
      return absl::OkStatus();
    }
    if (TypeOf(*p) != "Sequence") {
      return ParsePostStep(*p);
    }
    auto list = p->find("processors");
    if (list == p->end() || !list->is_array()) {
      return Invalid("Sequence post_processor needs a \"processors\" list");
    }
    for (const Json& step : *list) {
      PD_RETURN_IF_ERROR(ParsePostStep(step));
    }
    return absl::OkStatus();
  }

  // First of: the option, the template, a conventionally named added token.
  uint32_t Resolve(std::optional<uint32_t> option, std::optional<uint32_t> from_template,
                   std::initializer_list<const char*> names) const {
    if (option.has_value()) {
      return *option;
    }
    if (from_template.has_value()) {
      return *from_template;
    }
    for (const char* name : names) {
      auto it = t_.token_to_id_.find(name);
      if (it != t_.token_to_id_.end() &&
          t_.entries_[it->second].kind != HfTokenizer::Kind::kRegular) {
        return it->second;
      }
    }
    return Tokenizer::kNoToken;
  }

  absl::Status ResolveSpecialIds() {
    if (t_.entries_.empty()) {
      return Invalid("the vocabulary is empty");
    }
    t_.bos_id_ =
        Resolve(options_.bos_id, template_bos_, {"<|begin_of_text|>", "<s>", "<|endoftext|>"});
    t_.eos_id_ =
        Resolve(options_.eos_id, template_eos_, {"<|end_of_text|>", "</s>", "<|endoftext|>"});
    for (const auto& [what, id] : {std::pair{"bos", t_.bos_id_}, std::pair{"eos", t_.eos_id_}}) {
      if (id != Tokenizer::kNoToken && id >= t_.entries_.size()) {
        return Invalid(absl::StrCat(what, " id ", id, " is >= vocab size ", t_.entries_.size()));
      }
    }
    return absl::OkStatus();
  }

  const HfTokenizerOptions& options_;
  absl::string_view source_;
  HfTokenizer t_;
  std::optional<uint32_t> template_bos_;
  std::optional<uint32_t> template_eos_;
};

HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<HfTokenizer> HfTokenizer::Load(absl::string_view path,
                                              const HfTokenizerOptions& options) {
  PD_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return Parse(file.contents(), options, path);
}

absl::StatusOr<HfTokenizer> HfTokenizer::Parse(absl::string_view json,
                                               const HfTokenizerOptions& options,
                                               absl::string_view source) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  return HfTokenizerParser(options, source).Run(j);
}

absl::StatusOr<std::vector<std::string>> HfTokenizer::PreTokenize(absl::string_view text) const {
  std::vector<std::string> pieces = {std::string(text)};
  std::vector<std::string> next;
  std::vector<absl::string_view> views;
  for (const PreStep& step : pre_steps_) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        piece.insert(0, 1, ' ');
      }
      if (!step.splitter.has_value()) {
        next.push_back(std::move(piece));
        continue;
      }
      views.clear();
      PD_RETURN_IF_ERROR(step.splitter->Split(piece, &views));
      for (absl::string_view v : views) {
        next.emplace_back(v);
      }
    }
    pieces.swap(next);
  }
  return pieces;
}

absl::StatusOr<std::string> HfTokenizer::Normalize(absl::string_view text) const {
  if (!nfc_ || std::all_of(text.begin(), text.end(),
                           [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);  // ASCII is its own NFC
  }
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(error);
  if (U_FAILURE(error)) {
    return absl::InternalError(absl::StrCat("ICU's NFC normalizer: ", u_errorName(error)));
  }
  // NFC of each run of well-formed UTF-8; a byte that starts no character is kept as it is
  // (Hugging Face's input is always well formed: this only decides what arbitrary bytes get).
  std::string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t size = static_cast<int32_t>(text.size());
  int32_t run = 0;
  int32_t i = 0;
  auto flush = [&](int32_t end) -> absl::Status {
    if (end > run) {
      icu::StringByteSink<std::string> sink(&out);
      UErrorCode e = U_ZERO_ERROR;
      nfc->normalizeUTF8(0, icu::StringPiece(text.data() + run, end - run), sink, nullptr, e);
      if (U_FAILURE(e)) {
        return absl::InternalError(absl::StrCat("ICU's NFC normalizer: ", u_errorName(e)));
      }
    }
    return absl::OkStatus();
  };
  while (i < size) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(bytes, i, size, c);
    if (c < 0) {
      PD_RETURN_IF_ERROR(flush(start));
      out.append(text.data() + start, static_cast<size_t>(i - start));
      run = i;
    }
  }
  PD_RETURN_IF_ERROR(flush(size));
  return out;
}

absl::Status HfTokenizer::EncodeOrdinary(absl::string_view raw, std::vector<uint32_t>* ids) const {
  if (raw.empty()) {
    return absl::OkStatus();
  }
  PD_ASSIGN_OR_RETURN(std::string text, Normalize(raw));
  PD_ASSIGN_OR_RETURN(std::vector<std::string> pieces, PreTokenize(text));
  for (const std::string& piece : pieces) {
    PD_RETURN_IF_ERROR(EncodePiece(piece, ids));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::EncodePiece(absl::string_view piece, std::vector<uint32_t>* ids) const {
  if (piece.empty()) {
    return absl::OkStatus();
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(piece);
    if (it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  std::vector<BpeSymbol> symbols(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    const unsigned char byte = static_cast<unsigned char>(piece[i]);
    if (byte_id_[byte] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "byte 0x%02x has no byte-level token in the vocabulary", static_cast<int>(byte)));
    }
    symbols[i] = BpeSymbol{static_cast<uint32_t>(byte_id_[byte]), static_cast<int32_t>(i) - 1,
                           i + 1 < piece.size() ? static_cast<int32_t>(i + 1) : -1};
  }
  ApplyMerges(
      [this](uint32_t left, uint32_t right) -> std::optional<std::pair<uint32_t, uint32_t>> {
        auto it = merges_.find(PairKey(left, right));
        if (it == merges_.end()) {
          return std::nullopt;
        }
        return std::make_pair(it->second.rank, it->second.id);
      },
      &symbols);
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    ids->push_back(symbols[i].id);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> HfTokenizer::Encode(absl::string_view text, bool add_bos,
                                                          bool add_eos) const {
  std::vector<uint32_t> ids;
  if (add_bos) {
    if (bos_id_ == kNoToken) {
      return absl::FailedPreconditionError(
          "Encode: add_bos requested but the tokenizer has no BOS");
    }
    ids.push_back(bos_id_);
  }
  size_t segment = 0;  // start of the text not yet encoded
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (uint32_t length : added_lengths_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (length > text.size() - i) {
        continue;
      }
      auto it = added_index_.find(text.substr(i, length));
      if (it != added_index_.end()) {
        match = &added_[it->second];
        break;  // longest first
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, end = i + match->content.size();
    while (match->lstrip && start > segment && IsAsciiSpace(text[start - 1])) {
      --start;
    }
    while (match->rstrip && end < text.size() && IsAsciiSpace(text[end])) {
      ++end;
    }
    PD_RETURN_IF_ERROR(EncodeOrdinary(text.substr(segment, start - segment), &ids));
    ids.push_back(match->id);
    segment = i = end;
  }
  PD_RETURN_IF_ERROR(EncodeOrdinary(text.substr(segment), &ids));
  if (add_eos) {
    if (eos_id_ == kNoToken) {
      return absl::FailedPreconditionError(
          "Encode: add_eos requested but the tokenizer has no EOS");
    }
    ids.push_back(eos_id_);
  }
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::DecodeToken(uint32_t /*prev*/, uint32_t next) const {
  if (next >= entries_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", next, " is out of range (vocab size ", entries_.size(), ")"));
  }
  const Entry& e = entries_[next];
  if (e.kind == Kind::kSpecial && skip_special_tokens_) {
    return std::string();
  }
  return e.bytes;
}

std::optional<uint32_t> HfTokenizer::TokenToId(absl::string_view token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? std::nullopt : std::optional<uint32_t>(it->second);
}

const std::string& HfTokenizer::TokenBytes(uint32_t id) const {
  CHECK_LT(id, entries_.size());
  return entries_[id].bytes;
}

bool HfTokenizer::IsSpecial(uint32_t id) const {
  return id < entries_.size() && entries_[id].kind == Kind::kSpecial;
}

std::string HfTokenizer::SpecialTokenText(uint32_t id) const {
  return IsSpecial(id) ? entries_[id].bytes : std::string();
}

}  // namespace pd::engine
