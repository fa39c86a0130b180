#include "engine/scheduler/draft_proposer.h"

#include <algorithm>
#include <utility>

namespace pd::engine {

DraftProposer::DraftProposer(LlamaForward* forward, int64_t num_blocks, int64_t block_size)
    : forward_(forward), block_size_(block_size) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

void DraftProposer::Drop(Entry* e) {
  free_.insert(free_.end(), e->blocks.begin(), e->blocks.end());
  e->blocks.clear();
  e->computed.clear();
}

void DraftProposer::Release(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Drop(&it->second);
  entries_.erase(it);
}

bool DraftProposer::Reserve(Entry* e, int64_t blocks) {
  while (static_cast<int64_t>(e->blocks.size()) < blocks) {
    if (free_.empty()) {
      // The least recently used sequence not in this call gives its blocks up (it computes
      // its tokens again if it proposes later).
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.last_used < calls_ && !it->second.blocks.empty() &&
            (victim == entries_.end() || it->second.last_used < victim->second.last_used)) {
          victim = it;
        }
      }
      if (victim == entries_.end()) return false;
      Drop(&victim->second);
      entries_.erase(victim);
      ++stats_.evictions;
    }
    e->blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

absl::StatusOr<std::vector<std::vector<uint32_t>>> DraftProposer::Propose(
    absl::Span<const Want> wants) {
  ++calls_;
  std::vector<std::vector<uint32_t>> out(wants.size());
  const int64_t seq_len = forward_->config().seq_len;
  const auto max_rows = static_cast<size_t>(forward_->options().max_seqs);
  int64_t budget = forward_->options().max_batch_tokens;
  // Every want's entry first, so that none of them is evicted for another of this call.
  for (const Want& w : wants) entries_[w.key].last_used = calls_;
  struct Plan {
    size_t want;
    Entry* entry;
    int64_t from;  // first position computed by the first pass
    int64_t n;     // tokens it computes there
    int64_t k;     // tokens proposed
  };
  std::vector<Plan> plans;
  for (size_t i = 0; i < wants.size() && plans.size() < max_rows && budget > 0; ++i) {
    const Want& w = wants[i];
    Entry* e = &entries_.at(w.key);
    const auto len = static_cast<int64_t>(w.tokens.size());
    if (len == 0 || len > seq_len) continue;
    // The K/V the draft holds for this sequence is valid for the tokens it shares with it.
    size_t common = 0;
    const size_t most = std::min(e->computed.size(), w.tokens.size());
    while (common < most && e->computed[common] == w.tokens[common]) ++common;
    auto from = static_cast<int64_t>(common);
    if (from == len) from = len - 1;  // (the last token's logits are needed)
    e->computed.resize(static_cast<size_t>(from));
    const int64_t todo = len - from;
    const int64_t n = std::min(todo, budget);
    // A sequence still catching up computes a chunk and proposes next time.
    const int64_t k = n == todo ? std::max<int64_t>(0, std::min(w.k, seq_len - len + 1)) : 0;
    // Positions computed: [from, from + n), then len .. len + k - 2 (each proposed token but
    // the last).
    const int64_t last = std::max(from + n - 1, len + k - 2);
    if (!Reserve(e, last / block_size_ + 1)) continue;
    budget -= n;
    plans.push_back({i, e, from, n, k});
  }
  if (plans.empty()) return out;
  auto fail = [&](absl::Status status) {
    for (const Plan& p : plans) Drop(p.entry);
    return status;
  };
  // Pass 1: what each sequence took since its last proposal (or its prompt), and the first
  // proposed token from the last row.
  std::vector<ForwardSequence> rows;
  std::vector<SampleSpec> specs(plans.size());  // greedy
  std::vector<int32_t> sampled(plans.size());
  for (const Plan& p : plans) {
    rows.push_back({wants[p.want].tokens.subspan(static_cast<size_t>(p.from),
                                                 static_cast<size_t>(p.n)),
                    p.from,
                    p.entry->blocks,
                    0});
  }
  absl::Status s = forward_->ForwardSample(rows, specs, sampled.data(), nullptr);
  ++stats_.forward_passes;
  if (!s.ok()) return fail(std::move(s));
  int64_t rounds = 0;
  for (size_t r = 0; r < plans.size(); ++r) {
    const Plan& p = plans[r];
    const absl::Span<const uint32_t> chunk = rows[r].tokens;
    p.entry->computed.insert(p.entry->computed.end(), chunk.begin(), chunk.end());
    stats_.catch_up_tokens += p.n;
    if (p.k > 0) out[p.want].push_back(static_cast<uint32_t>(sampled[r]));
    rounds = std::max(rounds, p.k);
  }
  // Passes 2..k: one token for every sequence whose proposal goes on.
  std::vector<uint32_t> inputs(plans.size());
  std::vector<size_t> which;
  for (int64_t j = 1; j < rounds; ++j) {
    rows.clear();
    which.clear();
    for (size_t r = 0; r < plans.size(); ++r) {
      const Plan& p = plans[r];
      if (p.k <= j) continue;
      inputs[r] = out[p.want].back();
      const auto len = static_cast<int64_t>(wants[p.want].tokens.size());
      rows.push_back({absl::MakeConstSpan(&inputs[r], 1), len + j - 1, p.entry->blocks, 0});
      which.push_back(r);
    }
    specs.resize(rows.size());
    s = forward_->ForwardSample(rows, specs, sampled.data(), nullptr);
    ++stats_.forward_passes;
    if (!s.ok()) return fail(std::move(s));
    for (size_t i = 0; i < which.size(); ++i) {
      const Plan& p = plans[which[i]];
      p.entry->computed.push_back(inputs[which[i]]);
      out[p.want].push_back(static_cast<uint32_t>(sampled[i]));
    }
  }
  return out;
}

DraftProposer::Stats DraftProposer::stats() const {
  Stats s = stats_;
  s.free_blocks = static_cast<int64_t>(free_.size());
  s.sequences = static_cast<int64_t>(entries_.size());
  return s;
}

}  // namespace pd::engine
