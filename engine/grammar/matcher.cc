#include "engine/grammar/matcher.h"

#include <algorithm>
#include <array>
#include <bit>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "common/base/status_macros.h"
#include "engine/grammar/token_trie.h"

namespace pd::grammar {

namespace {

// The bits set in a mask. x86-64's baseline has no popcount instruction (the compiler calls
// a library routine per word: 15 us for a 128k vocabulary's mask), so the CPU is asked once.
#if defined(__x86_64__)
__attribute__((target("popcnt"))) size_t CountBitsPopcnt(const std::vector<uint32_t>& mask) {
  size_t n = 0;
  for (const uint32_t w : mask) n += static_cast<size_t>(__builtin_popcount(w));
  return n;
}
#endif

size_t CountBits(const std::vector<uint32_t>& mask) {
#if defined(__x86_64__)
  static const bool popcnt = __builtin_cpu_supports("popcnt");
  if (popcnt) return CountBitsPopcnt(mask);
#endif
  size_t n = 0;
  for (const uint32_t w : mask) n += static_cast<size_t>(std::popcount(w));
  return n;
}

}  // namespace

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
  for (uint32_t r = 0; r < grammar.num_rules(); ++r) {
    if (!out->starts_[r].empty()) out->rule_starts_.emplace_back(out->starts_[r][0], r);
  }
  // Bounded repeats, found by their shape (AddRepeat numbers a chain's levels upwards):
  // level 1 is `inner | ε`, level k is `inner opt_{k-1} | ε` with the same inner.
  std::vector<std::pair<uint32_t, uint32_t>> level(grammar.num_rules(), {UINT32_MAX, 0});
  std::vector<uint32_t> inner_of;  // per chain
  for (uint32_t r = 0; r < grammar.num_rules(); ++r) {
    const std::vector<Grammar::Sequence>& alts = grammar.alternatives(r);
    if (alts.size() != 2 || !alts[1].empty() || alts[0].empty() || alts[0].size() > 2) continue;
    const Grammar::Sequence& a = alts[0];
    if (a[0].kind != Element::Kind::kRule) continue;
    if (a.size() == 1) {
      level[r] = {static_cast<uint32_t>(out->repeat_chains_.size()), 1};
      out->repeat_chains_.emplace_back(2, 0);
      inner_of.push_back(a[0].index);
      continue;
    }
    if (a[1].kind != Element::Kind::kRule || a[1].index >= r) continue;
    const auto [chain, below] = level[a[1].index];
    if (chain == UINT32_MAX || inner_of[chain] != a[0].index) continue;
    std::vector<uint32_t>& levels = out->repeat_chains_[chain];
    if (levels.size() != below + 1) continue;  // (a level already taken: another chain's)
    const uint32_t entry = out->starts_[r][0] + 1;  // "then opt_{k-1}"
    level[r] = {chain, below + 1};
    levels.push_back(entry);
    out->repeat_entries_.emplace(entry, std::make_pair(chain, below + 1));
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(out));
}

uint32_t CompiledGrammar::CapRepeatLevel(uint32_t pos, size_t depth) const {
  const auto it = repeat_entries_.find(pos);
  if (it == repeat_entries_.end()) return pos;
  const auto [chain, k] = it->second;
  const size_t cap = depth + 2;
  if (k <= cap) return pos;
  return repeat_chains_[chain][cap];
}

uint32_t CompiledGrammar::RuleOf(uint32_t pos) const {
  const auto it = std::upper_bound(rule_starts_.begin(), rule_starts_.end(),
                                   std::make_pair(pos, UINT32_MAX));
  return it == rule_starts_.begin() ? UINT32_MAX : std::prev(it)->second;
}

std::optional<bool> CompiledGrammar::FindPlainRun(const std::vector<uint32_t>& key) const {
  absl::MutexLock lock(&plain_mu_);
  const auto it = plain_runs_.find(key);
  if (it == plain_runs_.end()) return std::nullopt;
  return it->second;
}

void CompiledGrammar::StorePlainRun(const std::vector<uint32_t>& key, bool accepts) const {
  absl::MutexLock lock(&plain_mu_);
  if (plain_runs_.size() >= kMaxPlainRunEntries) plain_runs_.clear();
  plain_runs_.emplace(key, accepts);
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
      step_of_(other.step_of_),
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
  // (The matcher's scratch vectors: Normalize runs once per new step, and does not nest.)
  std::vector<uint32_t>& work = normalize_work_;
  work.assign(1, id);
  // Each stack is expanded once per call (ambiguous grammars reach one stack many ways).
  // Linear search while small (the common case), a hash set once expansions grow.
  std::vector<uint32_t>& seen = normalize_seen_;
  seen.clear();
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
    if (!IsByteTop(s) || el[nodes_[s].pos].kind == Element::Kind::kBytes) {
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

const Matcher::State* Matcher::Step(uint32_t id) const {
  if (id < step_of_.size() && step_of_[id] != 0) return &steps_[step_of_[id] - 1];
  const std::vector<Element>& el = grammar_->elements();
  const uint32_t pos = nodes_[id].pos;
  const uint32_t parent = nodes_[id].parent;
  const uint32_t next = el[pos + 1].kind != Element::Kind::kEnd ? Intern(pos + 1, parent) : parent;
  State out;
  if (!Normalize(next, &out)) return nullptr;
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  // (Normalize may have interned nodes past `id`: size the index after it.)
  if (step_of_.size() < nodes_.size()) step_of_.resize(nodes_.size() + nodes_.size() / 2, 0);
  steps_.push_back(std::move(out));
  step_of_[id] = static_cast<uint32_t>(steps_.size());
  return &steps_.back();
}

int32_t Matcher::DfaId(const State& state) const {
  auto it = dfa_ids_.find(state);
  if (it != dfa_ids_.end()) return it->second;
  if (dfa_.size() >= kMaxDfaStates) return kDfaNoId;
  DfaState entry;
  entry.stacks = state;
  entry.accepts = NextBytesOf(state);
  State live;
  for (const uint32_t s : state) {
    if (s != 0 && IsPlaceholder(s)) {
      entry.placeholders.push_back(nodes_[s].pos - kPlaceholderBase);
    } else if (s != 0) {
      live.push_back(s);
    }
  }
  // The live part first (it may take an id of its own), then this state.
  if (live.size() != state.size() && !live.empty()) {
    entry.live = DfaId(live);
    if (dfa_.size() >= kMaxDfaStates) return kDfaNoId;
  }
  const auto id = static_cast<int32_t>(dfa_.size());
  if (live.size() == state.size()) entry.live = id;
  dfa_ids_.emplace(state, id);
  dfa_.push_back(std::move(entry));
  return id;
}

void Matcher::TrimDfa() const {
  if (dfa_.size() < kMaxDfaStates / 4 * 3) return;
  ClearDfa();
}

void Matcher::ClearDfa() const {
  dfa_.clear();
  dfa_rows_used_ = 0;  // (the chunks stay, for the states to come)
  dfa_ids_.clear();
}

int32_t* Matcher::DfaRow(int32_t id) const {
  int32_t& row = dfa_[static_cast<size_t>(id)].row;
  if (row < 0) {
    const size_t chunk = dfa_rows_used_ / kDfaRowsPerChunk;
    if (chunk == dfa_row_chunks_.size()) {
      dfa_row_chunks_.push_back(std::make_unique<std::array<int32_t, 256 * kDfaRowsPerChunk>>());
    }
    row = static_cast<int32_t>(dfa_rows_used_++);
    int32_t* out = RowAt(row);
    std::fill(out, out + 256, kDfaUnknown);
    return out;
  }
  return RowAt(row);
}

int32_t Matcher::DfaStep(int32_t id, uint8_t byte, State* next) const {
  // (Rows live in chunks that never move: `row` stays valid as the DFA grows below.)
  int32_t* row = DfaRow(id);
  if (row[byte] != kDfaUnknown) return row[byte];
  if (!dfa_[static_cast<size_t>(id)].accepts.test(byte)) {
    row[byte] = kDfaRefused;
    return kDfaRefused;
  }
  const State& from = dfa_[static_cast<size_t>(id)].stacks;
  bool overflow = false;
  int32_t result = kDfaRefused;
  // (Advance leaves dfa_ alone; DfaId, which may grow it, runs after the last use of `from`.)
  dfa_work_ += from.size();
  if (Advance(from, byte, next, &overflow)) result = DfaId(*next);
  if (result != kDfaNoId) row[byte] = result;
  return result;
}

bool Matcher::Advance(const State& from, uint8_t byte, State* to, bool* overflow) const {
  const std::vector<Element>& el = grammar_->elements();
  to->clear();
  size_t sources = 0;
  for (const uint32_t s : from) {
    if (!IsByteTop(s) || !grammar_->set(el[nodes_[s].pos].index).test(byte)) continue;
    const State* next = Step(s);
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

uint32_t Matcher::CommonTail(const State& state) const {
  if (state.size() < 2) return 0;
  auto depth = [&](uint32_t id) {
    size_t d = 0;
    for (; id != 0; id = nodes_[id].parent) ++d;
    return d;
  };
  uint32_t tail = state[0];
  size_t tail_depth = depth(tail);
  for (size_t i = 1; i < state.size() && tail != 0; ++i) {
    uint32_t other = state[i];
    size_t other_depth = depth(other);
    for (; other_depth > tail_depth; --other_depth) other = nodes_[other].parent;
    for (; tail_depth > other_depth; --tail_depth) tail = nodes_[tail].parent;
    while (tail != other) {
      tail = nodes_[tail].parent;
      other = nodes_[other].parent;
      --tail_depth;
    }
  }
  return tail;
}

Matcher::Position Matcher::position() const {
  Position p;
  p.stacks = state_;
  p.overflowed = overflowed_;
  return p;
}

void Matcher::Restore(const Position& position) {
  state_ = position.stacks;
  overflowed_ = position.overflowed;
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
    if (IsByteTop(s)) out |= grammar_->set(grammar_->elements()[nodes_[s].pos].index);
  }
  return out;
}

Matcher::WalkStats Matcher::Walk(const TokenTrie& trie, uint32_t root, const State& state,
                                 std::vector<uint32_t>* mask,
                                 std::vector<CachedTokenMask::Boundary>* boundaries,
                                 size_t max_work, size_t max_boundaries) const {
  WalkStats stats;
  const size_t work_before = dfa_work_;
  auto allow_tokens = [&](const TokenTrie::Node& node) {
    for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
      const auto token = static_cast<uint32_t>(trie.token_at(k));
      uint32_t& word = (*mask)[token >> 5];
      const uint32_t bit = 1u << (token & 31);
      stats.added += (word & bit) == 0 ? 1 : 0;
      word |= bit;
    }
  };
  // Drops the placeholders of `s` (recording where they were reached); false when nothing
  // that accepts bytes is left.
  auto split = [&](uint32_t node, State* s) {
    if (boundaries == nullptr) return true;
    size_t keep = 0;
    for (const uint32_t id : *s) {
      if (id != 0 && IsPlaceholder(id)) {
        boundaries->push_back({node, nodes_[id].pos - kPlaceholderBase});
      } else {
        (*s)[keep++] = id;
      }
    }
    s->resize(keep);
    return keep > 0;
  };
  // Depth-first over the trie, one matcher state per level; a subtree whose first byte the
  // state refuses is skipped whole.
  std::vector<WalkFrame>& stack = walk_stack_;
  stack.clear();
  // Frames are filled in place (GCC's maybe-uninitialized misfires on moved InlinedVectors).
  auto push = [&](uint32_t node, int32_t dfa, const State* s) {
    WalkFrame& f = stack.emplace_back();
    f.node = node;
    f.dfa = dfa;
    if (s != nullptr) f.state = *s;
  };
  {
    const int32_t id = DfaId(state);
    push(root, id, id == kDfaNoId ? &state : nullptr);
  }
  State next;
  while (!stack.empty()) {
    const uint32_t frame_node = stack.back().node;
    const int32_t frame_dfa = stack.back().dfa;
    State frame_state;
    if (frame_dfa < 0) frame_state = stack.back().state;
    stack.pop_back();
    ++stats.nodes;
    const TokenTrie::Node& node = trie.node(frame_node);
    const uint32_t end = node.first_child + node.num_children;
    if (frame_dfa >= 0) {
      // Only the children whose byte the state accepts get a step: a bit test skips the others
      // (an object's key takes `"` and whitespace, of ~250 children at the trie's root). (A
      // copy: DfaStep may grow dfa_.)
      const ByteSet accepts = dfa_[static_cast<size_t>(frame_dfa)].accepts;
      for (uint32_t c = node.first_child; c < end; ++c) {
        const TokenTrie::Node& child = trie.node(c);
        if (!accepts.test(child.byte)) continue;
        const int32_t to = DfaStep(frame_dfa, child.byte, &next);
        if (stats.nodes + dfa_work_ - work_before > max_work) {
          stats.complete = false;
          return stats;
        }
        if (to == kDfaRefused) continue;
        if (boundaries != nullptr && boundaries->size() > max_boundaries) {
          stats.complete = false;
          return stats;
        }
        allow_tokens(child);
        stats.max_stacks = std::max(
            stats.max_stacks, to >= 0 ? dfa_[static_cast<size_t>(to)].stacks.size() : next.size());
        if (child.num_children == 0) continue;  // (a leaf is no boundary either)
        if (to == kDfaNoId) {
          if (split(c, &next)) push(c, kDfaNoId, &next);
          continue;
        }
        const DfaState& after = dfa_[static_cast<size_t>(to)];
        if (boundaries != nullptr) {
          for (const uint32_t p : after.placeholders) boundaries->push_back({c, p});
        }
        if (after.live >= 0) {
          push(c, after.live, nullptr);
        } else if (after.live == kDfaNoId) {
          State live;
          for (const uint32_t id : after.stacks) {
            if (IsByteTop(id)) live.push_back(id);
          }
          push(c, kDfaNoId, &live);
        }
      }
      continue;
    }
    const ByteSet bytes = NextBytesOf(frame_state);
    for (uint32_t c = node.first_child; c < end; ++c) {
      const TokenTrie::Node& child = trie.node(c);
      if (!bytes.test(child.byte)) continue;
      bool overflow = false;
      dfa_work_ += frame_state.size();
      if (stats.nodes + dfa_work_ - work_before > max_work) {
        stats.complete = false;
        return stats;
      }
      if (!Advance(frame_state, child.byte, &next, &overflow)) continue;
      stats.max_stacks = std::max(stats.max_stacks, next.size());
      if (boundaries != nullptr && boundaries->size() > max_boundaries) {
        stats.complete = false;
        return stats;
      }
      allow_tokens(child);
      if (child.num_children > 0 && split(c, &next)) push(c, kDfaNoId, &next);
    }
  }
  return stats;
}

namespace {

// One stack cut at most Matcher::kCutDepth entries below its top (kMaxCutDeeper more when
// the cut goes deeper).
struct Cut {
  std::array<uint32_t, Matcher::kCutDepth + Matcher::kMaxCutDeeper> pos;  // positions, top first
  int len = 0;
  uint32_t below = 0;  // stack id below the cut; 0: the stack ends above it
};

// Past this many words a cut state's canonical form is not built (the state reaches most of
// a big grammar, and only its own grammar's cache can serve it).
constexpr size_t kMaxCanonicalWords = 16384;

// The canonical form of the grammar reachable from `cuts` (sorted, with placeholder numbers
// `tails`): every alternative tail and rule met, numbered in the order a walk from the cut
// stacks meets them, byte sets by content. Two cut states with equal forms accept the same
// byte strings from every stack, whatever grammar they come from. Empty when too big.
std::vector<uint32_t> CanonicalForm(const CompiledGrammar& g, absl::Span<const Cut> cuts,
                                    absl::Span<const uint32_t> tails) {
  const std::vector<Element>& el = g.elements();
  std::vector<uint32_t> out = {static_cast<uint32_t>(cuts.size())};
  absl::flat_hash_map<uint32_t, uint32_t> tail_ids;  // position -> number
  absl::flat_hash_map<uint32_t, uint32_t> rule_ids;
  absl::flat_hash_map<uint32_t, uint32_t> set_ids;
  std::vector<std::pair<bool, uint32_t>> queue;  // (is_rule, position or rule)
  std::vector<uint32_t> sets;
  auto tail_id = [&](uint32_t pos) {
    auto [it, added] = tail_ids.try_emplace(pos, static_cast<uint32_t>(tail_ids.size()));
    if (added) queue.emplace_back(false, pos);
    return it->second;
  };
  auto rule_id = [&](uint32_t rule) {
    auto [it, added] = rule_ids.try_emplace(rule, static_cast<uint32_t>(rule_ids.size()));
    if (added) queue.emplace_back(true, rule);
    return it->second;
  };
  for (size_t i = 0; i < cuts.size(); ++i) {
    out.push_back(static_cast<uint32_t>(cuts[i].len));
    for (int k = 0; k < cuts[i].len; ++k) out.push_back(tail_id(cuts[i].pos[static_cast<size_t>(k)]));
    out.push_back(tails[i]);
  }
  for (size_t q = 0; q < queue.size(); ++q) {
    if (out.size() > kMaxCanonicalWords) return {};
    const auto [is_rule, what] = queue[q];
    if (is_rule) {
      const std::vector<uint32_t>& starts = g.alternative_starts(what);
      out.push_back(0xFFFFFFFFu);
      out.push_back(static_cast<uint32_t>(starts.size()));
      // An empty alternative is its kEnd: a tail of no elements, numbered like any other.
      for (const uint32_t a : starts) out.push_back(tail_id(a));
      continue;
    }
    out.push_back(0xFFFFFFFEu);
    for (uint32_t p = what; el[p].kind != Element::Kind::kEnd; ++p) {
      if (el[p].kind == Element::Kind::kRule) {
        out.push_back(1);
        out.push_back(rule_id(el[p].index));
      } else {
        auto [it, added] = set_ids.try_emplace(el[p].index, static_cast<uint32_t>(sets.size()));
        if (added) sets.push_back(el[p].index);
        out.push_back(2);
        out.push_back(it->second);
      }
    }
  }
  for (const uint32_t set : sets) {
    const ByteSet& bits = g.set(set);
    for (int w = 0; w < 8; ++w) {
      uint32_t word = 0;
      for (int b = 0; b < 32; ++b) word |= static_cast<uint32_t>(bits.test(w * 32 + b)) << b;
      out.push_back(word);
    }
  }
  return out.size() > kMaxCanonicalWords ? std::vector<uint32_t>{} : out;
}

}  // namespace

size_t Matcher::AllowEndTokens(const TokenTrie& trie, const State& state,
                               std::vector<uint32_t>* mask) const {
  size_t added = 0;
  if (state.empty() || state.front() != 0) return 0;
  for (const int32_t t : trie.end_tokens()) {
    uint32_t& word = (*mask)[static_cast<size_t>(t) >> 5];
    const uint32_t bit = 1u << (static_cast<uint32_t>(t) & 31);
    added += (word & bit) == 0 ? 1 : 0;
    word |= bit;
  }
  return added;
}

size_t Matcher::FillTokenMaskUncached(const TokenTrie& trie, std::vector<uint32_t>* mask) const {
  TrimDfa();
  return WalkWhole(trie, state_, mask, false, nullptr);
}

size_t Matcher::WalkWhole(const TokenTrie& trie, const State& state, std::vector<uint32_t>* mask,
                          bool accumulate, size_t* max_stacks) const {
  if (!accumulate) mask->assign(trie.mask_words(), 0);
  size_t allowed = AllowEndTokens(trie, state, mask);
  if (!state.empty() && !(state.size() == 1 && state[0] == 0)) {
    const WalkStats stats = Walk(trie, 0, state, mask, nullptr);
    allowed += stats.added;
    if (max_stacks != nullptr) *max_stacks = std::max(*max_stacks, stats.max_stacks);
  }
  return allowed;
}

void Matcher::PlainClasses(int32_t id, int plain, std::vector<std::pair<ByteSet, int>>* classes,
                           std::vector<std::pair<ByteSet, int>>* split) const {
  // The plain bytes from each PlainStringStep state, by the state after them.
  static const auto* const kPlainClasses = [] {
    auto* classes = new std::array<std::array<ByteSet, kPlainStringStates>, kPlainStringStates>();
    for (int from = 0; from < kPlainStringStates; ++from) {
      for (int b = 0; b < 256; ++b) {
        const int to = PlainStringStep(from, static_cast<uint8_t>(b));
        if (to < 0) continue;
        (*classes)[static_cast<size_t>(from)][static_cast<size_t>(to)].set(static_cast<size_t>(b));
      }
    }
    return classes;
  }();
  // Bytes that the same stacks accept lead to the same state (a stack's step past its top
  // byte set does not depend on the byte): one step per class of (those stacks, the plain
  // state after the byte), found by splitting the plain classes by each stack's byte set.
  const std::vector<Element>& el = grammar_->elements();
  classes->clear();
  for (int to = 0; to < kPlainStringStates; ++to) {
    const ByteSet& bytes = (*kPlainClasses)[static_cast<size_t>(plain)][static_cast<size_t>(to)];
    if (bytes.any()) classes->emplace_back(bytes, to);
  }
  for (const uint32_t s : dfa_[static_cast<size_t>(id)].stacks) {
    if (!IsByteTop(s)) continue;
    const ByteSet& set = grammar_->set(el[nodes_[s].pos].index);
    split->clear();
    for (const auto& [bytes, to] : *classes) {
      const ByteSet in = bytes & set;
      if (in.none() || in == bytes) {
        split->emplace_back(bytes, to);
      } else {
        split->emplace_back(in, to);
        split->emplace_back(bytes & ~set, to);
      }
    }
    classes->swap(*split);
  }
}

bool Matcher::AcceptsEveryPlainRun(const State& cut, size_t max_steps, bool* dfa_full) const {
  const int32_t start = DfaId(cut);
  if (start < 0) {
    if (dfa_full != nullptr) *dfa_full = start == kDfaNoId;
    return false;
  }
  const int32_t live = dfa_[static_cast<size_t>(start)].live;
  if (live < 0) return false;
  // Pairs (DFA id of the live stacks, PlainStringStep state) met so far, and still to explore.
  absl::flat_hash_set<uint64_t> seen;
  std::vector<std::pair<int32_t, int>> pending = {{live, 0}};
  seen.insert(static_cast<uint64_t>(live) * kPlainStringStates);
  size_t steps = 0;
  State next;
  std::vector<std::pair<ByteSet, int>> classes;
  std::vector<std::pair<ByteSet, int>> split;
  while (!pending.empty()) {
    const auto [id, plain] = pending.back();
    pending.pop_back();
    PlainClasses(id, plain, &classes, &split);
    for (const auto& [bytes, plain_next] : classes) {
      if (++steps > max_steps) return false;
      size_t b = 0;
      while (!bytes.test(b)) ++b;
      const int32_t to = DfaStep(id, static_cast<uint8_t>(b), &next);
      if (to < 0) {  // refused (or the DFA is full)
        if (dfa_full != nullptr) *dfa_full = to == kDfaNoId;
        return false;
      }
      // Stacks that reached the cut drop out: a plain token is accepted when some stack
      // takes all of it, and the others do without going below. (None left, or no room for
      // them in the DFA: no.)
      const int32_t after = dfa_[static_cast<size_t>(to)].live;
      if (after < 0) return false;
      const uint64_t pair =
          static_cast<uint64_t>(after) * kPlainStringStates + static_cast<uint64_t>(plain_next);
      if (seen.insert(pair).second) pending.emplace_back(after, plain_next);
    }
  }
  return true;
}

int Matcher::PlainRunLimit(const State& cut) const {
  const int32_t start = DfaId(cut);
  if (start < 0) return -1;
  const int32_t live = dfa_[static_cast<size_t>(start)].live;
  if (live < 0) return -1;
  // Level by level (characters started): every pair (DFA id of the live stacks,
  // PlainStringStep state) of a level must take every plain byte, but at the level where all
  // of them, between characters, take none.
  std::vector<std::pair<int32_t, int>> level = {{live, 0}};
  std::vector<std::pair<int32_t, int>> next_level;
  std::vector<std::pair<int32_t, int>> pending;
  absl::flat_hash_set<uint64_t> seen;
  std::vector<int32_t> between;  // the level's ids between characters
  std::vector<std::pair<ByteSet, int>> classes;
  std::vector<std::pair<ByteSet, int>> split;
  State next;
  size_t steps = 0;
  // The state after the byte class, when it is accepted without reaching the cut; else
  // kDfaRefused (refused) or kDfaNoId (anything else: no answer).
  auto step = [&](int32_t id, const ByteSet& bytes) -> int32_t {
    size_t b = 0;
    while (!bytes.test(b)) ++b;
    const int32_t to = DfaStep(id, static_cast<uint8_t>(b), &next);
    if (to < 0) return to;
    const DfaState& after = dfa_[static_cast<size_t>(to)];
    if (!after.placeholders.empty() || after.live < 0) return kDfaNoId;
    return after.live;
  };
  for (int chars = 0; chars <= TokenTrie::kMaxPlainChars; ++chars) {
    // Inside characters: every continuation byte is taken, at this level.
    pending = level;
    seen.clear();
    between.clear();
    for (const auto& [id, plain] : pending) {
      seen.insert(static_cast<uint64_t>(id) * kPlainStringStates + static_cast<uint64_t>(plain));
    }
    while (!pending.empty()) {
      const auto [id, plain] = pending.back();
      pending.pop_back();
      if (plain == 0) {
        between.push_back(id);
        continue;
      }
      PlainClasses(id, plain, &classes, &split);
      for (const auto& [bytes, plain_next] : classes) {
        if (++steps > kMaxPlainLimitSteps) return -1;
        const int32_t to = step(id, bytes);
        if (to < 0) return -1;
        const uint64_t pair =
            static_cast<uint64_t>(to) * kPlainStringStates + static_cast<uint64_t>(plain_next);
        if (seen.insert(pair).second) pending.emplace_back(to, plain_next);
      }
    }
    // Between characters: a new character is taken in every way, or in none.
    size_t ended = 0;
    next_level.clear();
    for (const int32_t id : between) {
      PlainClasses(id, 0, &classes, &split);
      size_t refused = 0;
      for (const auto& [bytes, plain_next] : classes) {
        if (++steps > kMaxPlainLimitSteps) return -1;
        const int32_t to = step(id, bytes);
        if (to == kDfaNoId) return -1;
        if (to == kDfaRefused) {
          ++refused;
        } else {
          next_level.emplace_back(to, plain_next);
        }
      }
      if (refused == classes.size()) {
        ++ended;
      } else if (refused > 0) {
        return -1;
      }
    }
    if (ended > 0) return ended == between.size() ? chars : -1;
    std::sort(next_level.begin(), next_level.end());
    next_level.erase(std::unique(next_level.begin(), next_level.end()), next_level.end());
    // The same pairs again: runs of every length are taken (a string without a bound).
    if (next_level == level) return -1;
    level.swap(next_level);
  }
  return -1;
}

bool Matcher::SomeGroupAcceptsEveryPlainRun(const State& cut) const {
  // Each stack's entries above the cut, top first.
  std::vector<absl::InlinedVector<uint32_t, kCutDepth + 1>> chains;
  absl::flat_hash_map<uint32_t, uint32_t> shared;  // entry below a top -> stacks holding it
  for (const uint32_t s : cut) {
    auto& chain = chains.emplace_back();
    for (uint32_t id = s; id != 0 && !IsPlaceholder(id); id = nodes_[id].parent) {
      chain.push_back(id);
      if (id != s) ++shared[id];
    }
  }
  std::vector<std::pair<uint32_t, uint32_t>> groups;  // (stacks, shared entry)
  for (const auto& [entry, count] : shared) {
    if (count >= 2) groups.emplace_back(count, entry);
  }
  // The largest first; the deepest entry first among equals (it cuts least away).
  std::sort(groups.begin(), groups.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  });
  absl::flat_hash_set<uint32_t> tried;  // a group is tried once, under its deepest entry
  size_t tried_groups = 0;
  for (const auto& [count, entry] : groups) {
    if (tried_groups == kMaxPlainGroups) break;
    // The group's key: each member's positions down to (not including) the shared entry, a
    // separator after each, in a canonical order.
    std::vector<std::vector<uint32_t>> members;
    for (const auto& chain : chains) {
      const auto at = std::find(chain.begin(), chain.end(), entry);
      if (at == chain.end()) continue;
      std::vector<uint32_t>& m = members.emplace_back();
      for (auto it = chain.begin(); it != at; ++it) m.push_back(nodes_[*it].pos);
    }
    std::sort(members.begin(), members.end());
    members.erase(std::unique(members.begin(), members.end()), members.end());
    if (!tried.insert(static_cast<uint32_t>(absl::HashOf(members))).second) continue;
    ++tried_groups;
    std::vector<uint32_t> key;
    for (const auto& m : members) {
      key.insert(key.end(), m.begin(), m.end());
      key.push_back(UINT32_MAX);
    }
    std::optional<bool> known = grammar_->FindPlainRun(key);
    if (!known.has_value()) {
      // The group over a placeholder of its own in place of the shared entry.
      const uint32_t below = Intern(kPlaceholderBase + kMaxStacks + 1, 0);
      State group;
      for (const auto& m : members) {
        uint32_t id = below;
        for (auto it = m.rbegin(); it != m.rend(); ++it) id = Intern(*it, id);
        group.push_back(id);
      }
      std::sort(group.begin(), group.end());
      // The answer is kept, so it must not depend on this matcher's DFA: the search starts
      // with half the DFA free (no walk holds DFA ids here); one cut short by a full DFA is
      // searched again from an empty DFA, and that answer depends on the group alone (no
      // when the DFA fills even so: walk).
      if (dfa_.size() > kMaxDfaStates / 2) ClearDfa();
      bool dfa_full = false;
      const bool from_empty = dfa_.empty();
      known = AcceptsEveryPlainRun(group, kMaxGroupCheckSteps, &dfa_full);
      if (dfa_full && !from_empty) {
        ClearDfa();
        dfa_full = false;
        known = AcceptsEveryPlainRun(group, kMaxGroupCheckSteps, &dfa_full);
      }
      grammar_->StorePlainRun(key, *known);
      // (A search that filled the DFA leaves the walk after it room to build its states.)
      if (dfa_full) ClearDfa();
    }
    if (*known) return true;
  }
  return false;
}

const char* Matcher::MaskPathName(MaskPath path) {
  switch (path) {
    case MaskPath::kWholeManyStacks: return "whole (many stacks)";
    case MaskPath::kWholeManyHit: return "whole (many stacks), cached";
    case MaskPath::kWholeKnown: return "whole (known cheap)";
    case MaskPath::kWholeFirst: return "whole (first, cheap)";
    case MaskPath::kCutHit: return "cut, cached";
    case MaskPath::kCanonicalHit: return "cut, shared cache";
    case MaskPath::kCutWalked: return "cut, walked";
    case MaskPath::kCutFreeText: return "cut, free text";
    case MaskPath::kGroups: return "groups, merged";
    case MaskPath::kGroupsHit: return "groups, cached";
  }
  return "?";
}

bool Matcher::FreeTextMask(const TokenTrie& trie, const State& cut, CachedTokenMask* out) const {
  const int32_t id = DfaId(cut);
  if (id < 0) return false;
  State next;
  std::array<int32_t, 256> target{};
  absl::flat_hash_map<int32_t, int> votes;
  for (int b = 0; b < 256; ++b) {
    target[static_cast<size_t>(b)] = DfaStep(id, static_cast<uint8_t>(b), &next);
    if (target[static_cast<size_t>(b)] == kDfaNoId) return false;
    if (target[static_cast<size_t>(b)] >= 0) ++votes[target[static_cast<size_t>(b)]];
  }
  int32_t hub = -1;
  int most = 0;
  for (const auto& [state, n] : votes) {
    if (n > most || (n == most && state < hub)) hub = state, most = n;
  }
  if (most < 128) return false;
  // The byte values that move the hub, and the first bytes that do not lead to it and keep it.
  std::array<bool, 256> moves{};
  std::array<bool, 256> walk_first{};
  size_t num_moves = 0;
  size_t to_walk = 0;
  for (int b = 0; b < 256; ++b) {
    const int32_t h = DfaStep(hub, static_cast<uint8_t>(b), &next);
    if (h == kDfaNoId) return false;
    if (h != hub) {
      moves[static_cast<size_t>(b)] = true;
      to_walk += trie.tokens_with_byte(static_cast<uint8_t>(b)).size();
      if (++num_moves > kMaxFreeTextBytes) return false;
    }
    if (h != hub || target[static_cast<size_t>(b)] != hub) {
      walk_first[static_cast<size_t>(b)] = true;
      to_walk += trie.tokens_starting_with(static_cast<uint8_t>(b)).size();
    }
    if (to_walk > trie.vocab_size() / 4) return false;
  }
  // Whether `token` is accepted from DFA state `from`; nullopt when the DFA is full.
  auto accepts = [&](int32_t from, int32_t token) -> std::optional<bool> {
    for (const char c : trie.token_bytes(token)) {
      from = DfaStep(from, static_cast<uint8_t>(c), &next);
      if (from == kDfaNoId) return std::nullopt;
      if (from < 0) return false;
    }
    return true;
  };
  std::vector<uint32_t>& accepted = out->accepted;
  accepted = trie.bytes_mask();
  auto set = [&](int32_t t, bool on) {
    uint32_t& word = accepted[static_cast<size_t>(t) >> 5];
    const uint32_t bit = 1u << (t & 31);
    word = on ? (word | bit) : (word & ~bit);
  };
  // From the hub: every token, but those holding a moving byte are walked.
  for (int b = 0; b < 256; ++b) {
    if (!moves[static_cast<size_t>(b)]) continue;
    for (const int32_t t : trie.tokens_with_byte(static_cast<uint8_t>(b))) {
      const std::optional<bool> ok = accepts(hub, t);
      if (!ok.has_value()) return false;
      set(t, *ok);
    }
  }
  // From the cut state: as from the hub, but tokens whose first byte does not lead to the hub
  // and keep it are walked from the state itself.
  for (int b = 0; b < 256; ++b) {
    if (!walk_first[static_cast<size_t>(b)]) continue;
    for (const int32_t t : trie.tokens_starting_with(static_cast<uint8_t>(b))) {
      const std::optional<bool> ok = accepts(id, t);
      if (!ok.has_value()) return false;
      set(t, *ok);
    }
  }
  out->num_accepted = CountBits(accepted);
  return true;
}

std::vector<uint32_t> Matcher::WholeStateKey(const TokenTrie& trie, const State& state,
                                             uint32_t marker) const {
  // Every stack's positions, top to bottom, each list led by its length, the lists in order
  // (node ids are this matcher's own: another matcher of the grammar numbers them otherwise).
  std::vector<std::vector<uint32_t>> stacks;
  stacks.reserve(state.size());
  size_t words = 3;
  for (const uint32_t s : state) {
    std::vector<uint32_t>& positions = stacks.emplace_back();
    for (uint32_t id = s; id != 0; id = nodes_[id].parent) {
      positions.push_back(nodes_[id].pos);
      if (++words > kMaxWholeKeyWords) return {};
    }
    ++words;
  }
  std::sort(stacks.begin(), stacks.end());
  std::vector<uint32_t> key = {static_cast<uint32_t>(trie.id()),
                               static_cast<uint32_t>(trie.id() >> 32), marker};
  key.reserve(words);
  for (const auto& positions : stacks) {
    key.push_back(static_cast<uint32_t>(positions.size()));
    key.insert(key.end(), positions.begin(), positions.end());
  }
  return key;
}

size_t Matcher::FillManyStacksMask(const TokenTrie& trie, const State& state,
                                   std::vector<uint32_t>* mask, bool accumulate,
                                   size_t* max_stacks, bool only_cached) const {
  const std::vector<uint32_t> key = WholeStateKey(trie, state, kManyStacksKeyMarker);
  const bool cacheable = !key.empty();
  if (cacheable) {
    if (const auto part = grammar_->mask_cache().Find(key); part != nullptr) {
      last_mask_path_ = MaskPath::kWholeManyHit;
      if (max_stacks != nullptr) *max_stacks = std::max(*max_stacks, part->max_stacks);
      CopyOrMerge(part->accepted, accumulate, mask);
      return part->num_accepted + AllowEndTokens(trie, state, mask);
    }
  }
  if (only_cached) return kNotCached;
  last_mask_path_ = MaskPath::kWholeManyStacks;
  auto computed = std::make_shared<CachedTokenMask>();
  computed->accepted.assign(trie.mask_words(), 0);
  const WalkStats stats = Walk(trie, 0, state, &computed->accepted, nullptr);
  computed->num_accepted = stats.added;
  computed->max_stacks = stats.max_stacks;
  if (max_stacks != nullptr) *max_stacks = std::max(*max_stacks, stats.max_stacks);
  CopyOrMerge(computed->accepted, accumulate, mask);
  const size_t allowed = computed->num_accepted + AllowEndTokens(trie, state, mask);
  if (cacheable) grammar_->mask_cache().Store(key, std::move(computed));
  return allowed;
}

bool Matcher::MayWalkCheaply(const TokenTrie& trie, const State& state) const {
  const ByteSet first = NextBytesOf(state);
  const TokenTrie::Node& root = trie.node(0);
  size_t taken = 0;
  for (uint32_t c = root.first_child; c < root.first_child + root.num_children; ++c) {
    taken += first.test(trie.node(c).byte) ? 1 : 0;
  }
  // (The walk expands about the subtrees of the first bytes taken: their share of the trie.)
  return taken * trie.num_nodes() <= kMaxWalkEstimate * root.num_children;
}

size_t Matcher::FillStateMask(const TokenTrie& trie, const State& state,
                              std::vector<uint32_t>* mask, bool accumulate, size_t* max_stacks,
                              bool only_cached) const {
  // A state of many stacks (a value inside an anyOf of many objects: one stack per branch)
  // is cut shallow first, and stacks whose parts above the cut are equal are one stack over
  // a placeholder for all their tails: the parts, not the stacks, are walked.
  const bool many = state.size() > kMaxCutStacks;
  // Where stacks share what lies below (inside a JSON string: its closing quote and all
  // that follows), the cut goes just below the shared entry: it keeps the key free of the
  // context, and tokens reach the cut only once they leave the shared entry (the string).
  const uint32_t shared = CommonTail(state);
  std::shared_ptr<const CachedTokenMask> part;
  // Placeholder i stands for the stacks below[i] (one, but for states of many stacks).
  std::vector<absl::InlinedVector<uint32_t, 1>> below;
  size_t largest_below = 1;
  // Stacks that share an entry are first cut above it (deeper -1): the entry and all below it
  // are one placeholder, so the key is the stacks' own parts (a value's alternatives, whatever
  // member of whatever object they belong to: the next value of the same type hits, in this
  // grammar or, by canonical form, another). Where more than kMaxShallowBoundaries trie nodes
  // reach that placeholder (inside a string: every token that closes it), the cut goes below
  // the entry as before.
  const int first = shared != 0 && !many ? -1 : 0;
  for (int deeper = first;; ++deeper) {
    // A cut that almost every token crosses (CachedTokenMask::cut_deeper) goes `deeper`
    // entries further down.
    uint32_t common = shared;
    for (int d = 0; d <= deeper && common != 0; ++d) common = nodes_[common].parent;
    // (A cut at kCutDepth goes `deeper` entries further down too: inside a string whose
    // regex nests, a URI's authority and path, the string's own entries reach past it.)
    const int depth =
        many ? std::min(kCutDepth, kManyCutDepth + deeper) : kCutDepth + std::max(deeper, 0);
    const int max_depth = many ? kCutDepth : kCutDepth + kMaxCutDeeper;
    bool can_go_deeper = false;  // some stack was cut above max_depth, at `common` or `depth`
    absl::InlinedVector<Cut, 8> cuts;
    for (const uint32_t s : state) {
      if (s == 0) continue;  // a complete sentence: the end tokens, added below
      Cut cut;
      uint32_t id = s;
      while (id != 0 && id != common && cut.len < depth) {
        cut.pos[static_cast<size_t>(cut.len++)] =
            IsPlaceholder(id) ? nodes_[id].pos
                              : grammar_->CapRepeatLevel(nodes_[id].pos, trie.max_token_bytes());
        id = nodes_[id].parent;
      }
      cut.below = id;
      if (id != 0 && (id == common || cut.len == depth) && cut.len < max_depth &&
          deeper < kMaxCutDeeper) {
        can_go_deeper = true;
      }
      cuts.push_back(cut);
    }
    // (A stack whose top is the shared entry would go on below at once, from the trie's root:
    // no cut above the entry then.)
    if (deeper < 0 && std::any_of(cuts.begin(), cuts.end(),
                                  [](const Cut& c) { return c.len == 0 && c.below != 0; })) {
      continue;
    }
    std::sort(cuts.begin(), cuts.end(), [](const Cut& a, const Cut& b) {
      if (a.len != b.len) return a.len < b.len;
      for (int i = 0; i < a.len; ++i) {
        if (a.pos[static_cast<size_t>(i)] != b.pos[static_cast<size_t>(i)]) {
          return a.pos[static_cast<size_t>(i)] < b.pos[static_cast<size_t>(i)];
        }
      }
      return a.below < b.below;
    });
    // The key lists, per stack, the grammar positions above the cut and what lies below: the
    // empty stack, or placeholder i (numbered by first appearance, so stacks that share what
    // lies below share the placeholder).
    std::vector<uint32_t> key = {static_cast<uint32_t>(trie.id()),
                                 static_cast<uint32_t>(trie.id() >> 32),
                                 static_cast<uint32_t>(cuts.size())};
    below.clear();
    largest_below = 1;
    absl::InlinedVector<uint32_t, 8> tails;  // per cut: its placeholder, or UINT32_MAX
    // Each cut's stacks below (sorted; equal parts above merged when `many`).
    std::vector<absl::InlinedVector<uint32_t, 1>> tails_of;
    {
      size_t kept = 0;
      for (size_t i = 0; i < cuts.size(); ++i) {
        const bool same_part = many && kept > 0 && cuts[i].below != 0 &&
                               cuts[kept - 1].below != 0 && cuts[i].len == cuts[kept - 1].len &&
                               std::equal(cuts[i].pos.begin(), cuts[i].pos.begin() + cuts[i].len,
                                          cuts[kept - 1].pos.begin());
        if (same_part) {
          if (tails_of.back().back() != cuts[i].below) tails_of.back().push_back(cuts[i].below);
          continue;
        }
        cuts[kept++] = cuts[i];
        tails_of.emplace_back();
        if (cuts[i].below != 0) tails_of.back().push_back(cuts[i].below);
      }
      cuts.resize(kept);
    }
    // Merging did not make the state small (an object's key position, each stack a name of
    // its own): walk it whole.
    if (many && (cuts.size() > kMaxMergedCuts || cuts.size() * 2 > state.size())) {
      return FillManyStacksMask(trie, state, mask, accumulate, max_stacks, only_cached);
    }
    key[2] = static_cast<uint32_t>(cuts.size());
    for (size_t i = 0; i < cuts.size(); ++i) {
      const Cut& cut = cuts[i];
      key.push_back(static_cast<uint32_t>(cut.len));
      key.insert(key.end(), cut.pos.begin(), cut.pos.begin() + cut.len);
      uint32_t tail = UINT32_MAX;
      if (!tails_of[i].empty()) {
        const auto it = std::find(below.begin(), below.end(), tails_of[i]);
        tail = static_cast<uint32_t>(it - below.begin());
        if (it == below.end()) {
          below.push_back(tails_of[i]);
          largest_below = std::max(largest_below, tails_of[i].size());
        }
      }
      key.push_back(tail);
      tails.push_back(tail);
    }
    part = grammar_->mask_cache().Find(key);
    last_mask_path_ = MaskPath::kCutHit;
    if (part != nullptr && part->cut_deeper) {
      if (can_go_deeper) continue;
      part = nullptr;  // (another grammar's marker at a cut this one cannot lower)
    }
    if (part != nullptr && part->walk_whole) {
      if (many) return FillManyStacksMask(trie, state, mask, accumulate, max_stacks, only_cached);
      last_mask_path_ = MaskPath::kWholeKnown;
      return WalkWhole(trie, state, mask, accumulate, max_stacks);
    }
    // Merged stacks: a token the part accepts leaves as many stacks as the part's walk
    // held times the tails merged; past kMaxStacks the matcher refuses it, so walk whole.
    if (part != nullptr && !part->cut_deeper && part->max_stacks * largest_below > kMaxStacks) {
      return FillManyStacksMask(trie, state, mask, accumulate, max_stacks, only_cached);
    }
    if (part == nullptr && only_cached) return kNotCached;
    if (part == nullptr && deeper == first && !many && MayWalkCheaply(trie, state)) {
      last_mask_path_ = MaskPath::kWholeFirst;
      // First met in this grammar: most states (outside strings) are cheap to walk whole. Try
      // that within a budget; the cache is for the others.
      // (Bits a walk that stops early set are tokens the state accepts: kept when merging.)
      if (!accumulate) mask->assign(trie.mask_words(), 0);
      const size_t ends = AllowEndTokens(trie, state, mask);
      const WalkStats whole = Walk(trie, 0, state, mask, nullptr, kMinCachedWalk);
      if (whole.complete) {
        if (max_stacks != nullptr) *max_stacks = std::max(*max_stacks, whole.max_stacks);
        auto marker = std::make_shared<CachedTokenMask>();
        marker->walk_whole = true;
        grammar_->mask_cache().Store(key, std::move(marker));
        return ends + whole.added;
      }
    }
    std::vector<uint32_t> canonical;
    if (part == nullptr) {
      canonical = CanonicalForm(*grammar_, cuts, tails);
      if (!canonical.empty()) part = trie.mask_cache().Find(canonical);
      if (part != nullptr && part->cut_deeper && !can_go_deeper) part = nullptr;
      if (part != nullptr) grammar_->mask_cache().Store(key, part);
      if (part != nullptr && part->cut_deeper) continue;
      if (part != nullptr && part->max_stacks * largest_below > kMaxStacks) {
        return FillManyStacksMask(trie, state, mask, accumulate, max_stacks, only_cached);
      }
      last_mask_path_ = MaskPath::kCanonicalHit;
    }
    if (part == nullptr) {
      last_mask_path_ = MaskPath::kCutWalked;
      // Walk the cut state: its stacks rebuilt over placeholder nodes.
      auto computed = std::make_shared<CachedTokenMask>();
      computed->accepted.assign(trie.mask_words(), 0);
      State cut_state;
      for (size_t i = 0; i < cuts.size(); ++i) {
        uint32_t base = tails[i] == UINT32_MAX ? 0 : Intern(kPlaceholderBase + tails[i], 0);
        for (int k = cuts[i].len - 1; k >= 0; --k) {
          base = Intern(cuts[i].pos[static_cast<size_t>(k)], base);
        }
        if (IsPlaceholder(base)) {
          // A stack cut at its top continues below at once: from the trie's root.
          computed->boundaries.push_back({0, tails[i]});
        } else {
          cut_state.push_back(base);
        }
      }
      std::sort(cut_state.begin(), cut_state.end());
      cut_state.erase(std::unique(cut_state.begin(), cut_state.end()), cut_state.end());
      std::sort(computed->boundaries.begin(), computed->boundaries.end(),
                [](const auto& a, const auto& b) { return a.placeholder < b.placeholder; });
      computed->boundaries.erase(
          std::unique(computed->boundaries.begin(), computed->boundaries.end(),
                      [](const auto& a, const auto& b) { return a.placeholder == b.placeholder; }),
          computed->boundaries.end());
      // (Only with nothing below the cut: a token walked on its own cannot go on below it.)
      const bool free_text = below.empty() && !cut_state.empty() && trie.rest() != nullptr &&
                             FreeTextMask(trie, cut_state, computed.get());
      if (free_text) last_mask_path_ = MaskPath::kCutFreeText;
      // Inside a string the cut state usually accepts every plain run without reaching the cut:
      // then the plain tokens are all accepted, and only the others (the rest trie, ~4% of a
      // vocabulary) are walked; the part's boundaries are nodes of the rest trie.
      const TokenTrie* walked = &trie;
      int plain_limit = -1;  // a bounded string: the plain tokens of at most this many chars
      if (!free_text && computed->boundaries.empty() && !cut_state.empty() &&
          trie.rest() != nullptr &&
          // (Above a shared entry the stacks are one group: searched with a group's budget.)
          (SomeGroupAcceptsEveryPlainRun(cut_state) ||
           AcceptsEveryPlainRun(cut_state,
                                deeper < 0 ? kMaxGroupCheckSteps : kMaxPlainCheckSteps) ||
           (plain_limit = PlainRunLimit(cut_state)) >= 0)) {
        walked = trie.rest();
        computed->rest_trie = true;
      }
      // (A free-text mask is kept in the caches: walked whole it would cost the full trie.)
      size_t nodes = free_text ? kMinCachedWalk : 0;
      if (!cut_state.empty() && !free_text) {
        const WalkStats stats =
            Walk(*walked, 0, cut_state, &computed->accepted, &computed->boundaries, SIZE_MAX,
                 deeper < 0              ? kMaxShallowBoundaries
                 : can_go_deeper || many ? kMaxBoundaries
                                         : SIZE_MAX);
        if (!stats.complete && !can_go_deeper) {
          // (Only for many stacks: cut as deep as it goes, and still crossed by almost every
          // token. Walk such a state whole.)
          auto marker = std::make_shared<CachedTokenMask>();
          marker->walk_whole = true;
          grammar_->mask_cache().Store(key, std::move(marker));
          return FillManyStacksMask(trie, state, mask, accumulate, max_stacks, only_cached);
        }
        if (!stats.complete) {
          // Almost every token crosses this cut: remember to cut deeper, here and for every
          // grammar whose cut state has this form.
          auto marker = std::make_shared<CachedTokenMask>();
          marker->cut_deeper = true;
          if (!canonical.empty()) trie.mask_cache().Store(canonical, marker);
          grammar_->mask_cache().Store(key, std::move(marker));
          continue;
        }
        computed->num_accepted = stats.added;
        computed->max_stacks = std::max(cut_state.size(), stats.max_stacks);
        nodes = stats.nodes;
      }
      if (computed->rest_trie) {
        const std::vector<uint32_t>& plain =
            plain_limit >= 0 ? trie.plain_mask_upto(plain_limit) : trie.plain_mask();
        for (size_t w = 0; w < computed->accepted.size(); ++w) computed->accepted[w] |= plain[w];
        computed->num_accepted +=
            plain_limit >= 0 ? trie.num_plain_upto(plain_limit) : trie.num_plain();
      }
      part = computed;
      if (computed->max_stacks * largest_below > kMaxStacks) {
        // (Kept: the next state that merges fewer tails may use it.)
        if (!canonical.empty()) trie.mask_cache().Store(canonical, computed);
        grammar_->mask_cache().Store(key, std::move(computed));
        return FillManyStacksMask(trie, state, mask, accumulate, max_stacks, only_cached);
      }
      if (nodes < kMinCachedWalk && !computed->rest_trie && !many) {
        // The cut walk is short though the whole one was not (the long part lies below the
        // cut): the cut saves nothing here, walk the whole state next time.
        auto marker = std::make_shared<CachedTokenMask>();
        marker->walk_whole = true;
        grammar_->mask_cache().Store(key, std::move(marker));
      } else {
        if (!canonical.empty()) trie.mask_cache().Store(canonical, computed);
        grammar_->mask_cache().Store(key, std::move(computed));
      }
    }
    break;
  }
  if (part->rest_trie) ++plain_universal_masks_;
  CopyOrMerge(part->accepted, accumulate, mask);
  size_t allowed = part->num_accepted + AllowEndTokens(trie, state, mask);
  if (max_stacks != nullptr) {
    *max_stacks = std::max(*max_stacks, part->max_stacks * largest_below);
  }
  // Below the cut: walk on from each boundary with the real stack there, expanded once per
  // placeholder.
  absl::InlinedVector<std::optional<State>, 4> resumed(below.size());
  last_mask_boundaries_ += part->boundaries.size();
  for (const CachedTokenMask::Boundary& b : part->boundaries) {
    std::optional<State>& from = resumed[b.placeholder];
    if (!from.has_value()) {
      from.emplace();
      for (const uint32_t tail : below[b.placeholder]) {
        if (!Normalize(tail, &*from) || from->size() > kMaxStacks * 4) {
          // Too ambiguous to expand: the uncached walk refuses what the matcher would.
          return WalkWhole(trie, state, mask, accumulate, max_stacks);
        }
      }
      std::sort(from->begin(), from->end());
      from->erase(std::unique(from->begin(), from->end()), from->end());
      from->erase(std::remove(from->begin(), from->end(), 0u), from->end());
    }
    if (!from->empty()) {
      const WalkStats stats =
          Walk(part->rest_trie ? *trie.rest() : trie, b.trie_node, *from, mask, nullptr);
      allowed += stats.added;
      if (max_stacks != nullptr) {
        *max_stacks = std::max(*max_stacks, std::max(from->size(), stats.max_stacks));
      }
    }
  }
  return allowed;
}

size_t Matcher::FillTokenMask(const TokenTrie& trie, std::vector<uint32_t>* mask) const {
  if (steps_.capacity() < kMaskMemoReserve) {
    // A matcher that masks builds thousands of steps and stack entries in its first masks:
    // room for them at once rather than by doubling (a matcher that only checks bytes,
    // Matches, keeps its maps small).
    steps_.reserve(kMaskMemoReserve);
    intern_.reserve(2 * kMaskMemoReserve);
    dfa_ids_.reserve(kMaskMemoReserve / 2);
  }
  TrimDfa();
  last_mask_boundaries_ = 0;
  if (state_.size() >= kMinGroupStacks) {
    // A state met before is one part (cached); a new one of many stacks is split.
    const size_t allowed = FillStateMask(trie, state_, mask, false, nullptr, true);
    if (allowed != kNotCached) return allowed;
    // A state merged from its groups before: its whole mask, under its stacks' positions.
    const std::vector<uint32_t> key = WholeStateKey(trie, state_, kGroupsKeyMarker);
    const auto hit = key.empty() ? nullptr : grammar_->mask_cache().Find(key);
    if (hit != nullptr) {
      last_mask_path_ = MaskPath::kGroupsHit;
      *mask = hit->accepted;
      return hit->num_accepted;
    }
    if (const std::optional<size_t> merged = FillGroupsMask(trie, mask); merged.has_value()) {
      if (last_mask_path_ == MaskPath::kGroups && !key.empty()) {
        auto whole = std::make_shared<CachedTokenMask>();
        whole->accepted = *mask;
        whole->num_accepted = *merged;
        grammar_->mask_cache().Store(key, std::move(whole));
      }
      return *merged;
    }
  }
  return FillStateMask(trie, state_, mask, false, nullptr, false);
}

std::optional<size_t> Matcher::FillGroupsMask(const TokenTrie& trie,
                                              std::vector<uint32_t>* mask) const {
  // Group the stacks by the rule of their entry just above the deepest one they all share (an
  // object's key position: one group per name still to come, one for the other keys).
  const uint32_t tail = CommonTail(state_);
  std::vector<std::pair<uint32_t, uint32_t>> grouped;  // (the group's rule, stack)
  grouped.reserve(state_.size());
  // (Stacks that are all one entry over the tail are the alternatives of one position, such
  // as a string's next character: one cut part serves them.)
  bool deep = false;
  for (const uint32_t s : state_) deep = deep || (s != 0 && s != tail && nodes_[s].parent != tail);
  if (!deep) return std::nullopt;
  bool repeat = false;
  for (const uint32_t s : state_) {
    if (s == 0) continue;  // a complete sentence: the end tokens, added below
    uint32_t entry = s;
    while (entry != tail && nodes_[entry].parent != tail) entry = nodes_[entry].parent;
    repeat = repeat || (!IsPlaceholder(entry) && grammar_->IsRepeatLevel(nodes_[entry].pos));
    grouped.emplace_back(IsPlaceholder(entry) ? nodes_[entry].pos
                                              : grammar_->RuleOf(nodes_[entry].pos),
                         s);
  }
  std::stable_sort(grouped.begin(), grouped.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t num_groups = 0;
  for (size_t i = 0; i < grouped.size(); ++i) {
    num_groups += (i == 0 || grouped[i].first != grouped[i - 1].first) ? 1 : 0;
  }
  if (num_groups < 2 || (num_groups == 2 && repeat)) return std::nullopt;
  mask->assign(trie.mask_words(), 0);
  AllowEndTokens(trie, state_, mask);
  // A token is accepted from the state exactly when some group accepts it, unless the
  // state's stacks would pass kMaxStacks on the way where no group's do: so the groups' most
  // stacks must sum within the bound (they do but for pathological ambiguity).
  size_t stacks = 0;
  State group;
  for (size_t i = 0; i < grouped.size();) {
    group.clear();
    size_t j = i;
    for (; j < grouped.size() && grouped[j].first == grouped[i].first; ++j) {
      group.push_back(grouped[j].second);
    }
    i = j;
    size_t most = group.size();
    FillStateMask(trie, group, mask, true, &most, false);
    stacks += most;
    if (stacks > kMaxStacks) {
      last_mask_boundaries_ = 0;
      return FillStateMask(trie, state_, mask, false, nullptr, false);
    }
  }
  last_mask_path_ = MaskPath::kGroups;
  return CountBits(*mask);
}

void Matcher::CopyOrMerge(const std::vector<uint32_t>& part, bool accumulate,
                          std::vector<uint32_t>* mask) {
  if (!accumulate) {
    *mask = part;
    return;
  }
  for (size_t w = 0; w < part.size(); ++w) (*mask)[w] |= part[w];
}

bool Matches(std::shared_ptr<const CompiledGrammar> grammar, absl::string_view text) {
  Matcher m(std::move(grammar));
  return m.AcceptBytes(text) && m.CanEnd();
}

}  // namespace pd::grammar
