#include "engine/grammar/matcher.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/base/status_macros.h"

namespace pd::grammar {

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar) {
  PD_RETURN_IF_ERROR(grammar.Validate());
  auto out = std::make_shared<CompiledGrammar>();
  out->sets_ = grammar.sets();
  out->elements_.push_back(Grammar::Ref(grammar.root()));
  out->elements_.push_back(Element{});
  out->starts_.resize(grammar.num_rules());
  for (uint32_t r = 0; r < grammar.num_rules(); ++r) {
    for (const Grammar::Sequence& alt : grammar.alternatives(r)) {
      out->starts_[r].push_back(static_cast<uint32_t>(out->elements_.size()));
      out->elements_.insert(out->elements_.end(), alt.begin(), alt.end());
      out->elements_.push_back(Element{});
    }
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(out));
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  Normalize(Stack{grammar_->start()}, &stacks_);
}

bool Matcher::Normalize(Stack stack, std::vector<Stack>* out) const {
  // Iterative over a work list: each item is a stack to expand.
  std::vector<Stack> work;
  work.push_back(std::move(stack));
  const std::vector<Element>& el = grammar_->elements();
  while (!work.empty()) {
    Stack s = std::move(work.back());
    work.pop_back();
    if (s.empty() || el[s.back()].kind == Element::Kind::kBytes) {
      out->push_back(std::move(s));
      if (out->size() > kMaxStacks * 4) return false;
      continue;
    }
    // Top is a rule reference: replace it by its continuation, then push each alternative.
    const uint32_t pos = s.back();
    s.pop_back();
    if (el[pos + 1].kind != Element::Kind::kEnd) s.push_back(pos + 1);
    const std::vector<uint32_t>& alts = grammar_->alternative_starts(el[pos].index);
    for (const uint32_t a : alts) {
      Stack next = s;
      if (el[a].kind != Element::Kind::kEnd) next.push_back(a);
      work.push_back(std::move(next));
    }
  }
  return true;
}

bool Matcher::AcceptByte(uint8_t byte) {
  const std::vector<Element>& el = grammar_->elements();
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;
    const uint32_t pos = s.back();
    if (!grammar_->set(el[pos].index).test(byte)) continue;
    Stack t = s;
    t.pop_back();
    if (el[pos + 1].kind != Element::Kind::kEnd) t.push_back(pos + 1);
    if (!Normalize(std::move(t), &next)) {
      overflowed_ = true;
      return false;
    }
  }
  if (next.empty()) return false;
  // Deduplicate.
  absl::flat_hash_set<Stack> seen;
  std::vector<Stack> unique;
  unique.reserve(next.size());
  for (Stack& s : next) {
    if (seen.insert(s).second) unique.push_back(std::move(s));
  }
  if (unique.size() > kMaxStacks) {
    overflowed_ = true;
    return false;
  }
  overflowed_ = false;
  stacks_ = std::move(unique);
  return true;
}

bool Matcher::AcceptBytes(absl::string_view bytes) {
  std::vector<Stack> saved = stacks_;
  for (const char c : bytes) {
    if (!AcceptByte(static_cast<uint8_t>(c))) {
      stacks_ = std::move(saved);
      return false;
    }
  }
  return true;
}

bool Matcher::CanEnd() const {
  for (const Stack& s : stacks_) {
    if (s.empty()) return true;
  }
  return false;
}

ByteSet Matcher::NextBytes() const {
  ByteSet out;
  for (const Stack& s : stacks_) {
    if (!s.empty()) out |= grammar_->set(grammar_->elements()[s.back()].index);
  }
  return out;
}

bool Matches(std::shared_ptr<const CompiledGrammar> grammar, absl::string_view text) {
  Matcher m(std::move(grammar));
  return m.AcceptBytes(text) && m.CanEnd();
}

}  // namespace pd::grammar
