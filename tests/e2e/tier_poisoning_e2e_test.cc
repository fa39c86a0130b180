// KV block poisoning through pd-tierd (issue #40 item 1), tried for real: an outside process
// learns a prompt's block hashes from a worker's KV events, attaches to the node's pd-tierd with
// the layout from the worker's GetInfo, writes its own bytes into the DRAM slots AllocateSlots
// grants, and commits them with a checksum it computed itself.
//
//   - Without a cluster token (a cluster started by hand without --cluster_token_file) the plant
//     succeeds, but when the real worker evicts the same blocks and offers them (with their
//     checksums), tierd sees two contents under one hash: it drops the planted copy, refuses the
//     hash and counts it, so the next request for the prompt recomputes and its greedy answer is
//     the reference engine's.
//   - The default local cluster (deploy/local/pd-local) runs with a generated cluster token, so
//     the outsider is refused at its first call to pd-tierd or a worker.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/hash/block_hash.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pd/v1/kv_events.grpc.pb.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "pd/v1/worker.grpc.pb.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tier_shm/dram_slots.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

namespace iv1 = ::pdserve::internal::v1;
using ::pd::e2e::Cluster;
using ::pd::e2e::Generated;
using ::pd::e2e::Metric;
using ::pd::e2e::Reference;
using ::pd::e2e::Tierd;
using ::pd::testing::ExitInfo;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;

constexpr char kPdLocal[] = PD_SOURCE_DIR "/deploy/local/pd-local";

std::string Prompt(int k) {
  return absl::StrCat("Tale number ", k,
                      ". Once upon a time, there was a little girl named Lily. She loved to "
                      "play outside in the park with her friends. One day, she saw a big red ball "
                      "under a tree. She ran to the ball and picked it up. It was shiny and round. "
                      "Lily wanted to show it to her mom, so she went home. Her mom smiled and "
                      "said it was a very nice ball. Then they");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<grpc::Channel> Plaintext(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return ctx;
}

// What the outsider learns from a worker without any token: every block hash it holds (the KV
// events snapshot).
std::vector<BlockHash> SnapshotHashes(const std::string& worker_address) {
  auto events = iv1::KvEventService::NewStub(Plaintext(worker_address));
  grpc::ClientContext ctx;
  auto reader = events->Subscribe(WithDeadline(&ctx), {});
  std::vector<BlockHash> hashes;
  iv1::KvEventBatch batch;
  while (reader->Read(&batch)) {
    for (const iv1::BlockStored& run : batch.snapshot().blocks()) {
      absl::StatusOr<std::vector<BlockHash>> h = SplitBlockHashes(run.block_hashes());
      EXPECT_TRUE(h.ok()) << h.status();
      if (h.ok()) hashes.insert(hashes.end(), h->begin(), h->end());
    }
    if (batch.snapshot().complete()) break;
  }
  ctx.TryCancel();
  return hashes;
}

// The outsider: attaches with the worker's layout, writes its own bytes into every slot it is
// granted for `hashes` and commits them with their checksums. Returns how many tierd stored.
int Plant(const std::string& tierd_address, const iv1::KvLayout& layout,
          const std::vector<BlockHash>& hashes) {
  auto tier = iv1::TierService::NewStub(Plaintext(tierd_address));
  iv1::AttachRequest attach;
  attach.set_worker_id("outsider");
  *attach.mutable_layout() = layout;
  iv1::AttachResponse session;
  grpc::ClientContext actx;
  grpc::Status s = tier->Attach(WithDeadline(&actx), attach, &session);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (!s.ok()) return 0;
  absl::StatusOr<std::unique_ptr<tier_shm::ShmRegion>> pool =
      tier_shm::MapDramPool(session.shm_name(), session.num_slots(), session.slot_bytes());
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return 0;

  iv1::AllocateSlotsRequest alloc;
  alloc.set_session_id(session.session_id());
  alloc.set_block_hashes(ConcatBlockHashes(hashes));
  iv1::AllocateSlotsResponse grants;
  grpc::ClientContext gctx;
  s = tier->AllocateSlots(WithDeadline(&gctx), alloc, &grants);
  EXPECT_TRUE(s.ok()) << s.error_message();
  iv1::CommitRequest commit;
  commit.set_session_id(session.session_id());
  for (int i = 0; i < grants.grants_size() && i < static_cast<int>(hashes.size()); ++i) {
    if (grants.grants(i).status() != iv1::SLOT_GRANT_STATUS_GRANTED) continue;
    uint8_t* slot = (*pool)->data() + grants.grants(i).slot() * session.slot_bytes();
    // Plausible f32 keys and values, not the model's.
    const size_t floats = layout.block_bytes() / sizeof(float);
    for (size_t k = 0; k < floats; ++k) {
      const float v = 0.75f * std::sin(0.37f * static_cast<float>(k + 1009 * i));
      std::memcpy(slot + k * sizeof(float), &v, sizeof(v));
    }
    iv1::CommitEntry* e = commit.add_entries();
    e->set_block_hash(hashes[static_cast<size_t>(i)].ToBytes());
    e->set_slot(grants.grants(i).slot());
    e->set_checksum(tier_shm::BlockChecksum(absl::MakeConstSpan(slot, layout.block_bytes())));
  }
  iv1::CommitResponse results;
  grpc::ClientContext cctx;
  s = tier->Commit(WithDeadline(&cctx), commit, &results);
  EXPECT_TRUE(s.ok()) << s.error_message();
  int stored = 0;
  for (int r : results.results()) stored += r == iv1::COMMIT_STATUS_STORED;
  return stored;
}

class TierPoisoningE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-poison-e2e-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }
  std::optional<pd::testing::TempDir> dir_;
};

TEST_F(TierPoisoningE2eTest, WithoutTokenThePlantedBlockIsDroppedWhenTheWorkerOffersItsOwn) {
  const std::string dir = dir_->path();
  Tierd tierd(dir);
  // Every request runs (and prefills) on the decode worker, whose pool of 24 blocks holds under
  // three prompts: a few more prompts evict the victim's blocks, which it then offers to tierd.
  Cluster c(dir, 1, 1, "round_robin", {"--kv_blocks=24", "--tierd_address=" + tierd.address()},
            {"--disagg_threshold_tokens=100000"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  EXPECT_THAT(tierd.process().ReadLog(), HasSubstr("internal RPCs are unauthenticated"));
  Reference ref;
  const std::string victim = Prompt(0);
  const std::vector<uint32_t> want = ref.Greedy(victim, 16).first;
  Generated first = c.GenerateText(victim, 16);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.tokens, want);

  // The outsider: hashes from the decode worker's KV events, layout from its GetInfo.
  const std::string worker = absl::StrCat("127.0.0.1:", c.workers()[1].grpc_port);
  const std::vector<BlockHash> hashes = SnapshotHashes(worker);
  ASSERT_GE(hashes.size(), 8u) << "the victim's blocks";
  auto decode = iv1::DecodeService::NewStub(Plaintext(worker));
  iv1::WorkerInfo info;
  grpc::ClientContext ictx;
  ASSERT_TRUE(decode->GetInfo(WithDeadline(&ictx), {}, &info).ok());
  ASSERT_EQ(Plant(tierd.address(), info.layout(), hashes), static_cast<int>(hashes.size()))
      << tierd.Log();

  // Other prompts evict the victim's blocks from the worker's pool; it offers them to tierd
  // with their checksums and tierd finds the planted copies.
  for (int k = 1; k <= 3; ++k) {
    Generated g = c.GenerateText(Prompt(k), 16);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Metric(tierd.Metrics(), "pd_tierd_conflicting_commits_total") < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::string tm = tierd.Metrics();
  EXPECT_GE(Metric(tm, "pd_tierd_conflicting_commits_total"), 1) << tm << tierd.Log();
  EXPECT_GE(Metric(tm, "pd_tierd_disputed_blocks"), 1) << tm;
  EXPECT_THAT(tierd.process().ReadLog(), HasSubstr("two contents under one hash"));

  // The victim again, from a pool that no longer holds it: no planted block comes back.
  Generated again = c.GenerateText(victim, 16);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, want) << "a planted KV block changed the answer: " << again.text;
}

// The cluster an operator starts with deploy/local/pd-local and no options: the outsider's
// first calls to pd-tierd and to a worker are refused; the token pd-local generated is the
// only thing that opens them (a holder of it is a cluster member, docs/security.md).
TEST_F(TierPoisoningE2eTest, DefaultLocalClusterRefusesTheOutsider) {
  const std::string run_dir = dir_->path() + "/run";
  const std::string ready_file = dir_->path() + "/ready";
  absl::StatusOr<Subprocess> cluster = Subprocess::Spawn(
      {kPdLocal, "--build-dir", PD_BINARY_DIR, "--run_dir", run_dir, "--ready_file", ready_file,
       "--port=0", "--model", e2e::kModel, "--tokenizer", e2e::kTokenizer, "--aggregated",
       "--tierd_nvme_mib=0", "--tierd_dram_mib=16", "--stop_timeout=10", "--start_timeout=40"},
      dir_->path() + "/pd-local.log");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (::access(ready_file.c_str(), F_OK) != 0 && absl::Now() < deadline) {
    std::optional<ExitInfo> ended = cluster->Poll();
    ASSERT_FALSE(ended.has_value()) << "pd-local " << ended->ToString() << ":\n"
                                    << cluster->LogTail(60);
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(::access(ready_file.c_str(), F_OK), 0) << cluster->LogTail(60);

  std::string tierd_address, worker_address, token_file;
  for (absl::string_view line : absl::StrSplit(ReadFile(run_dir + "/cluster.txt"), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() >= 2 && f[0] == "tierd") tierd_address = f[1];
    if (f.size() >= 2 && f[0] == "both-0") worker_address = f[1];
    if (f.size() >= 2 && f[0] == "cluster_token_file") token_file = f[1];
  }
  ASSERT_FALSE(tierd_address.empty()) << ReadFile(run_dir + "/cluster.txt");
  ASSERT_FALSE(worker_address.empty()) << ReadFile(run_dir + "/cluster.txt");
  ASSERT_FALSE(token_file.empty()) << ReadFile(run_dir + "/cluster.txt");
  struct stat st {};
  ASSERT_EQ(::stat(token_file.c_str(), &st), 0) << token_file;
  EXPECT_EQ(st.st_mode & 0777, 0600u) << token_file;

  // No token: nothing of the attack gets through.
  auto decode = iv1::DecodeService::NewStub(Plaintext(worker_address));
  iv1::WorkerInfo info;
  grpc::ClientContext ictx;
  EXPECT_EQ(decode->GetInfo(WithDeadline(&ictx), {}, &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto events = iv1::KvEventService::NewStub(Plaintext(worker_address));
  grpc::ClientContext ectx;
  auto reader = events->Subscribe(WithDeadline(&ectx), {});
  iv1::KvEventBatch batch;
  EXPECT_FALSE(reader->Read(&batch));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto tier = iv1::TierService::NewStub(Plaintext(tierd_address));
  iv1::AttachRequest attach;
  attach.set_worker_id("outsider");
  iv1::AttachResponse session;
  grpc::ClientContext actx;
  grpc::Status refused = tier->Attach(WithDeadline(&actx), attach, &session);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  iv1::AllocateSlotsRequest alloc;
  alloc.set_session_id(1);
  iv1::AllocateSlotsResponse grants;
  grpc::ClientContext gctx;
  EXPECT_EQ(tier->AllocateSlots(WithDeadline(&gctx), alloc, &grants).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The generated token is what opens them: whoever can read the run dir is a cluster member.
  const std::string token(absl::StripAsciiWhitespace(ReadFile(token_file)));
  grpc::ClientContext tctx;
  tctx.AddMetadata("x-pd-cluster-token", token);
  EXPECT_TRUE(decode->GetInfo(WithDeadline(&tctx), {}, &info).ok());
  // Nothing started by pd-local warned about unauthenticated RPCs.
  for (const char* log : {"/tierd.log", "/both-0.log", "/router.log"}) {
    EXPECT_THAT(ReadFile(run_dir + log), ::testing::Not(HasSubstr("unauthenticated"))) << log;
  }

  ASSERT_TRUE(cluster->Signal(SIGTERM).ok());
  absl::StatusOr<ExitInfo> exit = cluster->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << "pd-local did not stop:\n" << cluster->LogTail(40);
  EXPECT_TRUE(exit->Success()) << exit->ToString() << "\n" << cluster->LogTail(40);
}

}  // namespace
}  // namespace pd
