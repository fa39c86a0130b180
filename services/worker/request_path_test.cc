// The worker's request path in one process: a decode-side and a prefill-side EngineLoop over
// stories260K, their KvHandoffs on one loopback transport hub, and a PrefillPeer that runs the
// prefill side (PrefillJob) directly instead of over gRPC. Covers the whole hand-off of a
// RemotePrefill: success (the output equals a local prefill's, token for token), a peer that
// never answers and a peer that fails (both fall back to a local prefill with the same output),
// and a decode request cancelled while its prefill is in flight (ends CANCELLED, blocks freed).
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/disagg/kv_handoff.h"
#include "engine/runtime/engine_loop.h"
#include "engine/runtime/model_runtime.h"
#include "engine/runtime/runtime_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/base/kv_layout_proto.h"
#include "services/worker/convert.h"
#include "services/worker/prefill_job.h"
#include "services/worker/prefill_peer.h"
#include "services/worker/remote_prefill.h"
#include "services/worker/worker_context.h"
#include "transport/testing/loopback_transport.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

constexpr int64_t kBlocks = 64;
constexpr uint32_t kMaxTokens = 12;

// One worker: runtime, handoff on the shared loopback hub, engine loop, and its context.
struct Side {
  metrics::Registry registry;
  std::unique_ptr<engine::ModelRuntime> runtime;
  std::unique_ptr<disagg::KvHandoff> handoff;
  std::unique_ptr<engine::EngineLoop> loop;
  WorkerContext ctx;

  // As WorkerServer::Drain: the loop stops, then the handoff fails what still waits.
  void Stop() {
    if (loop != nullptr) loop->Stop();
    handoff.reset();
    loop.reset();
  }
};

std::unique_ptr<Side> MakeSide(WorkerRole role, const std::string& id,
                               std::shared_ptr<transport::LoopbackHub> hub) {
  auto side = std::make_unique<Side>();
  engine::ModelRuntimeConfig c = engine::testing::StoriesConfig(kernels::Device::kCpu);
  c.kv_blocks = kBlocks;
  absl::StatusOr<std::unique_ptr<engine::ModelRuntime>> rt = engine::ModelRuntime::Create(c);
  EXPECT_TRUE(rt.ok()) << rt.status();
  if (!rt.ok()) return nullptr;
  side->runtime = *std::move(rt);
  memory::KvPoolMemory* pool = side->runtime->kv_memory();
  absl::StatusOr<transport::PoolGeometry> geometry =
      disagg::GeometryFor(side->runtime->kv_layout(), side->runtime->fingerprint(), kBlocks);
  EXPECT_TRUE(geometry.ok()) << geometry.status();
  if (!geometry.ok()) return nullptr;
  disagg::KvHandoffConfig hc;
  hc.transport.backend = "loopback";
  hc.transport.loopback_hub = std::move(hub);
  absl::StatusOr<std::unique_ptr<disagg::KvHandoff>> h =
      disagg::KvHandoff::Create(hc, pool->base(), pool->size_bytes(), *geometry);
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return nullptr;
  side->handoff = *std::move(h);
  side->loop = std::make_unique<engine::EngineLoop>(side->runtime->scheduler());
  WorkerContext& ctx = side->ctx;
  ctx.config.role = role;
  ctx.worker_id = id;
  ctx.node_name = "test-node";
  ctx.runtime = side->runtime.get();
  ctx.loop = side->loop.get();
  ctx.handoff = side->handoff.get();
  ctx.layout = services::LayoutToProto(side->runtime->kv_layout(), side->runtime->fingerprint());
  absl::StatusOr<WorkerMetrics> m = WorkerMetrics::Register(&side->registry);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  ctx.metrics = *m;
  return side;
}

using engine::testing::StatsAfterPosted;

// A PrefillPeer in the same process: hands the request to PrefillJob::Run on its own thread
// (as a gRPC server thread would), or misbehaves as told.
class LoopbackPrefillPeer final : public PrefillPeer {
 public:
  enum class Mode { kForward, kNeverAnswer, kFail, kForwardWhenOpened };

  LoopbackPrefillPeer(WorkerContext* prefill, Mode mode) : prefill_(prefill), mode_(mode) {}
  ~LoopbackPrefillPeer() override {
    if (!gate_.HasBeenNotified()) gate_.Notify();
    absl::MutexLock lock(&mu_);
    for (std::thread& t : threads_) t.join();
  }

  void Prefill(iv1::PrefillRequest request, absl::Time deadline, Done done) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    called_.Notify();
    switch (mode_) {
      case Mode::kNeverAnswer:
        held_.push_back(std::move(done));  // dropped with the peer
        return;
      case Mode::kFail:
        // Before Prefill returns, on the decode engine's thread: allowed by the contract.
        done(absl::UnavailableError("prefill worker went away"), iv1::PrefillResponse());
        return;
      case Mode::kForward:
      case Mode::kForwardWhenOpened:
        threads_.emplace_back(
            [this, request = std::move(request), deadline, done = std::move(done)]() mutable {
              if (mode_ == Mode::kForwardWhenOpened) gate_.WaitForNotification();
              PrefillJob::Run(prefill_, std::move(request), deadline, std::move(done));
            });
        return;
    }
  }

  void Open() { gate_.Notify(); }
  bool WaitCalled() { return called_.WaitForNotificationWithTimeout(absl::Seconds(30)); }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  WorkerContext* const prefill_;
  const Mode mode_;
  absl::Notification called_;
  absl::Notification gate_;
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<Done> held_ ABSL_GUARDED_BY(mu_);
};

struct Collected {
  absl::Mutex mu;
  std::vector<uint32_t> tokens ABSL_GUARDED_BY(mu);
  engine::GenerationOutput last ABSL_GUARDED_BY(mu);
  absl::Notification done;
};

class RequestPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto hub = std::make_shared<transport::LoopbackHub>();
    decode_ = MakeSide(WorkerRole::kDecode, "decode-0", hub);
    prefill_ = MakeSide(WorkerRole::kPrefill, "prefill-0", hub);
    ASSERT_NE(decode_, nullptr);
    ASSERT_NE(prefill_, nullptr);
    // Three blocks: two full ones and a partial one.
    prompt_ = {1};
    for (uint32_t t = 0; t < 39; ++t) prompt_.push_back(300 + t);
  }

  void TearDown() override {
    peer_.reset();  // joins its threads, drops answers it never gave
    if (decode_ != nullptr) decode_->Stop();
    if (prefill_ != nullptr) prefill_->Stop();
    EXPECT_EQ(RemotePrefill::LiveForTest(), 0) << "a RemotePrefill outlived its request";
  }

  iv1::DecodeRequest Decode(const std::string& cache_salt) const {
    iv1::DecodeRequest d;
    d.set_request_id("request-" + cache_salt);
    d.mutable_token_ids()->Add(prompt_.begin(), prompt_.end());
    d.mutable_sampling()->set_max_tokens(kMaxTokens);
    d.mutable_sampling()->set_ignore_eos(true);
    d.set_cache_salt(cache_salt);
    return d;
  }

  // Submits `d` to the decode side, prefilled by `peer` when given (else locally); the request
  // id is returned for cancelling.
  pd::RequestId Submit(const iv1::DecodeRequest& d, PrefillPeer* peer, absl::Duration timeout,
                       Collected* out) {
    engine::GenerationRequest r;
    r.id = decode_->ctx.NewRequestId();
    r.prompt.assign(d.token_ids().begin(), d.token_ids().end());
    absl::StatusOr<engine::SamplingOptions> sampling = SamplingFromProto(d.sampling());
    EXPECT_TRUE(sampling.ok()) << sampling.status();
    r.sampling = *sampling;
    r.cache_salt = d.cache_salt();
    r.resume.tokens.assign(d.resume().token_ids().begin(), d.resume().token_ids().end());
    r.resume.text_offset = d.resume().text_offset();
    r.on_output = [out](engine::GenerationOutput o) {
      bool last = false;
      {
        absl::MutexLock lock(&out->mu);
        out->tokens.insert(out->tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.finish_reason != engine::FinishReason::kNone) {
          out->last = std::move(o);
          last = true;
        }
      }
      if (last) out->done.Notify();
    };
    if (peer != nullptr) {
      RemotePrefill::Attach(&decode_->ctx, peer, std::make_shared<const iv1::DecodeRequest>(d),
                            absl::Now() + timeout, stats_, &r);
    }
    const pd::RequestId id = r.id;
    EXPECT_TRUE(decode_->loop->Submit(std::move(r)).ok());
    return id;
  }

  // The greedy output of a local prefill (its own cache salt: nothing it caches is shared).
  std::vector<uint32_t> LocalReference() {
    Collected c;
    Submit(Decode("reference"), nullptr, absl::Seconds(30), &c);
    EXPECT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    absl::MutexLock lock(&c.mu);
    EXPECT_TRUE(c.last.status.ok()) << c.last.status;
    EXPECT_EQ(c.tokens.size(), kMaxTokens);
    return c.tokens;
  }

  // Runs the prompt through a peer in `mode` (prefill deadline `timeout`) and checks that the
  // output equals a local prefill's, token for token, and where the prompt was prefilled.
  void ExpectOutputOfLocalPrefill(LoopbackPrefillPeer::Mode mode, absl::Duration timeout,
                                  bool remote) {
    const std::vector<uint32_t> want = LocalReference();
    peer_ = std::make_unique<LoopbackPrefillPeer>(&prefill_->ctx, mode);
    Collected c;
    Submit(Decode("remote"), peer_.get(), timeout, &c);
    ASSERT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    absl::MutexLock lock(&c.mu);
    EXPECT_TRUE(c.last.status.ok()) << c.last.status;
    EXPECT_EQ(c.last.prefilled_remotely, remote);
    EXPECT_EQ(c.tokens, want);
    EXPECT_EQ(peer_->calls(), 1);
  }

  double Prefills(const Side& side, const std::string& where) {
    return side.ctx.metrics.prefills->WithLabels({where}).Value();
  }

  // Nothing is left in flight on either side: no blocks in use, none held for a transfer.
  void ExpectBlocksFreed() {
    const engine::SchedulerStats d = StatsAfterPosted(decode_->loop.get());
    EXPECT_EQ(d.kv.num_blocks_used, 0);
    EXPECT_EQ(d.remote_prefills, 0);
    EXPECT_EQ(d.running + d.waiting, 0);
    const engine::SchedulerStats p = StatsAfterPosted(prefill_->loop.get());
    EXPECT_EQ(p.kv.num_blocks_used, 0);
    EXPECT_EQ(p.held, 0);
  }

  std::unique_ptr<Side> decode_;
  std::unique_ptr<Side> prefill_;
  std::unique_ptr<LoopbackPrefillPeer> peer_;
  std::shared_ptr<RemotePrefillStats> stats_ = std::make_shared<RemotePrefillStats>();
  std::vector<uint32_t> prompt_;
};

TEST_F(RequestPathTest, RemotePrefillEqualsLocalPrefill) {
  ExpectOutputOfLocalPrefill(LoopbackPrefillPeer::Mode::kForward, absl::Seconds(30),
                             /*remote=*/true);
  EXPECT_EQ(Prefills(*decode_, "remote"), 1);
  EXPECT_EQ(Prefills(*decode_, "fallback"), 0);
  // Every prompt block the decode side did not hold went over the transport, both ways counted.
  const double out = prefill_->ctx.metrics.kv_transfer_bytes->WithLabels({"out"}).Value();
  EXPECT_EQ(out, 3.0 * decode_->runtime->kv_memory()->block_bytes());
  EXPECT_EQ(decode_->ctx.metrics.kv_transfer_bytes->WithLabels({"in"}).Value(), out);
  EXPECT_EQ(StatsAfterPosted(decode_->loop.get()).remote_prefill_failures, 0);
  ExpectBlocksFreed();
}

// Migration: a resumed request's prompt and streamed tokens go to the prefill worker with the
// resume state, which samples the next token as step len(resume) of the seeded stream: the
// continuation equals the undisturbed run's.
TEST_F(RequestPathTest, ResumedRequestIsPrefilledRemotelyFromItsResumeState) {
  iv1::DecodeRequest ref = Decode("reference");
  ref.mutable_sampling()->set_temperature(1.0f);
  ref.mutable_sampling()->set_seed(11);
  Collected want;
  Submit(ref, nullptr, absl::Seconds(30), &want);
  ASSERT_TRUE(want.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::vector<uint32_t> all;
  {
    absl::MutexLock lock(&want.mu);
    ASSERT_TRUE(want.last.status.ok()) << want.last.status;
    all = want.tokens;
  }
  constexpr int kStreamed = 5;
  iv1::DecodeRequest d = ref;
  d.set_request_id("request-resumed");
  d.set_cache_salt("resumed");
  d.mutable_resume()->mutable_token_ids()->Add(all.begin(), all.begin() + kStreamed);
  peer_ =
      std::make_unique<LoopbackPrefillPeer>(&prefill_->ctx, LoopbackPrefillPeer::Mode::kForward);
  Collected c;
  Submit(d, peer_.get(), absl::Seconds(30), &c);
  ASSERT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  absl::MutexLock lock(&c.mu);
  EXPECT_TRUE(c.last.status.ok()) << c.last.status;
  EXPECT_TRUE(c.last.prefilled_remotely);
  EXPECT_EQ(c.tokens, std::vector<uint32_t>(all.begin() + kStreamed, all.end()));
  EXPECT_EQ(c.last.completion_tokens, all.size());
  EXPECT_EQ(peer_->calls(), 1);
  EXPECT_EQ(Prefills(*decode_, "remote"), 1);
}

TEST_F(RequestPathTest, PeerThatNeverAnswersFallsBackAtTheDeadline) {
  ExpectOutputOfLocalPrefill(LoopbackPrefillPeer::Mode::kNeverAnswer, absl::Milliseconds(200),
                             /*remote=*/false);
  EXPECT_EQ(Prefills(*decode_, "remote"), 0);
  EXPECT_EQ(Prefills(*decode_, "fallback"), 1);
  ExpectBlocksFreed();
}

TEST_F(RequestPathTest, PeerFailureFallsBackToLocalPrefill) {
  ExpectOutputOfLocalPrefill(LoopbackPrefillPeer::Mode::kFail, absl::Seconds(30),
                             /*remote=*/false);
  EXPECT_EQ(Prefills(*decode_, "remote"), 0);
  EXPECT_EQ(Prefills(*decode_, "fallback"), 1);
  EXPECT_EQ(StatsAfterPosted(decode_->loop.get()).remote_prefill_failures, 1);
  ExpectBlocksFreed();
}

TEST_F(RequestPathTest, CancelWhilePrefillInFlightEndsCancelledAndFreesBlocks) {
  peer_ = std::make_unique<LoopbackPrefillPeer>(&prefill_->ctx,
                                                LoopbackPrefillPeer::Mode::kForwardWhenOpened);
  Collected c;
  const pd::RequestId id = Submit(Decode("cancel"), peer_.get(), absl::Seconds(30), &c);
  ASSERT_TRUE(peer_->WaitCalled());
  // The cancel reaches the engine while the prefill worker has not even started.
  absl::Notification cancelled;
  decode_->loop->Post([&](engine::Scheduler& s) {
    EXPECT_TRUE(s.Cancel(id).ok());
    cancelled.Notify();
  });
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // The stream ends at once; the blocks stay reserved for the write still to come.
  ASSERT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  {
    absl::MutexLock lock(&c.mu);
    EXPECT_EQ(c.last.status.code(), absl::StatusCode::kCancelled) << c.last.status;
    EXPECT_EQ(c.last.finish_reason, engine::FinishReason::kAbort);
  }
  engine::SchedulerStats held = StatsAfterPosted(decode_->loop.get());
  EXPECT_EQ(held.remote_prefills, 1);
  EXPECT_EQ(held.kv.num_blocks_used, 3);
  peer_->Open();
  // The prefill runs and lands in the reserved blocks; its outcome releases them. Each check
  // waits for the engine loop (it wakes every poll interval while a remote prefill is pending).
  const absl::Time by = absl::Now() + absl::Seconds(30);
  while (held.remote_prefills > 0 && absl::Now() < by) {
    held = StatsAfterPosted(decode_->loop.get());
  }
  EXPECT_EQ(held.remote_prefills, 0);
  // Exactly one outcome was posted for the request.
  EXPECT_EQ(Prefills(*decode_, "remote") + Prefills(*decode_, "fallback"), 1);
  ExpectBlocksFreed();
}

}  // namespace
}  // namespace pd::worker

namespace pd::worker {
namespace {

// The prefill side's checks of a SnapKV request (PrefillRequest.kv_policy): the decode worker
// reserved blocks for the kept tokens only, nothing cached, nothing resumed.
TEST_F(RequestPathTest, PrefillJobChecksTheBlocksOfACompressedPrompt) {
  iv1::PrefillRequest req;
  *req.mutable_layout() = prefill_->ctx.layout;
  req.set_transport(std::string(prefill_->ctx.handoff->backend()));
  req.set_transport_endpoint("x");
  req.set_transport_descriptor("x");
  req.mutable_token_ids()->Add(prompt_.begin(), prompt_.end());  // 40 tokens, 3 blocks
  req.set_kv_policy("snapkv");
  req.set_kv_budget_tokens(16);
  req.set_kv_recent_tokens(8);
  req.add_target_block_ids(5);
  EXPECT_TRUE(PrefillJob::Validate(prefill_->ctx, req).ok());
  req.set_kv_budget_tokens(20);  // rounded up to 2 whole blocks
  EXPECT_THAT(std::string(PrefillJob::Validate(prefill_->ctx, req).message()),
              ::testing::HasSubstr("target_block_ids has 1 entries, expected 2"));
  req.add_target_block_ids(6);
  EXPECT_TRUE(PrefillJob::Validate(prefill_->ctx, req).ok());
  req.set_kv_budget_tokens(4096);  // more than the prompt: all of it, 3 blocks
  req.add_target_block_ids(7);
  EXPECT_TRUE(PrefillJob::Validate(prefill_->ctx, req).ok());
  req.set_num_cached_blocks(1);
  EXPECT_THAT(std::string(PrefillJob::Validate(prefill_->ctx, req).message()),
              ::testing::HasSubstr("a compressed prompt is computed whole"));
  req.set_num_cached_blocks(0);
  req.set_kv_policy("lru");
  EXPECT_THAT(std::string(PrefillJob::Validate(prefill_->ctx, req).message()),
              ::testing::HasSubstr("kv_policy \"lru\" is not one of h2o, snapkv"));
  req.set_kv_policy("snapkv");
  req.set_kv_recent_tokens(0);
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillJob::Validate(prefill_->ctx, req)));
}

}  // namespace
}  // namespace pd::worker
