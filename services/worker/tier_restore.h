// Tier restore: before a prompt reaches the engine, the node's tiers (pd-tierd's DRAM/NVMe,
// through the TierClient) are asked for the prompt's blocks after the pool's own cached prefix;
// what they pin is attached to the request as its TierPrefix, and the engine copies those blocks
// into its pool at admission instead of computing them. Both the decode and the prefill side
// submit through here.
//
// The copy goes through memory::KvPoolMemory only (host and device pools alike): WriteBlock
// from tierd's shared memory into the pool block, then the shared-memory bytes are verified
// against tierd's checksum; a failed copy or checksum ends the restore at that block (the rest
// of the prompt is computed).
//
// The other direction: blocks the pool evicts (or writes through) are offered to the tiers by
// TierOfferHook, the pool's on_evict / on_store hook.
//
// Both go through tier_client::TierLink, so tests run them against an in-memory fake
// (services/tier_client/testing) instead of a pd-tierd.
//
// Thread-safety: SubmitWithTiers may be called from any thread that may block (not an engine
// loop thread); the hook runs on the scheduler thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/hash/block_hash.h"
#include "engine/runtime/model_runtime.h"
#include "engine/scheduler/request.h"
#include "services/tier_client/tier_link.h"
#include "services/worker/worker_context.h"

namespace pd::worker {

// Submits `r` to ctx->loop; with the node's tiers configured (ctx->tiers), first asks them for
// the blocks of `chain_bytes` (the prompt's hash chain, 16 bytes a hash) after the pool's
// cached prefix, and attaches what they pinned as r.tier_prefix. `rejected` runs (on the
// calling thread, the tier client's thread or the engine loop's) when the engine refuses the
// request; exactly one
// of the request's final output or `rejected` happens. A malformed chain or an unreachable
// tierd only costs the restore.
// The pool's eviction / write-through hook (ModelRuntimeConfig::on_evict, on_store): offers the
// block to the link `link` points to, if any (null before the link starts and after the worker
// drains: the block is simply not offered). Scheduler thread; the link copies the block before
// Offer returns and never blocks on tierd.
std::function<void(const BlockHash&, engine::ModelRuntimeConfig::CopyBlockTo)> TierOfferHook(
    std::shared_ptr<const std::atomic<tier_client::TierLink*>> link);

void SubmitWithTiers(WorkerContext* ctx, const std::string& chain_bytes,
                     engine::GenerationRequest r,
                     std::function<void(const absl::Status&)> rejected);

}  // namespace pd::worker
