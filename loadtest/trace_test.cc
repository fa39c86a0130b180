#include "loadtest/trace.h"

#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<Trace> Parse(const std::string& text, TraceOptions options = {}) {
  std::istringstream in(text);
  return ParseTrace(in, "t.jsonl", options);
}

TEST(TraceTest, ParsesGoodLines) {
  absl::StatusOr<Trace> t = Parse(
      "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1, "
      "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n"
      "\n"
      "{\"timestamp\": 27.5, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [0], "
      "\"extra\": \"ignored\"}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->records.size(), 2u);
  EXPECT_EQ(t->records[0].line_number, 1);
  EXPECT_EQ(t->records[0].input_length, 6758);
  EXPECT_EQ(t->records[0].output_length, 500);
  EXPECT_EQ(t->records[0].hash_ids.size(), 14u);
  EXPECT_EQ(t->records[1].line_number, 3);  // the empty line 2 is skipped
  EXPECT_EQ(t->records[1].arrival_offset, absl::Microseconds(27500));
  EXPECT_TRUE(t->skipped.empty());
  EXPECT_EQ(t->num_capped, 0);
}

TEST(TraceTest, MalformedLineAbortsWithItsLineNumber) {
  const std::string good =
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n";
  struct Case {
    std::string line;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"timestamp\": 0, \"input_length\": 10", "not valid JSON"},
           {"[1, 2]", "not a JSON object"},
           {"{\"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}",
            "missing field 'timestamp'"},
           {"{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}",
            "field 'timestamp' must be a number >= 0"},
           {"{\"timestamp\": 0, \"input_length\": \"10\", \"output_length\": 5, \"hash_ids\": "
            "[1]}",
            "field 'input_length' must be an integer"},
           {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 0, \"hash_ids\": [1]}",
            "field 'output_length' must be >= 1"},
           {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [-1]}",
            "field 'hash_ids' must hold integers >= 0"},
           {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": 3}",
            "field 'hash_ids' must be an array"},
           {"{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": "
            "[1]}",
            "'hash_ids' has 1 entries but input_length 1000 needs ceil(1000 / 512) = 2"},
       }) {
    absl::StatusOr<Trace> t = Parse(good + good + c.line + "\n" + good);
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("t.jsonl:3: " + c.why)) << c.line;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("--on_bad_line=skip"));
  }
}

TEST(TraceTest, SkipPolicyRecordsBadLines) {
  TraceOptions o;
  o.on_bad_line = BadLinePolicy::kSkip;
  absl::StatusOr<Trace> t = Parse(
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n"
      "garbage\n"
      "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n",
      o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->records.size(), 2u);
  EXPECT_THAT(t->skipped, ElementsAre(HasSubstr("t.jsonl:2: not valid JSON")));
}

TEST(TraceTest, NoValidRecordIsAnError) {
  TraceOptions o;
  o.on_bad_line = BadLinePolicy::kSkip;
  EXPECT_EQ(Parse("garbage\n", o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TraceTest, TimeScaleAndOffsetsFromTheFirstTimestamp) {
  TraceOptions o;
  o.time_scale = 0.5;
  absl::StatusOr<Trace> t = Parse(
      "{\"timestamp\": 1000, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 4000, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [2]}\n"
      "{\"timestamp\": 3000, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [3]}\n",
      o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->records.size(), 3u);
  // Sorted by timestamp (stable), offsets relative to the first and halved.
  EXPECT_EQ(t->records[0].arrival_offset, absl::ZeroDuration());
  EXPECT_EQ(t->records[1].arrival_offset, absl::Seconds(1));
  EXPECT_EQ(t->records[1].line_number, 3);
  EXPECT_EQ(t->records[2].arrival_offset, absl::Milliseconds(1500));
  o.time_scale = 0;
  EXPECT_EQ(Parse("", o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TraceTest, MaxInputLenCapsPromptAndHashIds) {
  TraceOptions o;
  o.max_input_len = 600;
  absl::StatusOr<Trace> t = Parse(
      "{\"timestamp\": 0, \"input_length\": 2000, \"output_length\": 5, \"hash_ids\": [0, 1, 2, "
      "3]}\n"
      "{\"timestamp\": 0, \"input_length\": 300, \"output_length\": 5, \"hash_ids\": [0]}\n",
      o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->records[0].input_length, 600);
  EXPECT_THAT(t->records[0].hash_ids, ElementsAre(0, 1));
  EXPECT_EQ(t->records[1].input_length, 300);
  EXPECT_EQ(t->num_capped, 1);
}

// Found by tests/fuzz/trace_fuzzer: ceil(input_length / block_tokens) overflowed int64 for
// input_length near INT64_MAX (undefined behaviour; a wrapped, negative count in the message).
TEST(TraceTest, HugeInputLengthIsRejectedWithTheRightBlockCount) {
  absl::StatusOr<TraceRecord> r = ParseTraceLine(
      "{\"timestamp\": 0, \"input_length\": 9223372036854775807, \"output_length\": 1, "
      "\"hash_ids\": [0]}",
      512);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("= 18014398509481984"));
}

TEST(TraceTest, BadLinePolicyNames) {
  EXPECT_EQ(*ParseBadLinePolicy("skip"), BadLinePolicy::kSkip);
  EXPECT_EQ(*ParseBadLinePolicy("abort"), BadLinePolicy::kAbort);
  EXPECT_FALSE(ParseBadLinePolicy("ignore").ok());
}

TEST(TraceTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadTrace("/no/such/trace.jsonl", {}).status().code(), absl::StatusCode::kNotFound);
}

// The shared Mooncake trace parses completely and matches its README's statistics.
TEST(TraceTest, SharedMooncakeTrace) {
  absl::StatusOr<Trace> t =
      LoadTrace(PD_SHARED_DIR "/traces/mooncake_conversation_trace.jsonl", {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->records.size(), 12031u);
  EXPECT_TRUE(t->skipped.empty());
  int64_t input = 0;
  for (const TraceRecord& r : t->records) {
    input += r.input_length;
  }
  EXPECT_EQ(input / 12031, 12035);  // README: mean input 12,035 tokens
  EXPECT_NEAR(absl::ToDoubleSeconds(t->records.back().arrival_offset), 3537.0, 1.0);
}

}  // namespace
}  // namespace pd::loadtest
