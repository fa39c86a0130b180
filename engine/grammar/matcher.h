// Matcher: runs a Grammar over bytes as a pushdown automaton.
//
// The state is a set of stacks. Each stack entry is a position in the flattened grammar (the
// next element to match in one rule's alternative); the top is always a byte set (or the stack
// is empty, which means the input so far is a complete sentence). Accepting a byte keeps the
// stacks whose top contains it, steps past it and expands rule references until every top is a
// byte set again. Stacks are deduplicated, and their number is bounded (ambiguous grammars can
// otherwise grow it without limit): a byte that would exceed the bound is refused, and
// overflowed() says why.
//
// The matcher is the reference semantics of constrained decoding: the token masker must allow
// exactly the tokens whose bytes this matcher accepts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

 private:
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> starts_;
  std::vector<ByteSet> sets_;
};

class Matcher {
 public:
  // Most stacks a state may hold before a byte is refused as too ambiguous.
  static constexpr size_t kMaxStacks = 4096;

  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

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
  // The last refused byte was refused because the state would exceed kMaxStacks.
  bool overflowed() const { return overflowed_; }
  size_t num_stacks() const { return stacks_.size(); }

 private:
  using Stack = std::vector<uint32_t>;
  // Expands `stack` until every top is a byte set (or the stack is empty) into `out`.
  bool Normalize(Stack stack, std::vector<Stack>* out) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<Stack> stacks_;
  bool overflowed_ = false;
};

// Whole-string match: `text` is a sentence of the grammar.
bool Matches(std::shared_ptr<const CompiledGrammar> grammar, absl::string_view text);

}  // namespace pd::grammar
