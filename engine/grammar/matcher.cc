#include "engine/grammar/matcher.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/base/status_macros.h"
#include "engine/grammar/token_trie.h"

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
  nodes_.push_back(Node{0, 0});  // id 0: the empty stack
  if (!Normalize(Intern(grammar_->start(), 0), &state_)) {
    // More than kMaxStacks ways to start: nothing is accepted, and overflowed() says why.
    state_.clear();
    overflowed_ = true;
    return;
  }
  std::sort(state_.begin(), state_.end());
  state_.erase(std::unique(state_.begin(), state_.end()), state_.end());
}

Matcher::Matcher(const Matcher& other)
    : grammar_(other.grammar_),
      nodes_(other.nodes_),
      intern_(other.intern_),
      steps_(other.steps_),
      state_(other.state_),
      overflowed_(other.overflowed_) {}

uint32_t Matcher::Intern(uint32_t pos, uint32_t parent) const {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | parent;
  auto [it, inserted] = intern_.try_emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (inserted) nodes_.push_back(Node{pos, parent});
  return it->second;
}

bool Matcher::Normalize(uint32_t id, State* out) const {
  const std::vector<Element>& el = grammar_->elements();
  std::vector<uint32_t> work{id};
  // Each stack is expanded once per call (ambiguous grammars reach one stack many ways).
  // Linear search while small (the common case), a hash set once expansions grow.
  std::vector<uint32_t> seen;
  absl::flat_hash_set<uint32_t> seen_set;
  while (!work.empty()) {
    const uint32_t s = work.back();
    work.pop_back();
    if (seen_set.empty()) {
      if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
      seen.push_back(s);
      if (seen.size() > 32) seen_set.insert(seen.begin(), seen.end());
    } else {
      if (!seen_set.insert(s).second) continue;
      seen.push_back(s);
    }
    if (s == 0 || el[nodes_[s].pos].kind == Element::Kind::kBytes) {
      out->push_back(s);
      if (out->size() > kMaxStacks) return false;
      continue;
    }
    // Top is a rule reference: replace it by its continuation, then push each alternative.
    const uint32_t pos = nodes_[s].pos;
    const uint32_t parent = nodes_[s].parent;
    const uint32_t base =
        el[pos + 1].kind != Element::Kind::kEnd ? Intern(pos + 1, parent) : parent;
    for (const uint32_t a : grammar_->alternative_starts(el[pos].index)) {
      work.push_back(el[a].kind != Element::Kind::kEnd ? Intern(a, base) : base);
    }
    if (nodes_.size() > kMaxNodes || seen.size() > kMaxStacks * 4) return false;
  }
  return true;
}

const Matcher::State* Matcher::Step(uint32_t id, uint8_t byte) const {
  const uint64_t key = (static_cast<uint64_t>(id) << 8) | byte;
  auto it = steps_.find(key);
  if (it != steps_.end()) return &it->second;
  const std::vector<Element>& el = grammar_->elements();
  const uint32_t pos = nodes_[id].pos;
  const uint32_t parent = nodes_[id].parent;
  const uint32_t next = el[pos + 1].kind != Element::Kind::kEnd ? Intern(pos + 1, parent) : parent;
  State out;
  if (!Normalize(next, &out)) return nullptr;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return &steps_.emplace(key, std::move(out)).first->second;
}

int32_t Matcher::QuickStep(uint32_t id, uint8_t byte) const {
  if (quick_.size() <= id) quick_.resize(nodes_.size());
  if (!quick_[id]) {
    quick_[id] = std::make_unique<std::array<int32_t, 256>>();
    quick_[id]->fill(kUnknown);
  }
  int32_t& slot = (*quick_[id])[byte];
  if (slot != kUnknown) return slot;
  int32_t result = kRefused;
  if (id != 0 && grammar_->set(grammar_->elements()[nodes_[id].pos].index).test(byte)) {
    const State* next = Step(id, byte);
    if (next != nullptr && next->size() == 1) {
      result = static_cast<int32_t>((*next)[0]);
    } else if (next != nullptr) {
      result = kSeveral;
    }
  }
  // Step may have grown quick_ (through nodes_): index again.
  (*quick_[id])[byte] = result;
  return result;
}

bool Matcher::Advance(const State& from, uint8_t byte, State* to, bool* overflow) const {
  const std::vector<Element>& el = grammar_->elements();
  to->clear();
  size_t sources = 0;
  for (const uint32_t s : from) {
    if (s == 0 || !grammar_->set(el[nodes_[s].pos].index).test(byte)) continue;
    const State* next = Step(s, byte);
    if (next == nullptr) {
      *overflow = true;
      return false;
    }
    if (sources++ == 0) {
      *to = *next;
    } else {
      to->insert(to->end(), next->begin(), next->end());
    }
  }
  if (to->empty()) return false;
  if (sources > 1) {
    std::sort(to->begin(), to->end());
    to->erase(std::unique(to->begin(), to->end()), to->end());
  }
  if (to->size() > kMaxStacks) {
    *overflow = true;
    return false;
  }
  return true;
}

bool Matcher::AcceptByte(uint8_t byte) {
  State next;
  bool overflow = false;
  if (!Advance(state_, byte, &next, &overflow)) {
    overflowed_ = overflow;
    return false;
  }
  overflowed_ = false;
  state_ = std::move(next);
  return true;
}

bool Matcher::AcceptBytes(absl::string_view bytes) {
  State saved = state_;
  for (const char c : bytes) {
    if (!AcceptByte(static_cast<uint8_t>(c))) {
      state_ = std::move(saved);
      return false;
    }
  }
  return true;
}

bool Matcher::CanEnd() const { return !state_.empty() && state_.front() == 0; }

ByteSet Matcher::NextBytes() const { return NextBytesOf(state_); }

ByteSet Matcher::NextBytesOf(const State& state) const {
  ByteSet out;
  for (const uint32_t s : state) {
    if (s != 0) out |= grammar_->set(grammar_->elements()[nodes_[s].pos].index);
  }
  return out;
}

size_t Matcher::FillTokenMask(const TokenTrie& trie, std::vector<uint32_t>* mask) const {
  mask->assign(trie.mask_words(), 0);
  size_t allowed = 0;
  auto allow = [&](int32_t token) {
    uint32_t& word = (*mask)[static_cast<size_t>(token) >> 5];
    const uint32_t bit = 1u << (static_cast<uint32_t>(token) & 31);
    if ((word & bit) == 0) {
      word |= bit;
      ++allowed;
    }
  };
  if (CanEnd()) {
    for (const int32_t t : trie.end_tokens()) allow(t);
  }
  // Depth-first over the trie, one matcher state per level; a subtree whose first byte the
  // state refuses is skipped whole. A state of one stack (the common case) steps by table.
  struct Frame {
    uint32_t node;
    State state;
  };
  std::vector<Frame> stack;
  stack.push_back({0, state_});
  State next;
  while (!stack.empty()) {
    Frame frame = std::move(stack.back());
    stack.pop_back();
    const TokenTrie::Node& node = trie.node(frame.node);
    const uint32_t end = node.first_child + node.num_children;
    if (frame.state.size() == 1) {
      const uint32_t id = frame.state[0];
      for (uint32_t c = node.first_child; c < end; ++c) {
        const TokenTrie::Node& child = trie.node(c);
        const int32_t q = QuickStep(id, child.byte);
        if (q == kRefused) continue;
        for (uint32_t k = child.tokens_begin; k < child.tokens_end; ++k) allow(trie.token_at(k));
        if (child.num_children == 0) continue;
        if (q >= 0) {
          stack.push_back({c, State{static_cast<uint32_t>(q)}});
        } else {
          stack.push_back({c, *Step(id, child.byte)});
        }
      }
      continue;
    }
    const ByteSet bytes = NextBytesOf(frame.state);
    for (uint32_t c = node.first_child; c < end; ++c) {
      const TokenTrie::Node& child = trie.node(c);
      if (!bytes.test(child.byte)) continue;
      bool overflow = false;
      if (!Advance(frame.state, child.byte, &next, &overflow)) continue;
      for (uint32_t k = child.tokens_begin; k < child.tokens_end; ++k) allow(trie.token_at(k));
      if (child.num_children > 0) stack.push_back({c, next});
    }
  }
  return allowed;
}

bool Matches(std::shared_ptr<const CompiledGrammar> grammar, absl::string_view text) {
  Matcher m(std::move(grammar));
  return m.AcceptBytes(text) && m.CanEnd();
}

}  // namespace pd::grammar
