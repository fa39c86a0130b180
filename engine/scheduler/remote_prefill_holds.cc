#include "engine/scheduler/remote_prefill_holds.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "engine/scheduler/sequence.h"

namespace pd::engine {
namespace {

absl::Status NotPending(RequestId id) {
  return absl::NotFoundError(
      absl::StrCat("request ", id.ToString(), " has no remote prefill outstanding"));
}

}  // namespace

RemotePrefillHolds::RemotePrefillHolds(kvcache::KvCacheManager* kv, int64_t vocab_size)
    : kv_(kv), vocab_size_(vocab_size) {}

RemotePrefillHolds::~RemotePrefillHolds() = default;

void RemotePrefillHolds::Start(Sequence* seq, kvcache::ImportTarget import,
                               std::vector<BlockHash> chain) {
  seq->remote_started = true;
  seq->remote_pending = true;
  RemotePrefillTarget target;
  target.id = seq->request.id;
  target.num_cached_tokens = import.num_cached_tokens;
  target.first_block = import.first_block;
  target.block_ids = std::move(import.block_ids);
  target.chain = std::move(chain);
  if (seq->remote_keep > 0) {
    target.kv_policy = {"snapkv", seq->compress.budget(), seq->compress.recent()};
  }
  seq->request.remote_prefill(std::move(target));
}

absl::Status RemotePrefillHolds::Complete(RequestId id, Sequence* seq, uint32_t first_token,
                                          std::optional<TokenLogprob>* first_logprob,
                                          int64_t kept_tokens) {
  if (seq == nullptr || !seq->remote_pending) {
    return NotPending(id);
  }
  seq->remote_pending = false;
  if (seq->finished != FinishReason::kNone) {
    return absl::OkStatus();  // cancelled meanwhile: the next sweep frees its blocks
  }
  if (first_token >= static_cast<uint32_t>(vocab_size_)) {
    ++num_failures_;
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id.ToString(), ": remote first token ", first_token,
                     " >= vocab size ", vocab_size_, "; prefilling locally"));
  }
  const int32_t asked = seq->request.sampling.logprobs;
  if (asked < 0) {
    first_logprob->reset();
  } else {
    const std::optional<TokenLogprob>& lp = *first_logprob;
    const bool usable = lp.has_value() && lp->top.size() <= static_cast<size_t>(asked) &&
                        std::all_of(lp->top.begin(), lp->top.end(), [&](const auto& t) {
                          return t.first < static_cast<uint32_t>(vocab_size_);
                        });
    if (!usable) {
      ++num_failures_;
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id.ToString(), ": asked for logprobs (", asked,
                       " alternatives) but the remote first token's entry is ",
                       lp.has_value() ? "malformed" : "missing", "; prefilling locally"));
    }
  }
  if (kept_tokens != seq->remote_keep) {
    ++num_failures_;
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", id.ToString(), ": the prefill worker kept ", kept_tokens,
        " tokens of the prompt, this worker's kv_policy keeps ", seq->remote_keep,
        "; prefilling locally"));
  }
  seq->num_computed = static_cast<int64_t>(seq->tokens.size());
  seq->prefilled_remotely = true;
  if (seq->remote_keep > 0) {
    return absl::OkStatus();  // compressed: its blocks are not the text's (nothing to share)
  }
  seq->chain = ComputeBlockHashes(seq->seed, seq->tokens, static_cast<uint32_t>(kv_->block_size()));
  absl::Status commit = kv_->CommitBlocks(seq->kv_id, seq->chain);
  CHECK(commit.ok()) << commit;  // the chain hashes exactly the prompt's full blocks
  return absl::OkStatus();
}

absl::Status RemotePrefillHolds::Fail(RequestId id, Sequence* seq) {
  if (seq == nullptr || !seq->remote_pending) {
    return NotPending(id);
  }
  seq->remote_pending = false;
  if (seq->finished == FinishReason::kNone) {
    ++num_failures_;
  }
  return absl::OkStatus();  // num_computed is still the cached prefix: Step prefills the rest
}

void RemotePrefillHolds::Prefilled(Sequence* seq, uint32_t first_token,
                                   std::optional<TokenLogprob> logprob) {
  PrefilledBlocks out;
  out.id = seq->request.id;
  out.first_token = first_token;
  out.first_logprob = std::move(logprob);
  out.cached_tokens = seq->cached_tokens;
  out.restored_tokens = std::min(seq->restored_tokens, seq->cached_tokens);
  out.restore = seq->restore_time;
  const kvcache::BlockTable* table = kv_->GetTable(seq->kv_id);
  out.block_ids.assign(table->blocks().begin(), table->blocks().end());
  if (seq->compress.enabled()) {
    out.kept_tokens = seq->num_allocated - seq->dropped;
  }
  const absl::Time scheduled = seq->first_scheduled;
  out.queue = scheduled - seq->submitted;
  out.prefill = seq->prefill_done - scheduled;
  seq->held = true;
  seq->request.on_prefilled(std::move(out));
}

void RemotePrefillHolds::Hold(std::unique_ptr<Sequence> seq) { held_.push_back(std::move(seq)); }

absl::Status RemotePrefillHolds::Release(RequestId id) {
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if ((*it)->request.id == id) {
      absl::Status s = kv_->Free((*it)->kv_id);
      CHECK(s.ok()) << s;
      held_.erase(it);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("request ", id.ToString(), " holds no prefilled blocks"));
}

bool RemotePrefillHolds::Holds(RequestId id) const {
  return std::any_of(held_.begin(), held_.end(),
                     [&](const std::unique_ptr<Sequence>& s) { return s->request.id == id; });
}

}  // namespace pd::engine
