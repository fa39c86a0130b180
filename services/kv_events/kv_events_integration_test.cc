// KvEventPublisher behind a real gRPC server on 127.0.0.1 and KvEventSubscriber (or a raw
// client) on the other side: convergence, replay, snapshots for their three reasons, falling
// behind, restart, shutdown and chunking.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/kv_events/kv_event_publisher.h"
#include "services/kv_events/kv_event_subscriber.h"
#include "services/router/kv_index.h"

namespace pd::kv_events {
namespace {

namespace iv1 = pdserve::internal::v1;
using HeldMap = absl::flat_hash_map<BlockHash, std::optional<BlockHash>>;

constexpr char kWorker[] = "w0";

// Polls `done` every few milliseconds until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

std::vector<BlockHash> Decode(absl::string_view bytes) {
  absl::StatusOr<std::vector<BlockHash>> out = SplitBlockHashes(bytes);
  CHECK(out.ok()) << out.status();
  return *std::move(out);
}

std::optional<BlockHash> DecodeParent(absl::string_view bytes) {
  if (bytes.empty()) {
    return std::nullopt;
  }
  return Decode(bytes).at(0);
}

HeldMap ToMap(const std::vector<HeldBlock>& blocks) {
  HeldMap m;
  for (const HeldBlock& b : blocks) {
    m.emplace(b.hash, b.parent);
  }
  return m;
}

// What a router does with the stream: KvIndex::Apply, plus a plain fold (hash -> parent) to
// compare with the publisher's held set, and a record of the snapshots seen.
class Consumer {
 public:
  Consumer() {
    absl::StatusOr<std::unique_ptr<router::KvIndex>> index = router::KvIndex::Create({});
    CHECK(index.ok());
    index_ = *std::move(index);
  }

  absl::Status Apply(const iv1::KvEventBatch& batch) {
    absl::MutexLock lock(&mu_);
    ++batches_;
    if (fail_after_ > 0 && --fail_after_ == 0) {
      return absl::InternalError("injected consumer failure");
    }
    if (absl::Status s = index_->Apply(kWorker, batch); !s.ok()) {
      ADD_FAILURE() << "KvIndex rejected a batch: " << s;
      return s;
    }
    if (batch.has_snapshot()) {
      const iv1::KvSnapshot& snap = batch.snapshot();
      if (!in_snapshot_ || snap_epoch_ != batch.epoch() || snap_sequence_ != snap.sequence()) {
        held_.clear();
        reasons_.push_back(snap.reason());
        snap_epoch_ = batch.epoch();
        snap_sequence_ = snap.sequence();
      }
      in_snapshot_ = !snap.complete();
      for (const iv1::BlockStored& run : snap.blocks()) {
        std::optional<BlockHash> parent = DecodeParent(run.parent_hash());
        for (const BlockHash& h : Decode(run.block_hashes())) {
          held_[h] = parent;
          parent = h;
        }
      }
    }
    for (const iv1::KvEvent& e : batch.events()) {
      EXPECT_EQ(e.worker_id(), kWorker);
      if (e.has_stored()) {
        std::optional<BlockHash> parent = DecodeParent(e.stored().parent_hash());
        for (const BlockHash& h : Decode(e.stored().block_hashes())) {
          held_[h] = parent;
          parent = h;
        }
      } else if (e.has_removed()) {
        for (const BlockHash& h : Decode(e.removed().block_hashes())) {
          held_.erase(h);
        }
      } else {
        held_.clear();
      }
    }
    return absl::OkStatus();
  }

  // The next call to Apply, `n` calls from now, fails.
  void FailAfter(int n) {
    absl::MutexLock lock(&mu_);
    fail_after_ = n;
  }
  HeldMap held() const {
    absl::MutexLock lock(&mu_);
    return held_;
  }
  std::vector<iv1::SnapshotReason> reasons() const {
    absl::MutexLock lock(&mu_);
    return reasons_;
  }
  const router::KvIndex& index() const { return *index_; }

  std::function<absl::Status(const iv1::KvEventBatch&)> Callback() {
    return [this](const iv1::KvEventBatch& b) { return Apply(b); };
  }

 private:
  mutable absl::Mutex mu_;
  std::unique_ptr<router::KvIndex> index_;
  HeldMap held_ ABSL_GUARDED_BY(mu_);
  bool in_snapshot_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t snap_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t snap_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<iv1::SnapshotReason> reasons_ ABSL_GUARDED_BY(mu_);
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_after_ ABSL_GUARDED_BY(mu_) = 0;
};

// A publisher served on 127.0.0.1.
class PublisherServer {
 public:
  // `port` 0 = ephemeral.
  static std::unique_ptr<PublisherServer> Start(KvEventPublisherConfig config, int port = 0) {
    auto s = std::make_unique<PublisherServer>();
    absl::StatusOr<std::unique_ptr<KvEventPublisher>> p = KvEventPublisher::Create(config);
    CHECK(p.ok()) << p.status();
    s->publisher_ = *std::move(p);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &s->port_);
    builder.RegisterService(s->publisher_.get());
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr || s->port_ == 0) {
      return nullptr;
    }
    return s;
  }

  ~PublisherServer() { Stop(); }

  // Publisher first, so that Server::Shutdown does not wait for the endless streams.
  void Stop() {
    if (server_ != nullptr) {
      publisher_->Shutdown();
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      server_->Wait();
      server_.reset();
    }
  }

  KvEventPublisher* publisher() { return publisher_.get(); }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  std::unique_ptr<KvEventPublisher> publisher_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

KvEventPublisherConfig PublisherConfig() {
  KvEventPublisherConfig c;
  c.worker_id = kWorker;
  c.max_batch_events = 16;
  c.heartbeat_interval = absl::Milliseconds(100);
  c.block_size = 16;
  return c;
}

KvEventSubscriberConfig SubscriberConfig(const std::string& address, Consumer* consumer) {
  KvEventSubscriberConfig c;
  c.address = address;
  c.subscriber_id = "test-router";
  c.idle_timeout = absl::Seconds(5);
  c.on_batch = consumer->Callback();
  return c;
}

std::unique_ptr<KvEventSubscriber> StartSubscriber(KvEventSubscriberConfig config) {
  absl::StatusOr<std::unique_ptr<KvEventSubscriber>> s = KvEventSubscriber::Start(config);
  CHECK(s.ok()) << s.status();
  return *std::move(s);
}

// Drives a publisher's listener like a block pool: random stored chains (some continuing a held
// block), removals of random held blocks, rare clears.
class PoolDriver {
 public:
  PoolDriver(kvcache::KvEventListener* listener, uint64_t salt)
      : listener_(listener), next_(salt << 40) {}

  void Run(int ops) {
    for (int i = 0; i < ops; ++i) {
      const int kind = absl::Uniform(gen_, 0, 1000);
      if (kind < 600 || held_.empty()) {
        std::optional<BlockHash> parent;
        if (!held_.empty() && absl::Bernoulli(gen_, 0.5)) {
          parent = held_[absl::Uniform<size_t>(gen_, 0, held_.size())];
        }
        std::vector<BlockHash> run(absl::Uniform<size_t>(gen_, 1, 40));
        for (BlockHash& h : run) {
          h = BlockHash{next_, next_ * 0x9e3779b97f4a7c15ULL};
          ++next_;
        }
        listener_->OnBlocksStored(run, parent);
        held_.insert(held_.end(), run.begin(), run.end());
      } else if (kind < 995) {
        std::shuffle(held_.begin(), held_.end(), gen_);
        const size_t n = absl::Uniform<size_t>(gen_, 1, std::min<size_t>(held_.size(), 20) + 1);
        listener_->OnBlocksRemoved(absl::MakeConstSpan(held_).subspan(held_.size() - n));
        held_.resize(held_.size() - n);
      } else {
        listener_->OnAllCleared();
        held_.clear();
      }
    }
  }

  void Store(int n) {
    std::vector<BlockHash> run;
    for (int i = 0; i < n; ++i) {
      run.push_back(BlockHash{next_, ~next_});
      ++next_;
      if (run.size() == 1000) {
        listener_->OnBlocksStored(run, std::nullopt);
        run.clear();
      }
    }
    if (!run.empty()) {
      listener_->OnBlocksStored(run, std::nullopt);
    }
  }

 private:
  kvcache::KvEventListener* listener_;
  absl::BitGen gen_;
  std::vector<BlockHash> held_;
  uint64_t next_;
};

// The subscriber applied everything the publisher recorded, and the consumer's fold and index
// equal the publisher's held set.
::testing::AssertionResult Converged(KvEventPublisher* p, KvEventSubscriber* s,
                                     const Consumer& consumer) {
  const bool caught_up = Eventually([&] {
    const KvEventSubscriberStats st = s->Stats();
    return st.epoch == p->epoch() && st.last_sequence == p->Stats().last_sequence;
  });
  if (!caught_up) {
    const KvEventSubscriberStats st = s->Stats();
    return ::testing::AssertionFailure()
           << "subscriber at (" << st.epoch << ", " << st.last_sequence << "), publisher at ("
           << p->epoch() << ", " << p->Stats().last_sequence << "), last error " << st.last_error;
  }
  const HeldMap want = ToMap(p->HeldBlocksForTest());
  const HeldMap got = consumer.held();
  if (got != want) {
    return ::testing::AssertionFailure() << "folded " << got.size() << " blocks, publisher holds "
                                         << want.size() << " (or parents differ)";
  }
  const router::KvIndexStats is = consumer.index().Stats();
  if (is.entries != static_cast<int64_t>(want.size())) {
    return ::testing::AssertionFailure()
           << "index has " << is.entries << " entries, publisher holds " << want.size();
  }
  int checked = 0;
  for (const auto& [hash, parent] : want) {
    std::vector<router::WorkerOverlap> m = consumer.index().Match({hash});
    if (m.size() != 1 || m[0].worker_id != kWorker || m[0].hbm_blocks != 1) {
      return ::testing::AssertionFailure() << "index does not hold " << hash.ToHex();
    }
    if (++checked == 200) {
      break;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(KvEventsIntegrationTest, RandomChangesConvergeToThePublishersHeldSet) {
  auto server = PublisherServer::Start(PublisherConfig());
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 1);
  pool.Run(500);  // before anyone subscribes: the first stream is a snapshot
  Consumer consumer;
  std::unique_ptr<KvEventSubscriber> sub =
      StartSubscriber(SubscriberConfig(server->address(), &consumer));
  ASSERT_TRUE(Eventually([&] { return sub->Stats().snapshots == 1; }));
  for (int i = 0; i < 20; ++i) {
    pool.Run(100);  // while streaming
  }
  EXPECT_TRUE(Converged(p, sub.get(), consumer));
  EXPECT_THAT(consumer.reasons(), ::testing::ElementsAre(iv1::SNAPSHOT_REASON_REQUESTED));
  const KvEventSubscriberStats st = sub->Stats();
  EXPECT_TRUE(st.connected);
  EXPECT_EQ(st.snapshots, 1);
  EXPECT_EQ(st.resyncs, 0);
  EXPECT_GT(st.events, 0);
  EXPECT_EQ(p->Stats().subscribers, 1);
  EXPECT_EQ(p->Stats().snapshots_sent, 1);

  // More rounds, including clears, after the first convergence.
  pool.Run(1000);
  EXPECT_TRUE(Converged(p, sub.get(), consumer));
  sub->Stop();
  EXPECT_TRUE(Eventually([&] { return p->Stats().subscribers == 0; }));
}

TEST(KvEventsIntegrationTest, IdleStreamsGetHeartbeatsThatAreNotPassedOn) {
  auto server = PublisherServer::Start(PublisherConfig());  // heartbeat every 100 ms
  ASSERT_NE(server, nullptr);
  Consumer consumer;
  std::unique_ptr<KvEventSubscriber> sub =
      StartSubscriber(SubscriberConfig(server->address(), &consumer));
  ASSERT_TRUE(Eventually([&] { return sub->Stats().heartbeats >= 3; }));
  const KvEventSubscriberStats st = sub->Stats();
  EXPECT_EQ(st.batches, st.heartbeats + 1);  // the (empty) snapshot, then heartbeats only
  EXPECT_EQ(st.reconnects, 0);
  EXPECT_TRUE(st.connected);
}

TEST(KvEventsIntegrationTest, ResumingWithTheSamePositionReplaysInsteadOfASnapshot) {
  auto server = PublisherServer::Start(PublisherConfig());
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 2);
  pool.Run(300);
  Consumer consumer;
  std::unique_ptr<KvEventSubscriber> sub =
      StartSubscriber(SubscriberConfig(server->address(), &consumer));
  ASSERT_TRUE(Converged(p, sub.get(), consumer));
  sub->Stop();
  const KvEventSubscriberStats before = sub->Stats();
  sub.reset();

  pool.Run(300);  // missed while away; the history (100000) keeps it
  KvEventSubscriberConfig config = SubscriberConfig(server->address(), &consumer);
  config.resume_epoch = before.epoch;
  config.resume_sequence = before.last_sequence;
  sub = StartSubscriber(config);
  EXPECT_TRUE(Converged(p, sub.get(), consumer));
  EXPECT_EQ(sub->Stats().snapshots, 0);
  EXPECT_THAT(consumer.reasons(), ::testing::ElementsAre(iv1::SNAPSHOT_REASON_REQUESTED));
  EXPECT_EQ(p->Stats().snapshots_sent, 1);
  EXPECT_EQ(p->Stats().replays, 1);
}

TEST(KvEventsIntegrationTest, ResumingPastTheHistoryGetsAHistoryTruncatedSnapshot) {
  KvEventPublisherConfig pc = PublisherConfig();
  pc.history_events = 10;
  auto server = PublisherServer::Start(pc);
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 3);
  pool.Run(100);
  Consumer consumer;
  std::unique_ptr<KvEventSubscriber> sub =
      StartSubscriber(SubscriberConfig(server->address(), &consumer));
  ASSERT_TRUE(Converged(p, sub.get(), consumer));
  sub->Stop();
  const KvEventSubscriberStats before = sub->Stats();
  sub.reset();

  pool.Run(50);
  KvEventSubscriberConfig config = SubscriberConfig(server->address(), &consumer);
  config.resume_epoch = before.epoch;
  config.resume_sequence = before.last_sequence;
  sub = StartSubscriber(config);
  EXPECT_TRUE(Converged(p, sub.get(), consumer));
  EXPECT_THAT(consumer.reasons(), ::testing::ElementsAre(iv1::SNAPSHOT_REASON_REQUESTED,
                                                         iv1::SNAPSHOT_REASON_HISTORY_TRUNCATED));
  EXPECT_EQ(sub->Stats().snapshots, 1);
}

TEST(KvEventsIntegrationTest, AStreamThatFallsBehindTheHistoryIsAbortedAndResyncs) {
  KvEventPublisherConfig pc = PublisherConfig();
  pc.history_events = 10;
  auto server = PublisherServer::Start(pc);
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 4);
  pool.Run(100);
  Consumer consumer;
  absl::Mutex mu;
  std::vector<absl::Status> disconnects;
  KvEventSubscriberConfig config = SubscriberConfig(server->address(), &consumer);
  config.on_disconnect = [&](const absl::Status& s) {
    absl::MutexLock lock(&mu);
    disconnects.push_back(s);
  };
  std::unique_ptr<KvEventSubscriber> sub = StartSubscriber(config);
  ASSERT_TRUE(Converged(p, sub.get(), consumer));

  p->PauseWritesForTest(true);
  pool.Run(50);  // 50 events, 10 kept: the stream's next event is gone
  p->PauseWritesForTest(false);
  EXPECT_TRUE(Converged(p, sub.get(), consumer));
  EXPECT_EQ(p->Stats().streams_fell_behind, 1);
  EXPECT_THAT(consumer.reasons(), ::testing::ElementsAre(iv1::SNAPSHOT_REASON_REQUESTED,
                                                         iv1::SNAPSHOT_REASON_HISTORY_TRUNCATED));
  EXPECT_GE(sub->Stats().reconnects, 1);
  absl::MutexLock lock(&mu);
  ASSERT_FALSE(disconnects.empty());
  EXPECT_EQ(disconnects[0].code(), absl::StatusCode::kAborted) << disconnects[0];
  EXPECT_THAT(std::string(disconnects[0].message()), ::testing::HasSubstr("fell behind"));
}

TEST(KvEventsIntegrationTest, ARestartedPublisherOnTheSamePortGivesAnEpochChangedSnapshot) {
  auto first = PublisherServer::Start(PublisherConfig());
  ASSERT_NE(first, nullptr);
  const int port = first->port();
  PoolDriver pool1(first->publisher(), 5);
  pool1.Run(200);
  Consumer consumer;
  absl::Mutex mu;
  std::vector<absl::Status> disconnects;
  KvEventSubscriberConfig config = SubscriberConfig(first->address(), &consumer);
  config.on_disconnect = [&](const absl::Status& s) {
    absl::MutexLock lock(&mu);
    disconnects.push_back(s);
  };
  std::unique_ptr<KvEventSubscriber> sub = StartSubscriber(config);
  ASSERT_TRUE(Converged(first->publisher(), sub.get(), consumer));
  const uint64_t old_epoch = first->publisher()->epoch();

  first.reset();  // the worker goes away
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return !disconnects.empty();
  }));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(disconnects[0].code(), absl::StatusCode::kUnavailable) << disconnects[0];
  }
  std::unique_ptr<PublisherServer> second;
  ASSERT_TRUE(Eventually([&] {  // the port may take a moment to be free again
    second = PublisherServer::Start(PublisherConfig(), port);
    return second != nullptr;
  }));
  ASSERT_NE(second->publisher()->epoch(), old_epoch);
  PoolDriver pool2(second->publisher(), 6);
  pool2.Run(200);
  EXPECT_TRUE(Converged(second->publisher(), sub.get(), consumer));
  EXPECT_THAT(consumer.reasons(), ::testing::ElementsAre(iv1::SNAPSHOT_REASON_REQUESTED,
                                                         iv1::SNAPSHOT_REASON_EPOCH_CHANGED));
  EXPECT_EQ(sub->Stats().epoch, second->publisher()->epoch());
}

TEST(KvEventsIntegrationTest, CallbackErrorsMakeTheSubscriberStartOverFromASnapshot) {
  auto server = PublisherServer::Start(PublisherConfig());
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 7);
  pool.Run(100);
  Consumer consumer;
  std::unique_ptr<KvEventSubscriber> sub =
      StartSubscriber(SubscriberConfig(server->address(), &consumer));
  ASSERT_TRUE(Converged(p, sub.get(), consumer));
  consumer.FailAfter(2);
  pool.Run(200);
  EXPECT_TRUE(Converged(p, sub.get(), consumer));
  EXPECT_EQ(sub->Stats().resyncs, 1);
  EXPECT_THAT(consumer.reasons(), ::testing::ElementsAre(iv1::SNAPSHOT_REASON_REQUESTED,
                                                         iv1::SNAPSHOT_REASON_REQUESTED));
}

TEST(KvEventsIntegrationTest, AnIdleTimeoutReconnects) {
  KvEventPublisherConfig pc = PublisherConfig();
  pc.heartbeat_interval = absl::Seconds(60);  // silent after the first batch
  auto server = PublisherServer::Start(pc);
  ASSERT_NE(server, nullptr);
  PoolDriver pool(server->publisher(), 11);
  pool.Run(5);  // so that the position to resume from is not 0 (which asks for a snapshot)
  Consumer consumer;
  KvEventSubscriberConfig config = SubscriberConfig(server->address(), &consumer);
  config.idle_timeout = absl::Milliseconds(200);
  std::unique_ptr<KvEventSubscriber> sub = StartSubscriber(config);
  ASSERT_TRUE(Eventually([&] { return sub->Stats().reconnects >= 2; }));
  EXPECT_EQ(sub->Stats().last_error.code(), absl::StatusCode::kDeadlineExceeded)
      << sub->Stats().last_error;
  // Reconnections resume (replay), they do not ask for new snapshots.
  EXPECT_EQ(server->publisher()->Stats().snapshots_sent, 1);
}

// Reads a raw stream until it ends; returns its status. `batches` gets what was read.
grpc::Status ReadAll(grpc::ClientReaderInterface<iv1::KvEventBatch>* reader,
                     std::vector<iv1::KvEventBatch>* batches) {
  iv1::KvEventBatch b;
  while (reader->Read(&b)) {
    batches->push_back(b);
  }
  return reader->Finish();
}

TEST(KvEventsIntegrationTest, ShutdownEndsStreamsWithUnavailableAndRefusesNewOnes) {
  auto server = PublisherServer::Start(PublisherConfig());
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 8);
  pool.Run(50);
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = iv1::KvEventService::NewStub(channel);

  // Two raw streams and one subscriber, all live.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<iv1::KvEventBatch>>> readers;
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    // The bound: a stream Shutdown failed to end would end with DEADLINE_EXCEEDED.
    contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    iv1::SubscribeRequest req;
    req.set_subscriber_id(absl::StrCat("raw", i));
    readers.push_back(stub->Subscribe(contexts.back().get(), req));
    iv1::KvEventBatch first;
    ASSERT_TRUE(readers.back()->Read(&first));
    EXPECT_TRUE(first.has_snapshot());
  }
  Consumer consumer;
  absl::Notification disconnected;
  absl::Status why;
  KvEventSubscriberConfig config = SubscriberConfig(server->address(), &consumer);
  config.on_disconnect = [&](const absl::Status& s) {
    if (!disconnected.HasBeenNotified()) {
      why = s;
      disconnected.Notify();
    }
  };
  std::unique_ptr<KvEventSubscriber> sub = StartSubscriber(config);
  ASSERT_TRUE(Converged(p, sub.get(), consumer));
  ASSERT_EQ(p->Stats().subscribers, 3);

  p->Shutdown();
  for (auto& reader : readers) {
    std::vector<iv1::KvEventBatch> rest;
    const grpc::Status status = ReadAll(reader.get(), &rest);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("shutting down"));
  }
  ASSERT_TRUE(disconnected.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;

  // New streams are refused at once.
  grpc::ClientContext late;
  late.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  std::vector<iv1::KvEventBatch> none;
  const grpc::Status refused =
      ReadAll(stub->Subscribe(&late, iv1::SubscribeRequest()).get(), &none);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(none.empty());
  sub->Stop();
  server->Stop();  // returns: no stream is left for Server::Shutdown to wait for
  EXPECT_TRUE(Eventually([&] { return p->Stats().subscribers == 0; }));
}

TEST(KvEventsIntegrationTest, APublisherWithoutWorkerIdRefusesUntilItIsSet) {
  KvEventPublisherConfig pc = PublisherConfig();
  pc.worker_id.clear();
  auto server = PublisherServer::Start(pc);
  ASSERT_NE(server, nullptr);
  auto stub = iv1::KvEventService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    std::vector<iv1::KvEventBatch> none;
    const grpc::Status s = ReadAll(stub->Subscribe(&ctx, iv1::SubscribeRequest()).get(), &none);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  server->publisher()->SetWorkerId(kWorker);
  Consumer consumer;
  std::unique_ptr<KvEventSubscriber> sub =
      StartSubscriber(SubscriberConfig(server->address(), &consumer));
  PoolDriver pool(server->publisher(), 9);
  pool.Run(20);
  EXPECT_TRUE(Converged(server->publisher(), sub.get(), consumer));
}

TEST(KvEventsIntegrationTest, ABigSnapshotIsChunkedBelowOneMiBPerMessage) {
  auto server = PublisherServer::Start(PublisherConfig());
  ASSERT_NE(server, nullptr);
  KvEventPublisher* p = server->publisher();
  PoolDriver pool(p, 10);
  pool.Store(150'000);  // 2.4 MB of hashes
  auto stub = iv1::KvEventService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  std::unique_ptr<grpc::ClientReader<iv1::KvEventBatch>> reader =
      stub->Subscribe(&ctx, iv1::SubscribeRequest());
  std::vector<iv1::KvEventBatch> chunks;
  iv1::KvEventBatch b;
  while (reader->Read(&b)) {
    ASSERT_TRUE(b.has_snapshot()) << "events or heartbeat before the snapshot completed";
    chunks.push_back(b);
    if (b.snapshot().complete()) {
      break;
    }
  }
  ASSERT_FALSE(chunks.empty());
  ASSERT_TRUE(chunks.back().snapshot().complete());
  EXPECT_GE(chunks.size(), 3u);
  Consumer consumer;
  for (const iv1::KvEventBatch& c : chunks) {
    EXPECT_LT(c.ByteSizeLong(), size_t{1} << 20);
    EXPECT_EQ(c.snapshot().sequence(), p->Stats().last_sequence);
    EXPECT_EQ(c.snapshot().reason(), iv1::SNAPSHOT_REASON_REQUESTED);
    ASSERT_TRUE(consumer.Apply(c).ok());
  }
  EXPECT_EQ(consumer.held().size(), 150'000u);
  EXPECT_TRUE(consumer.held() == ToMap(p->HeldBlocksForTest()));
  EXPECT_EQ(consumer.index().Stats().entries, 150'000);
  ctx.TryCancel();
  while (reader->Read(&b)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace pd::kv_events
