#include "engine/grammar/token_trie.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "engine/grammar/grammar.h"

namespace pd::grammar {

std::string TokenGrammarBytes(std::string decoded, absl::string_view special_text) {
  if (!special_text.empty()) return SpecialTokenBytes(special_text);
  if (decoded.find(static_cast<char>(kSpecialTokenMark)) != std::string::npos) return "";
  return decoded;
}

int PlainStringStep(int state, uint8_t byte) {
  const bool cont = byte >= 0x80 && byte <= 0xBF;
  switch (state) {
    case 0:
      if (byte >= 0x20 && byte <= 0x7E) return byte == '"' || byte == '\\' ? -1 : 0;
      if (byte >= 0xC2 && byte <= 0xDF) return 1;
      if (byte == 0xE0) return 3;
      if (byte == 0xED) return 4;
      if (byte >= 0xE1 && byte <= 0xEF) return 2;
      if (byte == 0xF0) return 6;
      if (byte >= 0xF1 && byte <= 0xF3) return 5;
      if (byte == 0xF4) return 7;
      return -1;
    case 1:
      return cont ? 0 : -1;
    case 2:
      return cont ? 1 : -1;
    case 3:
      return byte >= 0xA0 && byte <= 0xBF ? 1 : -1;
    case 4:
      return byte >= 0x80 && byte <= 0x9F ? 1 : -1;
    case 5:
      return cont ? 2 : -1;
    case 6:
      return byte >= 0x90 && byte <= 0xBF ? 2 : -1;
    case 7:
      return byte >= 0x80 && byte <= 0x8F ? 2 : -1;
    default:
      return -1;
  }
}

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens)
    : TokenTrie(token_bytes, std::move(end_tokens), /*split_plain=*/true) {}

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens,
                     bool split_plain)
    : end_tokens_(std::move(end_tokens)),
      token_bytes_(token_bytes),
      vocab_size_(token_bytes.size()) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1);
  std::vector<int32_t> order;
  for (size_t t = 0; t < token_bytes.size(); ++t) {
    if (!token_bytes[t].empty()) order.push_back(static_cast<int32_t>(t));
    max_token_bytes_ = std::max(max_token_bytes_, token_bytes[t].size());
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[static_cast<size_t>(a)] < token_bytes[static_cast<size_t>(b)];
  });
  // Breadth-first over ranges of `order` sharing a prefix: each queue item is a node, the
  // range of sorted tokens below it, and its depth. Children of one node are appended
  // together, so they are contiguous.
  struct Item {
    uint32_t node;
    size_t begin;
    size_t end;
    size_t depth;
  };
  nodes_.emplace_back();
  std::vector<Item> queue{{0, 0, order.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Item item = queue[q];
    size_t i = item.begin;
    // Tokens that end at this node sort first (they are the shortest).
    nodes_[item.node].tokens_begin = static_cast<uint32_t>(tokens_.size());
    while (i < item.end && token_bytes[static_cast<size_t>(order[i])].size() == item.depth) {
      tokens_.push_back(order[i]);
      ++i;
    }
    nodes_[item.node].tokens_end = static_cast<uint32_t>(tokens_.size());
    nodes_[item.node].first_child = static_cast<uint32_t>(nodes_.size());
    while (i < item.end) {
      const auto byte =
          static_cast<uint8_t>(token_bytes[static_cast<size_t>(order[i])][item.depth]);
      size_t j = i;
      while (j < item.end &&
             static_cast<uint8_t>(token_bytes[static_cast<size_t>(order[j])][item.depth]) == byte) {
        ++j;
      }
      Node child;
      child.byte = byte;
      nodes_.push_back(child);
      queue.push_back({static_cast<uint32_t>(nodes_.size() - 1), i, j, item.depth + 1});
      ++nodes_[item.node].num_children;
      i = j;
    }
  }
  if (!split_plain) return;
  bytes_mask_.assign(mask_words(), 0);
  for (size_t t = 0; t < token_bytes.size(); ++t) {
    if (token_bytes[t].empty()) continue;
    bytes_mask_[t >> 5] |= 1u << (t & 31);
    starting_with_[static_cast<uint8_t>(token_bytes[t][0])].push_back(static_cast<int32_t>(t));
    std::array<bool, 256> seen{};
    for (const char c : token_bytes[t]) {
      const auto b = static_cast<uint8_t>(c);
      if (seen[b]) continue;
      seen[b] = true;
      with_byte_[b].push_back(static_cast<int32_t>(t));
    }
  }
  plain_mask_.assign(mask_words(), 0);
  std::vector<std::string> rest = token_bytes;
  std::vector<std::vector<int32_t>> by_chars(kMaxPlainChars + 1);
  for (size_t t = 0; t < token_bytes.size(); ++t) {
    if (token_bytes[t].empty()) continue;
    int state = 0;
    int chars = 0;  // characters started
    for (const char c : token_bytes[t]) {
      chars += state == 0 ? 1 : 0;
      state = PlainStringStep(state, static_cast<uint8_t>(c));
      if (state < 0) break;
    }
    if (state < 0) continue;
    plain_mask_[t >> 5] |= 1u << (t & 31);
    ++num_plain_;
    rest[t].clear();
    if (chars <= kMaxPlainChars) {
      by_chars[static_cast<size_t>(chars)].push_back(static_cast<int32_t>(t));
      max_plain_chars_ = std::max(max_plain_chars_, chars);
    }
  }
  plain_upto_.resize(static_cast<size_t>(max_plain_chars_) + 1);
  num_plain_upto_.resize(plain_upto_.size());
  for (size_t c = 0; c < plain_upto_.size(); ++c) {
    plain_upto_[c] = c == 0 ? std::vector<uint32_t>(mask_words(), 0) : plain_upto_[c - 1];
    num_plain_upto_[c] = (c == 0 ? 0 : num_plain_upto_[c - 1]) + by_chars[c].size();
    for (const int32_t t : by_chars[c]) {
      plain_upto_[c][static_cast<size_t>(t) >> 5] |= 1u << (static_cast<uint32_t>(t) & 31);
    }
  }
  rest_.reset(new TokenTrie(rest, end_tokens_, /*split_plain=*/false));
}

std::shared_ptr<const CachedTokenMask> TokenMaskCache::Find(
    const std::vector<uint32_t>& key) const {
  absl::MutexLock lock(&mu_);
  auto it = masks_.find(key);
  if (it == masks_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.mask;
}

void TokenMaskCache::Store(const std::vector<uint32_t>& key,
                           std::shared_ptr<const CachedTokenMask> mask) const {
  absl::MutexLock lock(&mu_);
  const size_t bytes = mask->ByteSize() + 2 * key.size() * sizeof(uint32_t) + sizeof(Entry);
  if (bytes > max_bytes_ || masks_.contains(key)) return;
  while (stats_.bytes + bytes > max_bytes_ && !lru_.empty()) {
    auto victim = masks_.find(*lru_.back());
    stats_.bytes -= victim->second.bytes;
    --stats_.entries;
    ++stats_.evictions;
    lru_.pop_back();
    masks_.erase(victim);
  }
  auto [it, added] = masks_.try_emplace(key);
  it->second.mask = std::move(mask);
  it->second.bytes = bytes;
  lru_.push_front(&it->first);
  it->second.lru = lru_.begin();
  stats_.bytes += bytes;
  ++stats_.entries;
}

TokenMaskCache::Stats TokenMaskCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace pd::grammar
