#include "loadtest/workload.h"

#include <algorithm>
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

absl::StatusOr<std::unique_ptr<Workload>> MakeTraceWorkload(Trace trace,
                                                            const TraceWorkloadOptions& options) {
  PD_RETURN_IF_ERROR(options.vocab.Validate());
  if (options.block_tokens < 1) {
    return absl::InvalidArgumentError("trace block size must be >= 1");
  }
  return std::make_unique<TraceWorkload>(std::move(trace), options);
}

}  // namespace pd::loadtest
