// Replays one fuzz target's committed corpus (tests/fuzz/corpus/<target>: seeds and the inputs
// that once crashed it) through its LLVMFuzzerTestOneInput, built by the main build with its
// compiler and flags. This is the regression half of fuzzing, in every test run and without
// clang; run_fuzzers.sh does the fuzzing. The target CHECKs its properties, so a regression
// aborts this test; the last "replaying" line on stderr names the input.
//
// Compiled once per target with PD_FUZZ_TARGET (the target's name, also the test's name) and
// PD_FUZZ_CORPUS_DIR.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Defined by the targets that build a fixture up front.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

TEST(FuzzCorpus, PD_FUZZ_TARGET) {
  std::vector<std::string> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(PD_FUZZ_CORPUS_DIR, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file(ec)) {
      files.push_back(it->path().string());
    }
  }
  ASSERT_FALSE(ec) << PD_FUZZ_CORPUS_DIR << ": " << ec.message();
  ASSERT_FALSE(files.empty()) << "no inputs in " << PD_FUZZ_CORPUS_DIR;
  std::sort(files.begin(), files.end());
  if (LLVMFuzzerInitialize != nullptr) {
    int argc = 0;
    char** argv = nullptr;
    LLVMFuzzerInitialize(&argc, &argv);
  }
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    ASSERT_TRUE(in) << file;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replaying %s\n", file.c_str());
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
              0)
        << file;
  }
}

}  // namespace
