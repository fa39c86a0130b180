// TokenTrie: a model's vocabulary as a byte trie, built once per tokenizer and shared by every
// constrained request. The matcher walks it to compute a token mask: a subtree whose first
// byte the grammar refuses is skipped whole, so a mask costs what the allowed prefixes cost,
// not the vocabulary size.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pd::grammar {

// The part of a token mask that does not depend on the stack below a cut: the tokens accepted
// without reaching the cut, and the trie nodes where a walk reached it (the rest of those
// tokens depends on what lies below). Matcher::FillTokenMask explains the cut.
struct CachedTokenMask {
  struct Boundary {
    uint32_t trie_node;    // the bytes of this node's path were accepted, popping to the cut
    uint32_t placeholder;  // which cut stack (the key's placeholder number)
  };
  std::vector<uint32_t> accepted;    // bitmask, TokenTrie::mask_words() words
  size_t num_accepted = 0;           // bits set in `accepted`
  // A marker instead of a mask: this state's walk is short, walk the whole state each time.
  bool walk_whole = false;
  // A marker instead of a mask: cut here, almost every token reaches the cut (a string of
  // `minLength` 1 is cut after its first character), so cut one stack entry deeper.
  bool cut_deeper = false;
  // The cut state accepts every plain string run (TokenTrie::plain_mask) without reaching the
  // cut: `accepted` holds the plain tokens and what a walk of the rest trie accepted, and the
  // boundaries are nodes of TokenTrie::rest().
  bool rest_trie = false;
  std::vector<Boundary> boundaries;  // only nodes with children (leaves are in `accepted`)
  // The most stacks a state of the walk held (a token accepted here leaves at most this many
  // per stack merged under one placeholder: Matcher::FillTokenMask).
  size_t max_stacks = 0;
  size_t ByteSize() const {
    return accepted.size() * sizeof(uint32_t) + boundaries.size() * sizeof(Boundary);
  }
};

// A bounded, thread-safe map of cached mask parts (Matcher::FillTokenMask). Past `max_bytes`,
// the least recently used parts are dropped.
class TokenMaskCache {
 public:
  explicit TokenMaskCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  std::shared_ptr<const CachedTokenMask> Find(const std::vector<uint32_t>& key) const;
  void Store(const std::vector<uint32_t>& key, std::shared_ptr<const CachedTokenMask> mask) const;
  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    size_t entries = 0;
    size_t bytes = 0;
    int64_t evictions = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const CachedTokenMask> mask;
    size_t bytes = 0;
    std::list<const std::vector<uint32_t>*>::iterator lru;  // its place in lru_
  };
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  // node_hash_map: the keys stay put, so lru_ can point at them.
  mutable absl::node_hash_map<std::vector<uint32_t>, Entry> masks_ ABSL_GUARDED_BY(mu_);
  mutable std::list<const std::vector<uint32_t>*> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  mutable Stats stats_ ABSL_GUARDED_BY(mu_);
};

// Plain JSON string content, byte by byte: UTF-8 (no overlong forms, no surrogates) of the
// characters a JSON string holds without an escape (not '"', '\\', a control below 0x20, or
// 0x7F). State 0 is between characters, 1..7 inside one; returns the state after `byte`, or -1
// when the byte cannot come next.
inline constexpr int kPlainStringStates = 8;
int PlainStringStep(int state, uint8_t byte);

// The bytes token t stands for in a grammar (grammar.h, special tokens): a special token
// (`special_text` its text, not empty) stands for SpecialTokenBytes(special_text); any other
// for its decoded bytes, or for nothing (never allowed) when they hold the special token mark,
// which no UTF-8 text holds (a byte-fallback token's 0xFF): such a token could otherwise begin
// a special token's bytes.
std::string TokenGrammarBytes(std::string decoded, absl::string_view special_text);

class TokenTrie {
 public:
  // Most bytes of cached token masks the trie keeps for all grammars together (past it, the
  // least recently used go): 32 MiB, about 2,000 masks of a 128k vocabulary.
  static constexpr size_t kMaxMaskCacheBytes = size_t{32} << 20;

  struct Node {
    uint8_t byte = 0;
    uint32_t first_child = 0;  // children are contiguous, sorted by byte
    uint32_t num_children = 0;
    uint32_t tokens_begin = 0;  // token ids whose bytes end here: token_at(begin..end)
    uint32_t tokens_end = 0;
  };

  // `token_bytes[t]`: the bytes token t decodes to; empty for tokens a grammar never allows
  // (special and control tokens). `end_tokens`: the tokens that end the output (EOS and the
  // like), allowed exactly when the grammar's sentence is complete.
  TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens);

  const Node& node(uint32_t i) const { return nodes_[i]; }
  int32_t token_at(uint32_t i) const { return tokens_[i]; }
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  bool is_end_token(int32_t t) const {
    return std::find(end_tokens_.begin(), end_tokens_.end(), t) != end_tokens_.end();
  }
  // The bytes token t stands for in the grammar (empty: never allowed, unless an end token).
  const std::string& token_bytes(int32_t t) const { return token_bytes_[static_cast<size_t>(t)]; }
  size_t vocab_size() const { return vocab_size_; }
  // The longest token's bytes.
  size_t max_token_bytes() const { return max_token_bytes_; }
  size_t mask_words() const { return (vocab_size_ + 31) / 32; }
  size_t num_nodes() const { return nodes_.size(); }
  // Unique per trie ever built in this process (a key for caches of masks over it).
  uint64_t id() const { return id_; }

  // Token masks shared by every grammar: keyed by the canonical form of a cut state's
  // reachable grammar (Matcher::FillTokenMask), so a JSON string's mask computed for one schema
  // serves every other schema's strings.
  const TokenMaskCache& mask_cache() const { return masks_; }

  // The plain tokens: those whose bytes, from between two characters, are plain JSON string
  // content (PlainStringStep; a token may end inside a character). Inside a string almost
  // every token is one (122,893 of Llama 3.1's 128,000), so a state that accepts every plain
  // run allows them all at once, and only the other tokens are walked: rest() holds them, with
  // the same token ids (a trie of 10,852 nodes instead of 274,521 for Llama 3.1).
  const std::vector<uint32_t>& plain_mask() const { return plain_mask_; }
  size_t num_plain() const { return num_plain_; }
  // The plain tokens that start at most `chars` characters (a token ending inside a character
  // counts it), for a string of bounded length (Matcher::PlainRunLimit); `chars` at most
  // kMaxPlainChars.
  static constexpr int kMaxPlainChars = 256;
  const std::vector<uint32_t>& plain_mask_upto(int chars) const {
    return plain_upto_[static_cast<size_t>(std::min(chars, max_plain_chars_))];
  }
  size_t num_plain_upto(int chars) const {
    return num_plain_upto_[static_cast<size_t>(std::min(chars, max_plain_chars_))];
  }
  // Null for the rest trie itself.
  const TokenTrie* rest() const { return rest_.get(); }
  // The tokens that have bytes, as a mask; per byte value, the tokens whose bytes contain it,
  // and the tokens whose bytes start with it, ascending (all empty in the rest trie). For
  // states that few byte values move (free text: Matcher::FreeTextMask).
  const std::vector<uint32_t>& bytes_mask() const { return bytes_mask_; }
  const std::vector<int32_t>& tokens_with_byte(uint8_t byte) const { return with_byte_[byte]; }
  const std::vector<int32_t>& tokens_starting_with(uint8_t byte) const {
    return starting_with_[byte];
  }

 private:
  TokenTrie(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens,
            bool split_plain);

  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<int32_t> tokens_;
  std::vector<int32_t> end_tokens_;
  std::vector<std::string> token_bytes_;
  size_t vocab_size_ = 0;
  size_t max_token_bytes_ = 0;
  uint64_t id_ = 0;
  TokenMaskCache masks_{kMaxMaskCacheBytes};
  std::vector<uint32_t> plain_mask_;
  size_t num_plain_ = 0;
  // [c]: the plain tokens of at most c characters, up to the most any plain token has (capped
  // at kMaxPlainChars: longer tokens are in none).
  std::vector<std::vector<uint32_t>> plain_upto_;
  std::vector<size_t> num_plain_upto_;
  int max_plain_chars_ = 0;
  std::vector<uint32_t> bytes_mask_;
  std::array<std::vector<int32_t>, 256> with_byte_;
  std::array<std::vector<int32_t>, 256> starting_with_;
  std::unique_ptr<TokenTrie> rest_;
};

}  // namespace pd::grammar
