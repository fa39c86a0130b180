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
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/token_trie.h"

namespace pd::grammar {

// A validated grammar, flattened for matching. Immutable but for its token-mask cache
// (thread-safe); shared by every matcher of it.
class CompiledGrammar {
 public:
  // Most bytes of cached token masks one grammar keeps (past it, the least recently used
  // go): 2 MiB, about 128 masks of a 128k vocabulary.
  static constexpr size_t kMaxMaskCacheBytes = size_t{2} << 20;

  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar);

  // Flattened alternatives: each ends with an Element of kind kEnd.
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<uint32_t>& alternative_starts(uint32_t rule) const { return starts_[rule]; }
  const ByteSet& set(uint32_t index) const { return sets_[index]; }
  // Position of the synthetic start element (a reference to the root followed by kEnd).
  uint32_t start() const { return 0; }
  // The rule whose alternative holds position `pos` (UINT32_MAX for the start element).
  uint32_t RuleOf(uint32_t pos) const;
  // Cached mask parts of this grammar, by the grammar positions of a cut state (Matcher).
  const TokenMaskCache& mask_cache() const { return masks_; }
  // Whether a group of stacks (by its grammar positions: Matcher::SomeGroupAcceptsEveryPlainRun)
  // accepts every plain run: answers already found by any matcher of this grammar.
  // Thread-safe.
  std::optional<bool> FindPlainRun(const std::vector<uint32_t>& key) const;
  void StorePlainRun(const std::vector<uint32_t>& key, bool accepts) const;
  // Most answers kept (past it, all are dropped and found again).
  static constexpr size_t kMaxPlainRunEntries = 16384;

  // Bounded repeats (Grammar::AddRepeat: opt_k ::= inner opt_{k-1} | ε) put one stack entry
  // per level: "then up to k-1 more". A token of `depth` bytes or fewer cannot tell two levels
  // above depth + 1 apart, so for masks the entry at `pos` may stand for its level capped at
  // depth + 2: the cut states of a long string's positions (`maxLength` 4096) are then one
  // state, cached once. Returns `pos` itself when it is no such entry or its level is lower.
  uint32_t CapRepeatLevel(uint32_t pos, size_t depth) const;
  // `pos` is such an entry (of any level).
  bool IsRepeatLevel(uint32_t pos) const { return repeat_entries_.contains(pos); }

  // Approximate bytes held, without the mask cache (for caches that bound their memory).
  size_t ByteSize() const {
    size_t n = elements_.size() * sizeof(Element) + sets_.size() * sizeof(ByteSet);
    for (const auto& s : starts_) n += s.size() * sizeof(uint32_t) + sizeof(s);
    return n;
  }

 private:
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> starts_;
  // (first position, rule) of every rule with alternatives, by position.
  std::vector<std::pair<uint32_t, uint32_t>> rule_starts_;
  std::vector<ByteSet> sets_;
  // Bounded repeats: a level-k entry's position -> (its chain, k); per chain, the position of
  // its level-k entry at [k] (0 where a level has none).
  absl::flat_hash_map<uint32_t, std::pair<uint32_t, uint32_t>> repeat_entries_;
  std::vector<std::vector<uint32_t>> repeat_chains_;
  TokenMaskCache masks_{kMaxMaskCacheBytes};
  mutable absl::Mutex plain_mu_;
  mutable absl::flat_hash_map<std::vector<uint32_t>, bool> plain_runs_ ABSL_GUARDED_BY(plain_mu_);
};

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

  // A point of the input to come back to (speculative decoding walks proposed tokens ahead
  // and back). Valid for this matcher and its copies made after it was taken.
  class Position {
   private:
    friend class Matcher;
    absl::InlinedVector<uint32_t, 4> stacks;
    bool overflowed = false;
  };
  Position position() const;
  void Restore(const Position& position);

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
  // Masks this matcher took from a cut state that accepts every plain run (FillTokenMask).
  size_t plain_universal_masks() const { return plain_universal_masks_; }
  size_t num_stacks() const { return state_.size(); }
  // How the last FillTokenMask computed its mask (for benchmarks: where the time goes).
  enum class MaskPath {
    kWholeManyStacks,  // more than kMaxCutStacks stacks: walked whole (then cached)
    kWholeManyHit,     // ... the same whole state met before in this grammar: cached
    kWholeKnown,       // a state this grammar walks whole (cached marker)
    kWholeFirst,       // first met, and cheap enough to walk whole
    kCutHit,           // the cut state's part came from this grammar's cache
    kCanonicalHit,     // ... from the tokenizer's cache (another grammar's)
    kCutWalked,        // the cut state was walked (then cached)
    kCutFreeText,      // the cut state is free text (FreeTextMask; then cached)
    kGroups,           // the union of its groups' masks (FillGroupsMask; then cached)
    kGroupsHit,        // ... the same whole state merged before in this grammar: cached
  };
  static constexpr int kNumMaskPaths = 10;
  static const char* MaskPathName(MaskPath path);
  MaskPath last_mask_path() const { return last_mask_path_; }
  // Walks from below a cut that the last FillTokenMask made (each boundary of a cached part
  // costs one: a measure of how well the cut was placed).
  size_t last_mask_boundaries() const { return last_mask_boundaries_; }

  // The token mask: sets bit t of `mask` (trie.mask_words() words) for every token t whose
  // bytes this matcher accepts from its current state, and the end tokens when CanEnd().
  // Returns the number of tokens allowed.
  //
  // How (docs/structured-outputs.md, "Token masks"): most of a mask does not depend on the
  // whole stack. Inside a JSON string every token that does not close the string is allowed
  // or refused whatever the string belongs to. So the stacks are cut just below the deepest
  // entry they all share (the string's closing quote), at most kCutDepth entries down; what
  // lies below becomes placeholders; and the trie walk of that cut state is cached: in the
  // CompiledGrammar under its grammar positions, and in the TokenTrie under the canonical form
  // of the grammar it reaches, so one schema's strings serve every other schema's. A hit costs
  // a copy of the cached bitmask plus walks of the subtrees where a token reached a
  // placeholder (tokens that close the string and go on), from the real stack below. States
  // that are cheap to walk whole (most, outside strings) are walked whole and not cached.
  // A new state of many stacks (an object's key position) is masked as the union of its
  // groups of stacks, each cut and cached on its own (FillGroupsMask); the union is cached
  // under the whole state's positions.
  // The walk itself runs a lazy DFA over matcher states. The result is the same as
  // FillTokenMaskUncached's, bit for bit (tested on the shared schema set).
  size_t FillTokenMask(const TokenTrie& trie, std::vector<uint32_t>* mask) const;
  // The same mask by one walk of the trie from the whole state (the reference).
  size_t FillTokenMaskUncached(const TokenTrie& trie, std::vector<uint32_t>* mask) const;
  // Most stack entries kept above the cut. The cut goes just below the deepest entry all
  // stacks share when that is nearer (inside a JSON string: its closing quote), so the key
  // does not reach into the context. (A cut that almost every token crosses goes deeper, up to
  // kMaxCutDeeper entries past this, below.)
  static constexpr int kCutDepth = 4;
  // States of more stacks than this are walked whole (the cut would split the kMaxStacks
  // bound's accounting, and such ambiguity is rare), and their masks cached in the grammar
  // under the whole state's positions (an object's key positions: the next request with the
  // same schema meets the same states).
  static constexpr size_t kMaxCutStacks = 64;
  // ... are cut this many entries down first (then deeper, as above), and stacks with equal
  // parts above the cut share one placeholder for all their tails.
  static constexpr int kManyCutDepth = 2;
  // ... unless more parts than this stay after merging, or more than half the stacks: then
  // the state is walked whole.
  static constexpr size_t kMaxMergedCuts = 128;
  // A cut state whose walk reaches the cut at more trie nodes than this is cut again one
  // stack entry deeper (each boundary costs a walk from the real stack on every mask), at
  // most kMaxCutDeeper times (a string of minLength 1 is cut after its first character).
  static constexpr size_t kMaxBoundaries = 1024;
  static constexpr int kMaxCutDeeper = 3;
  // Stacks that share an entry are cut above it first (the key is then their own parts: a
  // value's alternatives, whatever follows them); when more trie nodes than this reach that
  // cut, it goes below the entry (inside a string every token that closes it would cross).
  static constexpr size_t kMaxShallowBoundaries = 256;
  // A state of this many stacks or more whose mask is not cached as a whole is split into
  // groups of stacks, each masked as above (cut, cached), and the masks merged, when it makes
  // at least two groups (FillGroupsMask).
  static constexpr size_t kMinGroupStacks = 8;
  // States whose walk costs less work than this (Walk) are walked whole each time rather than
  // cached (a 128k vocabulary's mask is 16 KiB; a short walk is cheaper).
  static constexpr size_t kMinCachedWalk = 2048;
  // A state is not tried whole first when the trie nodes below the first bytes it takes
  // (estimated as their share of the trie) pass this: inside a string, where most first bytes
  // are taken, the try would stop at kMinCachedWalk and be thrown away.
  static constexpr size_t kMaxWalkEstimate = 8 * kMinCachedWalk;

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
  // Cut placeholders are nodes whose position is kPlaceholderBase + their number: a stack
  // that pops down to one stops there (Normalize keeps it as a top that accepts no byte).
  static constexpr uint32_t kPlaceholderBase = 0x80000000u;
  bool IsPlaceholder(uint32_t id) const { return nodes_[id].pos >= kPlaceholderBase; }
  // A top that accepts bytes: not the empty stack, not a placeholder.
  bool IsByteTop(uint32_t id) const { return id != 0 && !IsPlaceholder(id); }
  // The deepest stack entry every stack of `state` shares (0: none, or fewer than 2 stacks).
  uint32_t CommonTail(const State& state) const;
  // Depth-first walk of the trie below `node` from `state`, setting the bits of the tokens
  // accepted. A step that reaches a placeholder is recorded in *boundaries (which must then
  // be non-null) when the node has children.
  // It stops once its work (nodes expanded, plus stacks stepped to extend the DFA) passes
  // `max_work` (complete = false: the mask is partial).
  struct WalkStats {
    size_t added = 0;  // bits newly set
    size_t nodes = 0;  // trie nodes expanded
    size_t max_stacks = 0;  // the most stacks a state reached by a byte held
    bool complete = true;
  };
  // It also stops (complete = false) once it has recorded more than `max_boundaries`.
  WalkStats Walk(const TokenTrie& trie, uint32_t node, const State& state,
                 std::vector<uint32_t>* mask, std::vector<CachedTokenMask::Boundary>* boundaries,
                 size_t max_work = SIZE_MAX, size_t max_boundaries = SIZE_MAX) const;

  // The cut state `cut` (no stack cut at its top) accepts every run of plain string bytes
  // (PlainStringStep, from between characters) with a stack that stays above the cut (stacks
  // that reach a placeholder drop out: the others take the plain token whole): explored over
  // pairs of its DFA states and PlainStringStep states, at most kMaxPlainCheckSteps DFA steps
  // (past that, or with the DFA full, the answer is no; *dfa_full then says which).
  bool AcceptsEveryPlainRun(const State& cut, size_t max_steps = kMaxPlainCheckSteps,
                            bool* dfa_full = nullptr) const;
  static constexpr size_t kMaxPlainCheckSteps = 2048;
  // A string of bounded length (`maxLength`): the cut state accepts exactly the plain runs
  // that start at most r characters, without reaching the cut; returns r (then the plain
  // tokens of at most r characters, TokenTrie::plain_mask_upto, are accepted at once), or -1.
  // Explored level by level over pairs of its DFA states and PlainStringStep states, at most
  // kMaxPlainLimitSteps steps.
  int PlainRunLimit(const State& cut) const;
  static constexpr size_t kMaxPlainLimitSteps = 8192;
  // The classes of plain bytes from PlainStringStep state `plain` that the stacks of DFA
  // state `id` do not tell apart (each: the bytes, the plain state after them).
  void PlainClasses(int32_t id, int plain, std::vector<std::pair<ByteSet, int>>* classes,
                    std::vector<std::pair<ByteSet, int>>* split) const;
  // Free text (a structural tag's text between triggers): the cut state `cut` (nothing below
  // the cut) sends most byte values to one DFA state, the hub, which all but at most
  // kMaxFreeTextBytes byte values keep where it is (free text: the trigger's first byte moves
  // it). Then a token is accepted from `cut` as from the hub when its first byte goes to the
  // hub and stays there, and from the hub unless it holds a byte that moves it: the mask is
  // every token with bytes, less those holding a moving byte or starting with another byte
  // (TokenTrie::tokens_with_byte / tokens_starting_with), which are walked one by one. A few
  // percent of a vocabulary instead of the whole trie. Fills out->accepted / num_accepted;
  // false (then walk) when the state is not such, the DFA is full, or the tokens to walk are
  // more than a quarter of the vocabulary.
  bool FreeTextMask(const TokenTrie& trie, const State& cut, CachedTokenMask* out) const;
  static constexpr int kMaxFreeTextBytes = 16;
  // Before the whole cut state, its groups: stacks that share an entry X above the cut (an
  // object's other-key trie, say, beside its named keys' literals) accept every plain run
  // when, with X taken as a cut, they do by themselves; and then so does the whole state.
  // Such a group is the same at every key of an object and in every request: its answer is
  // kept in the grammar (FindPlainRun) under its positions down to X, and found once, with
  // this larger bound. At most kMaxPlainGroups groups (the largest) are tried.
  bool SomeGroupAcceptsEveryPlainRun(const State& cut) const;
  static constexpr size_t kMaxGroupCheckSteps = 16384;
  static constexpr size_t kMaxPlainGroups = 3;
  // FillTokenMask of `state`, which need not be the matcher's. With `accumulate` the mask's
  // bits are added to *mask (mask_words() words) and the count returned is not the mask's;
  // *max_stacks (when not null) is raised to the most stacks a state of the walks held.
  // With `only_cached`, a state whose mask is not cached (nor known cheap to walk) is left
  // alone: kNotCached is returned and *mask untouched.
  size_t FillStateMask(const TokenTrie& trie, const State& state, std::vector<uint32_t>* mask,
                       bool accumulate, size_t* max_stacks, bool only_cached) const;
  // Whether a whole walk of `state` may stay within kMinCachedWalk (kMaxWalkEstimate).
  bool MayWalkCheaply(const TokenTrie& trie, const State& state) const;
  static constexpr size_t kNotCached = SIZE_MAX;
  // A state is accepted from exactly where one of its stacks is, so its mask is the union of
  // its stacks' masks, grouped: by the rule of their entry just above the deepest one all
  // stacks share. At an object's key position that makes a group for the names still to
  // come (one per name, or one for a trie of names) and one for the other keys, instead of a
  // new state at each position; the alternatives of one rule (a key trie's node) stay
  // together, so a group that takes every plain run as a whole still does. Exact while the
  // groups' most stacks sum within kMaxStacks (else the whole state is masked). nullopt
  // (nothing done) when the state makes one group, or two of which one is a bounded repeat's
  // (a string of maxLength: its next characters and its end, better masked whole, where
  // PlainRunLimit takes its short plain tokens at once), or its stacks all lie one entry over
  // their shared one (the alternatives of one position, such as a string's next character:
  // one cut part serves them).
  std::optional<size_t> FillGroupsMask(const TokenTrie& trie, std::vector<uint32_t>* mask) const;
  static void CopyOrMerge(const std::vector<uint32_t>& part, bool accumulate,
                          std::vector<uint32_t>* mask);
  // The whole walk of `state` (FillTokenMaskUncached's), for FillStateMask.
  size_t WalkWhole(const TokenTrie& trie, const State& state, std::vector<uint32_t>* mask,
                   bool accumulate, size_t* max_stacks) const;
  // The key of a whole state's mask in the grammar's cache: `marker` (one no cut key has
  // after the trie's id), then every stack's positions; empty when longer than
  // kMaxWholeKeyWords words.
  static constexpr uint32_t kManyStacksKeyMarker = 0xFFFFFFFDu;
  static constexpr uint32_t kGroupsKeyMarker = 0xFFFFFFFEu;
  std::vector<uint32_t> WholeStateKey(const TokenTrie& trie, const State& state,
                                      uint32_t marker) const;
  // FillStateMask for a state of more than kMaxCutStacks stacks: walked whole, cached in the
  // grammar under all its positions (when they fit kMaxWholeKeyWords words).
  size_t FillManyStacksMask(const TokenTrie& trie, const State& state,
                            std::vector<uint32_t>* mask, bool accumulate, size_t* max_stacks,
                            bool only_cached) const;
  static constexpr size_t kMaxWholeKeyWords = 16384;
  // Sets the end tokens' bits when `state` is a complete sentence; returns how many were
  // newly set.
  size_t AllowEndTokens(const TokenTrie& trie, const State& state,
                        std::vector<uint32_t>* mask) const;
  struct WalkFrame {
    uint32_t node;
    int32_t dfa;  // the state's DFA id, or kDfaNoId: then `state` holds it
    State state;
  };
  mutable std::vector<WalkFrame> walk_stack_;
  // Steps the maps hold room for from the first mask on.
  static constexpr size_t kMaskMemoReserve = 2048;
  mutable std::vector<uint32_t> normalize_work_;
  mutable std::vector<uint32_t> normalize_seen_;
  // Expands stack `id` until every top is a byte set (or the stack is empty), into `out`.
  bool Normalize(uint32_t id, State* out) const;
  // The stacks after stack `id`'s top takes a byte it accepts (the same for each such
  // byte), memoized; valid until the next Step.
  const State* Step(uint32_t id) const;
  // The trie walk runs a lazy DFA over whole states: a state seen before has an id, and its
  // step over a byte is a table lookup after the first time. At most kMaxDfaStates states get
  // an id (1 KiB of table each); past that, a walk carries the states themselves.
  static constexpr size_t kMaxDfaStates = 4096;
  static constexpr int32_t kDfaRefused = -1;  // no stack accepts the byte
  static constexpr int32_t kDfaNoId = -2;     // accepted, but the DFA is full: Advance again
  static constexpr int32_t kDfaUnknown = -3;
  struct DfaState {
    State stacks;  // sorted; may hold placeholders and the empty stack
    absl::InlinedVector<uint32_t, 2> placeholders;  // the placeholder numbers among them
    // The id of the stacks among them that accept bytes: -1 none, kDfaNoId no room.
    int32_t live = -1;
    // Its row of next ids (DfaRow) in the chunks: -1 before its first step.
    int32_t row = -1;
    // The bytes some stack's top accepts (NextBytesOf): any other byte is refused without a
    // step, and a walk visits only the trie children these bytes lead to.
    ByteSet accepts;
  };
  // The id of `state` (sorted), or kDfaNoId when the DFA is full.
  int32_t DfaId(const State& state) const;
  // Empties the DFA once it is three-quarters full, so that the next walk builds the states it
  // needs instead of stepping whole states for good (the states a generation visits drift: an
  // object's keys, then its values). Only between walks: a walk holds DFA ids.
  void TrimDfa() const;
  void ClearDfa() const;
  // The row of DFA state `id` (256 next ids), made (all kDfaUnknown) on first use.
  int32_t* DfaRow(int32_t id) const;
  // The id of the state after `byte` from DFA state `id`: kDfaRefused, or kDfaNoId (then
  // *next holds the state).
  int32_t DfaStep(int32_t id, uint8_t byte, State* next) const;
  // The state after `byte` from `from`; false when no stack accepts it or a bound is hit
  // (then *overflow is set).
  bool Advance(const State& from, uint8_t byte, State* to, bool* overflow) const;
  ByteSet NextBytesOf(const State& state) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  mutable std::vector<Node> nodes_;
  mutable absl::flat_hash_map<uint64_t, uint32_t> intern_;
  // Step's memo: the stacks after stack id's top (a byte set) takes a byte do not depend on
  // which byte it was, so they are kept per stack id: step_of_[id] is 1 + their index in
  // steps_, 0 before the first step.
  mutable std::vector<uint32_t> step_of_;
  mutable std::vector<State> steps_;
  mutable std::vector<DfaState> dfa_;
  // The DFA states' rows of next ids (256, by byte), handed out in order; the chunks are kept
  // when the DFA is emptied.
  static constexpr size_t kDfaRowsPerChunk = 32;
  mutable std::vector<std::unique_ptr<std::array<int32_t, 256 * kDfaRowsPerChunk>>> dfa_row_chunks_;
  mutable size_t dfa_rows_used_ = 0;
  int32_t* RowAt(int32_t row) const {
    const auto r = static_cast<size_t>(row);
    return dfa_row_chunks_[r / kDfaRowsPerChunk]->data() + (r % kDfaRowsPerChunk) * 256;
  }
  mutable absl::flat_hash_map<State, int32_t> dfa_ids_;
  mutable size_t dfa_work_ = 0;  // stacks stepped to extend the DFA, ever (a work measure)
  State state_;
  bool overflowed_ = false;
  mutable size_t plain_universal_masks_ = 0;
  mutable MaskPath last_mask_path_ = MaskPath::kWholeFirst;
  mutable size_t last_mask_boundaries_ = 0;
};

// Whole-string match: `text` is a sentence of the grammar.
bool Matches(std::shared_ptr<const CompiledGrammar> grammar, absl::string_view text);

}  // namespace pd::grammar
