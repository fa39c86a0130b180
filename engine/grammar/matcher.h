// Matcher: runs a Grammar over bytes as a pushdown automaton.
//
// The state is a set of stacks. Each stack entry is a position in the flattened grammar (the
// next element to match in one rule's alternative); the top is always a byte set (or the stack
// is empty, which means the input so far is a complete sentence). Stacks are interned, so they
// share tails and compare as integers. Accepting a byte keeps the
// stacks whose top contains it, steps past it and expands rule references until every top is a
// byte set again. Stacks are deduplicated, and their number is bounded (ambiguous grammars can
// otherwise grow it without limit): a byte that would exceed the bound is refused, and
// overflowed() says why.
//
// The matcher is the reference semantics of constrained decoding: the token masker must allow
// exactly the tokens whose bytes this matcher accepts.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace pd::grammar {

// A validated grammar, flattened for matching. Immutable; shared by every matcher of it.
class CompiledGrammar {
 public:
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar);

  // Flattened alternatives: each ends with an Element of kind kEnd.
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<uint32_t>& alternative_starts(uint32_t rule) const { return starts_[rule]; }
  const ByteSet& set(uint32_t index) const { return sets_[index]; }
  // Position of the synthetic start element (a reference to the root followed by kEnd).
  uint32_t start() const { return 0; }
  // Approximate bytes held (for caches that bound their memory).
  size_t ByteSize() const {
    size_t n = elements_.size() * sizeof(Element) + sets_.size() * sizeof(ByteSet);
    for (const auto& s : starts_) n += s.size() * sizeof(uint32_t) + sizeof(s);
    return n;
  }

 private:
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> starts_;
  std::vector<ByteSet> sets_;
};

class TokenTrie;

// A matcher is owned by one request (not thread-safe); copies are independent.
class Matcher {
 public:
  // Most stacks a state may hold before a byte is refused as too ambiguous.
  static constexpr size_t kMaxStacks = 4096;
  // Most interned stack entries one matcher may create (deep nesting, long ambiguous input)
  // before bytes are refused; overflowed() then says why.
  static constexpr size_t kMaxNodes = size_t{1} << 22;

  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  Matcher(const Matcher& other);
  Matcher& operator=(const Matcher& other) = delete;
  Matcher(Matcher&&) = default;
  Matcher& operator=(Matcher&&) = default;

  // Accepts one byte; false (state unchanged) when the grammar does not allow it here.
  bool AcceptByte(uint8_t byte);
  // Accepts all of `bytes` or none of them.
  bool AcceptBytes(absl::string_view bytes);
  // The input so far is a complete sentence of the grammar.
  bool CanEnd() const;
  // No byte can follow (only true at a complete sentence with nothing left to add).
  bool IsFinished() const { return NextBytes().none(); }
  // The bytes the grammar allows next.
  ByteSet NextBytes() const;
  // The last refused byte was refused because a bound (kMaxStacks, kMaxNodes) was hit.
  bool overflowed() const { return overflowed_; }
  size_t num_stacks() const { return state_.size(); }

  // The token mask: sets bit t of `mask` (trie.mask_words() words) for every token t whose
  // bytes this matcher accepts from its current state, and the end tokens when CanEnd().
  // Returns the number of tokens allowed.
  size_t FillTokenMask(const TokenTrie& trie, std::vector<uint32_t>* mask) const;

 private:
  // Stacks are interned: id 0 is the empty stack, id i > 0 is (top position, id of the rest).
  // Equal stacks have equal ids, so a state is a sorted list of ids, and the step of one
  // stack over one byte is memoized: a mask walking the token trie mostly looks steps up.
  using State = absl::InlinedVector<uint32_t, 4>;
  struct Node {
    uint32_t pos;
    uint32_t parent;
  };
  uint32_t Intern(uint32_t pos, uint32_t parent) const;
  // Expands stack `id` until every top is a byte set (or the stack is empty), into `out`.
  bool Normalize(uint32_t id, State* out) const;
  // The stacks after `byte` from stack `id` (whose top accepts it), memoized.
  const State* Step(uint32_t id, uint8_t byte) const;
  // Step of a stack whose result is one stack, as a table lookup after the first time:
  // the next stack id, kRefused, or kSeveral (then Step() has the stacks).
  static constexpr int32_t kRefused = -1;
  static constexpr int32_t kSeveral = -2;
  int32_t QuickStep(uint32_t id, uint8_t byte) const;
  // The state after `byte` from `from`; false when no stack accepts it or a bound is hit
  // (then *overflow is set).
  bool Advance(const State& from, uint8_t byte, State* to, bool* overflow) const;
  ByteSet NextBytesOf(const State& state) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  mutable std::vector<Node> nodes_;
  mutable absl::flat_hash_map<uint64_t, uint32_t> intern_;
  mutable absl::flat_hash_map<uint64_t, State> steps_;
  // Per stack id (allocated when first needed): 256 QuickStep results, kUnknown until known.
  static constexpr int32_t kUnknown = -3;
  mutable std::vector<std::unique_ptr<std::array<int32_t, 256>>> quick_;
  State state_;
  bool overflowed_ = false;
};

// Whole-string match: `text` is a sentence of the grammar.
bool Matches(std::shared_ptr<const CompiledGrammar> grammar, absl::string_view text);

}  // namespace pd::grammar
