#include "loadtest/workload.h"

#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

constexpr VocabRange kVocab{3, 512};

std::vector<RequestSpec> Take(Workload& w, int n) {
  std::vector<RequestSpec> out;
  RequestSpec s;
  for (int i = 0; i < n && w.Next(&s); ++i) {
    out.push_back(s);
  }
  return out;
}

TEST(WorkloadTest, SyntheticLengthsAndUniquePrompts) {
  SyntheticOptions o;
  o.input_len = *LengthSpec::Parse("uniform:10,20");
  o.output_len = LengthSpec::Fixed(7);
  o.vocab = kVocab;
  o.seed = 42;
  auto w = MakeSyntheticWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->name(), "synthetic");
  EXPECT_FALSE((*w)->size().has_value());
  std::vector<RequestSpec> reqs = Take(**w, 200);
  ASSERT_EQ(reqs.size(), 200u);
  absl::flat_hash_set<uint32_t> first_tokens;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].index, static_cast<int64_t>(i));
    EXPECT_GE(reqs[i].prompt.size(), 10u);
    EXPECT_LE(reqs[i].prompt.size(), 20u);
    EXPECT_EQ(reqs[i].output_len, 7);
    EXPECT_FALSE(reqs[i].arrival_offset.has_value());
    first_tokens.insert(reqs[i].prompt[0]);
  }
  EXPECT_GT(first_tokens.size(), 150u);  // prompts do not share prefixes

  // The same seed gives the same requests.
  auto again = MakeSyntheticWorkload(o);
  ASSERT_TRUE(again.ok());
  std::vector<RequestSpec> reqs2 = Take(**again, 200);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].prompt, reqs2[i].prompt);
  }
}

TEST(WorkloadTest, SharedPrefixPoolVisitedBeforeRepeating) {
  SharedPrefixOptions o;
  o.num_prefixes = 3;
  o.suffixes_per_prefix = 4;
  o.prefix_len = 32;
  o.suffix_len = 8;
  o.output_len = LengthSpec::Fixed(5);
  o.vocab = kVocab;
  auto w = MakeSharedPrefixWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<RequestSpec> reqs = Take(**w, 24);
  absl::flat_hash_set<std::vector<uint32_t>> first_pass, prefixes, all;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(reqs[i].prompt.size(), 40u);
    EXPECT_EQ(reqs[i].output_len, 5);
    std::vector<uint32_t> prefix(reqs[i].prompt.begin(), reqs[i].prompt.begin() + 32);
    prefixes.insert(prefix);
    all.insert(reqs[i].prompt);
    if (i < 12) {
      EXPECT_TRUE(first_pass.insert(reqs[i].prompt).second) << "repeat within the first pass";
    }
  }
  EXPECT_EQ(prefixes.size(), 3u);
  EXPECT_EQ(all.size(), 12u);  // P x S distinct prompts
}

TEST(WorkloadTest, SharedPrefixRejectsBadOptions) {
  SharedPrefixOptions o;
  o.vocab = kVocab;
  o.num_prefixes = 0;
  EXPECT_EQ(MakeSharedPrefixWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.num_prefixes = 1;
  o.prefix_len = 0;
  EXPECT_EQ(MakeSharedPrefixWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.prefix_len = 1;
  o.vocab = {5, 5};
  EXPECT_EQ(MakeSharedPrefixWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkloadTest, TraceReplaysRecordsWithSharedBlocks) {
  std::istringstream in(
      "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 9, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 2000, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, "
      "2]}\n");
  TraceOptions to;
  to.time_scale = 0.1;
  absl::StatusOr<Trace> trace = ParseTrace(in, "t", to);
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto w = MakeTraceWorkload(*std::move(trace), {512, kVocab});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->size(), 2);
  std::vector<RequestSpec> reqs = Take(**w, 10);
  ASSERT_EQ(reqs.size(), 2u);  // exhausted after the trace
  EXPECT_EQ(reqs[0].prompt.size(), 1000u);
  EXPECT_EQ(reqs[1].prompt.size(), 600u);
  EXPECT_EQ(reqs[0].output_len, 9);
  EXPECT_EQ(reqs[1].source_line, 2);
  EXPECT_EQ(reqs[1].arrival_offset, absl::Milliseconds(200));
  // Block 0 shared, the second block not.
  EXPECT_TRUE(
      std::equal(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 512, reqs[1].prompt.begin()));
  EXPECT_FALSE(std::equal(reqs[0].prompt.begin() + 512, reqs[0].prompt.begin() + 600,
                          reqs[1].prompt.begin() + 512));
}

}  // namespace
}  // namespace pd::loadtest
