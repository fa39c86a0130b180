#include "services/router/request_validation.h"

#include <cmath>
#include <functional>
#include <string>

#include "gtest/gtest.h"

namespace pd::router {
namespace {

using pdserve::v1::GenerateRequest;

GenerateRequest Valid() {
  GenerateRequest r;
  r.set_text("Once upon a time");
  r.mutable_sampling()->set_max_tokens(32);
  return r;
}

TEST(RequestValidationTest, AcceptsMinimalAndFullRequests) {
  RequestLimits limits;
  EXPECT_TRUE(ValidateGenerateRequest(Valid(), limits).ok());
  GenerateRequest full = Valid();
  full.clear_text();
  full.mutable_token_ids()->add_ids(1);
  full.mutable_token_ids()->add_ids(403);
  auto* s = full.mutable_sampling();
  s->set_min_tokens(4);
  s->set_temperature(0.7f);
  s->set_top_p(0.9f);
  s->set_top_k(40);
  s->set_seed(7);
  s->add_stop("\n\n");
  s->add_stop("é");
  s->add_stop_token_ids(2);
  s->set_logprobs(20);
  s->set_presence_penalty(-2.0f);
  s->set_frequency_penalty(2.0f);
  s->set_repetition_penalty(1.3f);
  s->set_min_p(1.0f);
  for (uint32_t id = 0; id < 300; ++id) {
    (*s->mutable_logit_bias())[id] = id % 2 == 0 ? -100.0f : 100.0f;
  }
  full.set_client_request_id("abc");
  full.set_tenant("team-a");
  full.set_cache_salt("salt");
  full.set_timeout_ms(1000);
  full.set_n(16);
  EXPECT_TRUE(ValidateGenerateRequest(full, limits).ok());
}

struct BadCase {
  std::string name;
  std::function<void(GenerateRequest*)> mutate;
  std::string field;  // must appear in the message
};

class RequestValidationBadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(RequestValidationBadTest, RejectedNamingTheField) {
  GenerateRequest r = Valid();
  GetParam().mutate(&r);
  absl::Status s = ValidateGenerateRequest(r, RequestLimits{});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(GetParam().field), absl::string_view::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RequestValidationBadTest,
    ::testing::Values(
        BadCase{"NoPrompt", [](GenerateRequest* r) { r->clear_text(); }, "prompt"},
        BadCase{"EmptyText", [](GenerateRequest* r) { r->set_text(""); }, "text"},
        BadCase{"InvalidUtf8", [](GenerateRequest* r) { r->set_text("a\xC3("); }, "UTF-8"},
        BadCase{"OverlongUtf8", [](GenerateRequest* r) { r->set_text("\xC0\xAF"); }, "UTF-8"},
        BadCase{"Surrogate", [](GenerateRequest* r) { r->set_text("\xED\xA0\x80"); }, "UTF-8"},
        BadCase{"EmptyTokenIds", [](GenerateRequest* r) { r->mutable_token_ids(); }, "token_ids"},
        BadCase{"TooLongText",
                [](GenerateRequest* r) { r->set_text(std::string((1 << 20) + 1, 'a')); }, "text"},
        BadCase{"NegativeTemperature",
                [](GenerateRequest* r) { r->mutable_sampling()->set_temperature(-1); },
                "sampling.temperature"},
        BadCase{"NanTemperature",
                [](GenerateRequest* r) { r->mutable_sampling()->set_temperature(NAN); },
                "sampling.temperature"},
        BadCase{"TopPAboveOne", [](GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); },
                "sampling.top_p"},
        // Found by request_validation_fuzzer: the worker rejects top_k > INT32_MAX.
        BadCase{"TopKAboveInt32",
                [](GenerateRequest* r) { r->mutable_sampling()->set_top_k(2147483648u); },
                "sampling.top_k"},
        BadCase{"LogprobsAbove20",
                [](GenerateRequest* r) { r->mutable_sampling()->set_logprobs(21); },
                "sampling.logprobs"},
        BadCase{"PresenceAboveTwo",
                [](GenerateRequest* r) { r->mutable_sampling()->set_presence_penalty(2.5f); },
                "sampling.presence_penalty"},
        BadCase{"FrequencyNan",
                [](GenerateRequest* r) { r->mutable_sampling()->set_frequency_penalty(NAN); },
                "sampling.frequency_penalty"},
        BadCase{"FrequencyBelowMinusTwo",
                [](GenerateRequest* r) { r->mutable_sampling()->set_frequency_penalty(-3.0f); },
                "sampling.frequency_penalty"},
        BadCase{"NegativeRepetition",
                [](GenerateRequest* r) { r->mutable_sampling()->set_repetition_penalty(-1.0f); },
                "sampling.repetition_penalty"},
        BadCase{"InfiniteRepetition",
                [](GenerateRequest* r) { r->mutable_sampling()->set_repetition_penalty(INFINITY); },
                "sampling.repetition_penalty"},
        BadCase{"MinPAboveOne", [](GenerateRequest* r) { r->mutable_sampling()->set_min_p(1.1f); },
                "sampling.min_p"},
        BadCase{
            "BiasAbove100",
            [](GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[17] = 101; },
            "sampling.logit_bias[17]"},
        BadCase{"TooManyBiases",
                [](GenerateRequest* r) {
                  for (uint32_t id = 0; id < 301; ++id) {
                    (*r->mutable_sampling()->mutable_logit_bias())[id] = 1.0f;
                  }
                },
                "sampling.logit_bias: 301 entries exceed the limit 300"},
        BadCase{"MinAboveMax",
                [](GenerateRequest* r) { r->mutable_sampling()->set_min_tokens(64); },
                "sampling.min_tokens"},
        BadCase{"MaxTokensTooLarge",
                [](GenerateRequest* r) { r->mutable_sampling()->set_max_tokens(1u << 30); },
                "sampling.max_tokens"},
        BadCase{"EmptyStop", [](GenerateRequest* r) { r->mutable_sampling()->add_stop(""); },
                "sampling.stop[0]"},
        BadCase{"TooManyStops",
                [](GenerateRequest* r) {
                  for (int i = 0; i < 17; ++i) r->mutable_sampling()->add_stop("x");
                },
                "sampling.stop"},
        BadCase{"EmptyTenant", [](GenerateRequest* r) { r->set_tenant(""); }, "tenant"},
        BadCase{"TooManyChoices", [](GenerateRequest* r) { r->set_n(17); },
                "n: must be in [1, 16] (0 = 1), got 17"},
        BadCase{"EmptySalt", [](GenerateRequest* r) { r->set_cache_salt(""); }, "cache_salt"},
        BadCase{"LongClientId",
                [](GenerateRequest* r) { r->set_client_request_id(std::string(129, 'x')); },
                "client_request_id"},
        // The text fields are `bytes` on the wire: invalid UTF-8 reaches validation.
        BadCase{"InvalidUtf8Model", [](GenerateRequest* r) { r->set_model("m\xFF"); },
                "model: is not valid UTF-8"},
        BadCase{"InvalidUtf8ClientId",
                [](GenerateRequest* r) { r->set_client_request_id("id\xC3"); },
                "client_request_id: is not valid UTF-8"},
        BadCase{"InvalidUtf8Tenant", [](GenerateRequest* r) { r->set_tenant("\xED\xA0\x80"); },
                "tenant: is not valid UTF-8"},
        BadCase{"InvalidUtf8Salt", [](GenerateRequest* r) { r->set_cache_salt("\xC0\xAF"); },
                "cache_salt: is not valid UTF-8"},
        BadCase{"InvalidUtf8Stop",
                [](GenerateRequest* r) { r->mutable_sampling()->add_stop("ok\xFE"); },
                "sampling.stop[0]: is not valid UTF-8"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

}  // namespace
}  // namespace pd::router
