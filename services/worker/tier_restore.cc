#include "services/worker/tier_restore.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/hash/block_hash.h"
#include "common/log/log.h"
#include "engine/memory/kv_pool_memory.h"

namespace pd::worker {
namespace {

// Copies block `index` of the prompt chain (`first_block` = chain index of run's block 0) from
// tierd's shared memory into pool block `dst` and verifies it. Scheduler thread.
bool CopyIn(const tier_client::PromotedRun& run, memory::KvPoolMemory* pool, int64_t first_block,
            int64_t index, BlockId dst) {
  const int64_t k = index - first_block;
  if (k < 0 || k >= static_cast<int64_t>(run.size()) ||
      run.block_bytes() != static_cast<int64_t>(pool->block_bytes())) {
    return false;
  }
  // Device pools: cudaMemcpyAsync straight from tierd's shared memory (page-locked by the
  // worker's TierClient on_map hook), waited for; host pools: memcpy.
  absl::Status s = pool->WriteBlock(dst, run.BlockBytes(static_cast<size_t>(k)));
  if (!s.ok()) {
    LOG_EVERY_N(WARNING, 100) << "tier restore into pool block " << dst.value() << " failed: " << s;
    return false;
  }
  // After the copy: a slot reused (lease over) or damaged while it was read fails here.
  return run.Verify(static_cast<size_t>(k));
}

}  // namespace

std::function<void(const BlockHash&, engine::ModelRuntimeConfig::CopyBlockTo)> TierOfferHook(
    std::shared_ptr<const std::atomic<tier_client::TierLink*>> link) {
  return [link = std::move(link)](const BlockHash& hash,
                                  engine::ModelRuntimeConfig::CopyBlockTo copy) {
    // Pairs with the release store once the link started (and the clear in Drain).
    if (tier_client::TierLink* tiers = link->load(std::memory_order_acquire)) {
      tiers->Offer(hash, copy);
    }
  };
}

void SubmitWithTiers(WorkerContext* ctx, const std::string& chain_bytes,
                     engine::GenerationRequest r,
                     std::function<void(const absl::Status&)> rejected) {
  std::vector<BlockHash> chain;
  if (ctx->tiers != nullptr) {
    // A malformed chain only costs the tier lookup; the scheduler hashes the prompt itself.
    chain = SplitBlockHashes(chain_bytes).value_or(std::vector<BlockHash>{});
  }
  const int64_t local = chain.empty() ? 0 : ctx->local_blocks->LeadingMatch(chain);
  if (ctx->tiers == nullptr || local >= static_cast<int64_t>(chain.size())) {
    if (absl::Status s = ctx->loop->Submit(std::move(r)); !s.ok()) {
      rejected(s);
    }
    return;
  }
  std::vector<BlockHash> tail(chain.begin() + local, chain.end());
  auto request = std::make_shared<engine::GenerationRequest>(std::move(r));
  // What computing a block costs here, for tierd's fetch-or-recompute decision (0 = unknown).
  const double recompute_per_block = ctx->loop->PrefillSecondsPerToken() *
                                     static_cast<double>(ctx->runtime->kv_layout().block_size);
  ctx->tiers->Prepare(
      tail,
      [ctx, request, local, tail,
       rejected = std::move(rejected)](std::shared_ptr<const tier_client::PromotedRun> run) {
        if (run != nullptr) {
          engine::TierPrefix& tp = request->tier_prefix;
          tp.first_block = local;
          tp.chain.assign(tail.begin(), tail.begin() + static_cast<int64_t>(run->size()));
          tp.copy_in = [run, pool = ctx->runtime->kv_memory(), local](int64_t index, BlockId dst) {
            return CopyIn(*run, pool, local, index, dst);
          };
          tp.release = [tiers = ctx->tiers, run] { tiers->Release(*run); };
        }
        // Not Submit: this is the tier client's one thread, and waiting a step here for each
        // request made streams that moved here together wait for each other's admission.
        ctx->loop->SubmitAsync(std::move(*request),
                               [ctx, run, rejected](const absl::Status& s) {
                                 if (run != nullptr) {
                                   // The refused request never reached the scheduler.
                                   ctx->tiers->Release(*run);
                                 }
                                 rejected(s);
                               });
      },
      recompute_per_block);
}

}  // namespace pd::worker
