// deploy/local/pd-local and pd-client as an operator uses them: start the local cluster with
// stories260K, stream the model README's greedy text through pd-client, check that the workers
// and pd-tierd name the same node (a prompt evicted to DRAM is placed with tier credit), stop it
// with SIGINT, and leave no process behind. Also the usage-error and RPC-error exit codes of both
// tools.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

using ::pd::testing::ExitInfo;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPdLocal[] = PD_SOURCE_DIR "/deploy/local/pd-local";
constexpr char kClient[] = PD_BINARY_DIR "/services/client/pd-client";
constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

// What ../shared/models/stories260K/README.md says greedy decoding from BOS alone starts with.
constexpr char kReadmeGreedyText[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The shell commands of the OpenAI examples in a Markdown file: every `curl` line of its ```sh
// blocks that calls the HTTP API (continuation lines joined), each preceded by the variable
// assignments its block made before it (BASE=...).
std::vector<std::string> DocCurlExamples(const std::string& markdown) {
  std::vector<std::string> out;
  std::istringstream in(markdown);
  std::string line, command, assignments;
  bool in_sh = false;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "```")) {
      in_sh = !in_sh && (line == "```sh" || line == "```bash");
      assignments.clear();
      continue;
    }
    if (!in_sh) continue;
    command += line;
    if (absl::EndsWith(command, "\\")) {
      command.pop_back();
      continue;
    }
    std::string whole = std::string(absl::StripAsciiWhitespace(command));
    command.clear();
    if (absl::StartsWith(whole, "BASE=")) {
      absl::StrAppend(&assignments, whole.substr(0, whole.find(' ')), "; ");
    } else if (absl::StartsWith(whole, "curl ") &&
               (absl::StrContains(whole, "/v1") || absl::StrContains(whole, "$BASE"))) {
      out.push_back(assignments + whole);
    }
  }
  return out;
}

struct CommandResult {
  ExitInfo exit;
  std::string out, err;
};

// Runs `argv` to completion (bounded by `timeout`), stdout and stderr captured separately.
CommandResult RunCommand(const std::string& dir, const std::string& name,
                         std::vector<std::string> argv,
                         absl::Duration timeout = absl::Seconds(30)) {
  const std::string out = absl::StrCat(dir, "/", name, ".out");
  const std::string err = absl::StrCat(dir, "/", name, ".err");
  std::vector<std::string> sh = {"/bin/sh", "-c",
                                 absl::StrCat("exec \"$0\" \"$@\" >'", out, "' 2>'", err, "'")};
  sh.insert(sh.end(), argv.begin(), argv.end());
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(sh, absl::StrCat(dir, "/", name, ".log"));
  CommandResult run;
  if (!p.ok()) {
    run.err = p.status().ToString();
    return run;
  }
  absl::StatusOr<ExitInfo> exit = p->Wait(timeout);
  if (!exit.ok()) {
    run.err = absl::StrCat(name, " still running after ", absl::FormatDuration(timeout));
    exit = p->Stop(absl::Seconds(1));
  }
  run.exit = exit.ok() ? *exit : ExitInfo{};
  run.out = ReadFile(out);
  run.err += ReadFile(err);
  return run;
}

// "<name> <pid>" lines of a pd-local run dir.
std::vector<std::pair<std::string, pid_t>> ReadPids(const std::string& run_dir) {
  std::vector<std::pair<std::string, pid_t>> pids;
  for (absl::string_view line : absl::StrSplit(ReadFile(run_dir + "/pids"), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int pid = 0;
    if (f.size() == 2 && absl::SimpleAtoi(f[1], &pid) && pid > 0) {
      pids.emplace_back(f[0], pid);
    }
  }
  return pids;
}

// True while `pid` runs one of the cluster's programs (a reused pid running something else
// does not count).
bool ClusterProcessAlive(pid_t pid) {
  const std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (cmdline.empty() || paren == std::string::npos || stat.substr(paren + 2, 1) == "Z") {
    return false;
  }
  return absl::StrContains(cmdline, "pd-router") || absl::StrContains(cmdline, "pd-worker") ||
         absl::StrContains(cmdline, "pd-tierd") || absl::StrContains(cmdline, "redis-server");
}

// The metrics URL of each process in a pd-local run dir's cluster.txt ("router" for the router's
// "router_metrics URL" line, else the line's name before "... metrics URL").
std::vector<std::pair<std::string, std::string>> MetricsUrls(const std::string& run_dir) {
  std::vector<std::pair<std::string, std::string>> urls;
  for (absl::string_view line : absl::StrSplit(ReadFile(run_dir + "/cluster.txt"), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() == 2 && f[0] == "router_metrics") {
      urls.emplace_back("router", f[1]);
    }
    for (size_t i = 1; i + 1 < f.size(); ++i) {
      if (f[i] == "metrics") urls.emplace_back(f[0], f[i + 1]);
    }
  }
  return urls;
}

// The value of `series` (e.g. `pd_tierd_blocks{tier="dram"}`) in Prometheus text, or -1.
double Metric(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      double v = 0;
      if (absl::SimpleAtod(absl::StripAsciiWhitespace(line), &v)) return v;
    }
  }
  return -1;
}

class LocalClusterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-local-e2e-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }
  // Whatever happened, nothing of the run survives the test.
  void TearDown() override {
    if (!run_dir_.empty()) {
      for (const auto& [name, pid] : ReadPids(run_dir_)) {
        if (ClusterProcessAlive(pid)) {
          ::kill(pid, SIGKILL);
        }
      }
    }
  }
  std::string Dir() const { return dir_->path(); }

  std::string Scrape(const std::string& url) {
    CommandResult r = RunCommand(Dir(), "scrape", {"curl", "-sf", "--max-time", "5", url});
    EXPECT_TRUE(r.exit.Success()) << url << ": " << r.exit.ToString() << " " << r.err;
    return r.out;
  }

  std::optional<pd::testing::TempDir> dir_;
  std::string run_dir_;
};

TEST_F(LocalClusterE2eTest, StreamsTheReadmeGreedyTextAndStopsCleanlyOnSigint) {
  if (!Exists(kModel) || !Exists(kTokenizer)) {
    GTEST_SKIP() << "stories260K not found under " << PD_SHARED_DIR;
  }
  run_dir_ = Dir() + "/run";
  const std::string ready_file = Dir() + "/ready";
  absl::StatusOr<Subprocess> cluster = Subprocess::Spawn(
      {kPdLocal, "--build-dir", PD_BINARY_DIR, "--run_dir", run_dir_, "--ready_file", ready_file,
       "--port=0", "--model", kModel, "--tokenizer", kTokenizer, "--prefill=1", "--decode=1",
       // Small pools: a few prompts evict each other's blocks to pd-tierd's DRAM tier.
       "--worker_arg=--kv_blocks=24", "--stop_timeout=10", "--start_timeout=40",
       // The decode worker at tensor parallel 2 (--decode_arg is for its role only): the
       // README's text is TP 1's, and the prefill worker at TP 1 pairs with it.
       "--decode_arg=--tensor_parallel=2",
       // A loaded test machine can take more than the default 5 ms per Redis lookup; one slow
       // lookup would pause lookups for a second, past the retries below.
       "--router_arg=--redis_lookup_timeout=500ms"},
      Dir() + "/pd-local.log");
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (!Exists(ready_file) && absl::Now() < deadline) {
    std::optional<ExitInfo> ended = cluster->Poll();
    ASSERT_FALSE(ended.has_value()) << "pd-local " << ended->ToString() << ":\n"
                                    << cluster->LogTail(60);
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(Exists(ready_file)) << cluster->LogTail(60);
  const std::string endpoint(absl::StripAsciiWhitespace(ReadFile(ready_file)));
  EXPECT_THAT(endpoint, StartsWith("127.0.0.1:"));
  EXPECT_THAT(cluster->ReadLog(), HasSubstr("ready after"));

  // Greedy from BOS alone, as the README's "no prompt" run; dashed flag spellings on purpose.
  CommandResult gen = RunCommand(Dir(), "generate",
                                 {kClient, "--router", endpoint, "--token-ids=1", "--max-tokens",
                                  "100", "--temperature=0", "--timeout=20s"});
  ASSERT_TRUE(gen.exit.Success()) << gen.exit.ToString() << "\n" << gen.err;
  EXPECT_THAT(gen.out, StartsWith(kReadmeGreedyText)) << gen.out;
  EXPECT_EQ(gen.out.back(), '\n');
  EXPECT_THAT(gen.err, HasSubstr("prompt_tokens=1 cached_tokens=0 generated_tokens="));
  EXPECT_THAT(gen.err, HasSubstr("finish_reason="));

  CommandResult models =
      RunCommand(Dir(), "models", {kClient, "--router=" + endpoint, "--list_models"});
  ASSERT_TRUE(models.exit.Success()) << models.exit.ToString() << "\n" << models.err;
  EXPECT_THAT(models.out, StartsWith("stories260K block_size=16 "));

  // Workers and pd-tierd name the same node, so the router credits the node's DRAM blocks to
  // them: no worker reports a mismatch, and a prompt whose blocks were evicted to DRAM is placed
  // with tier credit from the Redis index.
  std::string router_url, tierd_url;
  std::vector<std::string> worker_urls;
  for (const auto& [name, url] : MetricsUrls(run_dir_)) {
    if (name == "router") router_url = url;
    if (name == "tierd") tierd_url = url;
    if (name == "prefill-0" || name == "decode-0") worker_urls.push_back(url);
    if (name == "decode-0") {
      EXPECT_EQ(Metric(Scrape(url), "pd_worker_tensor_parallel_ranks"), 2) << url;
    }
  }
  ASSERT_FALSE(router_url.empty()) << ReadFile(run_dir_ + "/cluster.txt");
  ASSERT_FALSE(tierd_url.empty()) << ReadFile(run_dir_ + "/cluster.txt");
  ASSERT_EQ(worker_urls.size(), 2u) << ReadFile(run_dir_ + "/cluster.txt");
  for (const std::string& url : worker_urls) {
    // A worker attaches to pd-tierd in the background (again every second while it fails, as
    // when its first try came before pd-tierd listened): wait for it rather than assume it.
    std::string m = Scrape(url);
    for (int i = 0; i < 150 && Metric(m, "pd_worker_tierd_attached") != 1; ++i) {
      absl::SleepFor(absl::Milliseconds(100));
      m = Scrape(url);
    }
    EXPECT_EQ(Metric(m, "pd_worker_tierd_attached"), 1) << url << "\n" << m;
    EXPECT_EQ(Metric(m, "pd_worker_tierd_node_mismatch"), 0) << url << "\n" << m;
  }
  // Six prompts of ~140 tokens (9+ blocks each) through pools of 24 blocks: the first ones are
  // evicted from both workers and offered to DRAM, which tierd publishes to Redis.
  auto prompt = [](int k) {
    return absl::StrCat("Tale ", k,
                        ". Once upon a time, there was a little girl named Lily. She "
                        "loved to play outside in the park with her friends. One day, she saw a "
                        "big red ball under a tree. She ran to the ball and picked it up. It was "
                        "shiny and round. Lily wanted to show it to her mom, so she went home. Her "
                        "mom smiled and said it was a very nice ball. Then they");
  };
  constexpr int kPrompts = 6;
  for (int k = 0; k < kPrompts; ++k) {
    CommandResult r =
        RunCommand(Dir(), "fill",
                   {kClient, "--router=" + endpoint, "--max_tokens=2", "--timeout=20s", prompt(k)});
    ASSERT_TRUE(r.exit.Success()) << r.exit.ToString() << "\n" << r.err;
  }
  const absl::Time published_by = absl::Now() + absl::Seconds(15);
  std::string tm = Scrape(tierd_url);
  while ((Metric(tm, "pd_tierd_redis_published_total") <= 0 ||
          Metric(tm, "pd_tierd_redis_pending_updates") != 0) &&
         absl::Now() < published_by) {
    absl::SleepFor(absl::Milliseconds(100));
    tm = Scrape(tierd_url);
  }
  ASSERT_GT(Metric(tm, "pd_tierd_blocks{tier=\"dram\"}"), 0) << tm;
  ASSERT_GT(Metric(tm, "pd_tierd_redis_published_total"), 0) << tm;
  // Asking again for the oldest prompts: each placement looks its chain up in Redis. A lookup
  // may still miss its budget, so up to three evicted prompts are tried, each after the pause
  // that a missed lookup starts has ended.
  double credited = 0;
  std::string rm;
  for (int k = 0; k < 3 && credited <= 0; ++k) {
    rm = Scrape(router_url);
    for (int i = 0; i < 30 && Metric(rm, "pd_router_tier_credit_breaker_open") == 1; ++i) {
      absl::SleepFor(absl::Milliseconds(100));
      rm = Scrape(router_url);
    }
    CommandResult r =
        RunCommand(Dir(), "again",
                   {kClient, "--router=" + endpoint, "--max_tokens=2", "--timeout=20s", prompt(k)});
    ASSERT_TRUE(r.exit.Success()) << r.exit.ToString() << "\n" << r.err;
    rm = Scrape(router_url);
    credited = Metric(rm, "pd_router_tier_credit_workers_total");
  }
  EXPECT_GT(credited, 0) << rm;
  EXPECT_GT(Metric(rm, "pd_router_tier_credit_blocks_total{tier=\"dram\"}"), 0) << rm;

  const std::vector<std::pair<std::string, pid_t>> pids = ReadPids(run_dir_);
  std::vector<std::string> names;
  for (const auto& [name, pid] : pids) {
    names.push_back(name);
    EXPECT_TRUE(ClusterProcessAlive(pid)) << name << " " << pid;
  }
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre("redis", "tierd", "prefill-0", "decode-0", "router"));
  // Everything listens on loopback only, the workers' UCX data plane included (UCX's tcp
  // transport listens on every interface unless restricted to the one of --transport_host).
  for (const auto& [name, pid] : pids) {
    absl::StatusOr<std::vector<pd::testing::ListeningSocket>> socks =
        pd::testing::ListeningTcpSockets(pid);
    ASSERT_TRUE(socks.ok()) << name << ": " << socks.status();
    EXPECT_FALSE(socks->empty()) << name;
    for (const pd::testing::ListeningSocket& s : *socks) {
      EXPECT_TRUE(s.IsLoopback()) << name << " listens on " << s.ToString();
    }
  }

  // The README's and docs/openai.md's OpenAI examples, run as printed (the address aside)
  // against this default cluster: every one is answered without an error, and every model id
  // the docs' client examples name is the one served.
  const std::string openai(absl::StripAsciiWhitespace(ReadFile(ready_file + ".openai")));
  ASSERT_THAT(openai, StartsWith("http://127.0.0.1:")) << ReadFile(run_dir_ + "/cluster.txt");
  int examples = 0;
  for (const char* doc : {"README.md", "docs/openai.md"}) {
    const std::string text = ReadFile(absl::StrCat(PD_SOURCE_DIR, "/", doc));
    std::vector<std::string> commands = DocCurlExamples(text);
    EXPECT_GE(commands.size(), absl::string_view(doc) == "README.md" ? 1u : 4u) << doc;
    for (std::string& cmd : commands) {
      for (const char* printed : {"http://127.0.0.1:PORT/v1", "http://127.0.0.1:8000/v1"}) {
        cmd = absl::StrReplaceAll(cmd, {{printed, openai}});
      }
      CommandResult r = RunCommand(Dir(), absl::StrCat("example-", ++examples),
                                   {"/bin/bash", "-c", cmd + " --max-time 20 --fail-with-body"});
      EXPECT_TRUE(r.exit.Success()) << doc << ": " << cmd << "\n" << r.out << r.err;
      EXPECT_FALSE(r.out.empty()) << doc << ": " << cmd;
      EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\"error\""))) << doc << ": " << cmd;
      if (absl::StrContains(cmd, "\"stream\": true")) {
        EXPECT_THAT(r.out, HasSubstr("data: [DONE]")) << doc << ": " << cmd;
      }
    }
    // Python and Node examples cannot run here (no PyPI); their model ids must still be right.
    const std::regex model_re(R"re(model"?\s*[:=]\s*["']([^"']+)["'])re");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), model_re);
         it != std::sregex_iterator(); ++it) {
      EXPECT_EQ((*it)[1].str(), "stories260K") << doc << ": " << (*it)[0].str();
    }
  }

  // A killed pd-tierd is restarted on its ports, and the workers attach to the new one.
  pid_t old_tierd = 0;
  for (const auto& [name, pid] : pids) {
    if (name == "tierd") old_tierd = pid;
  }
  ASSERT_GT(old_tierd, 0);
  ASSERT_EQ(::kill(old_tierd, SIGKILL), 0);
  const absl::Time restarted_by = absl::Now() + absl::Seconds(20);
  auto restarted = [&] {
    int tierds = 0;
    for (const auto& [name, pid] : ReadPids(run_dir_)) {
      tierds += name == "tierd" && pid != old_tierd && ClusterProcessAlive(pid);
    }
    return tierds == 1;
  };
  while (!restarted() && absl::Now() < restarted_by) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(restarted()) << cluster->LogTail(20);
  EXPECT_THAT(cluster->ReadLog(), HasSubstr("restarting pd-tierd"));
  // Workers notice the restart at their next call to tierd and attach to the new one.
  double sessions = 0;
  const absl::Time attached_by = absl::Now() + absl::Seconds(20);
  while (sessions < 1 && absl::Now() < attached_by) {
    RunCommand(Dir(), "after-tierd-restart",
               {kClient, "--router=" + endpoint, "--max_tokens=2", "--timeout=20s", prompt(1)});
    // Not Scrape: the new tierd's metrics port may not answer yet.
    const CommandResult m =
        RunCommand(Dir(), "scrape-tierd", {"curl", "-sf", "--max-time", "5", tierd_url});
    sessions = Metric(m.out, "pd_tierd_sessions");
    if (sessions < 1) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GE(sessions, 1) << cluster->LogTail(20);
  const std::vector<std::pair<std::string, pid_t>> all_pids = ReadPids(run_dir_);

  ASSERT_TRUE(cluster->Signal(SIGINT).ok());
  absl::StatusOr<ExitInfo> exit = cluster->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << "pd-local did not stop:\n" << cluster->LogTail(40);
  EXPECT_TRUE(exit->Success()) << exit->ToString() << "\n" << cluster->LogTail(40);
  EXPECT_THAT(cluster->ReadLog(), HasSubstr("stopped"));
  for (const auto& [name, pid] : all_pids) {
    EXPECT_FALSE(ClusterProcessAlive(pid)) << name << " (pid " << pid << ") outlived pd-local";
  }
}

// --secure: TLS, mutual TLS between router and workers, the cluster token, a generated API key
// and a Redis password (docs/security.md). pd-client needs the CA and the key; redis-cli needs
// the password; the NVMe tier is 0700/0600; no secret reaches a log or a command line.
TEST_F(LocalClusterE2eTest, SecureClusterServesOnlyClientsWithTheCaAndTheKey) {
  if (!Exists(kModel) || !Exists(kTokenizer)) {
    GTEST_SKIP() << "stories260K not found under " << PD_SHARED_DIR;
  }
  run_dir_ = Dir() + "/run";
  const std::string ready_file = Dir() + "/ready";
  absl::StatusOr<Subprocess> cluster = Subprocess::Spawn(
      {kPdLocal, "--build-dir", PD_BINARY_DIR, "--run_dir", run_dir_, "--ready_file", ready_file,
       "--port=0", "--model", kModel, "--tokenizer", kTokenizer, "--prefill=1", "--decode=1",
       "--secure", "--stop_timeout=10", "--start_timeout=40"},
      Dir() + "/pd-local.log");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (!Exists(ready_file) && absl::Now() < deadline) {
    std::optional<ExitInfo> ended = cluster->Poll();
    ASSERT_FALSE(ended.has_value()) << "pd-local " << ended->ToString() << ":\n"
                                    << cluster->LogTail(60);
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(Exists(ready_file)) << cluster->LogTail(60);
  const std::string endpoint(absl::StripAsciiWhitespace(ReadFile(ready_file)));
  const std::string secrets = run_dir_ + "/secrets";

  CommandResult gen = RunCommand(Dir(), "secure-generate",
                                 {kClient, "--router", endpoint, "--tls_ca=" + secrets + "/ca.pem",
                                  "--api_key_file=" + secrets + "/api-key", "--token-ids=1",
                                  "--max-tokens=30", "--timeout=20s"});
  ASSERT_TRUE(gen.exit.Success()) << gen.exit.ToString() << "\n" << gen.err;
  EXPECT_THAT(gen.out, StartsWith(std::string(kReadmeGreedyText).substr(0, 40))) << gen.out;

  CommandResult no_key = RunCommand(
      Dir(), "secure-no-key",
      {kClient, "--router", endpoint, "--tls_ca=" + secrets + "/ca.pem", "--timeout=10s", "hi"});
  EXPECT_EQ(no_key.exit.code, 1) << no_key.err;
  EXPECT_THAT(no_key.err, HasSubstr("UNAUTHENTICATED"));
  CommandResult plaintext =
      RunCommand(Dir(), "secure-plaintext",
                 {kClient, "--router", endpoint, "--api_key_file=" + secrets + "/api-key",
                  "--timeout=5s", "hi"});
  EXPECT_EQ(plaintext.exit.code, 1) << plaintext.err;
  EXPECT_THAT(plaintext.err, HasSubstr("UNAVAILABLE"));

  // Redis wants the generated password: without it every command is refused (NOAUTH), with it
  // (REDISCLI_AUTH, as pd-local passes it) it answers, and pd-tierd is connected with it.
  std::string redis_port;
  for (absl::string_view line : absl::StrSplit(ReadFile(run_dir_ + "/cluster.txt"), '\n')) {
    if (absl::ConsumePrefix(&line, "redis 127.0.0.1:")) redis_port = std::string(line);
  }
  ASSERT_FALSE(redis_port.empty()) << ReadFile(run_dir_ + "/cluster.txt");
  CommandResult open_redis = RunCommand(
      Dir(), "redis-noauth", {"redis-cli", "-h", "127.0.0.1", "-p", redis_port, "set", "k", "v"});
  EXPECT_THAT(open_redis.out + open_redis.err, HasSubstr("NOAUTH")) << open_redis.exit.ToString();
  CommandResult authed =
      RunCommand(Dir(), "redis-auth",
                 {"/bin/sh", "-c",
                  "REDISCLI_AUTH=\"$(cat \"$0\")\" exec redis-cli -h 127.0.0.1 -p \"$1\" ping",
                  secrets + "/redis-password", redis_port});
  EXPECT_EQ(absl::StripAsciiWhitespace(authed.out), "PONG") << authed.err;
  std::string tierd_url;
  for (const auto& [name, url] : MetricsUrls(run_dir_)) {
    if (name == "tierd") tierd_url = url;
  }
  ASSERT_FALSE(tierd_url.empty()) << ReadFile(run_dir_ + "/cluster.txt");
  std::string tm = Scrape(tierd_url);
  const absl::Time connected_by = absl::Now() + absl::Seconds(10);
  while (Metric(tm, "pd_tierd_redis_connected") != 1 && absl::Now() < connected_by) {
    absl::SleepFor(absl::Milliseconds(100));
    tm = Scrape(tierd_url);
  }
  EXPECT_EQ(Metric(tm, "pd_tierd_redis_connected"), 1) << tm;
  // The NVMe tier (made by pd-tierd itself) is private to the cluster's user.
  struct stat st {};
  ASSERT_EQ(::stat((run_dir_ + "/nvme").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  int tier_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(run_dir_ + "/nvme")) {
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << e.path();
    ++tier_files;
  }
  EXPECT_GT(tier_files, 0);  // the manifest at least

  const std::string key(absl::StripAsciiWhitespace(ReadFile(secrets + "/api-key")));
  const std::string token(absl::StripAsciiWhitespace(ReadFile(secrets + "/cluster-token")));
  const std::string redis_password(
      absl::StripAsciiWhitespace(ReadFile(secrets + "/redis-password")));
  ASSERT_GE(key.size(), 32u);
  ASSERT_GE(token.size(), 32u);
  ASSERT_GE(redis_password.size(), 32u);
  for (const auto& [name, pid] : ReadPids(run_dir_)) {  // no secret on a command line
    const std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    EXPECT_THAT(cmdline, ::testing::Not(HasSubstr(redis_password))) << name;
  }
  ASSERT_TRUE(cluster->Signal(SIGINT).ok());
  absl::StatusOr<ExitInfo> exit = cluster->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << "pd-local did not stop:\n" << cluster->LogTail(40);
  EXPECT_TRUE(exit->Success()) << exit->ToString();
  for (const std::string& log : {cluster->ReadLog(), ReadFile(run_dir_ + "/router.log"),
                                 ReadFile(run_dir_ + "/decode-0.log"),
                                 ReadFile(run_dir_ + "/prefill-0.log"), gen.err, no_key.err}) {
    EXPECT_THAT(log, ::testing::Not(HasSubstr(key)));
    EXPECT_THAT(log, ::testing::Not(HasSubstr(token)));
    EXPECT_THAT(log, ::testing::Not(HasSubstr(redis_password)));
  }
}

TEST_F(LocalClusterE2eTest, UsageErrorsExitTwoAndRpcErrorsExitOne) {
  CommandResult help = RunCommand(Dir(), "local-help", {kPdLocal, "--help"});
  EXPECT_TRUE(help.exit.Success()) << help.exit.ToString();
  EXPECT_THAT(help.out, HasSubstr("--worker_arg"));
  EXPECT_THAT(help.out, HasSubstr("--decode_arg"));
  CommandResult bad = RunCommand(Dir(), "local-bad", {kPdLocal, "--decode=0"});
  EXPECT_EQ(bad.exit.code, 2) << bad.exit.ToString() << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("--decode must be at least 1"));

  CommandResult no_prompt = RunCommand(Dir(), "client-no-prompt", {kClient});
  EXPECT_EQ(no_prompt.exit.code, 2) << no_prompt.err;
  EXPECT_THAT(no_prompt.err, HasSubstr("no prompt"));
  CommandResult typo = RunCommand(Dir(), "client-typo", {kClient, "--max-tokns", "5", "hi"});
  EXPECT_EQ(typo.exit.code, 2) << typo.err;
  EXPECT_THAT(typo.err, HasSubstr("unknown flag: --max-tokns"));
  CommandResult value = RunCommand(Dir(), "client-value", {kClient, "--max-tokens=lots", "hi"});
  EXPECT_EQ(value.exit.code, 2) << value.err;

  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();  // nothing listens there
  ASSERT_TRUE(port.ok()) << port.status();
  CommandResult down =
      RunCommand(Dir(), "client-down",
                 {kClient, absl::StrCat("--router=127.0.0.1:", *port), "--timeout=2s", "hi"});
  EXPECT_EQ(down.exit.code, 1) << down.err;
  EXPECT_THAT(down.err, HasSubstr("pd-client: error: UNAVAILABLE: "));
  CommandResult waited = RunCommand(
      Dir(), "client-wait",
      {kClient, absl::StrCat("--router=127.0.0.1:", *port), "--wait_ready=500ms", "--list_models"});
  EXPECT_EQ(waited.exit.code, 1) << waited.err;
  EXPECT_THAT(waited.err, HasSubstr("not ready after 500ms"));
}

}  // namespace
}  // namespace pd
