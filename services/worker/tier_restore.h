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
// Thread-safety: SubmitWithTiers may be called from any thread that may block (not an engine
// loop thread).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "engine/scheduler/request.h"
#include "services/worker/worker_context.h"

namespace pd::worker {

// Submits `r` to ctx->loop; with the node's tiers configured (ctx->tiers), first asks them for
// the blocks of `chain_bytes` (the prompt's hash chain, 16 bytes a hash) after the pool's
// cached prefix, and attaches what they pinned as r.tier_prefix. `rejected` runs (on the
// calling thread or the tier client's thread) when the engine refuses the request; exactly one
// of the request's final output or `rejected` happens. A malformed chain or an unreachable
// tierd only costs the restore.
void SubmitWithTiers(WorkerContext* ctx, const std::string& chain_bytes,
                     engine::GenerationRequest r,
                     std::function<void(const absl::Status&)> rejected);

}  // namespace pd::worker
