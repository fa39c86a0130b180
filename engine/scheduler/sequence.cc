#include "engine/scheduler/sequence.h"

#include <algorithm>

namespace pd::engine::scheduler_internal {

void Sequence::AppendToken(uint32_t token, std::optional<TokenLogprob> logprob) {
  tokens.push_back(token);
  unsent_tokens.push_back(token);
  if (logprob.has_value()) {
    unsent_logprobs.push_back(*std::move(logprob));
  }
}

bool Sequence::IsStopToken(uint32_t token, absl::Span<const uint32_t> eos_ids) const {
  const SamplingOptions& so = request.sampling;
  const bool is_eos =
      !so.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  return is_eos || std::find(so.stop_token_ids.begin(), so.stop_token_ids.end(), token) !=
                       so.stop_token_ids.end();
}

bool Sequence::CutAtStopString(size_t* hold) {
  for (const std::string& stop : request.sampling.stop) {
    const size_t from = text_sent >= stop.size() ? text_sent - stop.size() + 1 : 0;
    const size_t at = text.find(stop, from);
    if (at != std::string::npos) {
      // Text already sent stays sent (possible only when min_tokens delayed the check).
      text.resize(std::max(at, text_sent));
      return true;
    }
    for (size_t k = std::min(stop.size() - 1, text.size()); k > *hold; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        *hold = k;
        break;
      }
    }
  }
  return false;
}

GenerationOutput Sequence::TakeUnsent() {
  GenerationOutput out;
  out.id = request.id;
  out.new_tokens = std::move(unsent_tokens);
  unsent_tokens.clear();
  out.logprobs = std::move(unsent_logprobs);
  unsent_logprobs.clear();
  return out;
}

GenerationOutput Sequence::TakeStreamOutput(size_t hold) {
  GenerationOutput out = TakeUnsent();
  const size_t sendable = std::max(text.size() - hold, text_sent);
  out.text = text.substr(text_sent, sendable - text_sent);
  text_sent = sendable;
  out.text_offset = text_sent;
  return out;
}

GenerationOutput Sequence::TakeFinalOutput(absl::Time now) {
  GenerationOutput out = TakeUnsent();
  if (status.ok()) {
    // Held-back text is released (a stop string match was cut off already); an incomplete
    // UTF-8 tail is flushed raw unless the text ended at a stop string.
    std::string tail = detok->Flush();
    if (finished != FinishReason::kStopString) {
      text += tail;
    }
    out.text = text.substr(std::min(text_sent, text.size()));
    text_sent = text.size();
  }
  // A failed request keeps what was held back: it could be a stop string's start, and a
  // resumed request (another worker) sends it once known.
  out.text_offset = text_sent;
  out.finish_reason = finished;
  out.status = status;
  out.prompt_tokens = static_cast<uint32_t>(prompt_len);
  out.cached_tokens = cached_tokens;
  out.restored_tokens = std::min(restored_tokens, cached_tokens);
  out.completion_tokens = static_cast<uint32_t>(num_generated());
  out.num_preemptions = num_preemptions;
  out.timings.restore = restore_time;
  out.prefilled_remotely = prefilled_remotely;
  const absl::Time scheduled = admitted_once ? first_scheduled : now;
  out.timings.queue = scheduled - submitted;
  out.timings.prefill = prefill_done > scheduled ? prefill_done - scheduled : absl::ZeroDuration();
  out.timings.first_token =
      first_token > submitted ? first_token - submitted : absl::ZeroDuration();
  out.timings.total = now - submitted;
  return out;
}

}  // namespace pd::engine::scheduler_internal
