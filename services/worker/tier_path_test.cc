// The worker's tier paths without a pd-tierd: two workers of one node (stories260K, CPU) share
// a TierLink: worker A writes its blocks through to it (TierOfferHook, the pool's on_store
// hook, as --tier_write_through wires it), worker B submits the same prompt through
// SubmitWithTiers and restores what the link holds instead of computing it. The link is the
// in-memory FakeTierLink behind a FaultInjectingTierLink, so each case injects one failure of
// the tiers: a restore that fails half-way, a damaged block (checksum mismatch), refused offers
// and a tierd that is gone. In every case the greedy output equals a full recompute, the
// restore stops exactly where the tiers failed, and every pinned run is released.
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/hash/block_hash.h"
#include "engine/runtime/engine_loop.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_test_util.h"
#include "gtest/gtest.h"
#include "services/tier_client/testing/fake_tier_link.h"
#include "services/tier_client/testing/fault_injecting_tier_link.h"
#include "services/worker/local_block_set.h"
#include "services/worker/tier_restore.h"
#include "services/worker/worker_context.h"

namespace pd::worker {
namespace {

using tier_client::FakeTierLink;
using tier_client::FaultInjectingTierLink;
using tier_client::TierFaultPolicy;
using tier_client::TierLink;
using tier_client::TierLinkStats;

constexpr uint32_t kMaxTokens = 8;
constexpr uint32_t kBlockTokens = 16;
// Four full blocks and one token: the four are restorable (the last prompt token's block is
// always computed).
constexpr int kPromptTokens = 4 * kBlockTokens + 1;
constexpr int64_t kRestorable = 4;

// One worker of the node: its runtime (writing through to `link`), engine loop and context.
struct Worker {
  std::shared_ptr<std::atomic<TierLink*>> slot = std::make_shared<std::atomic<TierLink*>>();
  std::unique_ptr<LocalBlockSet> local_blocks;
  std::unique_ptr<engine::ModelRuntime> runtime;
  std::unique_ptr<engine::EngineLoop> loop;
  WorkerContext ctx;

  ~Worker() {
    slot->store(nullptr, std::memory_order_release);  // as WorkerServer::Drain
    if (loop != nullptr) {
      loop->Stop();
    }
  }
};

std::unique_ptr<Worker> MakeWorker(TierLink* link) {
  auto w = std::make_unique<Worker>();
  w->local_blocks = std::make_unique<LocalBlockSet>(nullptr);
  engine::ModelRuntimeConfig c = engine::testing::StoriesConfig(kernels::Device::kCpu);
  c.block_size = kBlockTokens;
  c.kv_listener = w->local_blocks.get();
  c.on_evict = TierOfferHook(w->slot);
  c.on_store = c.on_evict;  // write-through: every block reaches the link once computed
  absl::StatusOr<std::unique_ptr<engine::ModelRuntime>> rt = engine::ModelRuntime::Create(c);
  EXPECT_TRUE(rt.ok()) << rt.status();
  if (!rt.ok()) {
    return nullptr;
  }
  w->runtime = *std::move(rt);
  w->loop = std::make_unique<engine::EngineLoop>(w->runtime->scheduler());
  w->ctx.runtime = w->runtime.get();
  w->ctx.loop = w->loop.get();
  w->ctx.tiers = link;
  w->ctx.local_blocks = w->local_blocks.get();
  w->slot->store(link, std::memory_order_release);
  return w;
}

struct Result {
  std::vector<uint32_t> tokens;
  engine::GenerationOutput last;
  absl::Status rejected;
};

class TierPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int t = 0; t < kPromptTokens; ++t) {
      prompt_.push_back(static_cast<uint32_t>(1 + t * 7));
    }
    a_ = MakeWorker(nullptr);
    ASSERT_NE(a_, nullptr);
    const int64_t block_bytes = static_cast<int64_t>(a_->runtime->kv_memory()->block_bytes());
    auto fake = std::make_unique<FakeTierLink>(block_bytes);
    fake_ = fake.get();
    link_ = std::make_unique<FaultInjectingTierLink>(std::move(fake), TierFaultPolicy{});
    a_->ctx.tiers = link_.get();
    a_->slot->store(link_.get(), std::memory_order_release);
    b_ = MakeWorker(link_.get());
    ASSERT_NE(b_, nullptr);
    absl::StatusOr<BlockHash> seed =
        ComputeHashSeed({a_->runtime->fingerprint(), "f32", kBlockTokens, ""});
    ASSERT_TRUE(seed.ok()) << seed.status();
    chain_ = ComputeBlockHashes(*seed, prompt_, kBlockTokens);
    ASSERT_EQ(static_cast<int64_t>(chain_.size()), kRestorable);
  }

  void TearDown() override {
    // Every run Prepare pinned was released, whatever happened to its request.
    if (fake_ != nullptr) {
      EXPECT_EQ(fake_->UnreleasedRunsForTest(), 0);
    }
    b_.reset();
    a_.reset();
  }

  // Runs the prompt on `w` through SubmitWithTiers (the worker's request path) to the end.
  Result Run(Worker* w) {
    struct Shared {
      absl::Mutex mu;
      Result result;
      absl::Notification done;
    };
    auto shared = std::make_shared<Shared>();
    engine::GenerationRequest r;
    r.id = w->ctx.NewRequestId();
    r.prompt = prompt_;
    r.sampling.max_tokens = kMaxTokens;
    r.sampling.ignore_eos = true;
    r.on_output = [shared](engine::GenerationOutput o) {
      absl::MutexLock lock(&shared->mu);
      shared->result.tokens.insert(shared->result.tokens.end(), o.new_tokens.begin(),
                                   o.new_tokens.end());
      if (o.finish_reason != engine::FinishReason::kNone) {
        shared->result.last = std::move(o);
        shared->done.Notify();
      }
    };
    SubmitWithTiers(&w->ctx, ConcatBlockHashes(chain_), std::move(r),
                    [shared](const absl::Status& s) {
                      absl::MutexLock lock(&shared->mu);
                      shared->result.rejected = s;
                      shared->done.Notify();
                    });
    EXPECT_TRUE(shared->done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    absl::MutexLock lock(&shared->mu);
    return shared->result;
  }

  // Worker A computes the prompt (writing its blocks through to the link); its greedy output.
  std::vector<uint32_t> ComputeOnA() {
    Result a = Run(a_.get());
    EXPECT_TRUE(a.last.status.ok()) << a.last.status;
    EXPECT_EQ(a.tokens.size(), kMaxTokens);
    EXPECT_EQ(a.last.restored_tokens, 0u);
    return a.tokens;
  }

  // Worker B runs the prompt: its output must equal A's, with `restored` blocks from the tiers.
  void ExpectBRestores(const std::vector<uint32_t>& want, int64_t restored, int64_t failures) {
    Result b = Run(b_.get());
    EXPECT_TRUE(b.rejected.ok()) << b.rejected;
    EXPECT_TRUE(b.last.status.ok()) << b.last.status;
    EXPECT_EQ(b.tokens, want) << "a restore changed the greedy output";
    EXPECT_EQ(b.last.restored_tokens, static_cast<uint32_t>(restored * kBlockTokens));
    const engine::SchedulerStats st = engine::testing::StatsAfterPosted(b_->loop.get());
    EXPECT_EQ(st.tier_restored_blocks, restored);
    EXPECT_EQ(st.tier_restore_failures, failures);
    EXPECT_EQ(st.kv.num_blocks_used, 0);
  }

  std::vector<uint32_t> prompt_;
  std::vector<BlockHash> chain_;
  std::unique_ptr<Worker> a_;
  std::unique_ptr<Worker> b_;
  FakeTierLink* fake_ = nullptr;  // owned by link_
  std::unique_ptr<FaultInjectingTierLink> link_;
};

TEST_F(TierPathTest, RestoredPrefixGivesTheSameOutput) {
  const std::vector<uint32_t> want = ComputeOnA();
  for (const BlockHash& h : chain_) {
    EXPECT_TRUE(fake_->Holds(h));
  }
  ExpectBRestores(want, kRestorable, /*failures=*/0);
  const TierLinkStats st = link_->Stats();
  EXPECT_EQ(st.promoted_blocks_total, static_cast<uint64_t>(kRestorable));
  EXPECT_EQ(st.checksum_failures_total, 0u);
}

// The slots go bad half-way through the copy (e.g. tierd lost the session and reused them):
// the first two blocks are restored, the rest of the prompt is computed.
TEST_F(TierPathTest, RestoreFailingHalfWayComputesTheRest) {
  const std::vector<uint32_t> want = ComputeOnA();
  link_->SetPolicy({.fail_from_block = 2});
  ExpectBRestores(want, /*restored=*/2, /*failures=*/1);
  EXPECT_EQ(link_->Stats().checksum_failures_total, 1u);
}

// A block damaged in the tier after it was stored (its bytes no longer match tierd's checksum)
// is caught by the worker's verification after the copy and computed instead.
TEST_F(TierPathTest, DamagedBlockFailsItsChecksumAndIsComputed) {
  const std::vector<uint32_t> want = ComputeOnA();
  ASSERT_TRUE(fake_->CorruptForTest(chain_[1]));
  ExpectBRestores(want, /*restored=*/1, /*failures=*/1);
  EXPECT_EQ(link_->Stats().checksum_failures_total, 1u);
}

// tierd refuses every offer: nothing reaches the tiers, B computes everything, nothing fails.
TEST_F(TierPathTest, RefusedOffersAreCountedAndCostOnlyTheRestore) {
  link_->SetPolicy({.refuse_offers = true});
  const std::vector<uint32_t> want = ComputeOnA();
  const TierLinkStats st = link_->Stats();
  EXPECT_GE(st.offer_dropped_blocks_total, static_cast<uint64_t>(kRestorable));
  EXPECT_EQ(st.offer_stored_blocks_total, 0u);
  for (const BlockHash& h : chain_) {
    EXPECT_FALSE(fake_->Holds(h));
  }
  link_->SetPolicy({});
  ExpectBRestores(want, /*restored=*/0, /*failures=*/0);
}

// tierd is gone: Prepare answers nothing, the request is computed as if there were no tiers.
TEST_F(TierPathTest, GoneTierdCostsOnlyTheRestore) {
  const std::vector<uint32_t> want = ComputeOnA();
  link_->SetPolicy({.tierd_gone = true});
  ExpectBRestores(want, /*restored=*/0, /*failures=*/0);
  const TierLinkStats st = link_->Stats();
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.rpc_failures_total, 1u);
}

// The engine refuses the request after the tiers pinned its blocks: the run is released (the
// fixture's TearDown checks) and the caller hears the refusal.
TEST_F(TierPathTest, RefusedRequestReleasesItsPinnedRun) {
  ComputeOnA();
  b_->loop->Stop();  // a stopped loop answers Submit with Unavailable
  Result b = Run(b_.get());
  EXPECT_EQ(b.rejected.code(), absl::StatusCode::kUnavailable) << b.rejected;
  EXPECT_EQ(link_->Stats().promoted_blocks_total, static_cast<uint64_t>(kRestorable));
}

}  // namespace
}  // namespace pd::worker
