// The stall a migrated stream sees (issue #32, docs/migration.md): pd-router and two decode
// pd-workers as real processes on loopback; each round starts --streams concurrent streams
// (a --prompt_tokens prompt each, fresh cache salt), SIGKILLs decode-0 once every stream has
// --after_tokens tokens, reads every stream to its end and restarts decode-0. A moved stream's
// stall is the gap between its last token before the move and its first after it, measured by
// the client; the router's pd_router_migrations_total says how many streams moved (m), and the
// m largest of the streams' largest gaps after the signal are taken as their stalls (the
// streams that stayed see ordinary gaps). The yardstick, measured in the same run: the TTFT of one fresh request
// whose prompt is as long as a moved stream's resumed prompt (prompt + after_tokens), on the
// idle cluster; and, as the load the moved streams meet, the TTFT of the rounds' own streams
// (--streams prompts prefilled at once, half per worker).
//
// Modes: recompute (the new worker computes the resumed prompt) and tier (both workers share a
// pd-tierd and write every computed block through to it: the new worker restores the blocks
// of the prompt and of the streamed tokens from the node's DRAM tier).
//
// --signal=kill (SIGKILL, a crash) or term (SIGTERM, a drain: the worker hands its streams
// over at once). A killed process's sockets close only once the kernel has torn it down (tens
// of ms for a worker's ~200 MB here), and only then can the router know: the bench holds a TCP
// connection to decode-0 and times kill -> that connection's end ("teardown"), and reports the
// rest of each stall, teardown's end -> the stream's next token ("move"), beside the stall.
// Under SIGTERM the worker ends its streams itself (their last tokens first): the move is
// the whole stall.
//
// Usage: migration_bench [--mode=both|recompute|tier] [--signal=kill|term] [--rounds=10]
//                        [--streams=8] [--prompt_tokens=256] [--after_tokens=32]
//                        [--model=HF_DIR] [--step_delay=5ms].
// stories260K from ../shared unless --model names another (a pd-make-model checkpoint).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log/log.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/cluster_fixture.h"

ABSL_FLAG(std::string, mode, "both", "recompute, tier or both");
ABSL_FLAG(int, rounds, 10, "kill rounds per mode");
ABSL_FLAG(int, streams, 8, "concurrent streams per round (half on the killed worker)");
ABSL_FLAG(int, prompt_tokens, 256, "prompt length in tokens");
ABSL_FLAG(int, after_tokens, 32, "tokens every stream has received when decode-0 is killed");
ABSL_FLAG(std::string, signal, "kill", "kill (SIGKILL: a crash) or term (SIGTERM: a drain)");
ABSL_FLAG(std::string, model, "",
          "a Hugging Face model directory (e.g. from pd-make-model) instead of stories260K");
ABSL_FLAG(std::string, step_delay, "5ms", "pd-worker --step_delay");

namespace {

using pd::e2e::Cluster;
using pd::e2e::Metric;

std::vector<uint32_t> Prompt(int n, int variant) {
  std::vector<uint32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 3 + (i * 7919 + variant * 104729) % 400;
  return p;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// First-token latency of one fresh request of `prompt`, in ms.
double Ttft(Cluster& c, const std::vector<uint32_t>& prompt, const std::string& salt) {
  pdserve::v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  req.mutable_sampling()->set_max_tokens(1);
  req.set_cache_salt(salt);
  grpc::ClientContext ctx;
  const absl::Time start = absl::Now();
  auto reader = c.api()->Generate(&ctx, req);
  pdserve::v1::GenerateResponse resp;
  absl::Time first = absl::InfiniteFuture();
  while (reader->Read(&resp)) {
    if (resp.token_ids_size() > 0 && first == absl::InfiniteFuture()) first = absl::Now();
  }
  const grpc::Status s = reader->Finish();
  CHECK(s.ok()) << s.error_message();
  return absl::ToDoubleMilliseconds(first - start);
}

// A plain TCP connection to 127.0.0.1:`port`; -1 on failure.
int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads `fd` until the peer closes it (whatever the server sent is dropped); when it closed.
absl::Time WaitClosed(int fd) {
  char buf[256];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  const absl::Time t = absl::Now();
  ::close(fd);
  return t;
}

struct ModeResult {
  std::vector<double> stalls_ms;
  std::vector<double> teardown_ms;  // signal -> decode-0's connection closed
  std::vector<double> move_ms;      // that close -> a moved stream's next token
  std::vector<double> ttft_ms;
  std::vector<double> stream_ttft_ms;  // the rounds' own streams: first token after the start
  int moved = 0;
  int failed = 0;
};

ModeResult RunMode(bool tier) {
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int after = absl::GetFlag(FLAGS_after_tokens);
  const int n = absl::GetFlag(FLAGS_streams);
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-migration-bench-");
  CHECK(dir.ok()) << dir.status();
  std::optional<pd::e2e::Tierd> tierd;
  // 5 ms per step keeps every stream running well past the kill.
  std::vector<std::string> flags = {"--step_delay=" + absl::GetFlag(FLAGS_step_delay),
                                    "--kv_blocks=2048", "--max_running=64"};
  const std::string model = absl::GetFlag(FLAGS_model);
  pd::e2e::ModelFiles files;
  if (!model.empty()) files = pd::e2e::ModelFiles{model, ""};
  if (tier) {
    std::vector<std::string> tierd_flags = {"--dram_mib=256", "--nvme_mib=256"};
    for (const std::string& f : files.Flags()) tierd_flags.push_back(f);
    if (files.tokenizer.empty()) tierd_flags.push_back("--tokenizer=");
    tierd.emplace(dir->path(), tierd_flags);
    flags.push_back("--tierd_address=" + tierd->address());
    flags.push_back("--tier_write_through");
  }
  Cluster c(dir->path(), 0, 2, "round_robin", flags, {}, nullptr, nullptr, files);
  CHECK(c.WaitReady(absl::Seconds(60))) << c.Logs();
  ModeResult r;
  for (int i = 0; i < absl::GetFlag(FLAGS_rounds); ++i) {
    r.ttft_ms.push_back(
        Ttft(c, Prompt(prompt_tokens + after, 1000 + i), absl::StrCat("ttft-", tier, "-", i)));
  }
  const bool term = absl::GetFlag(FLAGS_signal) == "term";
  const std::string moved_metric =
      absl::StrCat("pd_router_migrations_total{reason=\"", term ? "drain" : "failure",
                   "\",result=\"moved\"}");
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const double moved_before = Metric(c.RouterMetrics(), moved_metric);
    std::vector<std::vector<absl::Time>> arrivals(n);
    std::vector<std::atomic<int>> received(n);
    std::vector<grpc::Status> status(n);
    std::vector<absl::Time> starts(n);
    std::vector<std::thread> threads;
    for (int s = 0; s < n; ++s) {
      threads.emplace_back([&, s] {
        pdserve::v1::GenerateRequest req;
        const std::vector<uint32_t> prompt = Prompt(prompt_tokens, s);
        req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
        req.mutable_sampling()->set_max_tokens(after + 160);
        req.mutable_sampling()->set_ignore_eos(true);
        req.set_cache_salt(absl::StrCat("round-", tier, "-", round, "-", s));
        grpc::ClientContext ctx;
        starts[s] = absl::Now();
        auto reader = c.api()->Generate(&ctx, req);
        pdserve::v1::GenerateResponse resp;
        while (reader->Read(&resp)) {
          if (resp.token_ids_size() == 0) continue;
          arrivals[s].push_back(absl::Now());
          received[s] += resp.token_ids_size();
        }
        status[s] = reader->Finish();
      });
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    auto all_have = [&] {
      for (auto& k : received) {
        if (k.load() < after) return false;
      }
      return true;
    };
    while (!all_have() && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(200));
    const int probe = ConnectLoopback(c.workers()[0].grpc_port);
    CHECK_GE(probe, 0) << "cannot connect to decode-0";
    absl::Time closed = absl::InfiniteFuture();
    std::thread watch([&] { closed = WaitClosed(probe); });
    const absl::Time signalled = absl::Now();
    CHECK(c.workers()[0].process->Signal(term ? SIGTERM : SIGKILL).ok());
    for (std::thread& t : threads) t.join();
    watch.join();
    struct Gap {
      double ms = 0;
      absl::Time end = absl::InfinitePast();
    };
    std::vector<Gap> gaps;
    for (int s = 0; s < n; ++s) {
      if (!status[s].ok()) ++r.failed;
      if (!arrivals[s].empty()) {
        r.stream_ttft_ms.push_back(absl::ToDoubleMilliseconds(arrivals[s][0] - starts[s]));
      }
      // The largest gap ending after the signal: a moved stream's stall (a drained worker
      // still sends its last tokens after the signal, then the seam comes), an ordinary gap
      // for the others.
      Gap after;
      for (size_t k = 1; k < arrivals[s].size(); ++k) {
        const double ms = absl::ToDoubleMilliseconds(arrivals[s][k] - arrivals[s][k - 1]);
        if (arrivals[s][k] > signalled && ms > after.ms) after = Gap{ms, arrivals[s][k]};
      }
      gaps.push_back(after);
    }
    const int moved = static_cast<int>(Metric(c.RouterMetrics(), moved_metric) - moved_before);
    std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.ms > b.ms; });
    for (int k = 0; k < moved && k < n; ++k) {
      r.stalls_ms.push_back(gaps[k].ms);
      // From when the router could first know: a killed worker's connections end once the
      // kernel has torn the process down; a drained worker ends the stream itself, right
      // after the last token before the seam (the move is the whole stall).
      r.move_ms.push_back(term ? gaps[k].ms : absl::ToDoubleMilliseconds(gaps[k].end - closed));
    }
    if (!term) r.teardown_ms.push_back(absl::ToDoubleMilliseconds(closed - signalled));
    r.moved += moved;
    (void)c.workers()[0].process->Wait(absl::Seconds(10));
    c.RestartWorker(0);
    CHECK(c.WaitReady(absl::Seconds(60))) << c.Logs();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The stall a migrated stream sees, against the TTFT of its resumed prompt; see the top of "
      "services/bench/migration_bench.cc");
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "both" && mode != "recompute" && mode != "tier") {
    std::fprintf(stderr, "--mode must be both, recompute or tier, got '%s'\n", mode.c_str());
    return 2;
  }
  const std::string sig = absl::GetFlag(FLAGS_signal);
  if (sig != "kill" && sig != "term") {
    std::fprintf(stderr, "--signal must be kill or term, got '%s'\n", sig.c_str());
    return 2;
  }
  std::printf("%-10s %-6s %6s %6s %13s %13s %15s %12s %12s %12s %9s %16s %14s\n", "mode",
              "signal", "moved", "failed", "stall_p50_ms", "stall_p99_ms", "teardown_p50_ms",
              "move_p50_ms", "move_p99_ms", "ttft_p50_ms", "p99/ttft", "load_ttft_p50_ms",
              "p99/load_ttft");
  for (const bool tier : {false, true}) {
    if ((tier && mode == "recompute") || (!tier && mode == "tier")) continue;
    const ModeResult r = RunMode(tier);
    const double ttft = Quantile(r.ttft_ms, 0.5);
    const double p99 = Quantile(r.stalls_ms, 0.99);
    const double load_ttft = Quantile(r.stream_ttft_ms, 0.5);
    std::printf("%-10s %-6s %6d %6d %13.2f %13.2f %15.2f %12.2f %12.2f %12.2f %9.2f %16.2f %14.2f\n",
                tier ? "tier" : "recompute", sig.c_str(), r.moved, r.failed,
                Quantile(r.stalls_ms, 0.5), p99, Quantile(r.teardown_ms, 0.5),
                Quantile(r.move_ms, 0.5), Quantile(r.move_ms, 0.99), ttft,
                ttft > 0 ? p99 / ttft : 0, load_ttft, load_ttft > 0 ? p99 / load_ttft : 0);
    std::fflush(stdout);
  }
  return 0;
}
