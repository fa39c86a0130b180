#include "services/router/worker_scorer.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace pd::router {
namespace {

// A candidate's overlap with the prompt, clamped to the prompt's full blocks.
struct Overlap {
  int64_t hbm = 0;
  int64_t dram = 0;
  int64_t nvme = 0;
  int64_t remote = 0;    // m(w) of the cost model: not part of total()
  double effective = 0;  // eff(w) of the cost model

  int64_t total() const { return hbm + dram + nvme; }
};

int64_t NonNegative(int64_t v) { return v < 0 ? 0 : v; }

// a < b beyond rounding noise.
bool DefinitelyLess(double a, double b) {
  return a < b - 1e-9 * std::max({1.0, std::abs(a), std::abs(b)});
}

// A lexicographic key: smaller is better. Fit comes first because a worker without room for
// the request would queue or preempt whatever its score says; requests (a count, not blocks)
// only separate equal scores.
struct Rank {
  bool does_not_fit = false;
  double score = 0;
  int64_t requests = 0;

  bool BetterThan(const Rank& o) const {
    if (does_not_fit != o.does_not_fit) {
      return !does_not_fit;
    }
    if (DefinitelyLess(score, o.score)) {
      return true;
    }
    if (DefinitelyLess(o.score, score)) {
      return false;
    }
    return requests < o.requests;
  }
};

int64_t Requests(const WorkerCandidate& c) {
  return NonNegative(c.running) + NonNegative(c.waiting) + NonNegative(c.inflight_assigned);
}

// Index into `eligible` of the best rank, scanning from `start` (rotation: the first of equals
// after the cursor wins). The rotation is over the eligible workers, not all candidates, so that
// ties spread evenly even when the eligible ones are bunched together in the candidate list.
template <typename RankFn>
int BestRotated(absl::Span<const int> eligible, uint64_t start, RankFn rank_of) {
  int best = -1;
  Rank best_rank;
  const size_t n = eligible.size();
  for (size_t k = 0; k < n; ++k) {
    const int i = eligible[(start + k) % n];
    const Rank r = rank_of(i);
    if (best < 0 || r.BetterThan(best_rank)) {
      best = i;
      best_rank = r;
    }
  }
  return best;
}

// m(w) of the cost model for every candidate, added to its effective overlap at 1 - weight
// per block: the longest overlap among the other healthy candidates beyond w's own. Only the
// two longest overlaps matter (the longest holder's m comes from the second longest).
void CreditRemoteBlocks(absl::Span<const WorkerCandidate> candidates, double remote_hit_weight,
                        absl::Span<Overlap> overlap) {
  int first = -1;
  int64_t second_total = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!candidates[i].healthy) {
      continue;
    }
    const int64_t total = overlap[i].total();
    if (first < 0 || total > overlap[first].total()) {
      if (first >= 0) {
        second_total = std::max(second_total, overlap[first].total());
      }
      first = static_cast<int>(i);
    } else {
      second_total = std::max(second_total, total);
    }
  }
  if (first < 0) {
    return;
  }
  for (size_t i = 0; i < overlap.size(); ++i) {
    const int64_t other = static_cast<int>(i) == first ? second_total : overlap[first].total();
    Overlap& o = overlap[i];
    o.remote = std::max<int64_t>(0, other - o.total());
    o.effective += (1.0 - remote_hit_weight) * static_cast<double>(o.remote);
  }
}

// `value` must be finite and in [0, max] (max < 0: no upper bound).
absl::Status CheckWeight(absl::string_view field, double value, double max) {
  if (!std::isfinite(value) || value < 0 || (max >= 0 && value > max)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scorer: ", field, " must be ",
        max >= 0 ? absl::StrCat("in [0, ", max, "]") : "finite and >= 0", ", got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScorerPolicy> ParsePolicy(absl::string_view name) {
  if (name == "cache_aware") {
    return ScorerPolicy::kCacheAware;
  }
  if (name == "round_robin") {
    return ScorerPolicy::kRoundRobin;
  }
  if (name == "random") {
    return ScorerPolicy::kRandom;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown placement policy \"", name,
                                                 "\"; valid: cache_aware, round_robin, random"));
}

absl::string_view PolicyName(ScorerPolicy policy) {
  switch (policy) {
    case ScorerPolicy::kCacheAware:
      return "cache_aware";
    case ScorerPolicy::kRoundRobin:
      return "round_robin";
    case ScorerPolicy::kRandom:
      return "random";
  }
  return "unknown";
}

absl::Status ScorerConfig::Validate() const {
  constexpr double kUnbounded = -1;
  for (auto [field, value, max] :
       {std::tuple<absl::string_view, double, double>{"prefill_weight", prefill_weight, kUnbounded},
        {"dram_hit_weight", dram_hit_weight, 1.0},
        {"nvme_hit_weight", nvme_hit_weight, 1.0},
        {"remote_hit_weight", remote_hit_weight, 1.0},
        {"decode_load_weight", decode_load_weight, kUnbounded},
        {"inflight_weight", inflight_weight, kUnbounded},
        {"inflight_blocks_weight", inflight_blocks_weight, kUnbounded},
        {"backlog_prefill_weight", backlog_prefill_weight, kUnbounded},
        {"min_hit_fraction", min_hit_fraction, 1.0}}) {
    absl::Status status = CheckWeight(field, value, max);
    if (!status.ok()) {
      return status;
    }
  }
  if (disagg_threshold_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scorer: disagg_threshold_tokens must be >= 0, got ", disagg_threshold_tokens));
  }
  switch (policy) {
    case ScorerPolicy::kCacheAware:
    case ScorerPolicy::kRoundRobin:
    case ScorerPolicy::kRandom:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("scorer: policy has unknown value ", static_cast<int>(policy)));
}

absl::StatusOr<std::unique_ptr<WorkerScorer>> WorkerScorer::Create(ScorerConfig config) {
  absl::Status status = config.Validate();
  if (!status.ok()) {
    return status;
  }
  return std::unique_ptr<WorkerScorer>(new WorkerScorer(std::move(config)));
}

absl::StatusOr<RoutingDecision> WorkerScorer::Choose(absl::Span<const WorkerCandidate> candidates,
                                                     absl::Span<const WorkerOverlap> overlaps,
                                                     int64_t prompt_tokens, int64_t block_size) {
  if (prompt_tokens <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("scorer: prompt_tokens (", prompt_tokens,
                                                   ") and block_size (", block_size,
                                                   ") must be > 0"));
  }
  const int n = static_cast<int>(candidates.size());
  absl::InlinedVector<int, 64> decoders;
  int num_prefillers = 0;
  for (int i = 0; i < n; ++i) {
    const WorkerCandidate& c = candidates[i];
    if (c.healthy && c.can_decode) {
      decoders.push_back(i);
    }
    if (c.healthy && c.can_prefill) {
      ++num_prefillers;
    }
  }
  if (decoders.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no healthy decode worker among ", n, " candidates"));
  }

  // Overlaps by candidate, clamped to the prompt's full blocks: a caller may pass the overlaps
  // of a longer chain, and an overlap beyond the prompt saves nothing.
  const int64_t full_blocks = prompt_tokens / block_size;
  const int64_t prompt_blocks = (prompt_tokens + block_size - 1) / block_size;
  absl::InlinedVector<Overlap, 64> overlap(n);
  if (!overlaps.empty()) {
    absl::flat_hash_map<absl::string_view, const WorkerOverlap*> by_id;
    by_id.reserve(overlaps.size());
    for (const WorkerOverlap& o : overlaps) {
      by_id.emplace(o.worker_id, &o);
    }
    for (int i = 0; i < n; ++i) {
      if (candidates[i].worker_id.empty()) {
        continue;
      }
      auto it = by_id.find(candidates[i].worker_id);
      if (it == by_id.end()) {
        continue;
      }
      Overlap& o = overlap[i];
      o.hbm = std::min(NonNegative(it->second->hbm_blocks), full_blocks);
      o.dram = std::min(NonNegative(it->second->dram_blocks), full_blocks - o.hbm);
      o.nvme = std::min(NonNegative(it->second->nvme_blocks), full_blocks - o.hbm - o.dram);
      o.effective = static_cast<double>(o.hbm) +
                    (1.0 - config_.dram_hit_weight) * static_cast<double>(o.dram) +
                    (1.0 - config_.nvme_hit_weight) * static_cast<double>(o.nvme);
    }
    if (config_.remote_hit_weight < 1.0) {
      CreditRemoteBlocks(candidates, config_.remote_hit_weight, absl::MakeSpan(overlap));
    }
  }

  // local(d) of the cost model. A worker that can prefill never counts as its own prefill
  // worker: sending itself a PrefillService call would only add a hop.
  auto local = [&](int d) {
    const WorkerCandidate& c = candidates[d];
    const int others = num_prefillers - (c.healthy && c.can_prefill ? 1 : 0);
    if (others == 0) {
      return true;
    }
    const int64_t uncached_tokens = prompt_tokens - overlap[d].total() * block_size;
    return uncached_tokens < config_.disagg_threshold_tokens;
  };

  RoutingDecision decision;
  const double bs = static_cast<double>(block_size);
  switch (config_.policy) {
    case ScorerPolicy::kRoundRobin:
      decision.decode_index =
          decoders[decode_cursor_.fetch_add(1, std::memory_order_relaxed) % decoders.size()];
      decision.reason = "round_robin";
      break;
    case ScorerPolicy::kRandom: {
      absl::MutexLock lock(&rng_mu_);
      decision.decode_index = decoders[absl::Uniform<size_t>(rng_, 0, decoders.size())];
      decision.reason = "random";
      break;
    }
    case ScorerPolicy::kCacheAware: {
      const double b_blocks = static_cast<double>(prompt_blocks);
      // backlog(d), pref(d) and alpha of the cost model.
      absl::InlinedVector<double, 64> backlog(n, 0.0);
      absl::InlinedVector<double, 64> pref(n, 0.0);
      double max_pref = 0;
      for (int d : decoders) {
        const WorkerCandidate& c = candidates[d];
        backlog[d] =
            config_.inflight_weight * static_cast<double>(NonNegative(c.inflight_assigned));
        if (local(d)) {
          backlog[d] += static_cast<double>(NonNegative(c.queued_prefill_tokens)) / bs +
                        config_.inflight_blocks_weight *
                            static_cast<double>(NonNegative(c.inflight_new_blocks));
        }
        const double eff = overlap[d].effective;
        pref[d] = eff >= config_.min_hit_fraction * b_blocks ? eff : 0.0;
        max_pref = std::max(max_pref, pref[d]);
      }
      double others_backlog = 0;
      int num_others = 0;
      for (int d : decoders) {
        if (DefinitelyLess(pref[d], max_pref)) {
          others_backlog += backlog[d];
          ++num_others;
        }
      }
      // A move off the holder costs what the others pay for the prefix: all of it without
      // remote credit, the fetch with it (see alpha in the header).
      const double alpha =
          config_.prefill_weight +
          (num_others > 0 ? config_.backlog_prefill_weight * config_.remote_hit_weight *
                                others_backlog / num_others
                          : 0.0);
      auto rank = [&](int d) {
        const WorkerCandidate& c = candidates[d];
        const Overlap& o = overlap[d];
        const int64_t new_blocks = prompt_blocks - o.hbm;
        Rank r;
        r.does_not_fit = c.total_kv_blocks > 0 && NonNegative(c.free_kv_blocks) < new_blocks;
        // A short hit does not attract through the KV term either: its shared blocks count as
        // new ones (see pref in the header).
        const int64_t charged_blocks = pref[d] > 0 ? new_blocks : prompt_blocks;
        const double kv_blocks =
            static_cast<double>(NonNegative(c.active_kv_blocks) + charged_blocks);
        const double occupancy =
            c.total_kv_blocks > 0
                ? std::min(1.0, kv_blocks / static_cast<double>(c.total_kv_blocks))
                : 1.0;
        r.score = alpha * (b_blocks - pref[d]) + backlog[d] +
                  config_.decode_load_weight * kv_blocks * occupancy;
        r.requests = Requests(c);
        return r;
      };
      decision.decode_index =
          BestRotated(decoders, decode_cursor_.fetch_add(1, std::memory_order_relaxed), rank);
      int64_t max_total = 0;
      int64_t min_total = full_blocks;
      for (int d : decoders) {
        max_total = std::max(max_total, overlap[d].total());
        min_total = std::min(min_total, overlap[d].total());
      }
      const int64_t chosen = overlap[decision.decode_index].total();
      decision.reason = chosen == max_total && max_total > min_total ? "cache_hit" : "load";
      break;
    }
  }
  const int d = decision.decode_index;
  decision.decode_overlap_blocks = overlap[d].total();

  if (local(d)) {
    const int others = num_prefillers - (candidates[d].healthy && candidates[d].can_prefill);
    decision.prefill_reason = others == 0 ? "no_prefill_worker" : "below_disagg_threshold";
    return decision;
  }
  absl::InlinedVector<int, 64> prefillers;
  for (int i = 0; i < n; ++i) {
    if (i != d && candidates[i].healthy && candidates[i].can_prefill) {
      prefillers.push_back(i);
    }
  }
  switch (config_.policy) {
    case ScorerPolicy::kRoundRobin:
      decision.prefill_index =
          prefillers[prefill_cursor_.fetch_add(1, std::memory_order_relaxed) % prefillers.size()];
      break;
    case ScorerPolicy::kRandom: {
      absl::MutexLock lock(&rng_mu_);
      decision.prefill_index = prefillers[absl::Uniform<size_t>(rng_, 0, prefillers.size())];
      break;
    }
    case ScorerPolicy::kCacheAware: {
      // P skips the blocks D holds (PrefillRequest.num_cached_blocks), so whichever of the two
      // caches covers more of the prefix bounds P's work.
      const double decode_effective = overlap[d].effective;
      auto rank = [&](int p) {
        const WorkerCandidate& c = candidates[p];
        Rank r;
        r.score = config_.prefill_weight * (static_cast<double>(prompt_blocks) -
                                            std::max(overlap[p].effective, decode_effective)) +
                  static_cast<double>(NonNegative(c.queued_prefill_tokens)) / bs +
                  config_.inflight_weight * static_cast<double>(NonNegative(c.inflight_assigned));
        r.requests = Requests(c);
        return r;
      };
      decision.prefill_index =
          BestRotated(prefillers, prefill_cursor_.fetch_add(1, std::memory_order_relaxed), rank);
      break;
    }
  }
  decision.prefill_overlap_blocks = overlap[decision.prefill_index].total();
  decision.prefill_reason = "remote_prefill";
  return decision;
}

}  // namespace pd::router
