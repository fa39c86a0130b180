#include "engine/grammar/token_trie.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace pd::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens)
    : end_tokens_(std::move(end_tokens)),
      token_bytes_(token_bytes),
      vocab_size_(token_bytes.size()) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1);
  std::vector<int32_t> order;
  for (size_t t = 0; t < token_bytes.size(); ++t) {
    if (!token_bytes[t].empty()) order.push_back(static_cast<int32_t>(t));
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
