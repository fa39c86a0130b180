#include "loadtest/workload.h"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pd::loadtest {
namespace {

class SyntheticWorkload final : public Workload {
 public:
  explicit SyntheticWorkload(const SyntheticOptions& o) : o_(o), rng_(o.seed) {}
  absl::string_view name() const override { return "synthetic"; }
  std::optional<int64_t> size() const override { return std::nullopt; }

  bool Next(RequestSpec* out) override {
    out->index = next_++;
    out->prompt.clear();
    const int64_t input_len = o_.input_len.Sample(rng_);
    out->output_len = o_.output_len.Sample(rng_);
    AppendBlock(BlockKey(KeyDomain::kUniquePrompt, o_.seed, static_cast<uint64_t>(out->index)),
                input_len, o_.vocab, &out->prompt);
    out->arrival_offset.reset();
    out->source_line = 0;
    return true;
  }

 private:
  const SyntheticOptions o_;
  std::mt19937_64 rng_;
  int64_t next_ = 0;
};

class SharedPrefixWorkload final : public Workload {
 public:
  explicit SharedPrefixWorkload(const SharedPrefixOptions& o)
      : o_(o), rng_(o.seed), order_(static_cast<size_t>(o.num_prefixes * o.suffixes_per_prefix)) {
    std::iota(order_.begin(), order_.end(), 0);
    pos_ = order_.size();  // shuffle on first use
  }
  absl::string_view name() const override { return "shared_prefix"; }
  std::optional<int64_t> size() const override { return std::nullopt; }

  bool Next(RequestSpec* out) override {
    if (pos_ == order_.size()) {
      std::shuffle(order_.begin(), order_.end(), rng_);
      pos_ = 0;
    }
    const int64_t item = order_[pos_++];
    const uint64_t p = static_cast<uint64_t>(item / o_.suffixes_per_prefix);
    const uint64_t s = static_cast<uint64_t>(item % o_.suffixes_per_prefix);
    out->index = next_++;
    out->prompt.clear();
    out->prompt.reserve(static_cast<size_t>(o_.prefix_len + o_.suffix_len));
    AppendBlock(BlockKey(KeyDomain::kSharedPrefix, o_.seed, p), o_.prefix_len, o_.vocab,
                &out->prompt);
    AppendBlock(BlockKey(KeyDomain::kSharedSuffix, o_.seed, p, s), o_.suffix_len, o_.vocab,
                &out->prompt);
    out->output_len = o_.output_len.Sample(rng_);
    out->arrival_offset.reset();
    out->source_line = 0;
    return true;
  }

 private:
  const SharedPrefixOptions o_;
  std::mt19937_64 rng_;
  std::vector<int64_t> order_;  // pool items (p * S + s) in this pass's order
  size_t pos_ = 0;
  int64_t next_ = 0;
};

class MultiTurnWorkload final : public Workload {
 public:
  explicit MultiTurnWorkload(const MultiTurnOptions& o)
      : o_(o), rng_(o.seed), slots_(static_cast<size_t>(o.num_conversations)) {
    AppendBlock(BlockKey(KeyDomain::kChatSystem, o_.seed), o_.system_prompt_len, o_.vocab,
                &system_prompt_);
    for (int64_t i = 0; i < o_.num_conversations; ++i) {
      by_last_use_.push_back(i);
    }
  }
  absl::string_view name() const override { return "multi_turn"; }
  std::optional<int64_t> size() const override { return std::nullopt; }

  bool Next(RequestSpec* out) override {
    // The next slot: a uniform draw among the least recently used half. A slot just used
    // waits at least floor(C / 2) requests, C on average, and the order has no period that a
    // round-robin router could align with.
    const size_t half = (by_last_use_.size() + 1) / 2;
    const size_t pick = std::uniform_int_distribution<size_t>(0, half - 1)(rng_);
    const int64_t slot = by_last_use_[pick];
    by_last_use_.erase(by_last_use_.begin() + static_cast<std::ptrdiff_t>(pick));
    by_last_use_.push_back(slot);
    Conversation& c = slots_[static_cast<size_t>(slot)];
    const int64_t user_len = o_.user_len.Sample(rng_);
    const int64_t output_len = o_.output_len.Sample(rng_);
    const bool capped = o_.max_prompt_len > 0 &&
                        static_cast<int64_t>(c.history.size()) + user_len > o_.max_prompt_len;
    if (!c.started || c.turn >= o_.num_turns || capped) {
      // A new conversation in this slot. Create() checked that its first turn fits the cap.
      c.started = true;
      c.id = next_conversation_++;
      c.turn = 0;
      c.history = system_prompt_;
    }
    const uint64_t id = static_cast<uint64_t>(c.id);
    const uint64_t turn = static_cast<uint64_t>(c.turn);
    AppendBlock(BlockKey(KeyDomain::kChatUser, o_.seed, id, turn), user_len, o_.vocab, &c.history);
    out->index = next_++;
    out->prompt = c.history;
    out->output_len = output_len;
    out->arrival_offset.reset();
    out->source_line = 0;
    AppendBlock(BlockKey(KeyDomain::kChatReply, o_.seed, id, turn), output_len, o_.vocab,
                &c.history);
    ++c.turn;
    return true;
  }

 private:
  struct Conversation {
    bool started = false;
    int64_t id = 0;
    int64_t turn = 0;               // turns sent
    std::vector<uint32_t> history;  // the next turn's prompt, without its user message
  };

  const MultiTurnOptions o_;
  std::mt19937_64 rng_;
  std::vector<uint32_t> system_prompt_;
  std::vector<Conversation> slots_;
  std::deque<int64_t> by_last_use_;  // slot indices, least recently used first
  int64_t next_ = 0;
  int64_t next_conversation_ = 0;
};

class TraceWorkload final : public Workload {
 public:
  TraceWorkload(Trace trace, const TraceWorkloadOptions& o) : trace_(std::move(trace)), o_(o) {}
  absl::string_view name() const override { return "trace"; }
  std::optional<int64_t> size() const override {
    return static_cast<int64_t>(trace_.records.size());
  }

  bool Next(RequestSpec* out) override {
    if (next_ >= trace_.records.size()) {
      return false;
    }
    const TraceRecord& r = trace_.records[next_];
    out->index = static_cast<int64_t>(next_++);
    out->prompt = SynthesizeTracePrompt(r.hash_ids, r.input_length, o_.block_tokens, o_.vocab);
    out->output_len = r.output_length;
    out->arrival_offset = r.arrival_offset;
    out->source_line = r.line_number;
    return true;
  }

 private:
  const Trace trace_;
  const TraceWorkloadOptions o_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Workload>> MakeSyntheticWorkload(const SyntheticOptions& options) {
  PD_RETURN_IF_ERROR(options.vocab.Validate());
  return std::make_unique<SyntheticWorkload>(options);
}

absl::StatusOr<std::unique_ptr<Workload>> MakeSharedPrefixWorkload(const SharedPrefixOptions& o) {
  PD_RETURN_IF_ERROR(o.vocab.Validate());
  if (o.num_prefixes < 1 || o.suffixes_per_prefix < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_prefixes and --suffixes_per_prefix must be >= 1, got ", o.num_prefixes,
                     " and ", o.suffixes_per_prefix));
  }
  if (o.num_prefixes * o.suffixes_per_prefix > 100'000'000) {
    return absl::InvalidArgumentError("--num_prefixes x --suffixes_per_prefix exceeds 1e8");
  }
  if (o.prefix_len < 1 || o.suffix_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefix_len must be >= 1 and --suffix_len >= 0, got ", o.prefix_len, " and ",
                     o.suffix_len));
  }
  return std::make_unique<SharedPrefixWorkload>(o);
}

absl::StatusOr<std::unique_ptr<Workload>> MakeMultiTurnWorkload(const MultiTurnOptions& o) {
  PD_RETURN_IF_ERROR(o.vocab.Validate());
  if (o.num_conversations < 1 || o.num_conversations > 1'000'000 || o.num_turns < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_conversations must be in [1, 1000000] and --num_turns >= 1, got ",
                     o.num_conversations, " and ", o.num_turns));
  }
  if (o.system_prompt_len < 0 || o.max_prompt_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--system_prompt_len and --max_input_len must be >= 0, got ",
                     o.system_prompt_len, " and ", o.max_prompt_len));
  }
  if (o.max_prompt_len > 0 && o.system_prompt_len + o.user_len.max() > o.max_prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a first turn (--system_prompt_len ", o.system_prompt_len, " + --user_len up to ",
        o.user_len.max(), ") does not fit --max_input_len ", o.max_prompt_len));
  }
  return std::make_unique<MultiTurnWorkload>(o);
}

absl::StatusOr<std::unique_ptr<Workload>> MakeTraceWorkload(Trace trace,
                                                            const TraceWorkloadOptions& options) {
  PD_RETURN_IF_ERROR(options.vocab.Validate());
  if (options.block_tokens < 1) {
    return absl::InvalidArgumentError("trace block size must be >= 1");
  }
  return std::make_unique<TraceWorkload>(std::move(trace), options);
}

}  // namespace pd::loadtest
