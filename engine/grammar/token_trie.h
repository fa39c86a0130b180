// TokenTrie: a model's vocabulary as a byte trie, built once per tokenizer and shared by every
// constrained request. The matcher walks it to compute a token mask: a subtree whose first
// byte the grammar refuses is skipped whole, so a mask costs what the allowed prefixes cost,
// not the vocabulary size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace pd::grammar {

class TokenTrie {
 public:
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
  size_t mask_words() const { return (vocab_size_ + 31) / 32; }
  size_t num_nodes() const { return nodes_.size(); }

 private:
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<int32_t> tokens_;
  std::vector<int32_t> end_tokens_;
  std::vector<std::string> token_bytes_;
  size_t vocab_size_ = 0;
};

}  // namespace pd::grammar
