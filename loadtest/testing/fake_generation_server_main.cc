// pd-fake-generation-server: the canned-token Generation server of pd-loadtest's tests as a
// process, for the load generator's throughput benchmark (docs/benchmarks.md) and for trying
// pd-loadtest without a cluster. Serves until SIGINT/SIGTERM.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "loadtest/testing/fake_generation_server.h"
#include "services/base/shutdown_signal.h"
#include "services/base/startup.h"

ABSL_FLAG(std::string, address, "127.0.0.1:0", "listen address; port 0 = pick one");
ABSL_FLAG(int, tokens_per_message, 1, "tokens per streamed message");
ABSL_FLAG(int64_t, default_output_tokens, 16, "tokens when a request sets no max_tokens");
ABSL_FLAG(absl::Duration, first_token_delay, absl::ZeroDuration(), "delay before the first token");
ABSL_FLAG(absl::Duration, token_delay, absl::ZeroDuration(), "delay before each later message");
ABSL_FLAG(uint32_t, vocab_size, 32000, "vocab_size reported by ListModels and enforced");
ABSL_FLAG(int64_t, fail_every_n, 0, "fail every n-th request with UNAVAILABLE; 0 = never");
ABSL_FLAG(bool, simulate_prefix_cache, false, "report cached_tokens from an unbounded cache");
ABSL_FLAG(int, num_threads, 2, "completion-queue polling threads, [1, 64]");

int main(int argc, char** argv) {
  pd::services::ParseFlagsAndInitLogging(argc, argv,
                                         "pd-fake-generation-server [--address=127.0.0.1:0]");
  pd::loadtest::testing::FakeGenerationServerOptions o;
  o.address = absl::GetFlag(FLAGS_address);
  o.tokens_per_message = absl::GetFlag(FLAGS_tokens_per_message);
  o.default_output_tokens = absl::GetFlag(FLAGS_default_output_tokens);
  o.first_token_delay = absl::GetFlag(FLAGS_first_token_delay);
  o.token_delay = absl::GetFlag(FLAGS_token_delay);
  o.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.fail_every_n = absl::GetFlag(FLAGS_fail_every_n);
  o.simulate_prefix_cache = absl::GetFlag(FLAGS_simulate_prefix_cache);
  o.num_threads = absl::GetFlag(FLAGS_num_threads);
  pd::services::ShutdownSignal signal;
  auto server = pd::loadtest::testing::FakeGenerationServer::Start(o);
  if (!server.ok()) {
    pd::services::ExitWithStartupError("pd-fake-generation-server", server.status());
  }
  std::printf("listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  signal.Wait();
  (*server)->Shutdown();
  const auto s = (*server)->stats();
  std::printf("served %lld requests (%lld ok, %lld failed, %lld cancelled), %lld tokens\n",
              static_cast<long long>(s.requests), static_cast<long long>(s.succeeded),
              static_cast<long long>(s.failed), static_cast<long long>(s.cancelled),
              static_cast<long long>(s.tokens_sent));
  return 0;
}
