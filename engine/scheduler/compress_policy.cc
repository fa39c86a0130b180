#include "engine/scheduler/compress_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace pd::engine {

absl::Status CompressPolicy::Validate(absl::string_view policy, int64_t budget_tokens,
                                      int64_t recent_tokens) {
  if (policy.empty()) {
    if (budget_tokens != 0 || recent_tokens != 0) {
      return absl::InvalidArgumentError(absl::StrCat("kv_budget_tokens ", budget_tokens,
                                                     " / kv_recent_tokens ", recent_tokens,
                                                     " need --kv_policy h2o or snapkv"));
    }
    return absl::OkStatus();
  }
  if (policy != "h2o" && policy != "snapkv") {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_policy \"", policy, "\" is not one of h2o, snapkv"));
  }
  if (budget_tokens <= 0 || recent_tokens <= 0 || recent_tokens >= budget_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_policy ", policy, ": need kv_budget_tokens > kv_recent_tokens > 0, got ",
                     budget_tokens, " and ", recent_tokens));
  }
  return absl::OkStatus();
}

absl::StatusOr<CompressPolicy> CompressPolicy::Create(absl::string_view policy,
                                                      int64_t budget_tokens, int64_t recent_tokens,
                                                      int64_t block_size, int64_t context_tokens) {
  if (absl::Status s = Validate(policy, budget_tokens, recent_tokens); !s.ok()) return s;
  if (policy.empty()) return CompressPolicy();
  const int64_t budget = (budget_tokens + block_size - 1) / block_size * block_size;
  if (budget + block_size > context_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_policy ", policy, ": a budget of ", budget, " tokens (whole blocks) plus the block ",
        "being filled exceeds the model's context of ", context_tokens));
  }
  return CompressPolicy(policy == "h2o" ? Kind::kH2o : Kind::kSnapKv, budget, recent_tokens,
                        block_size);
}

int64_t CompressPolicy::CacheCapTokens(int64_t prompt_len, bool compressed) const {
  switch (kind_) {
    case Kind::kH2o:
      return budget_ + block_size_;
    case Kind::kSnapKv:
      return compressed ? std::numeric_limits<int64_t>::max() : prompt_len;
    case Kind::kOff:
      break;
  }
  return std::numeric_limits<int64_t>::max();
}

int64_t CompressPolicy::ScoreSlots(int64_t prompt_len) const {
  switch (kind_) {
    case Kind::kH2o:
      return budget_ + block_size_;
    case Kind::kSnapKv:
      return prompt_len;
    case Kind::kOff:
      break;
  }
  return 0;
}

int64_t CompressPolicy::ScoreFrom(int64_t prompt_len, int64_t start) const {
  if (kind_ != Kind::kSnapKv) return 0;
  return std::max<int64_t>(0, prompt_len - recent_ - start);
}

int64_t CompressPolicy::MaxBlocks(int64_t unbounded_blocks) const {
  const int64_t fresh = budget_ / std::max<int64_t>(block_size_, 1);
  switch (kind_) {
    case Kind::kH2o:
      return std::min(unbounded_blocks, fresh + 1) + fresh;
    case Kind::kSnapKv:
      return unbounded_blocks + fresh;
    case Kind::kOff:
      break;
  }
  return unbounded_blocks;
}

void CompressPolicy::Select(const float* scores, int64_t stride, int64_t held, int64_t rows,
                            std::vector<int32_t>* keep) const {
  const int64_t n = KeepTokens(held);
  keep->assign(static_cast<size_t>(rows * n), 0);
  const int64_t recent = std::min(recent_, n);
  const int64_t older = held - recent;  // candidates [0, older)
  const int64_t heavy = n - recent;
  std::vector<float> score(static_cast<size_t>(std::max<int64_t>(older, 0)));
  std::vector<int32_t> order(score.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * stride;
    for (int64_t t = 0; t < older; ++t) {
      if (kind_ == Kind::kSnapKv) {
        float m = s[t];
        for (int64_t u = std::max<int64_t>(0, t - kSnapKvPool / 2);
             u <= std::min<int64_t>(older - 1, t + kSnapKvPool / 2); ++u) {
          m = std::max(m, s[u]);
        }
        score[t] = m;
      } else {
        score[t] = s[t];
      }
      if (std::isnan(score[t])) score[t] = -std::numeric_limits<float>::infinity();
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + heavy, order.end(), [&](int32_t a, int32_t b) {
      return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    int32_t* out = keep->data() + r * n;
    std::copy(order.begin(), order.begin() + heavy, out);
    std::sort(out, out + heavy);
    for (int64_t i = 0; i < recent; ++i) out[heavy + i] = static_cast<int32_t>(older + i);
  }
}

}  // namespace pd::engine
