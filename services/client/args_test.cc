#include "services/client/args.h"

#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A few flags shaped like pd-client's: booleans, an integer with a checked value, strings.
std::optional<FlagInfo> FakeLookup(absl::string_view name) {
  static const std::map<std::string, bool, std::less<>> kFlags = {
      {"json", true},  {"ignore_eos", true}, {"help", true},   {"max_tokens", false},
      {"stop", false}, {"router", false},    {"top_p", false}, {"token_ids", false}};
  auto it = kFlags.find(name);
  if (it == kFlags.end()) {
    return std::nullopt;
  }
  FlagInfo info;
  info.is_bool = it->second;
  if (name == "max_tokens") {
    info.check = [](absl::string_view v) {
      uint32_t n = 0;
      return absl::SimpleAtoi(v, &n) ? std::string() : std::string("not a uint32");
    };
  }
  return info;
}

absl::StatusOr<PreparsedArgs> Pre(std::vector<std::string> args) {
  args.insert(args.begin(), "pd-client");
  return PreparseArgs(args, FakeLookup);
}

TEST(PreparseArgsTest, AcceptsDashedNamesBothValueFormsAndBooleans) {
  absl::StatusOr<PreparsedArgs> p = Pre({"Once upon a time", "--max-tokens", "64", "--ignore-eos",
                                         "--router=127.0.0.1:1", "--nojson", "-top-p=0.5"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->argv,
              ElementsAre("pd-client", "Once upon a time", "--max_tokens=64", "--ignore_eos",
                          "--router=127.0.0.1:1", "--nojson", "--top_p=0.5"));
  EXPECT_TRUE(p->stop.empty());
}

TEST(PreparseArgsTest, CollectsEveryStopOccurrence) {
  absl::StatusOr<PreparsedArgs> p = Pre({"--stop", "a,b", "hi", "--stop=c", "--stop", "--json"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->argv, ElementsAre("pd-client", "hi"));
  EXPECT_THAT(p->stop, ElementsAre("a,b", "c", "--json"));  // a value may look like a flag
}

TEST(PreparseArgsTest, EverythingAfterDoubleDashIsPositional) {
  absl::StatusOr<PreparsedArgs> p = Pre({"--json", "--", "--max-tokens", "-5"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->argv, ElementsAre("pd-client", "--json", "--", "--max-tokens", "-5"));
}

TEST(PreparseArgsTest, RejectsUnknownFlagsMissingAndInvalidValues) {
  absl::StatusOr<PreparsedArgs> p = Pre({"--max-tokns=5", "hi"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("unknown flag: --max-tokns=5"));

  p = Pre({"hi", "--max_tokens"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("missing value for flag --max_tokens"));

  p = Pre({"hi", "--max-tokens", "many"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("invalid value 'many' for --max_tokens"));

  p = Pre({"--norouter"});  // --noNAME only exists for booleans
  EXPECT_THAT(p.status().message(), HasSubstr("unknown flag: --norouter"));
  p = Pre({"--nojson=1"});
  EXPECT_THAT(p.status().message(), HasSubstr("unknown flag"));
}

TEST(SplitStopListTest, SplitsOnUnescapedCommas) {
  absl::StatusOr<std::vector<std::string>> s = SplitStopList({"a,b", "c\\,d", "e\\\\"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(*s, ElementsAre("a", "b", "c,d", "e\\"));
  EXPECT_THAT(SplitStopList({"a,,b"}).status().message(), HasSubstr("empty stop string"));
  EXPECT_THAT(SplitStopList({""}).status().message(), HasSubstr("empty stop string"));
  EXPECT_THAT(SplitStopList({"a\\"}).status().message(), HasSubstr("backslash"));
  EXPECT_THAT(SplitStopList({"a\\n"}).status().message(), HasSubstr("backslash"));
}

TEST(ParseTokenIdsTest, ParsesCommaListsAndRejectsGarbage) {
  absl::StatusOr<std::vector<uint32_t>> ids = ParseTokenIds("1, 403,407 ,4294967295");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(1, 403, 407, 4294967295u));
  for (const char* bad : {"", " ", "1,,2", "1,", "x", "-1", "+1", "4294967296", "1.5"}) {
    EXPECT_EQ(ParseTokenIds(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(BuildRequestTest, TextPromptAndSamplingFromOptions) {
  RequestOptions o;
  o.prompt_words = {"Once", "upon a time"};
  o.max_tokens = 64;
  o.temperature = 0.7f;
  o.top_p = 0.9f;
  o.top_k = 40;
  o.seed = "18446744073709551615";
  o.stop = {"The end,!", "x\\,y"};
  o.ignore_eos = true;
  o.cache_salt = "s1";
  o.model = "stories260K";
  o.presence_penalty = 0.5f;
  o.frequency_penalty = -1.0f;
  o.repetition_penalty = 1.3f;
  o.min_p = 0.05f;
  o.logit_bias = "42:-100, 7:5.5";
  absl::StatusOr<pdserve::v1::GenerateRequest> r = BuildRequest(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text(), "Once upon a time");
  EXPECT_EQ(r->model(), "stories260K");
  const pdserve::v1::SamplingParams& s = r->sampling();
  EXPECT_EQ(s.max_tokens(), 64u);
  EXPECT_FLOAT_EQ(s.temperature(), 0.7f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 40u);
  ASSERT_TRUE(s.has_seed());
  EXPECT_EQ(s.seed(), 18446744073709551615ull);
  EXPECT_THAT(s.stop(), ElementsAre("The end", "!", "x,y"));
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -1.0f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.3f);
  EXPECT_FLOAT_EQ(s.min_p(), 0.05f);
  ASSERT_EQ(s.logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(s.logit_bias().at(42), -100.0f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(7), 5.5f);
  ASSERT_TRUE(r->has_cache_salt());
  EXPECT_EQ(r->cache_salt(), "s1");
  EXPECT_FALSE(r->has_tenant());
}

TEST(BuildRequestTest, DefaultsLeaveOptionalFieldsUnset) {
  RequestOptions o;
  o.token_ids = "1";
  absl::StatusOr<pdserve::v1::GenerateRequest> r = BuildRequest(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->token_ids().ids(), ElementsAre(1));
  EXPECT_FALSE(r->sampling().has_seed());
  EXPECT_FALSE(r->has_cache_salt());
  EXPECT_EQ(r->sampling().max_tokens(), 0u);
  EXPECT_EQ(r->sampling().temperature(), 0.0f);
  EXPECT_EQ(r->sampling().stop_size(), 0);
}

TEST(BuildRequestTest, BadInputIsAUsageError) {
  auto error = [](RequestOptions o) { return BuildRequest(o).status(); };
  RequestOptions o;
  EXPECT_THAT(error(o).message(), HasSubstr("no prompt"));
  o.prompt_words = {"hi"};
  o.token_ids = "1";
  EXPECT_THAT(error(o).message(), HasSubstr("not both"));
  o.token_ids = "";
  o.prompt_words = {""};
  EXPECT_THAT(error(o).message(), HasSubstr("empty"));
  o.prompt_words = {"hi"};
  o.temperature = -0.5f;
  EXPECT_THAT(error(o).message(), HasSubstr("--temperature"));
  o.temperature = std::nanf("");
  EXPECT_THAT(error(o).message(), HasSubstr("--temperature"));
  o.temperature = 0;
  for (const char* bad : {"42", "x:1", "42:", "42:nan", "-1:5", "1:2,,3:4"}) {
    o.logit_bias = bad;
    EXPECT_THAT(error(o).message(), HasSubstr("--logit_bias")) << bad;
  }
  o.logit_bias = "";
  o.top_p = 1.5f;
  EXPECT_THAT(error(o).message(), HasSubstr("--top_p"));
  o.top_p = 0;
  o.seed = "-1";
  EXPECT_THAT(error(o).message(), HasSubstr("--seed"));
  o.seed = "12x";
  EXPECT_THAT(error(o).message(), HasSubstr("--seed"));
  o.seed = "";
  o.stop = {"a,"};
  EXPECT_THAT(error(o).message(), HasSubstr("--stop"));
  o.stop = {};
  o.prompt_words = {};
  o.token_ids = "1,two";
  EXPECT_THAT(error(o).message(), HasSubstr("--token_ids"));
  EXPECT_EQ(error(o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::client
