// `--device` on the real binaries (pd-generate, pd-worker) with stories260K: a bad name is a
// usage error; `cuda` where it cannot run stops at startup naming why (no CUDA build, no
// device); on a GPU machine pd-generate --device cuda prints the CPU's greedy text and
// pd-worker --device cuda stops naming the transport that cannot register GPU memory (until a
// GPU KV transport exists, issue #9 item 3). Label e2e: runs everywhere, each machine checking
// the branch it has.
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"

namespace pd {
namespace {

using ::pd::testing::ExitInfo;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;

constexpr char kGenerate[] = PD_BINARY_DIR "/engine/tools/pd-generate";
constexpr char kWorker[] = PD_BINARY_DIR "/services/worker/pd-worker";
constexpr char kModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CommandResult {
  ExitInfo exit;
  std::string out, err;
};

class DeviceE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-device-e2e-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }

  // Runs `argv` to completion (30 s bound), stdout and stderr captured separately.
  CommandResult Run(const std::string& name, std::vector<std::string> argv) {
    const std::string out = absl::StrCat(dir_->path(), "/", name, ".out");
    const std::string err = absl::StrCat(dir_->path(), "/", name, ".err");
    std::vector<std::string> sh = {"/bin/sh", "-c",
                                   absl::StrCat("exec \"$0\" \"$@\" >'", out, "' 2>'", err, "'")};
    sh.insert(sh.end(), argv.begin(), argv.end());
    absl::StatusOr<Subprocess> p =
        Subprocess::Spawn(sh, absl::StrCat(dir_->path(), "/", name, ".log"));
    CommandResult run;
    if (!p.ok()) {
      run.err = p.status().ToString();
      return run;
    }
    absl::StatusOr<ExitInfo> exit = p->Wait(absl::Seconds(30));
    if (!exit.ok()) {
      run.err = absl::StrCat(name, " still running after 30s");
      exit = p->Stop(absl::Seconds(1));
    }
    run.exit = exit.ok() ? *exit : ExitInfo{};
    run.out = ReadFile(out);
    run.err += ReadFile(err);
    return run;
  }

  CommandResult Generate(const std::string& name, const std::string& device) {
    return Run(name, {kGenerate, "--model", kModel, "--tokenizer", kTokenizer, "--max_tokens=40",
                      "--device=" + device});
  }

  CommandResult Worker(const std::string& name, const std::string& device) {
    return Run(name,
               {kWorker, "--model", kModel, "--tokenizer", kTokenizer, "--grpc_address=127.0.0.1:0",
                "--metrics_address=127.0.0.1:0", "--transport=tcp", "--device=" + device});
  }

  std::optional<pd::testing::TempDir> dir_;
};

TEST_F(DeviceE2eTest, UnknownDeviceIsAStartupError) {
  CommandResult gen = Generate("gen-bad", "gpu");
  EXPECT_EQ(gen.exit.code, 1) << gen.exit.ToString() << gen.err;
  EXPECT_THAT(gen.err, HasSubstr("--device must be cpu or cuda, got \"gpu\""));
  CommandResult worker = Worker("worker-bad", "gpu");
  EXPECT_EQ(worker.exit.code, 1) << worker.exit.ToString() << worker.err;
  EXPECT_THAT(worker.err, HasSubstr("--device must be cpu or cuda"));
}

TEST_F(DeviceE2eTest, CudaRunsWhereItCanAndSaysWhyWhereItCannot) {
  CommandResult cpu = Generate("gen-cpu", "cpu");
  ASSERT_TRUE(cpu.exit.Success()) << cpu.exit.ToString() << cpu.err;
  EXPECT_THAT(cpu.out, HasSubstr("Once upon a time, there was a little girl named Lily."));
  CommandResult gen = Generate("gen-cuda", "cuda");
  CommandResult worker = Worker("worker-cuda", "cuda");
  EXPECT_EQ(worker.exit.code, 1) << worker.exit.ToString() << worker.err;
  if (!kernels::DeviceMemoryBuilt(kernels::Device::kCuda)) {
    EXPECT_EQ(gen.exit.code, 1) << gen.err;
    EXPECT_THAT(gen.err, HasSubstr("PD_ENABLE_CUDA"));
    EXPECT_THAT(worker.err, HasSubstr("PD_ENABLE_CUDA"));
    EXPECT_THAT(worker.err, HasSubstr("(UNIMPLEMENTED)"));
  } else if (kernels::DeviceCount(kernels::Device::kCuda) == 0) {
    EXPECT_EQ(gen.exit.code, 1) << gen.err;
    EXPECT_THAT(gen.err, HasSubstr("no CUDA device"));
    EXPECT_THAT(worker.err, HasSubstr("no CUDA device"));
    EXPECT_THAT(worker.err, HasSubstr("(FAILED_PRECONDITION)"));
  } else {
    ASSERT_TRUE(gen.exit.Success()) << gen.exit.ToString() << gen.err;
    EXPECT_EQ(gen.out, cpu.out);  // the same greedy text
    EXPECT_THAT(worker.err, HasSubstr("--transport tcp with --device cuda"));
    EXPECT_THAT(worker.err, HasSubstr("cannot register CUDA memory"));
  }
}

}  // namespace
}  // namespace pd
