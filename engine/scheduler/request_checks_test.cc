#include "engine/scheduler/request_checks.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig Model() {
  ModelConfig m;
  m.vocab_size = 32;
  m.seq_len = 8;
  return m;
}

GenerationRequest Request(std::vector<uint32_t> prompt) {
  GenerationRequest r;
  r.id = RequestId(5);
  r.prompt = std::move(prompt);
  return r;
}

void ExpectInvalid(const absl::Status& s, const char* message) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(message));
}

TEST(RequestChecksTest, Prompt) {
  EXPECT_TRUE(CheckPrompt(Request({1, 31}), Model()).ok());
  ExpectInvalid(CheckPrompt(Request({}), Model()), "request 5: empty prompt");
  ExpectInvalid(CheckPrompt(Request({1, 32}), Model()), "request 5: token id 32 >= vocab size 32");
  ExpectInvalid(CheckPrompt(Request(std::vector<uint32_t>(8, 1)), Model()),
                "prompt of 8 tokens does not fit the context of 8");
  EXPECT_TRUE(CheckPrompt(Request(std::vector<uint32_t>(7, 1)), Model()).ok());
}

TEST(RequestChecksTest, Options) {
  GenerationRequest r = Request({1});
  EXPECT_TRUE(CheckOptions(r, Model()).ok());
  r.sampling.forced_tokens = {3, 40};
  ExpectInvalid(CheckOptions(r, Model()), "forced token id 40 >= vocab size 32");
  r = Request({1});
  r.sampling.temperature = std::nanf("");
  ExpectInvalid(CheckOptions(r, Model()), "need a number, and top_p at most 1");
  r = Request({1});
  r.sampling.top_p = 1.5f;
  ExpectInvalid(CheckOptions(r, Model()), "top_p 1.5");
  r = Request({1});
  r.sampling.logprobs = 21;
  ExpectInvalid(CheckOptions(r, Model()), "logprobs 21 outside [-1, 20]");
  r.sampling.logprobs = -2;
  ExpectInvalid(CheckOptions(r, Model()), "logprobs -2 outside");
  r.sampling.logprobs = 20;
  EXPECT_TRUE(CheckOptions(r, Model()).ok());
  r.sampling.full_distribution = true;
  EXPECT_TRUE(CheckOptions(r, Model()).ok());
  r.sampling.logprobs = -1;
  ExpectInvalid(CheckOptions(r, Model()), "full_distribution needs logprobs >= 0");
  r.sampling.full_distribution = false;
  r.remote_prefill = [](RemotePrefillTarget) {};
  EXPECT_TRUE(CheckOptions(r, Model()).ok());
  r.on_prefilled = [](PrefilledBlocks) {};
  ExpectInvalid(CheckOptions(r, Model()), "remote_prefill and on_prefilled are exclusive");
}

}  // namespace
}  // namespace pd::engine
