#include "engine/scheduler/window_policy.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::engine {

absl::Status WindowPolicy::ValidateTokens(int64_t sink_tokens, int64_t window_tokens) {
  if (sink_tokens < 0 || window_tokens < 0 || (sink_tokens > 0 && window_tokens == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler: kv_sink_tokens (", sink_tokens,
                                                   ") and kv_window_tokens (", window_tokens,
                                                   ") must be >= 0, and sinks need a window > 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WindowPolicy> WindowPolicy::Create(int64_t sink_tokens, int64_t window_tokens,
                                                  int64_t block_size, int64_t context_tokens) {
  PD_RETURN_IF_ERROR(ValidateTokens(sink_tokens, window_tokens));
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sink + window: block size must be > 0, got ", block_size));
  }
  const int64_t sink_blocks = (sink_tokens + block_size - 1) / block_size;
  const int64_t window_blocks = (window_tokens + block_size - 1) / block_size;
  if (window_blocks > 0) {
    const int64_t cap = (sink_blocks + window_blocks + 1) * block_size;
    if (cap > context_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler: the sink + window cache of ", sink_blocks, " + ", window_blocks,
                       " + 1 blocks (", cap, " tokens) exceeds the model's context of ",
                       context_tokens, " tokens"));
    }
  }
  return WindowPolicy(sink_blocks, window_blocks, block_size);
}

int64_t WindowPolicy::CacheCapTokens() const {
  return enabled() ? (sink_blocks_ + window_blocks_ + 1) * block_size_
                   : std::numeric_limits<int64_t>::max();
}

int64_t WindowPolicy::MaxBlocks(int64_t unbounded_blocks) const {
  return enabled() ? std::min(unbounded_blocks, sink_blocks_ + window_blocks_ + 1 + sink_blocks_)
                   : unbounded_blocks;
}

absl::Status WindowPolicy::CheckPrefillOnly(absl::string_view request_id,
                                            int64_t prompt_tokens) const {
  if (prompt_tokens > CacheCapTokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id, ": prefill-only prompt of ", prompt_tokens,
                     " tokens exceeds the sink + window cache of ", CacheCapTokens(),
                     " tokens (its blocks would be dropped before the transfer)"));
  }
  return absl::OkStatus();
}

absl::Status WindowPolicy::Slide(kvcache::KvCacheManager* kv, kvcache::SequenceId seq,
                                 int64_t* dropped_tokens, SinkCopier copy_sinks) {
  if (sink_blocks_ > 0 && *dropped_tokens == 0) {
    PD_RETURN_IF_ERROR(kv->ForkLeadingBlocks(seq, sink_blocks_).status());
  }
  absl::Status dropped = kv->DropBlock(seq, sink_blocks_);
  CHECK(dropped.ok()) << dropped;  // S + W + 1 full blocks are held
  *dropped_tokens += block_size_;
  ++num_dropped_blocks_;
  if (sink_blocks_ == 0) {
    return absl::OkStatus();
  }
  const kvcache::BlockTable* table = kv->GetTable(seq);
  std::vector<int32_t> originals, live;
  for (int64_t i = 0; i < sink_blocks_; ++i) {
    originals.push_back(static_cast<int32_t>(table->set_aside()[i].value()));
    live.push_back(static_cast<int32_t>(table->blocks()[i].value()));
  }
  absl::Status copied = copy_sinks(originals, live, sink_blocks_ * block_size_, *dropped_tokens);
  if (!copied.ok()) {
    return absl::InternalError(
        absl::StrCat("sink + window: rebuilding the sinks failed: ", copied.message()));
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
