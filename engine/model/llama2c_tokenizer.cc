#include "engine/model/llama2c_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "common/utf8/utf8.h"
#include "engine/model/mapped_file.h"

namespace pd::engine {
namespace {

// run.c starts its best-score search at -1e10 with a strict '>', so pieces scored at or below
// this (or NaN) never merge.
constexpr float kMinMergeScore = -1e10f;

int32_t ReadInt32(absl::string_view bytes, size_t offset) {
  int32_t v;
  std::memcpy(&v, bytes.data() + offset, sizeof(v));
  return v;
}

float ReadFloat(absl::string_view bytes, size_t offset) {
  float v;
  std::memcpy(&v, bytes.data() + offset, sizeof(v));
  return v;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  return -1;
}

// The byte a "<0xHH>" piece stands for, or -1 if the piece is not spelled exactly like that.
int ByteFallbackValue(absl::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') {
    return -1;
  }
  const int hi = HexDigit(piece[3]);
  const int lo = HexDigit(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

absl::StatusOr<Llama2cTokenizer> Llama2cTokenizer::Load(absl::string_view path,
                                                        uint32_t vocab_size) {
  PD_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return Parse(file.contents(), vocab_size, path);
}

absl::StatusOr<Llama2cTokenizer> Llama2cTokenizer::Parse(absl::string_view bytes,
                                                         uint32_t vocab_size,
                                                         absl::string_view source) {
  if (vocab_size <= kEosId) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": vocab_size ", vocab_size, " leaves no room for <unk>, BOS and EOS (ids 0..2)"));
  }
  if (bytes.size() < sizeof(int32_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": file is ", bytes.size(), " bytes, shorter than the 4-byte max_token_length"));
  }
  Llama2cTokenizer t;
  t.max_token_length_ = ReadInt32(bytes, 0);
  if (t.max_token_length_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": negative max_token_length ", t.max_token_length_, " at offset 0"));
  }
  // Every entry takes at least 8 bytes: a vocab_size the file cannot hold must fail as truncated
  // below, not reserve gigabytes first (found by tests/fuzz/llama2c_tokenizer_fuzzer).
  const size_t max_entries = (bytes.size() - sizeof(int32_t)) / 8;
  t.pieces_.reserve(std::min<size_t>(vocab_size, max_entries));
  t.scores_.reserve(std::min<size_t>(vocab_size, max_entries));
  size_t offset = sizeof(int32_t);
  for (uint32_t id = 0; id < vocab_size; ++id) {
    if (bytes.size() - offset < 8) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": truncated at id ", id, " of ", vocab_size,
                       ": its score and length need 8 "
                       "bytes at offset ",
                       offset, " but the file is ", bytes.size(), " bytes"));
    }
    const float score = ReadFloat(bytes, offset);
    const int32_t len = ReadInt32(bytes, offset + 4);
    if (len < 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": id ", id, " has negative length ",
                                                     len, " at offset ", offset + 4));
    }
    offset += 8;
    if (bytes.size() - offset < static_cast<size_t>(len)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": truncated at id ", id, " of ", vocab_size, ": its ", len,
                       "-byte piece at offset ", offset, " runs past the end of the ", bytes.size(),
                       "-byte file"));
    }
    t.scores_.push_back(score);
    t.pieces_.emplace_back(bytes.substr(offset, len));
    offset += len;
  }
  if (offset != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", bytes.size() - offset, " trailing bytes after the last of ", vocab_size,
        " entries (offset ", offset, "); is vocab_size wrong for this file?"));
  }

  t.byte_of_id_.assign(vocab_size, -1);
  t.id_of_byte_.assign(256, -1);
  for (uint32_t id = 0; id < vocab_size; ++id) {
    if (id == kUnkId || id == kBosId || id == kEosId) {
      // Control pieces are never looked up, merged into or used as byte fallback, whatever
      // their spelling: a file whose BOS reads "<0x02>" must not turn byte 0x02 into BOS
      // (found by tests/fuzz/llama2c_tokenizer_fuzzer).
      continue;
    }
    const int byte = ByteFallbackValue(t.pieces_[id]);
    if (byte >= 0) {
      t.byte_of_id_[id] = static_cast<int16_t>(byte);
      if (t.id_of_byte_[byte] < 0) {
        t.id_of_byte_[byte] = id;
      }
      continue;
    }
    t.piece_to_id_.try_emplace(t.pieces_[id], id);
    t.longest_piece_bytes_ = std::max(t.longest_piece_bytes_, t.pieces_[id].size());
  }
  return t;
}

const std::string& Llama2cTokenizer::piece(uint32_t id) const {
  CHECK_LT(id, pieces_.size());
  return pieces_[id];
}

float Llama2cTokenizer::score(uint32_t id) const {
  CHECK_LT(id, scores_.size());
  return scores_[id];
}

absl::Status Llama2cTokenizer::AppendCodePoints(absl::string_view text,
                                                std::vector<uint32_t>* ids) const {
  // Like run.c: a group is one byte plus the continuation bytes (10xxxxxx) after it, at most 4
  // bytes; this is a UTF-8 code point for valid input and still well defined for invalid input.
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = start + utf8::ByteGroupLength(text, start);
    const absl::string_view group = text.substr(start, end - start);
    auto it = piece_to_id_.find(group);
    if (it != piece_to_id_.end()) {
      ids->push_back(it->second);
    } else {
      for (char c : group) {
        const unsigned char byte = static_cast<unsigned char>(c);
        if (id_of_byte_[byte] < 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "byte 0x%02X at text offset %d has no piece and no byte-fallback token", byte,
              start));
        }
        ids->push_back(static_cast<uint32_t>(id_of_byte_[byte]));
      }
    }
    start = end;
  }
  return absl::OkStatus();
}

void Llama2cTokenizer::MergePairs(std::vector<uint32_t>* ids) const {
  const size_t n = ids->size();
  if (n < 2) {
    return;
  }
  // Symbols form a doubly linked list over the original positions; a merge keeps the left
  // symbol and kills the right one, so list order equals position order and "leftmost pair"
  // is "smallest left position", exactly as run.c's left-to-right scan picks among equal scores.
  std::vector<uint32_t>& id = *ids;
  std::vector<size_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;  // n means "none"
    prev[i] = i == 0 ? n : i - 1;
  }
  struct Candidate {
    float score;
    size_t left;
    size_t right;
    uint32_t left_id;  // ids at push time: the candidate is stale if either symbol changed
    uint32_t right_id;
    uint32_t merged_id;
  };
  auto lower_priority = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower_priority)> queue(
      lower_priority);
  std::string concat;
  auto push_pair = [&](size_t left, size_t right) {
    if (left >= n || right >= n) {
      return;
    }
    const std::string& a = pieces_[id[left]];
    const std::string& b = pieces_[id[right]];
    if (a.size() + b.size() > longest_piece_bytes_) {
      return;
    }
    concat.assign(a).append(b);
    auto it = piece_to_id_.find(concat);
    if (it == piece_to_id_.end()) {
      return;
    }
    const float score = scores_[it->second];
    if (!(score > kMinMergeScore)) {
      return;
    }
    queue.push(Candidate{score, left, right, id[left], id[right], it->second});
  };
  for (size_t i = 0; i + 1 < n; ++i) {
    push_pair(i, i + 1);
  }
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || id[c.left] != c.left_id ||
        id[c.right] != c.right_id) {
      continue;  // stale: a neighbour merged since this candidate was pushed
    }
    id[c.left] = c.merged_id;
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.left] < n) {
      prev[next[c.left]] = c.left;
    }
    push_pair(prev[c.left], c.left);
    push_pair(c.left, next[c.left]);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; i = next[i]) {
    id[out++] = id[i];
  }
  ids->resize(out);
}

absl::StatusOr<std::vector<uint32_t>> Llama2cTokenizer::Encode(absl::string_view text, bool add_bos,
                                                               bool add_eos) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() + 3);
  if (!text.empty()) {
    // run.c's dummy prefix: the " " piece, i.e. SentencePiece's add_dummy_prefix.
    PD_RETURN_IF_ERROR(AppendCodePoints(" ", &ids));
    PD_RETURN_IF_ERROR(AppendCodePoints(text, &ids));
    MergePairs(&ids);
  }
  if (add_bos) {
    ids.insert(ids.begin(), kBosId);
  }
  if (add_eos) {
    ids.push_back(kEosId);
  }
  return ids;
}

absl::StatusOr<std::string> Llama2cTokenizer::DecodeToken(uint32_t prev, uint32_t next) const {
  if (next >= pieces_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", next, " out of range [0, ", pieces_.size(), ")"));
  }
  if (next == kBosId || next == kEosId) {
    return std::string();
  }
  if (byte_of_id_[next] >= 0) {
    return std::string(1, static_cast<char>(byte_of_id_[next]));
  }
  absl::string_view piece = pieces_[next];
  if (prev == kBosId && !piece.empty() && piece[0] == ' ') {
    piece.remove_prefix(1);
  }
  return std::string(piece);
}

}  // namespace pd::engine
